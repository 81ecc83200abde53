#!/usr/bin/env node
// Load benchmark: create→interactive latency of sandboxes through the official JS SDK under
// sequential, staggered and burst load, with CPU per create (see docs/bench-load.md).
//
// Each iteration: `Sandbox.create()` (SDK defaults, template from --template), a shell probe
// of ~10 small processes, `node -v`, `run_code("1+1")` for code-interpreter templates, then
// kill. A failed step is recorded and the next one still runs; every sandbox created is killed,
// also on errors and Ctrl-C. Talks only to the server URL given (or the one it starts).
//
//   node bench/bench-load.mjs --bin target/release/bulkhead --template base \
//        --shapes sequential:100,staggered:100@200,burst:100,burst:500
//   node bench/bench-load.mjs --url http://127.0.0.1:3000 --api-key e2b_… --server-pid 1234 \
//        --data-dir /var/lib/bulkhead --template code-interpreter-v1 --shapes staggered:100@200
//
// Needs `npm ci` in tests/sdk/js (and tests/sdk/js-interpreter for code-interpreter templates).

import { spawn } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import { chmodSync, mkdirSync, mkdtempSync, openSync, readFileSync, realpathSync, rmSync } from 'node:fs'
import { createRequire } from 'node:module'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { parseArgs } from 'node:util'

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const USAGE = `usage: bench-load.mjs [--url URL --api-key KEY [--server-pid PID] [--data-dir DIR]]
                     [--bin BULKHEAD [--serve-arg ARG]...] [--template T] [--shapes LIST]
  --shapes   comma-separated: sequential:N, staggered:N@MS, burst:N (default sequential:100,staggered:100@200,burst:100)
  --bin      start this bulkhead binary on a free loopback port with a temp data dir (default when no --url)
  --serve-arg extra argument for \`bulkhead serve\` (repeatable), e.g. --serve-arg=--pool=base=4..128
  --warmup   sequential iterations run first and not counted (default 5)
  --probe    the first command instead of the ~10-process shell probe (e.g. 'echo hi')
  --no-node  leave out the \`node -v\` step
  --settle   ms to wait between shapes (pools refill, kills settle; default 5000)
  --floor    also run every shape against bench/bench-sdk-floor.mjs, a server that answers at once
             and does no sandbox work: the SDK's and Node's own share of each figure on this machine
  --json     also print the results as one JSON line`

const { values: opt } = parseArgs({
  options: {
    url: { type: 'string' },
    'api-key': { type: 'string' },
    'server-pid': { type: 'string' },
    'data-dir': { type: 'string' },
    bin: { type: 'string' },
    'serve-arg': { type: 'string', multiple: true, default: [] },
    template: { type: 'string', default: 'base' },
    shapes: { type: 'string', default: 'sequential:100,staggered:100@200,burst:100' },
    warmup: { type: 'string', default: '5' },
    probe: { type: 'string' },
    settle: { type: 'string', default: '5000' },
    'no-node': { type: 'boolean', default: false },
    floor: { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
    help: { type: 'boolean', default: false },
  },
})
if (opt.help) {
  console.log(USAGE)
  process.exit(0)
}

const TEMPLATE = opt.template
const INTERPRETER = TEMPLATE.startsWith('code-interpreter')
const PROBE =
  opt.probe ?? 'uname -a; id; nproc; cat /etc/os-release; ls /; df -h /; free -m; ps aux | head -3; date; pwd'
const RUN_ID = randomBytes(4).toString('hex')
const METADATA = { 'bulkhead-bench': RUN_ID }

function parseShapes(s) {
  return s.split(',').map((part) => {
    const m = /^(sequential|staggered|burst):(\d+)(?:@(\d+))?$/.exec(part.trim())
    if (!m || (m[1] === 'staggered') !== (m[3] !== undefined)) {
      throw new Error(`bad shape '${part}': use sequential:N, staggered:N@MS or burst:N`)
    }
    return { kind: m[1], n: Number(m[2]), intervalMs: m[3] === undefined ? 0 : Number(m[3]) }
  })
}

function loadSdk() {
  const dir = INTERPRETER ? 'tests/sdk/js-interpreter' : 'tests/sdk/js'
  const pkg = INTERPRETER ? '@e2b/code-interpreter' : 'e2b'
  try {
    return createRequire(path.join(REPO, dir, 'package.json'))(pkg)
  } catch (e) {
    throw new Error(`cannot load the SDK '${pkg}' from ${dir}: run \`npm ci\` there (${e.message})`)
  }
}

// ---- the server: given, or started here ----

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.on('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => resolve(port))
    })
  })
}

async function startServer() {
  const bin = path.resolve(opt.bin ?? path.join(REPO, 'target/release/bulkhead'))
  const tmpRoot = mkdtempSync('/var/tmp/bulkhead-bench-load-')
  chmodSync(tmpRoot, 0o711) // sandbox uids traverse to their slot dirs
  const dataDir = path.join(tmpRoot, 'data')
  mkdirSync(dataDir)
  const port = await freePort()
  const apiKey = 'e2b_' + randomBytes(20).toString('hex')
  const log = openSync(path.join(tmpRoot, 'server.log'), 'a')
  const templates = INTERPRETER ? `base,${TEMPLATE}` : TEMPLATE
  const args = ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', dataDir, '--templates', templates, ...opt['serve-arg']]
  const proc = spawn(bin, args, {
    env: { ...process.env, BULKHEAD_API_KEY: apiKey, BULKHEAD_IMAGE_CACHE: process.env.BULKHEAD_IMAGE_CACHE ?? '/var/cache/bulkhead/images' },
    stdio: ['ignore', log, log],
    cwd: '/',
  })
  const url = `http://127.0.0.1:${port}`
  const deadline = Date.now() + 1_200_000
  for (;;) {
    if (proc.exitCode !== null) throw new Error(`bulkhead serve exited with ${proc.exitCode}; log: ${tmpRoot}/server.log`)
    try {
      if ((await fetch(url + '/health')).status === 204) break
    } catch {}
    if (Date.now() > deadline) throw new Error(`server not healthy; log: ${tmpRoot}/server.log`)
    await sleep(250)
  }
  return {
    url,
    apiKey,
    pid: proc.pid,
    dataDir,
    log: path.join(tmpRoot, 'server.log'),
    async stop() {
      if (proc.exitCode === null) {
        proc.kill('SIGTERM')
        await Promise.race([new Promise((r) => proc.once('exit', r)), sleep(60_000, null, { ref: false })])
        if (proc.exitCode === null) proc.kill('SIGKILL')
      }
      rmTree(tmpRoot)
    },
  }
}

// The client floor (bench/bench-sdk-floor.mjs) in its own process, so its CPU is not the load
// generator's.
async function startFloor() {
  const port = await freePort()
  const proc = spawn(process.execPath, [path.join(REPO, 'bench/bench-sdk-floor.mjs'), String(port)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  await new Promise((resolve, reject) => {
    proc.once('exit', (c) => reject(new Error(`the floor server exited with ${c}`)))
    proc.stdout.once('data', resolve)
  })
  return {
    url: `http://127.0.0.1:${port}`,
    apiKey: 'e2b_floor',
    pid: proc.pid,
    async stop() {
      proc.kill('SIGTERM')
    },
  }
}

function pointSdkAt(server) {
  process.env.E2B_API_URL = server.url
  process.env.E2B_SANDBOX_URL = server.url
  process.env.E2B_API_KEY = server.apiKey
}

function rmTree(root) {
  // The server's idmapped lower layers are mounted under the data dir: unmount, never walk in.
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split(' ')[4])
    .filter((mp) => mp.startsWith(root + '/'))
    .sort((a, b) => b.length - a.length)
  for (const mp of mounts) spawn('umount', ['-l', mp], { stdio: 'ignore' })
  if (mounts.length === 0) rmSync(root, { recursive: true, force: true })
}

// ---- CPU accounting ----

const HZ = 100 // USER_HZ on Linux
function systemBusyMs() {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
  // user nice system idle iowait irq softirq steal
  const busy = f[0] + f[1] + f[2] + f[5] + f[6] + (f[7] ?? 0)
  return (busy * 1000) / HZ
}
function procCpuMs(pid) {
  if (!pid) return { self: 0, children: 0 }
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8')
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ').map(Number)
    // fields 14-17 (utime stime cutime cstime) are indices 11-14 after the comm
    return { self: ((f[11] + f[12]) * 1000) / HZ, children: ((f[13] + f[14]) * 1000) / HZ }
  } catch {
    return { self: 0, children: 0 }
  }
}
// The server's sandboxes live under cgroup `bulkhead/<sha256(canonical data dir)[..8]>`; the
// parent's counter keeps the usage of removed (killed) sandboxes' cgroups.
function cgroupParent(dataDir) {
  if (!dataDir) return null
  let canonical = dataDir
  try {
    canonical = realpathSync(dataDir)
  } catch {}
  const rel = `bulkhead/${createHash('sha256').update(canonical).digest('hex').slice(0, 8)}`
  return [`/sys/fs/cgroup/cpuacct/${rel}/cpuacct.usage`, `/sys/fs/cgroup/cpu,cpuacct/${rel}/cpuacct.usage`, `/sys/fs/cgroup/${rel}/cpu.stat`]
}
function cgroupCpuMs(files) {
  for (const f of files ?? []) {
    try {
      const t = readFileSync(f, 'utf8')
      if (f.endsWith('cpuacct.usage')) return Number(t.trim()) / 1e6
      const m = /^usage_usec (\d+)/m.exec(t)
      if (m) return Number(m[1]) / 1e3
    } catch {}
  }
  return 0
}
function cpuSnapshot(server) {
  const u = process.cpuUsage()
  return {
    busy: systemBusyMs(),
    server: procCpuMs(server.pid),
    sandboxes: cgroupCpuMs(server.cgroup),
    loadgen: (u.user + u.system) / 1000,
  }
}
function cpuDelta(a, b, creates) {
  const d = {
    busy: b.busy - a.busy,
    server: b.server.self - a.server.self,
    serverChildren: b.server.children - a.server.children,
    sandboxes: b.sandboxes - a.sandboxes,
    loadgen: b.loadgen - a.loadgen,
  }
  // The server is the sandboxes' subreaper: its reaped-children time holds the launchers and,
  // for every sandbox killed in the window, that sandbox's whole-life CPU, which the cgroup
  // column already counts. So it is shown apart and not subtracted: `other` is the launchers,
  // kernel work outside the sandboxes, and every other process on the machine.
  d.other = d.busy - d.server - d.sandboxes - d.loadgen
  const per = {}
  for (const [k, v] of Object.entries(d)) per[k] = creates ? v / creates : 0
  return per
}

// ---- one iteration ----

const live = new Set()

async function iteration(Sandbox) {
  const steps = {}
  const errors = []
  const t0 = performance.now()
  const time = async (name, fn) => {
    const s = performance.now()
    try {
      await fn()
      steps[name] = performance.now() - s
      return true
    } catch (e) {
      errors.push(`${name}: ${String(e?.message ?? e).split('\n')[0].slice(0, 160)}`)
      return false
    }
  }
  let sbx
  const created = await time('create', async () => {
    sbx = await Sandbox.create(TEMPLATE, { metadata: METADATA })
    live.add(sbx)
  })
  if (created) {
    if (
      await time('probe', async () => {
        const r = await sbx.commands.run(PROBE)
        if (opt.probe === undefined && !r.stdout.includes('Linux')) throw new Error('probe printed no uname')
      })
    ) {
      steps['first cmd'] = performance.now() - t0
    }
    if (!opt['no-node']) {
      await time('node -v', async () => {
        const r = await sbx.commands.run('node -v')
        if (!/^v\d+/.test(r.stdout)) throw new Error(`node -v printed ${JSON.stringify(r.stdout)}`)
      })
    }
    if (INTERPRETER) {
      await time('run_code', async () => {
        const ex = await sbx.runCode('1+1')
        if (ex.error || ex.text !== '2') throw new Error(`run_code gave ${JSON.stringify(ex.error ?? ex.text)}`)
      })
    }
  }
  const total = performance.now() - t0
  if (sbx) {
    await time('kill', async () => {
      await sbx.kill()
      live.delete(sbx)
    })
  }
  return { ok: errors.length === 0, total, steps, errors }
}

async function killAll(Sandbox, apiOpts) {
  await Promise.allSettled([...live].map((s) => s.kill().then(() => live.delete(s))))
  // Creates the client gave up on may still have completed on the server: find them by tag.
  try {
    const pager = Sandbox.list({ query: { metadata: METADATA }, limit: 100, ...apiOpts })
    while (pager.hasNext) {
      const items = await pager.nextItems()
      await Promise.allSettled(items.map((i) => Sandbox.kill(i.sandboxId, apiOpts)))
    }
  } catch (e) {
    console.error(`warning: listing leftover bench sandboxes failed: ${e.message}`)
  }
}

// ---- shapes ----

async function runShape(Sandbox, shape, server) {
  const before = cpuSnapshot(server)
  const t0 = performance.now()
  let results
  if (shape.kind === 'sequential') {
    results = []
    for (let i = 0; i < shape.n; i++) results.push(await iteration(Sandbox))
  } else {
    const runs = []
    for (let i = 0; i < shape.n; i++) {
      runs.push(iteration(Sandbox))
      if (shape.kind === 'staggered' && i < shape.n - 1) await sleep(shape.intervalMs)
    }
    results = await Promise.all(runs)
  }
  const wall = performance.now() - t0
  const cpu = cpuDelta(before, cpuSnapshot(server), results.filter((r) => r.steps.create !== undefined).length)
  return { shape, results, wall, cpu }
}

function pct(sorted, p) {
  if (sorted.length === 0) return NaN
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]
}
function stats(values) {
  const s = [...values].sort((a, b) => a - b)
  return { n: s.length, p50: pct(s, 50), p95: pct(s, 95), p99: pct(s, 99) }
}
const ms = (v) => (Number.isNaN(v) ? '    -' : v.toFixed(0).padStart(5))
// What the p50 ratio compares: whole iterations when any succeeded, else create→first command
// (e.g. `node -v` failing on a template without Node.js).
function idleBasis(run, what) {
  const ok = run.results.filter((x) => x.ok)
  if (what === 'total' || (what === undefined && ok.length > 0)) return { what: 'total', ...stats(ok.map((x) => x.total)) }
  return { what: 'first cmd', ...stats(run.results.map((x) => x.steps['first cmd']).filter((v) => v !== undefined)) }
}
function label(shape) {
  return shape.kind === 'staggered' ? `staggered ${shape.n} @${shape.intervalMs}ms` : `${shape.kind} ${shape.n}`
}

function report(runs, idle) {
  const out = []
  for (const r of runs) {
    const ok = r.results.filter((x) => x.ok)
    const total = stats(ok.map((x) => x.total))
    const ratio = idle ? `${(idleBasis(r, idle.what).p50 / idle.p50).toFixed(2)}× (${idle.what})` : '-'
    out.push(`\n== ${TEMPLATE}: ${label(r.shape)} — ${ok.length}/${r.results.length} OK, wall ${(r.wall / 1000).toFixed(1)} s, p50/idle p50 ${ratio}`)
    out.push('  step          n    p50    p95    p99  (ms; successful steps)')
    const names = [...new Set(r.results.flatMap((x) => Object.keys(x.steps)))].sort((a, b) => (a === 'first cmd' ? -1 : b === 'first cmd' ? 1 : 0))
    const line = (name, st) => `  ${name.padEnd(10)} ${String(st.n).padStart(4)}  ${ms(st.p50)}  ${ms(st.p95)}  ${ms(st.p99)}`
    out.push(line('total', total) + '  (create→last step, iterations with every step OK)')
    out.push('  (first cmd = create→probe done, for every iteration whose create and probe succeeded)')
    for (const n of names) out.push(line(n, stats(r.results.map((x) => x.steps[n]).filter((v) => v !== undefined))))
    const c = r.cpu
    out.push(
      `  CPU per create: ${c.busy.toFixed(1)} ms system-wide busy = server ${c.server.toFixed(1)} + sandbox cgroups ${c.sandboxes.toFixed(1)}` +
        ` + load generator ${c.loadgen.toFixed(1)} + other ${c.other.toFixed(1)} (launchers, kernel, other processes;` +
        ` server's reaped children ${c.serverChildren.toFixed(1)}, incl. killed sandboxes' lifetime CPU)`,
    )
    const errs = new Map()
    for (const x of r.results) for (const e of x.errors) errs.set(e, (errs.get(e) ?? 0) + 1)
    for (const [e, n] of [...errs].sort((a, b) => b[1] - a[1]).slice(0, 8)) out.push(`  error ×${n}: ${e}`)
  }
  return out.join('\n')
}

// Every shape against the floor server. Run before the real shapes, while the real server is idle
// with full pools, so that neither run's after-effects (refills, kills) load the other.
async function runFloor(Sandbox, shapes, server) {
  const floor = await startFloor()
  const floorRuns = []
  try {
    pointSdkAt(floor)
    for (let i = 0; i < Number(opt.warmup); i++) await iteration(Sandbox)
    for (const shape of shapes) {
      await sleep(1000)
      floorRuns.push(await runShape(Sandbox, shape, floor))
    }
  } finally {
    pointSdkAt(server)
    await floor.stop()
  }
  return floorRuns
}

function reportFloor(floorRuns, runs) {
  const out = ['\n== client floor: the same shapes against a server that answers at once (bench/bench-sdk-floor.mjs)']
  out.push('  shape                     OK    p50    p95    p99  load generator CPU/iteration   real p50   real − floor')
  for (const f of floorRuns) {
    const st = stats(f.results.filter((x) => x.ok).map((x) => x.total))
    const real = runs.find((r) => r.shape === f.shape)
    const rp50 = real ? stats(real.results.filter((x) => x.ok).map((x) => x.total)).p50 : NaN
    out.push(
      `  ${label(f.shape).padEnd(24)} ${String(st.n).padStart(3)}  ${ms(st.p50)}  ${ms(st.p95)}  ${ms(st.p99)}  ${f.cpu.loadgen.toFixed(1).padStart(8)} ms` +
        `                  ${ms(rp50)}  ${ms(rp50 - st.p50)}`,
    )
  }
  return out.join('\n')
}

async function main() {
  const shapes = parseShapes(opt.shapes)
  const sdk = loadSdk()
  const Sandbox = sdk.Sandbox
  let server
  if (opt.url) {
    const u = new URL(opt.url)
    if (!['127.0.0.1', 'localhost', '::1', '[::1]'].includes(u.hostname)) {
      throw new Error(`--url must be a loopback address (got ${u.hostname}): the bench loads this machine only`)
    }
    const apiKey = opt['api-key'] ?? process.env.E2B_API_KEY
    if (!apiKey) throw new Error('--url needs --api-key (or E2B_API_KEY)')
    server = { url: opt.url.replace(/\/$/, ''), apiKey, pid: Number(opt['server-pid']) || 0, dataDir: opt['data-dir'], stop: async () => {} }
  } else {
    server = await startServer()
  }
  server.cgroup = cgroupParent(server.dataDir)
  pointSdkAt(server)
  delete process.env.E2B_DOMAIN
  const apiOpts = { apiKey: server.apiKey }

  let stopping = false
  const stop = async (code) => {
    if (stopping) return
    stopping = true
    await killAll(Sandbox, apiOpts)
    await server.stop()
    process.exit(code)
  }
  process.on('SIGINT', () => stop(130))
  process.on('SIGTERM', () => stop(143))

  try {
    console.log(
      `bench-load: template ${TEMPLATE}, server ${server.url}, ${os.cpus().length} CPUs, loadavg before ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`,
    )
    // Warm-up: first-use costs (SDK module init, HTTP connections, the template's page cache).
    for (let i = 0; i < Number(opt.warmup); i++) await iteration(Sandbox)
    // Let the pools fill (a server started here begins with empty ones) before anything is measured.
    await sleep(Number(opt.settle))
    const floorRuns = opt.floor ? await runFloor(Sandbox, shapes, server) : []
    // The idle baseline, in the same run: a short sequential shape unless one is asked for.
    let idle = null
    const runs = []
    if (shapes[0].kind !== 'sequential') {
      idle = await runShape(Sandbox, { kind: 'sequential', n: 20, intervalMs: 0 }, server)
      runs.push(idle)
    }
    for (const shape of shapes) {
      // Let pools refill and the previous shape's kills settle before the next shape.
      if (runs.length > 0) await sleep(Number(opt.settle))
      const r = await runShape(Sandbox, shape, server)
      runs.push(r)
      if (!idle && shape.kind === 'sequential') idle = r
      console.log(`  done: ${label(shape)} (loadavg ${os.loadavg()[0].toFixed(2)})`)
    }
    const idleBase = idle ? idleBasis(idle) : null
    const idleP50 = idleBase?.p50 ?? null
    console.log(report(runs, idleBase))
    if (opt.floor) console.log(reportFloor(floorRuns, runs))
    console.log(`\nloadavg after ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`)
    if (opt.json) {
      const summary = runs.map((r) => ({
        shape: label(r.shape),
        ok: r.results.filter((x) => x.ok).length,
        n: r.results.length,
        total: stats(r.results.filter((x) => x.ok).map((x) => x.total)),
        cpuPerCreateMs: r.cpu,
      }))
      console.log(JSON.stringify({ template: TEMPLATE, idleP50, runs: summary }))
    }
  } catch (e) {
    console.error(`bench-load: ${e.stack ?? e}`)
    process.exitCode = 1
  } finally {
    await stop(process.exitCode ?? 0)
  }
}

main().catch(async (e) => {
  console.error(`bench-load: ${e.message}`)
  process.exitCode = 1
})
