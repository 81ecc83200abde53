// `npm test` / `node run.mjs [files…]`: one `bulkhead serve` for all JS test files (unless
// BULKHEAD_TEST_URL is given), then `node --test` over them, one file at a time.
import { spawnSync } from 'node:child_process'
import { readdirSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { removeTree, startServer } from './helpers.mjs'

const here = path.dirname(fileURLToPath(import.meta.url))
const files = process.argv.slice(2).length
  ? process.argv.slice(2)
  : readdirSync(here)
      .filter((f) => f.endsWith('.test.mjs'))
      .sort()
      .map((f) => path.join(here, f))

let srv
const env = { ...process.env }
if (!env.BULKHEAD_TEST_URL) {
  srv = await startServer()
  Object.assign(env, {
    BULKHEAD_TEST_URL: srv.url,
    BULKHEAD_TEST_API_KEY: srv.apiKey,
    BULKHEAD_TEST_DATA_DIR: srv.dataDir,
    BULKHEAD_TEST_SANDBOX_DOMAIN: srv.sandboxDomain,
  })
}
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', ...files], { stdio: 'inherit', env })
if (srv) {
  await srv.stop()
  if (r.status !== 0) console.error(`\n--- bulkhead server log (tail) ---\n${srv.logTail(150)}\n(data kept at ${srv.tmpRoot})`)
  else if (!process.env.BULKHEAD_KEEP_DATA) removeTree(srv.tmpRoot)
}
process.exit(r.status ?? 1)
