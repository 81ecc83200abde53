// Issue 9 part 2 through the npm `e2b` SDK, where it maps answers differently from Python: write
// results with metadata, a killed sandbox under a streaming command (JS raises a TimeoutError
// after its health probe), getHost with the server's sandbox domain, the metrics series.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, TimeoutError } from 'e2b'
import { setup, teardown, tester, track, poll, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

let srv
before(async () => {
  srv = await setup()
})
after(async () => {
  await teardown()
})

const t = tester()

const create = (opts = {}) =>
  Sandbox.create(TEMPLATE, { timeoutMs: 180_000, ...opts, metadata: { ...SUITE_METADATA, ...(opts.metadata ?? {}) } }).then(track)

t('write returns the metadata and an overwrite without it clears it', async () => {
  const sbx = await create()
  const info = await sbx.files.write('/home/user/m.txt', 'one', { metadata: { owner: 'alice' } })
  assert.deepEqual(info.metadata, { owner: 'alice' })
  assert.deepEqual((await sbx.files.getInfo('/home/user/m.txt')).metadata, { owner: 'alice' })
  const again = await sbx.files.write('/home/user/m.txt', 'two')
  assert.equal(again.metadata, undefined)
  assert.equal((await sbx.files.getInfo('/home/user/m.txt')).metadata, undefined)
})

t('a command streaming when its sandbox is killed raises end of life', async () => {
  const sbx = await create()
  const killer = setTimeout(() => Sandbox.kill(sbx.sandboxId).catch(() => {}), 2000)
  try {
    await assert.rejects(
      sbx.commands.run('for i in $(seq 1 60); do echo tick $i; sleep 1; done', { timeoutMs: 120_000 }),
      (e) => e instanceof TimeoutError && /killed or reached its end of life/.test(e.message),
    )
  } finally {
    clearTimeout(killer)
  }
})

t('getHost names {port}-{id}.{domain} and the server routes that Host to the port', async () => {
  const sbx = await create()
  assert.equal(sbx.sandboxDomain, srv.sandboxDomain)
  const host = sbx.getHost(8124)
  assert.equal(host, `8124-${sbx.sandboxId}.${srv.sandboxDomain}`)
  await sbx.files.write('/home/user/site/index.html', 'js site')
  await sbx.commands.run('cd /home/user/site && python3 -m http.server 8124 --bind 127.0.0.1', { background: true })
  // Node's fetch refuses to set Host; plain http does.
  const { request } = await import('node:http')
  const port = new URL(srv.url).port
  const get = () =>
    new Promise((resolve) => {
      const req = request({ host: '127.0.0.1', port, path: '/index.html', headers: { Host: host } }, (res) => {
        let body = ''
        res.on('data', (c) => (body += c))
        res.on('end', () => resolve(res.statusCode === 200 ? body : undefined))
      })
      req.on('error', () => resolve(undefined))
      req.end()
    })
  assert.equal(await poll(get, 20_000, 300), 'js site')
})

t('getMetrics returns the 5 s series and honours start/end', async () => {
  const sbx = await create()
  const series = await poll(async () => {
    const m = await sbx.getMetrics()
    return m.length >= 3 ? m : undefined
  }, 30_000, 1000)
  assert.ok(series, 'fewer than 3 samples after 30 s')
  const stamps = series.map((m) => m.timestamp.getTime())
  assert.deepEqual(stamps, [...stamps].sort((a, b) => a - b))
  const early = new Date(stamps[0] - 3600_000)
  assert.deepEqual(await sbx.getMetrics({ start: early, end: new Date(early.getTime() + 60_000) }), [])
  const last = await sbx.getMetrics({ start: new Date(stamps.at(-1) + 1000) })
  assert.ok(last.every((m) => m.timestamp.getTime() >= stamps.at(-1)))
}, 60_000)

t('writes and makeDir create new top-level directories for the default user, as on E2B', async () => {
  const sbx = await create()
  for (const useOctetStream of [true, false]) {
    const top = `/0${useOctetStream ? 'r' : 'm'}`
    const info = await sbx.files.write(`${top}/x.txt`, 'x', { useOctetStream })
    assert.equal(info.path, `${top}/x.txt`)
    assert.equal(await sbx.files.read(`${top}/x.txt`), 'x')
    await sbx.files.write(`${top}deep/a/y.txt`, 'y', { useOctetStream })
    const out = await sbx.commands.run(`stat -c '%U:%G %a %n' ${top} ${top}/x.txt ${top}deep ${top}deep/a`)
    assert.equal(
      out.stdout,
      `user:user 755 ${top}\nuser:user 644 ${top}/x.txt\nuser:user 755 ${top}deep\nuser:user 755 ${top}deep/a\n`,
    )
  }
  assert.equal(await sbx.files.makeDir('/newtop/a/b'), true)
  assert.equal(await sbx.files.makeDir('/newtop/a/b'), false)
  const dirs = await sbx.commands.run("stat -c '%U %n' /newtop /newtop/a /newtop/a/b")
  assert.equal(dirs.stdout, 'user /newtop\nuser /newtop/a\nuser /newtop/a/b\n')
})

t('/proc, /sys, /dev and the agent stay unwritable, through top-level symlinks too', async () => {
  const sbx = await create()
  await sbx.commands.run('ln -s /proc/self /0 && ln -s /dev /1', { user: 'root' })
  for (const useOctetStream of [true, false]) {
    for (const path of ['/proc/x.txt', '/sys/new/x.txt', '/dev/x.txt', '/dev/new/x.txt', '/run/bulkhead/agent', '/0/x.txt', '/0/sub/x.txt', '/1/x.txt']) {
      for (const user of ['user', 'root']) {
        // procfs has no entry to create, so a new name in /proc does not exist (404).
        await assert.rejects(sbx.files.write(path, 'x', { useOctetStream, user }), /permission denied|does not exist/i, `${path} as ${user}`)
      }
    }
  }
  for (const dir of ['/proc/newdir', '/0/newdir', '/dev/newdir', '/sys/newdir']) {
    await assert.rejects(sbx.files.makeDir(dir), /permission denied|does not exist/i, dir)
  }
  const listing = await sbx.commands.run('ls -a /dev /sys', { user: 'root' })
  assert.ok(!/x\.txt|\bnew\b/.test(listing.stdout), listing.stdout)
})
