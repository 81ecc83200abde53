// sandbox.commands through the npm `e2b` SDK.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { Sandbox, CommandExitError, TimeoutError, NotFoundError } from 'e2b'
import { setup, teardown, tester, track, poll, sleep, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

let sbx
before(async () => {
  await setup()
  sbx = track(await Sandbox.create(TEMPLATE, { timeoutMs: 600_000, metadata: SUITE_METADATA }))
})
after(async () => {
  await teardown()
})

const t = tester()

const psArgs = async () => (await sbx.commands.run('ps -eo args', { user: 'root' })).stdout
const pids = async () => new Set((await sbx.commands.list()).map((p) => p.pid))

t('foreground stdout, stderr, exit code, callbacks', async () => {
  const out = []
  const err = []
  const r = await sbx.commands.run("echo out; echo err >&2; printf 'tail'", { onStdout: (d) => out.push(d), onStderr: (d) => err.push(d) })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'out\ntail')
  assert.equal(r.stderr, 'err\n')
  assert.equal(out.join(''), r.stdout)
  assert.equal(err.join(''), r.stderr)
})

t('non-zero exit rejects with CommandExitError', async () => {
  await assert.rejects(sbx.commands.run('echo partial; echo boom >&2; exit 7'), (e) => {
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, 7)
    assert.equal(e.stderr, 'boom\n')
    assert.equal(e.stdout, 'partial\n')
    return true
  })
})

t('large output', async () => {
  const r = await sbx.commands.run("head -c 3000000 /dev/zero | tr '\\0' 'b'")
  assert.equal(r.stdout.length, 3_000_000)
})

t('background + wait', async () => {
  const h = await sbx.commands.run('sleep 1; echo done', { background: true })
  assert.ok(h.pid > 0)
  assert.ok((await pids()).has(h.pid))
  const r = await h.wait()
  assert.equal(r.stdout, 'done\n')
  assert.equal(r.exitCode, 0)
  assert.ok(await poll(async () => !(await pids()).has(h.pid), 5_000))
})

t('stdin: send and close', async () => {
  const h = await sbx.commands.run('cat', { background: true, stdin: true })
  await h.sendStdin('hello\n')
  await sbx.commands.sendStdin(h.pid, 'world\n')
  await h.closeStdin()
  const r = await h.wait()
  assert.equal(r.stdout, 'hello\nworld\n')

  const data = randomBytes(128 * 1024)
  const h2 = await sbx.commands.run("sha256sum | cut -d' ' -f1", { background: true, stdin: true })
  for (let i = 0; i < data.length; i += 32 * 1024) await h2.sendStdin(data.subarray(i, i + 32 * 1024))
  await sbx.commands.closeStdin(h2.pid)
  assert.equal((await h2.wait()).stdout.trim(), createHash('sha256').update(data).digest('hex'))

  // Without stdin: true, stdin is closed.
  assert.equal((await sbx.commands.run('cat; echo rc=$?', { timeoutMs: 20_000 })).stdout, 'rc=0\n')
})

t('envs and cwd', async () => {
  assert.equal((await sbx.commands.run('echo "$A|$B"', { envs: { A: '1', B: 'two words' } })).stdout, '1|two words\n')
  assert.equal((await sbx.commands.run('echo "${A:-unset}"')).stdout, 'unset\n')
  assert.equal((await sbx.commands.run('pwd')).stdout, '/home/user\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
})

t('user root vs default user', async () => {
  assert.equal((await sbx.commands.run('whoami; id -u; echo $HOME')).stdout, 'user\n1000\n/home/user\n')
  assert.equal((await sbx.commands.run('whoami; id -u; echo $HOME', { user: 'root' })).stdout, 'root\n0\n/root\n')
  await assert.rejects(sbx.commands.run('touch /root/nope'), CommandExitError)
})

t('timeout kills the command', async () => {
  const t0 = Date.now()
  await assert.rejects(sbx.commands.run('sleep 988', { timeoutMs: 2_000 }), TimeoutError)
  assert.ok(Date.now() - t0 < 10_000)
  assert.ok(await poll(async () => !(await psArgs()).includes('sleep 988'), 8_000, 500), await psArgs())
})

t('kill a background command', async () => {
  const h = await sbx.commands.run('sleep 603', { background: true })
  assert.ok((await psArgs()).includes('sleep 603'))
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), CommandExitError)
  assert.ok(await poll(async () => !(await psArgs()).includes('sleep 603'), 5_000))
  assert.equal(await sbx.commands.kill(h.pid), false)
})

t('list reports running commands', async () => {
  const h = await sbx.commands.run('sleep 303', { background: true, envs: { MARK: 'js' }, cwd: '/tmp' })
  try {
    const p = (await sbx.commands.list()).find((x) => x.pid === h.pid)
    assert.ok(p)
    assert.equal(p.cmd, '/bin/bash')
    assert.equal(p.args[p.args.length - 1], 'sleep 303')
    assert.equal(p.envs.MARK, 'js')
    assert.equal(p.cwd, '/tmp')
  } finally {
    await h.kill()
  }
})

t('reattach with connect', async () => {
  const h = await sbx.commands.run('for i in 1 2 3 4; do echo tick$i; sleep 0.5; done; exit 3', { background: true })
  await h.disconnect()
  assert.ok((await pids()).has(h.pid))
  const h2 = await sbx.commands.connect(h.pid)
  await assert.rejects(h2.wait(), (e) => {
    assert.ok(e instanceof CommandExitError)
    assert.equal(e.exitCode, 3)
    assert.ok(e.stdout.includes('tick4'))
    return true
  })
  await assert.rejects(sbx.commands.connect(999999, { timeoutMs: 10_000 }), NotFoundError)
})

t('late connect gets the retained exit status', async () => {
  const h = await sbx.commands.run('exit 5', { background: true })
  await h.disconnect()
  await sleep(1000)
  const h2 = await sbx.commands.connect(h.pid, { timeoutMs: 10_000 })
  await assert.rejects(h2.wait(), (e) => e instanceof CommandExitError && e.exitCode === 5)
})

t('concurrent commands', async () => {
  const rs = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => sbx.commands.run(`sleep 0.5; echo n${i}`)))
  assert.deepEqual(
    rs.map((r) => r.stdout),
    [0, 1, 2, 3, 4, 5].map((i) => `n${i}\n`),
  )
})
