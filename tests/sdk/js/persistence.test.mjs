// Pause, resume, lifecycle, snapshots and fork through the npm `e2b` SDK (unmodified), against
// a real server with the jail driver and CRIU. (A restart while paused is covered by the Python
// suite, whose server fixture can restart; here one server serves every file.)
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { setup, teardown, tester, track, poll, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

before(async () => {
  await setup()
})
after(async () => {
  await teardown()
})

const t = tester(180_000)

const create = (opts = {}) =>
  Sandbox.create(TEMPLATE, { timeoutMs: 300_000, ...opts, metadata: { ...SUITE_METADATA, ...(opts.metadata ?? {}) } }).then(track)

async function listAll(opts) {
  const pag = Sandbox.list(opts)
  const items = []
  let pages = 0
  while (pag.hasNext) {
    items.push(...(await pag.nextItems()))
    assert.ok(++pages < 50, 'paginator does not terminate')
  }
  return items
}

async function snapshots(opts) {
  const pag = Sandbox.listSnapshots(opts)
  const items = []
  let pages = 0
  while (pag.hasNext) {
    items.push(...(await pag.nextItems()))
    assert.ok(++pages < 50, 'snapshot paginator does not terminate')
  }
  return items
}

const pids = async (sbx) => (await sbx.commands.list()).map((p) => p.pid)

// A REPL-like process: executes each stdin line; its variables live only in its memory.
const REPL = "python3 -u -c 'import sys\nfor line in sys.stdin: exec(line)'"

t('pause and connect keep processes, memory, files and env', async () => {
  const sbx = await create({ envs: { PERSIST_ENV: 'kept' } })
  await sbx.files.write('/home/user/note.txt', 'before the pause')
  const sleeper = await sbx.commands.run('sleep 3600', { background: true })
  const repl = await sbx.commands.run(REPL, { background: true, stdin: true })
  await sbx.commands.sendStdin(repl.pid, 'x = 41\n')
  assert.equal(await sbx.pause(), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')

  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 300_000 })
  assert.equal(again.sandboxId, sbx.sandboxId)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
  const list = await pids(again)
  assert.ok(list.includes(sleeper.pid), `background sleep lost: ${list}`)
  await again.commands.sendStdin(repl.pid, "open('/tmp/repl-out', 'w').write(str(x + 1))\n")
  assert.ok(await poll(() => again.files.exists('/tmp/repl-out'), 10_000))
  assert.equal(await again.files.read('/tmp/repl-out'), '42')
  assert.equal(await again.files.read('/home/user/note.txt'), 'before the pause')
  assert.equal((await again.commands.run('echo $PERSIST_ENV')).stdout.trim(), 'kept')
})

t('betaPause twice answers false; connect to a running sandbox only extends it', async () => {
  const sbx = await create()
  const same = await Sandbox.connect(sbx.sandboxId)
  assert.equal(same.sandboxId, sbx.sandboxId)
  assert.equal(await sbx.betaPause(), true)
  assert.equal(await sbx.betaPause(), false)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)
  const again = await sbx.connect()
  assert.equal((await again.commands.run('echo ok')).stdout, 'ok\n')
})

t('paused state in getInfo and list, with filters and pagination', async () => {
  const tag = randomBytes(4).toString('hex')
  const metadata = { persist: tag }
  const paused = [await create({ metadata }), await create({ metadata })]
  const running = await create({ metadata })
  for (const s of paused) assert.equal(await s.pause(), true)
  const ids = async (state, limit) =>
    new Set((await listAll({ query: { metadata, state }, limit })).map((i) => i.sandboxId))
  const want = new Set(paused.map((s) => s.sandboxId))
  assert.deepEqual(await ids(['paused']), want)
  assert.deepEqual(await ids(['paused'], 1), want)
  assert.deepEqual(await ids(['running']), new Set([running.sandboxId]))
  assert.deepEqual(await ids(['running', 'paused']), new Set([...want, running.sandboxId]))
})

t('filesystem-only pause keeps files, not processes', async () => {
  const sbx = await create()
  await sbx.files.write('/home/user/fs.txt', 'on disk')
  const sleeper = await sbx.commands.run('sleep 3600', { background: true })
  await sbx.commands.run('sync')
  assert.equal(await sbx.pause({ keepMemory: false }), true)
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal(await again.files.read('/home/user/fs.txt'), 'on disk')
  assert.ok(!(await pids(again)).includes(sleeper.pid))
})

t('onTimeout pause, then connect', async () => {
  const sbx = await create({ timeoutMs: 5_000, lifecycle: { onTimeout: 'pause' } })
  await sbx.files.write('/home/user/ttl.txt', 'survives the TTL')
  const info = await sbx.getInfo()
  assert.equal(info.lifecycle?.onTimeout, 'pause')
  assert.ok(
    await poll(async () => (await Sandbox.getInfo(sbx.sandboxId)).state === 'paused', 60_000),
    'not paused at the end of its TTL'
  )
  const again = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 120_000 })
  assert.equal(await again.files.read('/home/user/ttl.txt'), 'survives the TTL')
})

t('autoResume: envd traffic resumes a paused sandbox', async () => {
  const sbx = await create({ timeoutMs: 120_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  await sbx.files.write('/home/user/auto.txt', 'auto')
  assert.equal(await sbx.pause(), true)
  assert.equal(await sbx.files.read('/home/user/auto.txt'), 'auto')
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'running')
})

t('snapshots: named, listed, two independent sandboxes from one, deleted', async () => {
  const src = await create()
  await src.files.write('/home/user/snap.txt', 'from the snapshot')
  const name = `bh-js-snap-${randomBytes(4).toString('hex')}`
  const snap = await src.createSnapshot({ name })
  let anon
  try {
    assert.ok(snap.snapshotId.startsWith(name), snap.snapshotId)
    anon = await src.createSnapshot()
    assert.equal((await src.commands.run('echo running')).stdout, 'running\n')
    const all = new Set((await snapshots()).map((s) => s.snapshotId))
    assert.ok(all.has(snap.snapshotId) && all.has(anon.snapshotId))
    const mine = new Set((await snapshots({ sandboxId: src.sandboxId })).map((s) => s.snapshotId))
    assert.deepEqual(mine, new Set([snap.snapshotId, anon.snapshotId]))
    assert.deepEqual(new Set((await snapshots({ sandboxId: src.sandboxId, limit: 1 })).map((s) => s.snapshotId)), mine)
    assert.deepEqual((await snapshots({ name })).map((s) => s.snapshotId), [snap.snapshotId])

    const a = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 }).then(track)
    const b = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 }).then(track)
    assert.equal(await a.files.read('/home/user/snap.txt'), 'from the snapshot')
    await a.files.write('/home/user/snap.txt', 'changed in a')
    assert.equal(await b.files.read('/home/user/snap.txt'), 'from the snapshot')
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  } finally {
    for (const s of [snap, anon]) {
      if (s) await Sandbox.deleteSnapshot(s.snapshotId).catch(() => {})
    }
  }
})

t('fork: two copies independent of the parent', async () => {
  const parent = await create()
  await parent.files.write('/home/user/fork.txt', 'parent')
  const sleeper = await parent.commands.run('sleep 3600', { background: true })
  const forks = await parent.fork({ count: 2, timeoutMs: 120_000 })
  for (const f of forks) {
    assert.ok(!(f instanceof Error), String(f))
    track(f)
  }
  assert.equal(new Set(forks.map((f) => f.sandboxId)).size, 2)
  for (const f of forks) {
    assert.notEqual(f.sandboxId, parent.sandboxId)
    assert.equal(await f.files.read('/home/user/fork.txt'), 'parent')
    assert.ok((await pids(f)).includes(sleeper.pid))
  }
  await forks[0].files.write('/home/user/fork.txt', 'fork 0')
  assert.equal(await forks[1].files.read('/home/user/fork.txt'), 'parent')
  assert.equal(await parent.files.read('/home/user/fork.txt'), 'parent')
  assert.ok((await pids(parent)).includes(sleeper.pid))
})
