#!/usr/bin/env bash
# Configures and builds dsec into ${DSEC_BUILD_DIR:-build} (incremental).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${DSEC_BUILD_DIR:-$here/build}
cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)"
