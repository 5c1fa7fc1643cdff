#!/usr/bin/env bash
# The whole test suite: installs dependencies, builds, and runs every test (GoogleTest and pytest) through
# ctest. Run as root on Debian 12: the tests use real namespaces, cgroups, EROFS mounts.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
"$here/tests/install-deps.sh"
"$here/tests/build.sh"
build=${DSEC_BUILD_DIR:-$here/build}
cd "$build"
ctest --output-on-failure --timeout 900 -j"${DSEC_TEST_JOBS:-2}" "$@"
