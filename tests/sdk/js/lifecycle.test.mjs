// Control plane through the npm `e2b` SDK: create (v2), getInfo, list (filters, pagination),
// setTimeout, connect, kill, metrics; two sandboxes at once.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox, SandboxNotFoundError, NotFoundError, SandboxError } from 'e2b'
import { setup, teardown, tester, track, poll, sleep, recordingLogger, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

before(async () => {
  await setup()
})
after(async () => {
  await teardown()
})

const t = tester()

const create = (opts = {}) =>
  Sandbox.create(TEMPLATE, { timeoutMs: 180_000, ...opts, metadata: { ...SUITE_METADATA, ...(opts.metadata ?? {}) } }).then(track)

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

const secondsUntil = (d) => (d.getTime() - Date.now()) / 1000

t('create uses POST /v2/sandboxes and the sandbox works at once', async () => {
  const rec = recordingLogger()
  const sbx = await create({ envs: { GREETING: 'hello js' }, logger: rec.logger })
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.ok(rec.requests.some(([m, p]) => m === 'POST' && p === '/v2/sandboxes'), JSON.stringify(rec.requests))
  assert.ok(!rec.requests.some(([m, p]) => m === 'POST' && p === '/sandboxes'))
  assert.equal(await sbx.isRunning(), true)
  const r = await sbx.commands.run('echo "$GREETING"')
  assert.equal(r.stdout, 'hello js\n')
  assert.equal(r.exitCode, 0)
})

t('getInfo fields', async () => {
  const before = Date.now()
  const md = { purpose: 'info', odd: 'ünï c=&?/ x+y' }
  const sbx = await create({ timeoutMs: 240_000, metadata: md })
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.ok([info.templateId, info.name].includes(TEMPLATE), `${info.templateId} ${info.name}`)
  assert.deepEqual(info.metadata, { ...SUITE_METADATA, ...md })
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date)
  assert.ok(Math.abs(info.startedAt.getTime() - before) < 10_000)
  assert.ok(Math.abs((info.endAt - info.startedAt) / 1000 - 240) < 5)
  assert.equal(info.state, 'running')
  assert.ok(info.cpuCount >= 1 && info.memoryMB >= 64)
  const info2 = await Sandbox.getInfo(sbx.sandboxId)
  assert.equal(info2.sandboxId, sbx.sandboxId)
})

t('list with metadata/state filters and pagination', async () => {
  const group = randomBytes(6).toString('hex')
  const boxes = []
  for (let i = 0; i < 3; i++) boxes.push(await create({ metadata: { 'list-group': group, idx: String(i) } }))
  await create({ metadata: { 'list-group': group + '-other' } })
  const ids = new Set(boxes.map((b) => b.sandboxId))

  const found = await listAll({ query: { metadata: { 'list-group': group } } })
  assert.deepEqual(new Set(found.map((s) => s.sandboxId)), ids)
  for (const s of found) {
    assert.equal(s.metadata['list-group'], group)
    assert.equal(s.state, 'running')
  }
  const one = await listAll({ query: { metadata: { 'list-group': group, idx: '2' } } })
  assert.deepEqual(one.map((s) => s.sandboxId), [boxes[2].sandboxId])
  const running = await listAll({ query: { metadata: { 'list-group': group }, state: ['running'] } })
  assert.equal(running.length, 3)
  const paused = await listAll({ query: { metadata: { 'list-group': group }, state: ['paused'] } })
  assert.equal(paused.length, 0)

  const pag = Sandbox.list({ query: { metadata: { 'list-group': group } }, limit: 2 })
  const p1 = await pag.nextItems()
  assert.equal(p1.length, 2)
  assert.ok(pag.hasNext && pag.nextToken)
  const p2 = await pag.nextItems()
  assert.equal(p2.length, 1)
  assert.equal(pag.hasNext, false)
  assert.deepEqual(new Set([...p1, ...p2].map((s) => s.sandboxId)), ids)

  await boxes[0].kill()
  const left = await listAll({ query: { metadata: { 'list-group': group } } })
  assert.equal(left.length, 2)
})

t('list metadata filter with special characters', async () => {
  // The SDK encodes keys and values, then the whole k=v&… string: the server decodes twice.
  const tag = randomBytes(4).toString('hex')
  const md = { 'odd key/ü': `v a/l=u&e ü+%20 ${tag}` }
  const sbx = await create({ metadata: md })
  await create({ metadata: { 'odd key/ü': `other ${tag}` } })
  const found = await listAll({ query: { metadata: md } })
  assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId])
  assert.equal(found[0].metadata['odd key/ü'], md['odd key/ü'])
})

t('setTimeout moves endAt both ways', async () => {
  const sbx = await create({ timeoutMs: 60_000 })
  const end0 = (await sbx.getInfo()).endAt
  await sbx.setTimeout(600_000)
  const end1 = (await sbx.getInfo()).endAt
  assert.ok(end1 > end0)
  assert.ok(Math.abs(secondsUntil(end1) - 600) < 10)
  await sbx.setTimeout(45_000)
  assert.ok(Math.abs(secondsUntil((await sbx.getInfo()).endAt) - 45) < 10)
  await Sandbox.setTimeout(sbx.sandboxId, 120_000)
  assert.ok(Math.abs(secondsUntil((await Sandbox.getInfo(sbx.sandboxId)).endAt) - 120) < 10)
})

t('a 3 s sandbox is really gone after ~5 s', async () => {
  const t0 = Date.now()
  const sbx = await create({ timeoutMs: 3_000 })
  assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
  await sleep(Math.max(0, 5_000 - (Date.now() - t0)))
  assert.ok(await poll(async () => !(await sbx.isRunning()), 3_000), 'still running after its timeout')
  assert.ok(Date.now() - t0 < 10_000)
  await assert.rejects(sbx.getInfo(), SandboxNotFoundError)
  await assert.rejects(sbx.commands.run('echo nope', { timeoutMs: 10_000 }))
})

t('connect by id extends the TTL and never shortens it', async () => {
  const sbx = await create({ timeoutMs: 60_000 })
  await sbx.files.write('/home/user/connect.txt', 'same')
  const rec = recordingLogger()
  const other = await Sandbox.connect(sbx.sandboxId, { timeoutMs: 600_000, logger: rec.logger })
  assert.ok(rec.requests.some(([m, p]) => m === 'POST' && p === `/v2/sandboxes/${sbx.sandboxId}/connect`), JSON.stringify(rec.requests))
  assert.equal(other.sandboxId, sbx.sandboxId)
  assert.equal(await other.files.read('/home/user/connect.txt'), 'same')
  const endLong = (await sbx.getInfo()).endAt
  assert.ok(Math.abs(secondsUntil(endLong) - 600) < 10)
  await Sandbox.connect(sbx.sandboxId, { timeoutMs: 10_000 })
  assert.ok((await sbx.getInfo()).endAt >= endLong - 1000)
  await sbx.connect({ timeoutMs: 30_000 })
  assert.ok((await sbx.getInfo()).endAt >= endLong - 1000)
  await assert.rejects(Sandbox.connect('doesnotexist0000000000', { timeoutMs: 30_000 }), SandboxNotFoundError)
})

t('kill returns true, then false, and everything is not found', async () => {
  const sbx = await create()
  const id = sbx.sandboxId
  assert.equal(await sbx.kill(), true)
  assert.equal(await sbx.kill(), false)
  assert.equal(await Sandbox.kill(id), false)
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(sbx.getInfo(), SandboxNotFoundError)
  await assert.rejects(sbx.setTimeout(30_000), NotFoundError)
  await assert.rejects(Sandbox.connect(id, { timeoutMs: 30_000 }), SandboxNotFoundError)
  await assert.rejects(sbx.commands.run('echo ghost', { timeoutMs: 10_000 }), SandboxError)
  const all = await listAll({})
  assert.ok(!all.some((s) => s.sandboxId === id))
})

t('metrics are real', async () => {
  const sbx = await create()
  await sbx.commands.run("python3 -c 'x = bytearray(32 << 20)'")
  const m = await poll(async () => {
    const ms = await sbx.getMetrics()
    return ms.length ? ms[ms.length - 1] : null
  }, 20_000, 1_000)
  assert.ok(m, 'no metrics within 20 s')
  assert.ok(m.cpuCount >= 1)
  assert.ok(m.memTotal > 0 && m.memUsed > 0 && m.memUsed <= m.memTotal)
})

t('two sandboxes at once are separate', async () => {
  const [a, b] = await Promise.all([create(), create()])
  assert.notEqual(a.sandboxId, b.sandboxId)
  await a.files.write('/home/user/only-a.txt', 'A')
  assert.equal(await b.files.exists('/home/user/only-a.txt'), false)
  await Promise.all([a.files.write('/home/user/name.txt', 'A-content'), b.files.write('/home/user/name.txt', 'B-content')])
  const t0 = Date.now()
  const [ra, rb] = await Promise.all([a.commands.run('sleep 1; cat /home/user/name.txt'), b.commands.run('sleep 1; cat /home/user/name.txt')])
  assert.equal(ra.stdout, 'A-content')
  assert.equal(rb.stdout, 'B-content')
  assert.ok(Date.now() - t0 < 15_000)
})
