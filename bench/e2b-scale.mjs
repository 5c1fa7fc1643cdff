// E2B's JS SDK at agent-harness scale against dsec's E2B listener: COUNT sandboxes created at once from this one
// Node process, then one command in each (all at once), then all killed. Prints one JSON object: the wall times,
// creates per second and each command's round trip (p50, p99). Run by bench/e2b-scale.py.
import { Sandbox } from 'e2b'

const count = Number(process.env.COUNT || 200)
const template = process.env.E2B_TEMPLATE || 'base'
const pct = (xs, p) => {
  const s = [...xs].sort((a, b) => a - b)
  return s.length ? s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] : 0
}
const t0 = performance.now()
const sandboxes = await Promise.all(Array.from({ length: count }, () => Sandbox.create(template, { timeoutMs: 600_000 })))
const created = performance.now()
const rtts = await Promise.all(sandboxes.map(async (s) => {
  const a = performance.now()
  const r = await s.commands.run('echo hi')
  if (r.stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
  return performance.now() - a
}))
const ran = performance.now()
await Promise.all(sandboxes.map((s) => s.kill()))
const killed = performance.now()
console.log(JSON.stringify({
  count,
  create_s: (created - t0) / 1000,
  creates_per_s: count / ((created - t0) / 1000),
  run_wall_s: (ran - created) / 1000,
  run_p50_ms: pct(rtts, 50),
  run_p99_ms: pct(rtts, 99),
  kill_s: (killed - ran) / 1000,
}))
