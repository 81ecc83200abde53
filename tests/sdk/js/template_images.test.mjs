// Templates from registry images with the npm `e2b` SDK: `fromImage` and `fromDockerfile` (FROM
// line) against a `docker-registry` on loopback that this file starts (through the shared
// tests/sdk/registrylab.py) and pushes its own images into; its own `bulkhead serve` mirrors
// docker.io to it, so nothing leaves the machine. Plus an unreachable registry failing fast.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import readline from 'node:readline'
import { randomBytes } from 'node:crypto'
import { Sandbox, Template } from 'e2b'
import { REPO, setup, teardown, tester, track, SUITE_METADATA } from './helpers.mjs'

const LAB = path.join(REPO, 'tests/sdk/registrylab.py')
const haveRegistry = existsSync('/usr/bin/docker-registry')

let server, lab, labLines, ctx, port
before(async () => {
  if (!haveRegistry) return
  lab = spawn('python3', [LAB, 'serve'], { stdio: ['pipe', 'pipe', 'inherit'] })
  labLines = readline.createInterface({ input: lab.stdout })[Symbol.asyncIterator]()
  port = JSON.parse((await labLines.next()).value).port
  const closed = String(port + 1 === 65536 ? port - 1 : port + 1)
  server = await setup({
    ownServerArgs: [
      '--registry-mirror', `docker.io=http://127.0.0.1:${port}`,
      '--registry-mirror', `unreachable.invalid=http://127.0.0.1:${closed}`,
      // Loopback registries are the operator's explicit choice: allowed by name, plain HTTP.
      '--registry-allow', 'docker.io,unreachable.invalid,127.0.0.1,localhost',
      '--registry-insecure', '127.0.0.1,localhost',
      '--registry-connect-timeout', '3',
      '--pool-size', '0',
    ],
  })
  ctx = mkdtempSync(path.join(tmpdir(), 'bulkhead-js-img-'))
  writeFileSync(path.join(ctx, 'hello.txt'), 'hello from js\n')
})
after(async () => {
  if (ctx) rmSync(ctx, { recursive: true, force: true })
  await teardown()
  if (lab) {
    lab.stdin.end()
    await new Promise((r) => lab.once('exit', r))
  }
})

/** Pushes the lab's tiny glibc tree (plus `files`) as `reference` with config `env`. */
async function push(reference, { env, files, user, workdir } = {}) {
  lab.stdin.write(JSON.stringify({ push: reference, env, files, user, workdir }) + '\n')
  return JSON.parse((await labLines.next()).value).digest
}

async function remove(id) {
  await fetch(`${server.url}/templates/${id}`, { method: 'DELETE', headers: { 'X-API-Key': server.apiKey } })
}

const t = tester(600_000)
const name = (p) => `${p}-${randomBytes(4).toString('hex')}`

t('fromImage: the image env, E2B user/workdir, runCmd output', async (c) => {
  if (!haveRegistry) return c.skip('docker-registry is not installed')
  await push('bulkhead-test/tiny-js:1', { env: { PATH: '/usr/bin:/bin', IMAGE_VAR: 'js image' }, workdir: '/srv' })
  const tpl = Template()
    .fromImage(`localhost:${port}/bulkhead-test/tiny-js:1`)
    .setEnvs({ SET_VAR: 'js set' })
    .runCmd('echo "$IMAGE_VAR+$SET_VAR" > built.txt && id -un >> built.txt')
  const logs = []
  const alias = name('js-img')
  const info = await Template.build(tpl, alias, { onBuildLogs: (l) => logs.push(String(l.message)) })
  assert.ok(logs.some((l) => l.includes(`localhost:${port}/bulkhead-test/tiny-js:1@sha256:`)), logs.join('\n'))
  const sbx = track(await Sandbox.create(alias, { timeoutMs: 120_000, metadata: SUITE_METADATA }))
  const r = await sbx.commands.run('id -un; pwd; echo $IMAGE_VAR; echo $SET_VAR; cat built.txt')
  assert.equal(r.stdout, 'user\n/home/user\njs image\njs set\njs image+js set\nuser\n')
  await sbx.kill()
  await remove(info.templateId)
})

t('fromDockerfile with FROM, ENV, WORKDIR, COPY and RUN', async (c) => {
  if (!haveRegistry) return c.skip('docker-registry is not installed')
  await push('library/debian:bookworm', { env: { PATH: '/usr/bin:/bin' } })
  const dockerfile = 'FROM debian:bookworm\nENV MODE=js-docker\nWORKDIR /usr/src/app\nCOPY hello.txt ./\nRUN cat hello.txt > copied.txt && id -un > runner.txt\n'
  const info = await Template.build(Template({ fileContextPath: ctx }).fromDockerfile(dockerfile), name('js-df'))
  const sbx = track(await Sandbox.create(info.templateId, { timeoutMs: 120_000, metadata: SUITE_METADATA }))
  const r = await sbx.commands.run('cat /usr/src/app/copied.txt /usr/src/app/runner.txt; echo $MODE; id -un; pwd')
  // The sandbox keeps the Dockerfile's WORKDIR and gets E2B's user (the SDK resets only what
  // the Dockerfile did not set).
  assert.equal(r.stdout, 'hello from js\nroot\njs-docker\nuser\n/usr/src/app\n')
  await sbx.kill()
  await remove(info.templateId)
})

t('an unreachable registry fails the build fast with a clear message', async (c) => {
  if (!haveRegistry) return c.skip('docker-registry is not installed')
  const t0 = Date.now()
  await assert.rejects(
    Template.build(Template().fromImage('unreachable.invalid/app:1').runCmd('true'), name('js-down')),
    (e) => /Could not pull image/.test(String(e.message)) && /--registry-mirror/.test(String(e.message)),
  )
  assert.ok(Date.now() - t0 < 30_000, `took ${Date.now() - t0} ms`)
})
