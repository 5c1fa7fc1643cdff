// One E2B agent's life through E2B's own JS SDK (npm `e2b`), against dsec's E2B listener: E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY come from the environment. Prints one JSON object per step; test_e2b_sdk.py checks
// them. Any exception fails the run (exit 1) with its name and message.
import { Sandbox, CommandExitError } from 'e2b'

const out = (step, value) => console.log(JSON.stringify({ step, value }))
try {
  const sbx = await Sandbox.create(process.env.E2B_TEMPLATE || 'base', { timeoutMs: 120_000, metadata: { run: 'r1', tag: 'a&b=c%41' } })
  out('create', sbx.sandboxId)
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  out('run', { exitCode: r.exitCode, stdout: r.stdout, stderr: r.stderr })
  try {
    await sbx.commands.run('echo before; exit 3')
    out('failing', 'no error')
  } catch (e) {
    out('failing', { error: e instanceof CommandExitError ? 'CommandExitError' : e.constructor.name, exitCode: e.exitCode, stdout: e.stdout })
  }
  const pieces = []
  const bg = await sbx.commands.run('for i in 1 2 3; do echo line$i; sleep 0.3; done', {
    background: true,
    onStdout: (d) => pieces.push(d),
  })
  out('background-started', { pid: bg.pid, piecesBeforeWait: pieces.length })
  const done = await bg.wait()
  out('background', { exitCode: done.exitCode, stdout: pieces.join(''), pieces: pieces.length })
  const sleeper = await sbx.commands.run('sleep 60', { background: true })
  out('kill-command', await sleeper.kill())
  try {
    const r2 = await sleeper.wait()
    out('killed-wait', { exitCode: r2.exitCode })
  } catch (e) {
    out('killed-wait', { error: e.constructor.name, exitCode: e.exitCode })
  }
  out('kill-unknown', await sbx.commands.kill(987654))
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'piped ')
  await sbx.commands.sendStdin(cat.pid, 'in\n')
  await sbx.commands.closeStdin(cat.pid)
  out('stdin', (await cat.wait()).stdout)
  out('no-stdin', (await sbx.commands.run('cat; echo eof')).stdout)
  const env = await sbx.commands.run('echo $GREETING from $(pwd)', { envs: { GREETING: 'hey' }, cwd: '/tmp' })
  out('env-cwd', env.stdout)
  await sbx.files.write('/tmp/hello.txt', 'hi there')
  out('read', await sbx.files.read('/tmp/hello.txt'))
  out('list', (await sbx.files.list('/tmp')).map((e) => `${e.name}:${e.type}`).sort())
  out('exists', await sbx.files.exists('/tmp/hello.txt'))
  // A name with characters a query string escapes, and an escape of its own: read back and listed as written.
  await sbx.files.write('/tmp/odd %41&x=y.txt', 'odd')
  out('odd-name', { read: await sbx.files.read('/tmp/odd %41&x=y.txt'),
                    listed: (await sbx.files.list('/tmp')).some((e) => e.name === 'odd %41&x=y.txt') })
  await sbx.files.remove('/tmp/odd %41&x=y.txt')
  out('makeDir', [await sbx.files.makeDir('/tmp/d1'), await sbx.files.makeDir('/tmp/d1')])
  await sbx.files.rename('/tmp/hello.txt', '/tmp/d1/moved.txt')
  out('renamed', await sbx.files.read('/tmp/d1/moved.txt'))
  await sbx.files.remove('/tmp/d1/moved.txt')
  out('removed', await sbx.files.exists('/tmp/d1/moved.txt'))
  await sbx.setTimeout(60_000)
  const info = await sbx.getInfo()
  out('info', { templateId: info.templateId, metadata: info.metadata, state: info.state,
                lifetime: (info.endAt - info.startedAt) / 1000 })
  const again = await Sandbox.connect(sbx.sandboxId)
  out('connect', (await again.commands.run('cat /tmp/d1/../d1/.. >/dev/null 2>&1; echo still here')).stdout)
  const listed = await Sandbox.list({ query: { metadata: { run: 'r1' } } }).nextItems()
  out('listed', listed.map((s) => s.sandboxId).includes(sbx.sandboxId))
  const byTag = await Sandbox.list({ query: { metadata: { tag: 'a&b=c%41' } } }).nextItems()
  const byOtherTag = await Sandbox.list({ query: { metadata: { tag: 'a&b=cA' } } }).nextItems()
  out('listed-by-odd-metadata', [byTag.map((s) => s.sandboxId).includes(sbx.sandboxId),
                                 byOtherTag.map((s) => s.sandboxId).includes(sbx.sandboxId)])
  out('kill', await sbx.kill())
  out('kill-again', await Sandbox.kill(sbx.sandboxId))
} catch (e) {
  console.log(JSON.stringify({ step: 'error', value: `${e.constructor.name}: ${e.message}` }))
  process.exit(1)
}
