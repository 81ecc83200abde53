// Volumes through the npm `e2b` SDK: the Volume API, the volume content client pointed at
// Bulkhead with E2B_VOLUME_API_URL, and `Sandbox.create({ volumeMounts })` in two sandboxes at
// once. (Restart and size limit: tests/sdk/python/test_volumes.py, which owns its server.)
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox, Volume, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'
import { setup, teardown, tester, track, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

let server
const made = []
before(async () => {
  server = await setup()
  process.env.E2B_VOLUME_API_URL = server.url
})
after(async () => {
  for (const id of made) await Volume.destroy(id).catch(() => {})
  await teardown()
})

const t = tester()
const unique = (p) => `${p}-${randomBytes(3).toString('hex')}`
async function newVolume(prefix) {
  const v = await Volume.create(unique(prefix))
  made.push(v.volumeId)
  return v
}

t('create, list, connect, destroy', async () => {
  const v = await newVolume('js-crud')
  assert.ok(v.volumeId && v.token)
  assert.ok((await Volume.list()).some((x) => x.volumeId === v.volumeId && x.name === v.name))
  const again = await Volume.connect(v.volumeId)
  assert.equal(again.name, v.name)
  await assert.rejects(Volume.create(v.name), /already exists/)
  await assert.rejects(Volume.create('bad name'), /Invalid volume name/)
  assert.equal(await Volume.destroy(v.volumeId), true)
  assert.equal(await Volume.destroy(v.volumeId), false)
  await assert.rejects(Volume.getInfo(v.volumeId), VolumeNotFoundError)
})

t('content operations', async () => {
  const v = await newVolume('js-content')
  const st = await v.writeFile('/dir/hello.txt', 'hello from js', { force: true })
  assert.equal(st.path, '/dir/hello.txt')
  assert.equal(st.size, 13)
  assert.equal(await v.readFile('/dir/hello.txt'), 'hello from js')
  const bytes = await v.readFile('/dir/hello.txt', { format: 'bytes' })
  assert.equal(Buffer.from(bytes).toString(), 'hello from js')
  await v.makeDir('/a/b', { force: true })
  assert.deepEqual((await v.list('/')).map((e) => e.path), ['/a', '/dir'])
  assert.equal((await v.getInfo('/a/b')).type, 'directory')
  assert.equal(await v.exists('/dir/hello.txt'), true)
  assert.equal(await v.exists('/nope'), false)
  assert.equal((await v.updateMetadata('/dir/hello.txt', { mode: 0o600 })).mode, 0o600)
  await v.remove('/dir')
  await assert.rejects(v.readFile('/dir/hello.txt'), VolumePathNotFoundError)
  await assert.rejects(v.readFile('../../etc/passwd'), /Invalid path/)
})

t('two sandboxes share a volume; data outlives them', async () => {
  const v = await newVolume('js-shared')
  const a = track(await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: SUITE_METADATA, volumeMounts: { '/mnt/data': v } }))
  const b = track(await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: SUITE_METADATA, volumeMounts: { '/home/user/vol': v.name } }))
  await a.files.write('/mnt/data/from-a.txt', 'a wrote this')
  assert.equal(await b.files.read('/home/user/vol/from-a.txt'), 'a wrote this')
  await b.commands.run('echo b > /home/user/vol/from-b.txt')
  assert.equal((await a.commands.run('cat /mnt/data/from-b.txt')).stdout, 'b\n')
  assert.equal(await v.readFile('/from-b.txt'), 'b\n')
  await assert.rejects(Volume.destroy(v.volumeId), /mounted/)
  // A symlink planted by one sandbox is never followed out of the volume by the API.
  await a.commands.run('ln -s /etc/passwd /mnt/data/passwd')
  await assert.rejects(v.readFile('/passwd'), /outside the volume/)
  await assert.rejects(
    Sandbox.create(TEMPLATE, { timeoutMs: 60_000, metadata: SUITE_METADATA, volumeMounts: { '/proc/x': v } }),
    /Invalid volume mount/,
  )
  await a.kill()
  await b.kill()
  assert.equal(await v.readFile('/from-a.txt'), 'a wrote this')
  assert.equal(await Volume.destroy(v.volumeId), true)
})
