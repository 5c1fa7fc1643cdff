#!/usr/bin/env bash
# The house lint gate: clang-format (--dry-run --Werror, .clang-format at the root) and clang-tidy (.clang-tidy at
# the root: the bugprone set, warnings as errors) over every project C/C++ source. Exits non-zero on any finding.
#
#   tests/lint.sh [BUILD_DIR [PATH...]]
#     BUILD_DIR holds compile_commands.json (default: <root>/build); PATHs (files or folders, relative to the
#     root) limit the check to those sources, e.g. `tests/lint.sh build fs3 tests/fs3`.
#
# Environment: LINT_JOBS (parallel clang-tidy runs, default: nproc), LINT_SKIP_FORMAT=1, LINT_SKIP_TIDY=1,
# CLANG_FORMAT / CLANG_TIDY (binaries). Not registered in ctest: a full clang-tidy run takes minutes.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
build=$(cd "$build" 2>/dev/null && pwd) || {
  echo "lint: build directory '${1:-$root/build}' does not exist (configure with cmake first)" >&2
  exit 2
}
jobs=${LINT_JOBS:-$(nproc)}

pick() {  # the first of the named programs on PATH
  for p in "$@"; do
    if command -v "$p" >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

cd "$root" || exit 2
# Project sources: what git tracks plus what it does not ignore (so new files count before they are added);
# build directories are ignored by .gitignore. Outside a git checkout: every source below the root, minus build*/.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
    '*.cc' '*.cpp' '*.cxx' '*.c' '*.h' '*.hh' '*.hpp' | sort -u)
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f \
    \( -name '*.cc' -o -name '*.cpp' -o -name '*.cxx' -o -name '*.c' -o -name '*.h' -o -name '*.hh' \
    -o -name '*.hpp' \) -print | sed 's|^\./||' | sort)
fi
shift $(($# > 0 ? 1 : 0))
existing=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue  # git lists deleted-but-tracked files too
  if (($# > 0)); then
    wanted=0
    for p in "$@"; do
      p=${p%/}
      if [[ $f == "$p" || $f == "$p"/* ]]; then wanted=1; fi
    done
    ((wanted)) || continue
  fi
  existing+=("$f")
done
files=("${existing[@]}")
if ((${#files[@]} == 0)); then
  echo "lint: no C/C++ sources found below $root" >&2
  exit 2
fi

failed=0

if [[ ${LINT_SKIP_FORMAT:-0} != 1 ]]; then
  fmt=${CLANG_FORMAT:-$(pick clang-format clang-format-14)} || {
    echo "lint: clang-format not found" >&2
    exit 2
  }
  echo "lint: $fmt --dry-run --Werror on ${#files[@]} files"
  if ! fmt_out=$("$fmt" --dry-run --Werror "${files[@]}" 2>&1); then
    printf '%s\n' "$fmt_out" >&2
    echo "lint: clang-format: findings per file (fix with: $fmt -i FILE):" >&2
    printf '%s\n' "$fmt_out" | grep -oE '^[^: ]+:[0-9]+:[0-9]+: (warning|error):' | cut -d: -f1 | sort | uniq -c >&2
    failed=1
  fi
fi

if [[ ${LINT_SKIP_TIDY:-0} != 1 ]]; then
  tidy=${CLANG_TIDY:-$(pick clang-tidy clang-tidy-14)} || {
    echo "lint: clang-tidy not found" >&2
    exit 2
  }
  db=$build/compile_commands.json
  if [[ ! -f $db ]]; then
    echo "lint: $db missing (configure with CMAKE_EXPORT_COMPILE_COMMANDS=ON)" >&2
    exit 2
  fi
  # clang-tidy needs a compile command: check the translation units the database knows; headers are checked
  # through them (header filter: the project's own folders, so neither system nor build-dir headers).
  mapfile -t in_db < <(python3 -c '
import json, os, sys
for entry in json.load(open(sys.argv[1])):
    print(os.path.normpath(os.path.join(entry["directory"], entry["file"])))' "$db" | sort -u)
  declare -A known=()
  for f in "${in_db[@]}"; do known[$f]=1; done
  units=()
  unbuilt=()
  for f in "${files[@]}"; do
    case $f in *.cc | *.cpp | *.cxx | *.c) ;; *) continue ;; esac
    if [[ -n ${known[$root/$f]:-} ]]; then units+=("$root/$f"); else unbuilt+=("$f"); fi
  done
  if ((${#unbuilt[@]} > 0)); then
    # Not a failure: a source may be left out on purpose (an optional dependency is missing); say so loudly.
    echo "lint: WARNING: not in $db, so not checked by clang-tidy (reconfigure?):" >&2
    printf '  %s\n' "${unbuilt[@]}" >&2
  fi
  dirs=$(printf '%s\n' "${files[@]}" | grep / | cut -d/ -f1 | sort -u | paste -sd'|')
  root_re=$(printf '%s' "$root" | sed 's/[][\\.^$*+?(){}|]/\\&/g')
  header_filter="^$root_re/($dirs)/"
  if ((${#units[@]} == 0)); then
    echo "lint: no translation unit of the project is in $db" >&2
    exit 2
  fi
  echo "lint: $tidy on ${#units[@]} translation units, $jobs at a time"
  export LINT_TIDY=$tidy LINT_DB=$build LINT_HEADER_FILTER=$header_filter
  # One clang-tidy per file; each file's output is printed in one piece so parallel runs do not interleave.
  # xargs exits non-zero when any run did.
  # shellcheck disable=SC2016
  if ! printf '%s\0' "${units[@]}" | xargs -0 -n 1 -P "$jobs" sh -c '
      out=$("$LINT_TIDY" -p "$LINT_DB" --quiet --header-filter="$LINT_HEADER_FILTER" "$1" 2>&1); rc=$?
      out=$(printf "%s\n" "$out" | grep -Ev "^[0-9]+ (warning|error)s? (and [0-9]+ (warning|error)s? )?generated\.$")
      if [ "$rc" -ne 0 ] || [ -n "$out" ]; then printf "== %s\n%s\n" "$1" "$out"; fi
      exit "$rc"' lint-tidy; then
    echo "lint: clang-tidy: findings above" >&2
    failed=1
  fi
fi

if ((failed)); then
  echo "lint: FAILED" >&2
  exit 1
fi
echo "lint: clean"
