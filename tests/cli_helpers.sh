# Helpers of the command-line tests (tests/*/cli_test.sh), sourced after they set $tmp
# (a scratch folder) and fails=0.

# expect RC CMD...: runs CMD, checks its exit code; its output is in $tmp/out.
expect() {
  local want="$1"; shift
  "$@" >"$tmp/out" 2>&1
  local got=$?
  if [ "$got" -ne "$want" ]; then
    echo "FAIL (exit $got, expected $want): $*"; cat "$tmp/out"; fails=$((fails + 1))
  fi
}
# contains TEXT: the last command's output holds TEXT.
contains() {
  if ! grep -qF -- "$1" "$tmp/out"; then
    echo "FAIL: output lacks '$1':"; cat "$tmp/out"; fails=$((fails + 1))
  fi
}
# lacks TEXT: the last command's output does not hold TEXT.
lacks() {
  if grep -qF -- "$1" "$tmp/out"; then
    echo "FAIL: output holds '$1':"; cat "$tmp/out"; fails=$((fails + 1))
  fi
}
