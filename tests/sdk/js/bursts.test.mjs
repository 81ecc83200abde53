// Bursts through the npm `e2b` SDK: 30 creates at once, each running a first command, all
// killed and nothing left on the host; creates beyond the server's admission limit get E2B's
// 429 (the SDK's RateLimitError) and leave nothing half-made.
//
// This file starts its own server (also under scripts/test.sh) because it needs admission
// limits small enough to hit and a fixed warm pool, so the host's sandbox resources after the
// burst can be compared with those before it.

import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash } from 'node:crypto'
import { readdirSync, readFileSync, realpathSync, statSync } from 'node:fs'
import path from 'node:path'
import { Sandbox, RateLimitError } from 'e2b'
import { startServer, tester, poll, removeTree, sleep, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

const MAX_CONCURRENT = 4
const MAX_QUEUED = 40
let srv
const opts = () => ({ apiKey: srv.apiKey, apiUrl: srv.url, sandboxUrl: srv.url })

before(async () => {
  srv = await startServer([
    '--templates', TEMPLATE,
    '--pool-size', '2',
    '--max-concurrent-creates', String(MAX_CONCURRENT),
    '--max-queued-creates', String(MAX_QUEUED),
  ])
  delete process.env.E2B_DOMAIN
})
let failed = false
after(async () => {
  if (!srv) return
  await killTagged()
  await srv.stop()
  if (failed) console.error(`bulkhead server log tail:\n${srv.logTail(150)}\n(data kept at ${srv.tmpRoot})`)
  else removeTree(srv.tmpRoot)
})

const t = tester(600_000)
const test = (name, fn) =>
  t(name, async (ctx) => {
    try {
      await fn(ctx)
    } catch (e) {
      failed = true
      throw e
    }
  })

async function killTagged() {
  const pag = Sandbox.list({ query: { metadata: SUITE_METADATA }, limit: 100, ...opts() })
  while (pag.hasNext) {
    for (const s of await pag.nextItems()) await Sandbox.kill(s.sandboxId, opts()).catch(() => {})
  }
}

// ---- what this server's sandboxes hold on the host (per server: its cgroup subtree and data dir) ----

function cgroupSubtree() {
  const digest = createHash('sha256').update(realpathSync(srv.dataDir)).digest('hex').slice(0, 8)
  return `bulkhead/${digest}`
}
function cgroupDirs() {
  const found = []
  const walk = (d) => {
    let entries
    try {
      entries = readdirSync(d, { withFileTypes: true })
    } catch {
      return
    }
    for (const e of entries) {
      if (e.isDirectory()) {
        found.push(path.join(d, e.name))
        walk(path.join(d, e.name))
      }
    }
  }
  for (const root of readdirSync('/sys/fs/cgroup')) walk(path.join('/sys/fs/cgroup', root, cgroupSubtree()))
  walk(path.join('/sys/fs/cgroup', cgroupSubtree()))
  return found
}
function sandboxProcesses() {
  const sub = '/' + cgroupSubtree() + '/'
  const out = []
  for (const pid of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
    try {
      const cg = readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      const st = readFileSync(`/proc/${pid}/stat`, 'utf8')
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ')
      const zombieOfServer = f[0] === 'Z' && Number(f[1]) === srv.pid
      if (cg.includes(sub) || zombieOfServer) out.push(`${pid} ${st.slice(0, 80)}`)
    } catch {}
  }
  return out
}
function leftoverMounts() {
  const data = realpathSync(srv.dataDir)
  const lower = path.join(data, 'jail', 'l') + '/'
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split(' ')[4])
    .filter((mp) => mp.startsWith(data + '/') && !(mp + '/').startsWith(lower))
}
function nonemptySlots() {
  const slots = path.join(srv.dataDir, 'jail', 's')
  try {
    return readdirSync(slots).filter((d) => {
      const p = path.join(slots, d)
      return statSync(p).isDirectory() && readdirSync(p).length > 0
    })
  } catch {
    return []
  }
}
function hostState() {
  return { processes: sandboxProcesses(), cgroups: cgroupDirs(), mounts: leftoverMounts(), slots: nonemptySlots() }
}
const counts = (s) => Object.fromEntries(Object.entries(s).map(([k, v]) => [k, v.length]))
const notAbove = (base, now) => Object.keys(base).every((k) => now[k].length <= base[k].length)

async function listTagged(md) {
  const pag = Sandbox.list({ query: { metadata: md }, limit: 100, ...opts() })
  const items = []
  while (pag.hasNext) items.push(...(await pag.nextItems()))
  return items
}

test('30 sandboxes created at once all run a first command, are killed and leave nothing', async () => {
  // Start from the warm pool alone: the readiness probe's sandbox is gone and the pool full
  // when the host state holds still for a second.
  let last = JSON.stringify(counts(hostState()))
  await poll(async () => {
    await sleep(1000)
    const now = JSON.stringify(counts(hostState()))
    const still = now === last
    last = now
    return still
  }, 60_000, 0)
  const baseline = hostState()
  // The checks below see this server's sandboxes at all: its warm pool is there.
  assert.ok(baseline.processes.length >= 2 && baseline.cgroups.length >= 2, JSON.stringify(counts(baseline)))
  const md = { ...SUITE_METADATA, case: 'burst30' }
  const results = await Promise.allSettled(
    Array.from({ length: 30 }, async (_, i) => {
      const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: md, ...opts() })
      try {
        const r = await sbx.commands.run(`echo burst-${i}; id -un`)
        assert.equal(r.stdout, `burst-${i}\nuser\n`)
      } finally {
        await sbx.kill()
      }
    }),
  )
  const errors = results.filter((r) => r.status === 'rejected').map((r) => String(r.reason?.stack ?? r.reason))
  assert.deepEqual(errors, [], `${errors.length}/30 failed`)
  assert.deepEqual(await listTagged(md), [], 'killed sandboxes still listed')
  const settled = await poll(() => notAbove(baseline, hostState()), 90_000, 500)
  assert.ok(
    settled,
    `host resources did not return to the pre-burst level:\nbefore ${JSON.stringify(counts(baseline))}\nafter ${JSON.stringify(hostState(), null, 1).slice(0, 3000)}`,
  )
})

test("creates beyond the admission limit get E2B's 429 (RateLimitError) and nothing half-made", async () => {
  const md = { ...SUITE_METADATA, case: 'over-limit' }
  const n = 3 * (MAX_CONCURRENT + MAX_QUEUED)
  const results = await Promise.allSettled(
    Array.from({ length: n }, () => Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: md, ...opts() })),
  )
  const made = results.filter((r) => r.status === 'fulfilled').map((r) => r.value)
  const refused = results.filter((r) => r.status === 'rejected').map((r) => r.reason)
  try {
    for (const e of refused) {
      assert.ok(e instanceof RateLimitError, `expected RateLimitError, got ${e?.name}: ${e?.message}`)
      assert.match(e.message, /Too many sandbox creates at once/)
    }
    assert.ok(refused.length > 0, `all ${n} creates were admitted`)
    assert.ok(made.length >= MAX_CONCURRENT + MAX_QUEUED, `only ${made.length} of ${n} admitted`)
    // What the server recorded is exactly what the SDK got: no half-made sandboxes.
    const listed = new Set((await listTagged(md)).map((s) => s.sandboxId))
    assert.deepEqual(listed, new Set(made.map((s) => s.sandboxId)))
    const r = await made[0].commands.run('echo still fine')
    assert.equal(r.stdout, 'still fine\n')
  } finally {
    await Promise.allSettled(made.map((s) => s.kill()))
  }
})
