// sandbox.files through the npm `e2b` SDK, plus uploadUrl/downloadUrl used with plain fetch.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox, FileType, FilesystemEventType, NotFoundError, FileNotFoundError } from 'e2b'
import { setup, teardown, tester, track, sleep, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

let sbx
let server
before(async () => {
  server = await setup()
  sbx = track(await Sandbox.create(TEMPLATE, { timeoutMs: 600_000, metadata: SUITE_METADATA }))
})
after(async () => {
  await teardown()
})

const t = tester()

const sha = (buf) => createHash('sha256').update(buf).digest('hex')
const shaIn = async (path) => (await sbx.commands.run(`sha256sum '${path}' | cut -d' ' -f1`, { timeoutMs: 120_000 })).stdout.trim()

t('write/read text and bytes', async () => {
  const text = 'héllo wörld ✓\n'
  const info = await sbx.files.write('/home/user/js-hello.txt', text)
  assert.equal(info.path, '/home/user/js-hello.txt')
  assert.equal(info.name, 'js-hello.txt')
  assert.equal(await sbx.files.read('/home/user/js-hello.txt'), text)
  assert.equal((await sbx.commands.run('stat -c %U /home/user/js-hello.txt')).stdout, 'user\n')
  const data = new Uint8Array(256 * 8).map((_, i) => i % 256)
  await sbx.files.write('/home/user/js-bin.dat', data)
  const got = await sbx.files.read('/home/user/js-bin.dat', { format: 'bytes' })
  assert.ok(got instanceof Uint8Array)
  assert.deepEqual(Buffer.from(got), Buffer.from(data))
  const blob = await sbx.files.read('/home/user/js-bin.dat', { format: 'blob' })
  assert.equal(blob.size, data.length)
  // Relative paths are against the user's home.
  await sbx.files.write('js-rel/x.txt', 'rel')
  assert.equal((await sbx.commands.run('cat /home/user/js-rel/x.txt')).stdout, 'rel')
  await assert.rejects(sbx.files.read('/home/user/missing.txt'), FileNotFoundError)
})

t('large file (50 MiB) roundtrip with checksum', async () => {
  const data = randomBytes(50 * 1024 * 1024 + 777)
  await sbx.files.write('/home/user/js-large.bin', data, { requestTimeoutMs: 600_000 })
  assert.equal((await sbx.files.getInfo('/home/user/js-large.bin')).size, data.length)
  assert.equal(await shaIn('/home/user/js-large.bin'), sha(data))
  const got = await sbx.files.read('/home/user/js-large.bin', { format: 'bytes', requestTimeoutMs: 600_000 })
  assert.equal(got.length, data.length)
  assert.equal(sha(got), sha(data))
  // Streamed upload (octet-stream) and streamed download.
  await sbx.files.write('/home/user/js-large2.bin', new Blob([data]).stream(), { requestTimeoutMs: 600_000 })
  const stream = await sbx.files.read('/home/user/js-large2.bin', { format: 'stream' })
  const h = createHash('sha256')
  let n = 0
  for await (const chunk of stream) {
    h.update(chunk)
    n += chunk.length
  }
  assert.equal(n, data.length)
  assert.equal(h.digest('hex'), sha(data))
}, 300_000)

t('write many files', async () => {
  const files = Array.from({ length: 40 }, (_, i) => ({ path: `/home/user/js-many/d${i % 4}/f${i}.txt`, data: `c${i}` }))
  const infos = await sbx.files.write(files)
  assert.deepEqual(infos.map((i) => i.path).sort(), files.map((f) => f.path).sort())
  assert.equal((await sbx.commands.run('find /home/user/js-many -type f | wc -l')).stdout.trim(), '40')
  assert.equal(await sbx.files.read('/home/user/js-many/d1/f13.txt'), 'c13')
  const infos2 = await sbx.files.writeFiles([{ path: '/home/user/js-many/extra.txt', data: 'x' }])
  assert.equal(infos2[0].path, '/home/user/js-many/extra.txt')
})

t('list with depth, exists, getInfo', async () => {
  await sbx.commands.run('mkdir -p /home/user/js-tree/a/b/c && echo top > /home/user/js-tree/top.txt && echo d > /home/user/js-tree/a/b/c/d.txt')
  const d1 = await sbx.files.list('/home/user/js-tree')
  assert.deepEqual(new Set(d1.map((e) => e.name)), new Set(['a', 'top.txt']))
  assert.equal(d1.find((e) => e.name === 'a').type, FileType.DIR)
  assert.equal(d1.find((e) => e.name === 'top.txt').type, FileType.FILE)
  const d2 = await sbx.files.list('/home/user/js-tree', { depth: 2 })
  assert.deepEqual(new Set(d2.map((e) => e.path)), new Set(['/home/user/js-tree/a', '/home/user/js-tree/top.txt', '/home/user/js-tree/a/b']))
  await assert.rejects(sbx.files.list('/home/user/js-nope'), NotFoundError)

  assert.equal(await sbx.files.exists('/home/user/js-tree/top.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/js-tree'), true)
  assert.equal(await sbx.files.exists('/home/user/js-tree/zzz'), false)

  const info = await sbx.files.getInfo('/home/user/js-tree/top.txt')
  assert.equal(info.name, 'top.txt')
  assert.equal(info.type, FileType.FILE)
  assert.equal(info.size, 4)
  assert.equal(info.owner, 'user')
  assert.ok(info.modifiedTime instanceof Date && Math.abs(info.modifiedTime - Date.now()) < 120_000)
  assert.equal((await sbx.files.getInfo('/home/user/js-tree/a')).type, FileType.DIR)
})

t('makeDir, rename, remove', async () => {
  assert.equal(await sbx.files.makeDir('/home/user/js-dir/x/y'), true)
  assert.equal(await sbx.files.makeDir('/home/user/js-dir/x/y'), false)
  await sbx.files.write('/home/user/js-dir/old.txt', 'moving')
  const info = await sbx.files.rename('/home/user/js-dir/old.txt', '/home/user/js-dir/new.txt')
  assert.equal(info.path, '/home/user/js-dir/new.txt')
  assert.equal(await sbx.files.exists('/home/user/js-dir/old.txt'), false)
  assert.equal(await sbx.files.read('/home/user/js-dir/new.txt'), 'moving')
  await sbx.files.remove('/home/user/js-dir/new.txt')
  assert.equal(await sbx.files.exists('/home/user/js-dir/new.txt'), false)
  await sbx.files.remove('/home/user/js-dir')
  assert.equal(await sbx.files.exists('/home/user/js-dir'), false)
})

t('watchDir stream (recursive)', async () => {
  await sbx.files.makeDir('/home/user/js-watch')
  const events = []
  const want = [
    [FilesystemEventType.CREATE, 'one.txt'],
    [FilesystemEventType.WRITE, 'one.txt'],
    [FilesystemEventType.CREATE, 'sub/two.txt'],
    [FilesystemEventType.REMOVE, 'one.txt'],
  ]
  const has = () => want.every(([ty, n]) => events.some((e) => e.type === ty && e.name === n))
  const handle = await sbx.files.watchDir('/home/user/js-watch', (e) => events.push(e), { recursive: true, timeoutMs: 60_000 })
  await sbx.files.write('/home/user/js-watch/one.txt', '1')
  await sbx.files.makeDir('/home/user/js-watch/sub')
  await sbx.files.write('/home/user/js-watch/sub/two.txt', '2')
  await sbx.files.remove('/home/user/js-watch/one.txt')
  const deadline = Date.now() + 15_000
  while (!has() && Date.now() < deadline) await sleep(100)
  await handle.stop()
  assert.ok(has(), `events missing; saw ${JSON.stringify(events.map((e) => [e.type, e.name]))}`)
})

t('uploadUrl/downloadUrl with plain fetch', async () => {
  const up = await sbx.uploadUrl('/home/user/js-up/plain.bin')
  const u = new URL(up)
  assert.equal(u.origin, server.url)
  assert.equal(u.pathname, '/files')
  assert.ok(u.searchParams.get('signature').startsWith('v1_'))
  const data = randomBytes(200_000)
  const fd = new FormData()
  fd.append('file', new Blob([data]), 'plain.bin')
  const r = await fetch(up, { method: 'POST', body: fd })
  assert.equal(r.status, 200, await r.clone().text())
  assert.equal((await r.json())[0].path, '/home/user/js-up/plain.bin')
  assert.equal(sha(await sbx.files.read('/home/user/js-up/plain.bin', { format: 'bytes' })), sha(data))

  const down = await sbx.downloadUrl('/home/user/js-up/plain.bin')
  const d = await fetch(down)
  assert.equal(d.status, 200)
  assert.equal(sha(Buffer.from(await d.arrayBuffer())), sha(data))

  const bad = down.replace('signature=v1_', 'signature=v1_x')
  assert.ok([400, 401, 403, 404, 502].includes((await fetch(bad)).status))

  await sbx.files.write('/root/js-root.txt', 'root data', { user: 'root' })
  const rootUrl = await sbx.downloadUrl('/root/js-root.txt', { user: 'root' })
  assert.equal(await (await fetch(rootUrl)).text(), 'root data')

  const exp = await sbx.downloadUrl('/home/user/js-up/plain.bin', { useSignatureExpiration: 2 })
  assert.equal((await fetch(exp)).status, 200)
  await sleep(3500)
  assert.ok([400, 401, 403, 404, 502].includes((await fetch(exp)).status))
})
