// A light isolation check through the npm `e2b` SDK (the thorough one is tests/sdk/python/test_isolation.py).
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createServer } from 'node:http'
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { setup, teardown, tester, track, REPO, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

let a
let b
let server
before(async () => {
  server = await setup()
  ;[a, b] = await Promise.all([
    Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: SUITE_METADATA }).then(track),
    Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: SUITE_METADATA }).then(track),
  ])
})
after(async () => {
  await teardown()
})

const t = tester(60_000)

t('host processes and files are invisible', async () => {
  for (const user of ['user', 'root']) {
    const ps = (await a.commands.run('ps -eo args', { user })).stdout
    assert.ok(!ps.includes('bulkhead serve'), ps)
    assert.ok(!ps.includes('node --test'), ps)
    assert.ok(ps.trim().split('\n').length < 40)
    const paths = [REPO, `${REPO}/Cargo.toml`, ...(server.dataDir ? [server.dataDir] : [])]
    const r = await a.commands.run(paths.map((p) => `test -e '${p}' && echo "VISIBLE ${p}"`).join('; ') + '; true', { user })
    assert.equal(r.stdout, '')
  }
})

t('host loopback is unreachable', async () => {
  const srv = createServer((req, res) => res.end('host-says-hello'))
  await new Promise((r) => srv.listen(0, '127.0.0.1', r))
  const port = srv.address().port
  try {
    assert.equal(await (await fetch(`http://127.0.0.1:${port}/`)).text(), 'host-says-hello')
    const t0 = Date.now()
    const r = await a.commands.run(`curl -sSf -m 5 http://127.0.0.1:${port}/; echo " rc=$?"`, { timeoutMs: 30_000 })
    assert.ok(!r.stdout.includes('host-says-hello'))
    assert.ok(!r.stdout.includes(' rc=0'))
    assert.ok(Date.now() - t0 < 10_000)
  } finally {
    srv.close()
  }
})

t('sandbox A cannot see sandbox B', async () => {
  const tag = randomBytes(5).toString('hex')
  await b.files.write(`/home/user/b-${tag}.txt`, 'B')
  const h = await b.commands.run('sleep 4324', { background: true })
  try {
    assert.equal(await a.files.exists(`/home/user/b-${tag}.txt`), false)
    assert.ok(!(await a.commands.run('ps -eo args', { user: 'root' })).stdout.includes('sleep 4324'))
  } finally {
    await h.kill()
  }
})

t('mount, unshare and AF_VSOCK fail', async () => {
  const r = await a.commands.run(
    'mount -t tmpfs none /mnt 2>/dev/null; echo mount=$?; unshare -U true 2>/dev/null; echo unshare=$?; ' +
      "python3 -c 'import socket\ntry:\n socket.socket(40, socket.SOCK_STREAM); print(\"vsock=ok\")\nexcept OSError as e: print(\"vsock=%d\" % e.errno)'",
    { user: 'root' },
  )
  assert.match(r.stdout, /mount=[1-9]/)
  assert.match(r.stdout, /unshare=[1-9]/)
  assert.match(r.stdout, /vsock=1\n/)
})
