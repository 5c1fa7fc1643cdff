#!/usr/bin/env bash
# Installs the build into a staging root and checks what a Slurm admin would get (see cmake/DsecInstall.cmake):
# every part in its place, `dsec doctor` finding the sandbox helpers in libexec, pydsec importable from the
# site directory, and the hardening flags (full RELRO, immediate binding, no executable stack, stack
# protector) on the SPANK plugin and the programs.
# usage: install_test.sh BUILD_DIR PREFIX SPANK_PLUGIN_DIR PYTHON_SITEDIR
set -euo pipefail
build=$1 prefix=$2 plugin_dir=$3 site_dir=$4
stage=$(mktemp -d /tmp/dsec-install-test.XXXXXX)
trap 'rm -rf "$stage"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
under() { case "$1" in /*) echo "$stage$1" ;; *) echo "$stage$prefix/$1" ;; esac; }

DESTDIR=$stage cmake --install "$build" > "$stage.log" 2>&1 || { cat "$stage.log"; fail "cmake --install failed"; }
rm -f "$stage.log"
root=$stage$prefix

expect=("$root/bin/dsec" "$root/libexec/dsec/dsec-sandbox-init" "$root/libexec/dsec/dsec-sandbox-spawner"
        "$root/libexec/dsec/dsec-qos-probe" "$root/libexec/dsec/dsec-guest-agent"
        "$root/libexec/dsec/fetch-guest-kernel.sh" "$(under "$site_dir")/pydsec/__init__.py"
        "$root/share/dsec/slurm-configs/plugstack.conf")
[ -e "$build/launcher/dsec-launch" ] && expect+=("$root/bin/dsec-launch")
plugin=""
if [ -e "$build/spank/spank_dsec.so" ]; then
  plugin=$(under "$plugin_dir")/spank_dsec.so
  expect+=("$plugin" "$(under "$plugin_dir")/dsec-sandbox-init")
fi
for f in "${expect[@]}"; do
  [ -e "$f" ] || fail "not installed: ${f#$stage}"
done
for f in "$root/bin/dsec" "$root/libexec/dsec/dsec-sandbox-init" "$root/libexec/dsec/dsec-sandbox-spawner" \
  "$root/libexec/dsec/dsec-guest-agent" "$root/libexec/dsec/fetch-guest-kernel.sh"; do
  [ -x "$f" ] || fail "not executable: ${f#$stage}"
done
if [ -n "$(find "$(under "$site_dir")/pydsec" -name '__pycache__')" ]; then fail "bytecode caches installed"; fi

# The installed CLI finds the installed helpers (bin/../libexec/dsec), not the build tree's.
doctor=$("$root/bin/dsec" doctor 2>&1 || true)
grep -E "dsec-sandbox-init.*found" <<<"$doctor" >/dev/null || { echo "$doctor"; fail "installed dsec does not find dsec-sandbox-init"; }
grep -E "dsec-sandbox-spawner.*found" <<<"$doctor" >/dev/null || { echo "$doctor"; fail "installed dsec does not find dsec-sandbox-spawner"; }

# The SDK imports from where it was installed.
got=$(cd / && PYTHONPATH=$(under "$site_dir") /usr/bin/python3 -c 'import pydsec, os; print(os.path.realpath(pydsec.__file__))')
[ "$got" = "$(realpath "$(under "$site_dir")/pydsec/__init__.py")" ] || fail "pydsec imported from $got"

# Hardening.
hardened() {
  local f=$1 dyn
  dyn=$(readelf -dW "$f" 2>/dev/null || true)
  local segments
  segments=$(readelf -lW "$f")
  grep -q GNU_RELRO <<<"$segments" || fail "${f#$stage}: no RELRO segment"
  if grep -q "(DYNAMIC)\|NEEDED" <<<"$dyn"; then
    grep -Eq "BIND_NOW|FLAGS_1.*NOW" <<<"$dyn" || fail "${f#$stage}: not linked with -z now"
  fi
  if grep GNU_STACK <<<"$segments" | grep -q "RWE"; then fail "${f#$stage}: executable stack"; fi
}
for f in "$root/bin/dsec" "$root/libexec/dsec/dsec-sandbox-init" "$root/libexec/dsec/dsec-sandbox-spawner" \
  "$root/libexec/dsec/dsec-guest-agent" ${plugin:+"$plugin"}; do
  hardened "$f"
done
if [ -n "$plugin" ]; then
  imports=$(nm -D --undefined-only "$plugin")  # (not piped into grep -q: pipefail would see nm's SIGPIPE)
  grep -q "__stack_chk_fail" <<<"$imports" || fail "spank_dsec.so: built without the stack protector"
  grep -q "_chk@" <<<"$imports" || fail "spank_dsec.so: no fortified libc calls (_FORTIFY_SOURCE)"
fi
echo "install: every part in place under $prefix, helpers found, pydsec importable, hardening flags present"
