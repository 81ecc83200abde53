// sandbox.pty through the npm `e2b` SDK: create, input, resize, kill.
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'
import { setup, teardown, tester, track, sleep, enc, dec, TEMPLATE, SUITE_METADATA } from './helpers.mjs'

let sbx
before(async () => {
  await setup()
  sbx = track(await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, metadata: SUITE_METADATA }))
})
after(async () => {
  await teardown()
})

const t = tester(60_000)

function terminal() {
  let out = ''
  return {
    onData: (d) => {
      out += dec.decode(d, { stream: true })
    },
    text: () => out,
    async waitFor(re, timeoutMs = 15_000) {
      const deadline = Date.now() + timeoutMs
      while (Date.now() < deadline) {
        const m = out.match(re)
        if (m) return m
        await sleep(50)
      }
      throw new Error(`PTY output never matched ${re}; got:\n${out.slice(-2000)}`)
    },
  }
}

t('create, input, resize', async () => {
  const term = terminal()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: term.onData })
  assert.ok(h.pid > 0)
  const done = h.wait().then(
    (r) => ({ r }),
    (e) => ({ e }),
  )
  await sbx.pty.sendInput(h.pid, enc.encode('echo $((6*7))-marker\n'))
  await term.waitFor(/42-marker/)
  await sbx.pty.sendInput(h.pid, enc.encode('stty size\n'))
  await term.waitFor(/24 80/)
  await sbx.pty.resize(h.pid, { cols: 132, rows: 40 })
  await sbx.pty.sendInput(h.pid, enc.encode('stty size\n'))
  await term.waitFor(/40 132/)
  await sbx.pty.sendInput(h.pid, enc.encode('test -t 0 && echo is-$((1))-tty\n'))
  await term.waitFor(/is-1-tty/)
  await sbx.pty.sendInput(h.pid, enc.encode('exit 0\n'))
  const res = await done
  assert.equal(res.e, undefined, String(res.e))
  assert.equal(res.r.exitCode, 0)
})

t('user, cwd, envs', async () => {
  const term = terminal()
  const h = await sbx.pty.create({ cols: 100, rows: 30, onData: term.onData, user: 'root', cwd: '/tmp', envs: { PTYVAR: 'xyz' } })
  const done = h.wait().catch((e) => e)
  await sbx.pty.sendInput(h.pid, enc.encode('echo "v=$PTYVAR u=$(whoami) d=$(pwd)"\n'))
  await term.waitFor(/v=xyz u=root d=\/tmp/)
  await sbx.pty.sendInput(h.pid, enc.encode('exit 3\n'))
  const e = await done
  assert.ok(e instanceof CommandExitError)
  assert.equal(e.exitCode, 3)
})

t('kill', async () => {
  const term = terminal()
  const h = await sbx.pty.create({ cols: 80, rows: 24, onData: term.onData })
  const done = h.wait().catch((e) => e)
  await sbx.pty.sendInput(h.pid, enc.encode('echo ready-$((9))\n'))
  await term.waitFor(/ready-9/)
  assert.equal(await sbx.pty.kill(h.pid), true)
  const e = await Promise.race([done, sleep(15_000).then(() => 'hung')])
  assert.notEqual(e, 'hung', 'PTY stream did not end after kill')
  assert.ok(e instanceof CommandExitError)
  assert.equal(await sbx.pty.kill(h.pid), false)
})
