// Custom templates through E2B's Template API with the npm `e2b` SDK: a build with a copied
// file, env vars, a workdir and a start command with its ready check, then a sandbox of it.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { randomBytes } from 'node:crypto'
import { Sandbox, Template, waitForPort } from 'e2b'
import { setup, teardown, tester, track, SUITE_METADATA } from './helpers.mjs'

let server
let ctx
before(async () => {
  server = await setup()
  ctx = mkdtempSync(path.join(tmpdir(), 'bulkhead-js-tpl-'))
  writeFileSync(path.join(ctx, 'config.txt'), 'from js\n')
})
after(async () => {
  rmSync(ctx, { recursive: true, force: true })
  await teardown()
})

const t = tester(600_000)

t('Template.build, then Sandbox.create of it', async () => {
  const name = `js-tpl-${randomBytes(4).toString('hex')}`
  const template = Template({ fileContextPath: ctx })
    .fromBaseImage()
    .setWorkdir('/opt/js')
    .copy('config.txt', '/opt/js/config.txt', { mode: 0o600 })
    .setEnvs({ FROM_JS: 'yes' })
    .runCmd('echo "$FROM_JS" > env.txt')
    .setStartCmd('python3 -m http.server 8124', waitForPort(8124))
  const logs = []
  const info = await Template.build(template, name, { onBuildLogs: (l) => logs.push(String(l.message)) })
  assert.ok(info.templateId)
  assert.ok(await Template.exists(name))
  assert.ok(logs.some((l) => l.includes('ready check passed')), logs.join('\n'))

  const sbx = track(await Sandbox.create(name, { timeoutMs: 120_000, metadata: SUITE_METADATA }))
  const r = await sbx.commands.run("stat -c '%a %U' config.txt && cat config.txt env.txt && pwd")
  assert.equal(r.stdout, '600 user\nfrom js\nyes\n/opt/js\n')
  const port = await sbx.commands.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8124/")
  assert.equal(port.stdout, '200')
  await sbx.kill()

  const del = await fetch(`${server.url}/templates/${info.templateId}`, {
    method: 'DELETE',
    headers: { 'X-API-Key': server.apiKey },
  })
  assert.equal(del.status, 204)
  assert.equal(await Template.exists(name), false)
})
