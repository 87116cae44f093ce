#!/usr/bin/env bash
# Style checks: clang-format (the root .clang-format) and clang-tidy (the root .clang-tidy)
# over baton's C++ files. Exits 1 when a file is not formatted or a check fires, 2 on bad
# usage. CI calls it from scripts/test.sh (docs/development.md, "Lint").
#
#   scripts/lint.sh                  both checks on every C++ file git tracks
#   scripts/lint.sh --since REV      both checks on the C++ files changed since REV
#                                    (committed, staged or not; added files included)
#   scripts/lint.sh --tidy [BASE]    only clang-tidy: on every file, or with BASE (a
#                                    revision) on the files changed since BASE, its findings
#                                    kept to those files (what CI runs, BASE from
#                                    .ci/tidy-base); a changed header brings the .cpp of
#                                    its name when the build compiles one
#   scripts/lint.sh --format-only    only clang-format (seconds)
#   scripts/lint.sh --tidy-only      only clang-tidy
#   scripts/lint.sh --build DIR      the build folder whose compile_commands.json clang-tidy
#                                    reads (default build/release; configure it first)
#   scripts/lint.sh [...] FILE...    both checks (or the one asked for) on the files named
#
# clang-tidy reads only the files the build compiles (CUDA sources and files of options
# that are off are skipped); it runs on all cores (-j N to choose).
set -euo pipefail
cd "$(dirname "$0")/.."

since="" build="build/release" do_format=1 do_tidy=1 jobs="$(nproc)" named=() only_changed=0
while [ $# -gt 0 ]; do
  case "$1" in
    --since) since="${2:?--since needs a revision}"; shift 2 ;;
    --build) build="${2:?--build needs a folder}"; shift 2 ;;
    -j) jobs="${2:?-j needs a number}"; shift 2 ;;
    --format-only) do_tidy=0; shift ;;
    --tidy-only) do_format=0; shift ;;
    --tidy)
      do_format=0; shift
      # An optional BASE: the next word when it names a commit and no file.
      if [ $# -gt 0 ] && [ "${1#-}" = "$1" ] && [ ! -f "$1" ]; then
        git rev-parse --verify --quiet "$1^{commit}" >/dev/null ||
          { echo "lint.sh: --tidy: no revision '$1' (a shallow clone lacks old commits)" >&2; exit 2; }
        since="$1" only_changed=1; shift
      fi ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "lint.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    *) [ -f "$1" ] || { echo "lint.sh: no file '$1'" >&2; exit 2; }; named+=("$1"); shift ;;
  esac
done

find_tool() {  # version 14, the one the tree is formatted and checked with (setup.sh)
  local name="$1"
  if command -v "$name-14" >/dev/null; then echo "$name-14"; return; fi
  echo "lint.sh: $name-14 not found (scripts/setup.sh installs it)" >&2
  exit 2
}

cxx_pattern='\.(cpp|cc|h|hpp|cu|cuh)$'
if [ ${#named[@]} -gt 0 ]; then
  files=("${named[@]}")
elif [ -n "$since" ]; then
  git rev-parse --verify --quiet "$since^{commit}" >/dev/null ||
    { echo "lint.sh: --since: no revision '$since'" >&2; exit 2; }
  mapfile -t files < <({ git diff --name-only --diff-filter=ACMR "$since" --
                         git ls-files --others --exclude-standard; } |
                       grep -E "$cxx_pattern" | sort -u | while read -r f; do
                         [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(git ls-files | grep -E "$cxx_pattern")
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "lint.sh: no C++ files to check"
  exit 0
fi

status=0
if [ "$do_format" = 1 ]; then
  format="$(find_tool clang-format)"
  echo "== clang-format: ${#files[@]} files"
  if ! printf '%s\0' "${files[@]}" | xargs -0 -n 32 -P "$jobs" "$format" --dry-run -Werror; then
    echo "lint.sh: clang-format: the files above are not formatted (fix: $format -i FILE)" >&2
    status=1
  fi
fi

if [ "$do_tidy" = 1 ]; then
  tidy="$(find_tool clang-tidy)"
  db="$build/compile_commands.json"
  [ -f "$db" ] || { echo "lint.sh: $db missing: configure first (cmake --preset release)" >&2; exit 2; }
  # Only translation units the build compiles; headers are checked through them. A unity
  # build (CI's) compiles batches that #include the sources: each source gets its batch's
  # command, in a compile database of the units' own made for this run.
  dbdir="$(mktemp -d)"
  trap 'rm -rf "$dbdir"' EXIT
  mapfile -t units < <(python3 - "$db" "$dbdir/compile_commands.json" "${files[@]}" <<'PY'
import json, os, re, sys
entries = json.load(open(sys.argv[1]))
by_file = {}
for e in entries:
    src = os.path.realpath(os.path.join(e["directory"], e["file"]))
    by_file[src] = e
    if re.search(r"unity_[0-9]+_cxx\.cxx$", src) and os.path.exists(src):
        for inc in re.findall(r'^#include "([^"]+)"', open(src).read(), re.M):
            inc = os.path.realpath(os.path.join(os.path.dirname(src), inc))
            cmd = e.get("command") or " ".join(e["arguments"])
            by_file.setdefault(inc, {"directory": e["directory"], "file": inc,
                                     "command": cmd.replace(e["file"], inc)})
seen, out = set(), []
for f in sys.argv[3:]:
    # A header stands for the translation unit of its name (foo.h: foo.cpp), if any.
    # CUDA sources are formatted but not tidied: clang-tidy 14 takes neither nvcc's
    # command lines nor the CUDA 13 headers (nvcc's -Werror=all-warnings checks them).
    stem, ext = os.path.splitext(f)
    if ext in (".cu", ".cuh"):
        continue
    for u in [f] if ext in (".cpp", ".cc") else [stem + ".cpp", stem + ".cc"]:
        real = os.path.realpath(u)
        if real in by_file and u not in seen:
            seen.add(u)
            out.append(dict(by_file[real], file=real))
            print(u)
json.dump(out, open(sys.argv[2], "w"))
PY
  )
  # With a base, the findings are kept to the changed files: a finding in a header the
  # submission did not touch is not its business.
  filter=()
  if [ "$only_changed" = 1 ]; then
    filter=("--line-filter=$(python3 -c 'import json, sys; print(json.dumps([{"name": f} for f in sys.argv[1:]]))' "${files[@]}")")
  fi
  echo "== clang-tidy: ${#units[@]} of the files are compiled translation units"
  if [ ${#units[@]} -gt 0 ]; then
    # GCC-only warning flags and pragmas (#pragma GCC ivdep) are not clang-tidy's business.
    if ! printf '%s\0' "${units[@]}" |
        xargs -0 -n 1 -P "$jobs" "$tidy" -p "$dbdir" --quiet "${filter[@]}" \
          --extra-arg=-Wno-unknown-warning-option --extra-arg=-Wno-unknown-pragmas 2> >(grep -v '^[0-9]* warnings\? generated\.$' >&2); then
      echo "lint.sh: clang-tidy: the checks above fired (.clang-tidy lists them)" >&2
      status=1
    fi
  fi
fi
exit "$status"
