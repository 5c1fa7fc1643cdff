#!/usr/bin/env bash
# The main job: builds dsec, starts an embedded single-node fleet (`dsec serve`), runs the example rollout
# through pydsec against it, and stops the fleet. Layers are built on the first run and reused afterwards.
# Run as root on Debian 12. Arguments are passed to examples/rollout.py (e.g. --count 64).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/tests/install-deps.sh"
"$here/tests/build.sh"
build=${DSEC_BUILD_DIR:-$here/build}
export DSEC_BIN="$build/cli/dsec"
root=${DSEC_ROOT:-/var/lib/dsec}
fleet=example-rollout
port=${DSEC_PORT:-8470}
log=$(mktemp /tmp/dsec-serve.XXXXXX.log)

"$DSEC_BIN" serve --root "$root" --listen "127.0.0.1:$port" --fleet-name "$fleet" 2>"$log" &
serve_pid=$!
stop_serve() {
  kill -TERM "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
}
trap stop_serve EXIT
for _ in $(seq 100); do
  if curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 || \
     /usr/bin/python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
    break
  fi
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    echo "dsec serve failed to start:" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.1
done
PYTHONPATH="$here/pydsec${PYTHONPATH:+:$PYTHONPATH}" /usr/bin/python3 "$here/examples/rollout.py" \
  --fleet "$fleet" --root "$root" "$@"
