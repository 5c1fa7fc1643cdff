#!/usr/bin/env bash
# End-to-end test of the main job: an embedded single-node fleet (`dsec serve`) on a free port, the example
# rollout through pydsec (32 sandboxes), and a check that nothing is left behind (no sandboxes, cgroups,
# state files or per-sandbox mounts). Layers live in a persistent test root so they are built once per machine.
set -euo pipefail
dsec=${DSEC_BIN:?DSEC_BIN must name the dsec binary}
src=${DSEC_SOURCE_DIR:?DSEC_SOURCE_DIR must name the source tree}
root=${DSEC_EXAMPLE_ROOT:-/var/tmp/dsec-example-root}
fleet=rollout-test-$$
export HOME=${HOME:-/root}

if [ "$(id -u)" != 0 ]; then echo "SKIP: needs root (namespaces, mounts, cgroups)"; exit 77; fi

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp /tmp/dsec-rollout-test.XXXXXX.log)
"$dsec" serve --root "$root" --listen "127.0.0.1:$port" --fleet-name "$fleet" 2>"$log" &
serve_pid=$!
cleanup() { kill -TERM "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq 200); do
  /usr/bin/python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" \
    2>/dev/null && break
  kill -0 "$serve_pid" 2>/dev/null || { echo "dsec serve died:"; cat "$log"; exit 1; }
  sleep 0.1
done

out=$(mktemp /tmp/dsec-rollout-out.XXXXXX)
if ! PYTHONPATH="$src/pydsec" /usr/bin/python3 "$src/examples/rollout.py" --fleet "$fleet" --root "$root" \
     --count 32 --concurrency 32 | tee "$out"; then
  echo "FAIL: rollout exited non-zero"; echo "--- serve log"; tail -50 "$log"; exit 1
fi
grep -E '^rollout: 32 sandboxes' "$out" >/dev/null || { echo "FAIL: no summary line for 32 sandboxes"; exit 1; }
grep -E 'p50 [0-9.]+ ms p99 [0-9.]+ ms' "$out" >/dev/null || { echo "FAIL: summary lacks create p50/p99"; exit 1; }

# Nothing left behind: no sandbox state, no sandbox cgroups, no per-sandbox processes.
left=$(ls "$root/state/sandboxes" 2>/dev/null | wc -l)
[ "$left" = 0 ] || { echo "FAIL: $left sandbox state files left"; ls "$root/state/sandboxes"; exit 1; }
for h in /sys/fs/cgroup/memory/dsec /sys/fs/cgroup/dsec; do
  if [ -d "$h" ]; then
    n=$(find "$h" -mindepth 1 -maxdepth 1 -type d | wc -l)
    [ "$n" = 0 ] || { echo "FAIL: $n sandbox cgroups left under $h"; exit 1; }
  fi
done
cleanup
trap - EXIT
rm -f "$out" "$log"
echo "rollout end-to-end: ok"
