// Shared setup for the JS conformance tests (npm `e2b`, run with `node --test`).
//
// With BULKHEAD_TEST_URL + BULKHEAD_TEST_API_KEY set (scripts/test.sh and run.mjs do that),
// the tests use that server. Otherwise each test file starts its own `bulkhead serve` (binary
// from BULKHEAD_BIN, default target/debug/bulkhead) on a free port with a temp data dir.
// The SDK is pointed at the server only through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY.

import { spawn, spawnSync } from 'node:child_process'
import { test } from 'node:test'
import { randomBytes } from 'node:crypto'
import { chmodSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, existsSync } from 'node:fs'
import net from 'node:net'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..')
export const TEMPLATE = process.env.BULKHEAD_TEST_TEMPLATE ?? 'base'
export const RUN_ID = randomBytes(4).toString('hex')
export const SUITE_METADATA = { 'bulkhead-test': RUN_ID, sdk: 'js' }
// The `--sandbox-domain` of the servers the tests start (`.test`: reserved, never resolves);
// an external server's comes from BULKHEAD_TEST_SANDBOX_DOMAIN.
export const TEST_SANDBOX_DOMAIN = 'sandboxes.bulkhead.test'

export { sleep }

export function generateApiKey() {
  return 'e2b_' + randomBytes(20).toString('hex')
}

async function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer()
    s.unref()
    s.on('error', reject)
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address()
      s.close(() => resolve(port))
    })
  })
}

/** fetch that never throws on HTTP status; returns {status, headers, body (Buffer)} */
export async function http(method, url, { body, headers } = {}) {
  const init = { method, headers: { ...(headers ?? {}) } }
  if (body !== undefined) {
    if (typeof body === 'string' || body instanceof Uint8Array) init.body = body
    else {
      init.body = JSON.stringify(body)
      init.headers['Content-Type'] = 'application/json'
    }
  }
  const res = await fetch(url, init)
  const buf = Buffer.from(await res.arrayBuffer())
  return { status: res.status, headers: res.headers, body: buf, text: () => buf.toString(), json: () => JSON.parse(buf.toString() || 'null') }
}

async function waitReady(srv, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  let last = 'no answer'
  for (;;) {
    if (srv.proc && srv.proc.exitCode !== null) {
      throw new Error(`bulkhead serve exited with ${srv.proc.exitCode} during startup:\n${srv.logTail(80)}`)
    }
    try {
      const r = await http('GET', srv.url + '/health')
      if (r.status === 204) break
      last = `/health answered ${r.status}`
    } catch (e) {
      last = String(e)
    }
    if (Date.now() > deadline) throw new Error(`server ${srv.url} not healthy after ${timeoutMs} ms (${last})\n${srv.logTail(80)}`)
    await sleep(250)
  }
  for (;;) {
    const r = await http('POST', srv.url + '/v2/sandboxes', {
      body: { templateID: TEMPLATE, timeout: 60, metadata: { 'bulkhead-test': 'warmup' } },
      headers: { 'X-API-Key': srv.apiKey },
    })
    if (r.status === 201) {
      await http('DELETE', `${srv.url}/sandboxes/${r.json().sandboxID}`, { headers: { 'X-API-Key': srv.apiKey } })
      return
    }
    if (Date.now() > deadline || [400, 401, 404].includes(r.status)) {
      throw new Error(`server ${srv.url} cannot create a '${TEMPLATE}' sandbox: ${r.status} ${r.text().slice(0, 500)}\n${srv.logTail(80)}`)
    }
    await sleep(1000)
  }
}

/** Start a `bulkhead serve` for this process, with `extraArgs` after the usual flags. */
export async function startServer(extraArgs = []) {
  const bin = process.env.BULKHEAD_BIN ? path.resolve(REPO, process.env.BULKHEAD_BIN) : path.join(REPO, 'target/debug/bulkhead')
  if (!existsSync(bin)) throw new Error(`bulkhead binary not found at ${bin}: run \`cargo build --workspace\` or set BULKHEAD_BIN`)
  const imageCache = process.env.BULKHEAD_IMAGE_CACHE ?? '/var/cache/bulkhead/images'
  mkdirSync(imageCache, { recursive: true })
  const tmpRoot = mkdtempSync(path.join(process.env.BULKHEAD_TEST_TMPDIR ?? '/var/tmp', 'bulkhead-jstest-'))
  // Sandbox uids must traverse to their slot dirs (the jail refuses a 0700 ancestor).
  chmodSync(tmpRoot, 0o711)
  const dataDir = path.join(tmpRoot, 'data')
  mkdirSync(dataDir)
  const logPath = path.join(tmpRoot, 'server.log')
  const port = await freePort()
  const apiKey = generateApiKey()
  const logFd = openSync(logPath, 'a')
  const env = { ...process.env, BULKHEAD_API_KEY: apiKey }
  delete env.BULKHEAD_DATA_DIR
  delete env.BULKHEAD_DATABASE_URL
  delete env.BULKHEAD_LISTEN
  const proc = spawn(
    bin,
    ['serve', '--listen', `127.0.0.1:${port}`, '--data-dir', dataDir, '--image-cache', imageCache, '--log-level', process.env.BULKHEAD_TEST_LOG_LEVEL ?? 'info', ...(extraArgs.some((a) => a.startsWith('--sandbox-domain')) ? [] : ['--sandbox-domain', TEST_SANDBOX_DOMAIN]), ...extraArgs],
    { env, stdio: ['ignore', logFd, logFd], cwd: '/' },
  )
  const srv = {
    pid: proc.pid,
    url: `http://127.0.0.1:${port}`,
    apiKey,
    dataDir,
    tmpRoot,
    logPath,
    proc,
    sandboxDomain: TEST_SANDBOX_DOMAIN,
    owned: true,
    logTail(n = 200) {
      try {
        const lines = readFileSync(logPath, 'utf8').split('\n')
        return lines.slice(-n).join('\n')
      } catch {
        return ''
      }
    },
    async stop() {
      if (proc.exitCode === null) {
        proc.kill('SIGTERM')
        // An unref'd timer: a referenced one would hold the process open for the full minute.
        const exited = await Promise.race([new Promise((r) => proc.once('exit', () => r(true))), sleep(60000, false, { ref: false })])
        if (!exited) proc.kill('SIGKILL')
      }
    },
  }
  process.on('exit', () => {
    if (proc.exitCode === null) proc.kill('SIGTERM')
  })
  await waitReady(srv, Number(process.env.BULKHEAD_STARTUP_TIMEOUT ?? 1200) * 1000)
  return srv
}

let current
/** The server for this test file: external (BULKHEAD_TEST_URL) or started here. With
 * `ownServerArgs`, always one started here with those flags (e.g. a registry mirror). */
export async function setup({ ownServerArgs } = {}) {
  if (current) return current
  if (ownServerArgs) {
    current = await startServer(ownServerArgs)
  } else if (process.env.BULKHEAD_TEST_URL) {
    const apiKey = process.env.BULKHEAD_TEST_API_KEY ?? process.env.E2B_API_KEY
    if (!apiKey) throw new Error('BULKHEAD_TEST_URL is set but BULKHEAD_TEST_API_KEY is not')
    current = {
      url: process.env.BULKHEAD_TEST_URL.replace(/\/$/, ''),
      apiKey,
      dataDir: process.env.BULKHEAD_TEST_DATA_DIR,
      sandboxDomain: process.env.BULKHEAD_TEST_SANDBOX_DOMAIN,
      owned: false,
      logTail: () => '',
      stop: async () => {},
    }
    await waitReady(current, 120000)
  } else {
    current = await startServer()
  }
  process.env.E2B_API_URL = current.url
  process.env.E2B_SANDBOX_URL = current.url
  process.env.E2B_API_KEY = current.apiKey
  delete process.env.E2B_DOMAIN
  delete process.env.E2B_DEBUG
  return current
}

const tracked = []
/** Remember a sandbox so teardown() kills it. */
export function track(sbx) {
  tracked.push(sbx)
  return sbx
}

let failed = false
/** A `test()` maker with a per-file default timeout; a failing test makes teardown() print the
 * server log tail and keep the data dir. */
export function tester(defaultTimeout = 120_000) {
  return (name, fn, timeout = defaultTimeout) =>
    test(name, { timeout }, async (ctx) => {
      try {
        await fn(ctx)
      } catch (e) {
        failed = true
        throw e
      }
    })
}

export async function teardown() {
  for (const s of tracked.splice(0)) {
    try {
      await s.kill()
    } catch {}
  }
  if (current?.owned) {
    await current.stop()
    if (failed || process.env.BULKHEAD_KEEP_DATA) {
      console.error(`bulkhead server log tail:\n${current.logTail(150)}\n(data kept at ${current.tmpRoot})`)
    } else {
      removeTree(current.tmpRoot)
    }
  }
  current = undefined
}

function mountsUnder(root) {
  const prefix = root.replace(/\/$/, '') + '/'
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => l.split(' ')[4].replace(/\\([0-7]{3})/g, (_, o) => String.fromCharCode(parseInt(o, 8))))
    .filter((mp) => mp === root || mp.startsWith(prefix))
}

/** rm -rf that never walks into a mount (the server's idmapped lower layers live in the data dir). */
export function removeTree(root) {
  for (const mp of mountsUnder(root).sort((a, b) => b.length - a.length)) {
    spawnSync('umount', ['-l', mp], { stdio: 'ignore' })
  }
  if (mountsUnder(root).length === 0) {
    try {
      rmSync(root, { recursive: true, force: true })
    } catch {}
  }
}

/** Poll `fn` until it returns a truthy value or the time is up; returns the last value. */
export async function poll(fn, timeoutMs, intervalMs = 200) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await fn()
    if (v || Date.now() > deadline) return v
    await sleep(intervalMs)
  }
}

/** A logger for the SDK's `logger` option that records "Request METHOD URL" lines. */
export function recordingLogger() {
  const requests = []
  return {
    requests,
    logger: {
      info: (...args) => {
        const m = args.join(' ').split(/\s+/)
        if (m[0] === 'Request' && m.length >= 3) requests.push([m[1].toUpperCase(), new URL(m[2]).pathname])
      },
      error: () => {},
      warn: () => {},
      debug: () => {},
    },
  }
}

export const enc = new TextEncoder()
export const dec = new TextDecoder()
