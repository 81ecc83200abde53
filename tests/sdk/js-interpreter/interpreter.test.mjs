// The code interpreter through the official npm `@e2b/code-interpreter` SDK (representative
// subset of tests/sdk/interpreter): state, streaming callbacks, errors, a chart, DataFrame data,
// contexts, JS/TS/bash/SQL, env vars, timeout with state kept.
import './env.mjs'
import { before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, TimeoutError, NotFoundError } from '@e2b/code-interpreter'
import { setup, teardown, tester, track, SUITE_METADATA } from '../js/helpers.mjs'

let sbx
before(async () => {
  await setup()
  // No template argument: the SDK's default template must be served.
  sbx = track(await Sandbox.create({ timeoutMs: 900_000, metadata: SUITE_METADATA }))
})
after(async () => {
  await teardown()
})

const t = tester()

function ok(ex) {
  assert.equal(ex.error, undefined, ex.error && `${ex.error.name}: ${ex.error.value}\n${ex.error.traceback}`)
  return ex
}

t('state kept across calls, main result text', async () => {
  ok(await sbx.runCode('x = 41\ndef inc(v):\n    return v + 1'))
  const r = ok(await sbx.runCode('inc(x)'))
  assert.equal(r.text, '42')
  assert.equal(r.results.length, 1)
  assert.equal(r.results[0].isMainResult, true)
  assert.equal(ok(await sbx.runCode("'quoted'")).text, 'quoted')
  const a = await sbx.runCode('1')
  const b = await sbx.runCode('2')
  assert.equal(b.executionCount, a.executionCount + 1)
})

t('stdout/stderr callbacks stream while the cell runs', async () => {
  const t0 = Date.now()
  const events = []
  const r = await sbx.runCode(
    "import sys, time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('oops', file=sys.stderr, flush=True)\ntime.sleep(1)\nprint('second')\n6 * 7",
    {
      onStdout: (m) => events.push(['out', m.line, m.error, Date.now() - t0]),
      onStderr: (m) => events.push(['err', m.line, m.error, Date.now() - t0]),
    },
  )
  const done = Date.now() - t0
  assert.deepEqual(
    events.map(([k, l, e]) => [k, l, e]),
    [
      ['out', 'first\n', false],
      ['err', 'oops\n', true],
      ['out', 'second\n', false],
    ],
  )
  assert.ok(done - events[0][3] >= 2000, `first stdout at ${events[0][3]} ms, cell done at ${done} ms`)
  assert.equal(r.text, '42')
  assert.deepEqual(r.logs.stdout, ['first\n', 'second\n'])
  assert.deepEqual(r.logs.stderr, ['oops\n'])
})

t('errors: name, value, traceback', async () => {
  const seen = []
  const r = await sbx.runCode("print('before')\nraise ValueError('bad value 42')", { onError: (e) => seen.push(e) })
  assert.equal(r.error.name, 'ValueError')
  assert.equal(r.error.value, 'bad value 42')
  assert.match(r.error.traceback, /ValueError/)
  assert.match(r.error.traceback.replace(/\x1b\[[0-9;]*[A-Za-z]/g, ''), /raise ValueError\('bad value 42'\)/)
  assert.deepEqual(r.logs.stdout, ['before\n'])
  assert.equal(seen.length, 1)
  assert.equal(seen[0].name, 'ValueError')
  const z = await sbx.runCode('1/0')
  assert.equal(z.error.name, 'ZeroDivisionError')
  assert.equal(z.error.value, 'division by zero')
})

t('line chart as data', async () => {
  const r = ok(
    await sbx.runCode(
      "import numpy as np, matplotlib.pyplot as plt\nx = np.linspace(0, 4, 5)\nfig = plt.figure()\nplt.plot(x, x * 2, label='double')\nplt.xlabel('Time (s)')\nplt.ylabel('Speed [m/s]')\nplt.title('Ramp')\nplt.show()",
    ),
  )
  const charts = r.results.filter((x) => x.chart)
  assert.equal(charts.length, 1)
  const res = charts[0]
  assert.ok(res.png && res.png.length > 100)
  assert.equal(res.isMainResult, false)
  const c = res.chart
  assert.equal(c.type, 'line')
  assert.equal(c.title, 'Ramp')
  assert.equal(c.x_label, 'Time (s)')
  assert.equal(c.x_unit, 's')
  assert.equal(c.y_unit, 'm/s')
  assert.equal(c.x_scale, 'linear')
  assert.equal(c.elements.length, 1)
  assert.equal(c.elements[0].label, 'double')
  assert.deepEqual(c.elements[0].points.map(([a, b]) => [Number(a), Number(b)]), [[0, 0], [1, 2], [2, 4], [3, 6], [4, 8]])
  // Ticks as matplotlib itself reports them for the same figure: all locator ticks (E2B) or
  // exactly the ones inside the view limits, with their labels.
  const expected = await sbx.runCode(
    'import json\nax = fig.axes[0]\nt = [float(v) for v in ax.get_xticks()]\nl = [v.get_text() for v in ax.get_xticklabels()]\n' +
      'lo, hi = sorted(ax.get_xlim())\nk = [i for i, v in enumerate(t) if lo - 1e-9 <= v <= hi + 1e-9]\n' +
      'json.dumps([[t, l], [[t[i] for i in k], [l[i] for i in k] if len(l) == len(t) else l]])',
  )
  const allowed = JSON.parse(expected.text)
  const got = [c.x_ticks.map(Number), c.x_tick_labels]
  assert.ok(
    allowed.some((a) => JSON.stringify(a) === JSON.stringify(got)),
    `x ticks/labels ${JSON.stringify(got)} not in ${JSON.stringify(allowed)}`,
  )
})

t('bar chart as data', async () => {
  const r = ok(await sbx.runCode("import matplotlib.pyplot as plt\nplt.figure()\nplt.bar(['a', 'b'], [3, 5], label='g')\nplt.title('Bars')\nplt.show()"))
  const c = r.results.find((x) => x.chart).chart
  assert.equal(c.type, 'bar')
  assert.deepEqual(
    c.elements.map((e) => [e.label, e.group, Number(e.value)]),
    [
      ['a', 'g', 3],
      ['b', 'g', 5],
    ],
  )
})

t('DataFrame data', async () => {
  const r = ok(await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})"))
  assert.equal(r.results.length, 1)
  assert.deepEqual(r.results[0].data, { a: [1, 2], b: ['x', 'y'] })
  assert.match(r.results[0].html, /<table/)
})

t('contexts: create with cwd, list, restart, remove, 404', async () => {
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/tmp')
  assert.equal(ok(await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
  ok(await sbx.runCode('mine = 1', { context: ctx }))
  assert.equal((await sbx.runCode("'mine' in globals()")).text, 'False')
  const listed = await sbx.listCodeContexts()
  assert.ok(listed.some((c) => c.id === ctx.id && c.cwd === '/tmp'))
  assert.ok(listed.some((c) => c.language === 'python') && listed.some((c) => c.language === 'javascript'), JSON.stringify(listed))
  await sbx.restartCodeContext(ctx)
  const gone = await sbx.runCode('mine', { context: ctx })
  assert.equal(gone.error.name, 'NameError')
  await sbx.removeCodeContext(ctx.id)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  await assert.rejects(sbx.runCode('1', { context: ctx }), NotFoundError)
  await assert.rejects(sbx.runCode('1', { context: { id: 'no-such-context', language: 'python', cwd: '/home/user' } }), NotFoundError)
})

t('javascript: state, top-level await, console', async () => {
  ok(await sbx.runCode('var counter = 40', { language: 'javascript' }))
  const r = ok(await sbx.runCode('const w = await new Promise((r) => setTimeout(() => r(2), 200)); console.log("log", w); counter + w', { language: 'js' }))
  assert.equal(r.text, '42')
  assert.deepEqual(r.logs.stdout, ['log 2\n'])
  const e = await sbx.runCode("throw new TypeError('js broke')", { language: 'javascript' })
  assert.equal(e.error.name, 'TypeError')
  assert.equal(e.error.value, 'js broke')
})

t('typescript: types stripped, state kept', async () => {
  ok(await sbx.runCode('const base: number = 40\nfunction add(a: number, b: number): number { return a + b }', { language: 'typescript' }))
  assert.equal(ok(await sbx.runCode('add(base, 2)', { language: 'ts' })).text, '42')
})

t('bash: state kept', async () => {
  ok(await sbx.runCode('BH_N=41; cd /tmp', { language: 'bash' }))
  const r = ok(await sbx.runCode('echo $((BH_N + 1)); pwd', { language: 'bash' }))
  assert.equal(r.logs.stdout.join(''), '42\n/tmp\n')
})

t('sql: table kept, result as data', async () => {
  ok(await sbx.runCode("CREATE TABLE jst AS SELECT * FROM (VALUES (1, 'a'), (2, 'b')) v(id, name)", { language: 'sql' }))
  const r = ok(await sbx.runCode('SELECT id, name FROM jst ORDER BY id', { language: 'sql' }))
  const data = r.results.filter((x) => x.data).map((x) => x.data)
  assert.deepEqual(data, [{ id: [1, 2], name: ['a', 'b'] }])
})

t('per-call env vars visible in the call only', async () => {
  const r = ok(await sbx.runCode("import os; os.environ.get('BH_JS', '<unset>')", { envs: { BH_JS: 'v' } }))
  assert.equal(r.text, 'v')
  assert.equal(ok(await sbx.runCode("import os; os.environ.get('BH_JS', '<unset>')")).text, '<unset>')
  assert.equal(ok(await sbx.runCode('process.env.BH_JS', { language: 'javascript', envs: { BH_JS: 'j' } })).text, 'j')
  assert.equal(ok(await sbx.runCode('String(process.env.BH_JS)', { language: 'javascript' })).text, 'undefined')
})

t('sandbox-level envs', async () => {
  const s2 = track(await Sandbox.create({ timeoutMs: 300_000, metadata: SUITE_METADATA, envs: { BH_SBX: 'global' } }))
  assert.equal(ok(await s2.runCode("import os; os.environ['BH_SBX']")).text, 'global')
  assert.equal(ok(await s2.runCode('process.env.BH_SBX', { language: 'javascript' })).text, 'global')
  await s2.kill()
})

t('timeout rejects with TimeoutError, the context keeps its state', async () => {
  ok(await sbx.runCode('kept = 41'))
  const t0 = Date.now()
  await assert.rejects(sbx.runCode('import time; time.sleep(60)', { timeoutMs: 2000 }), TimeoutError)
  assert.ok(Date.now() - t0 < 15_000)
  const t1 = Date.now()
  const r = ok(await sbx.runCode('kept + 1', { timeoutMs: 30_000 }))
  assert.equal(r.text, '42')
  assert.ok(Date.now() - t1 < 15_000, `next call took ${Date.now() - t1} ms: the old cell kept running`)
})

t('R (IRkernel) and Java (JJava): state, env vars, cwd, errors', async () => {
  ok(await sbx.runCode('x <- 41', { language: 'r' }))
  const r = ok(await sbx.runCode('x + 1', { language: 'r' }))
  // IRkernel publishes values as display_data, as on E2B (same kernel).
  assert.deepEqual(r.results.map((x) => x.text), ['[1] 42'])
  const renv = ok(await sbx.runCode("Sys.getenv('BH_JS_R')", { language: 'r', envs: { BH_JS_R: 'v' } }))
  assert.deepEqual(renv.results.map((x) => x.text), ['[1] "v"'])
  const rerr = await sbx.runCode("stop('boom')", { language: 'r' })
  assert.equal(rerr.error.name, 'ERROR')
  assert.match(rerr.error.value, /boom/)

  ok(await sbx.runCode('int j = 41;', { language: 'java' }))
  assert.equal(ok(await sbx.runCode('j + 1', { language: 'java' })).text, '42')
  const jenv = ok(await sbx.runCode('System.getenv("BH_JS_J")', { language: 'java', envs: { BH_JS_J: 'w' } }))
  assert.equal(jenv.text, 'w')
  const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'java' })
  assert.equal(ok(await sbx.runCode('System.getProperty("user.dir")', { context: ctx })).text, '/tmp')
  const jerr = await sbx.runCode('int y = ;', { language: 'java' })
  assert.equal(jerr.error.name, 'CompilationException')
})

t('a context in /root runs as root (as every E2B kernel does)', async () => {
  const ctx = await sbx.createCodeContext({ cwd: '/root' })
  assert.equal(ctx.cwd, '/root')
  const r = ok(await sbx.runCode('import os\n(os.getcwd(), os.getuid())', { context: ctx }))
  assert.equal(r.text, "('/root', 0)")
})

t('the interpreter API answers on localhost:49999 inside the sandbox', async () => {
  ok(await sbx.runCode('from_sdk = 40'))
  const out = await sbx.commands.run(
    `curl -sS --fail-with-body -XPOST localhost:49999/execute -H 'content-type: application/json' -d '{"code": "from_sdk + 2"}'`,
  )
  const lines = out.stdout.trim().split('\n').map((l) => JSON.parse(l))
  assert.ok(lines.some((l) => l.type === 'result' && l.text === '42'), out.stdout)
  assert.deepEqual(lines.at(-1), { type: 'end_of_execution' })
})
