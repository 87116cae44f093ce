# Sourced by the bench/*.sh scripts: an inner command's failure said, not lost. The scripts
# keep each command's output in a scratch folder that their exit trap deletes, so a failing
# command had ended a script with its exit status and no word.

# print_usage SCRIPT: the comment block at the top of SCRIPT (its usage), for --help.
print_usage() {
  sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$1"
}

# run_logged OUT CMD [ARG...]: runs CMD with stdout and stderr to OUT; if it fails, prints
# the command, its exit status and the last lines of OUT to stderr and exits with that
# status.
run_logged() {
  local out="$1" rc=0
  shift
  "$@" >"$out" 2>&1 || rc=$?
  [ "$rc" = 0 ] || fail_with_output "$out" "$rc" "$@"
}

# fail_with_output OUT STATUS CMD [ARG...]: the message of run_logged, then exit STATUS.
fail_with_output() {
  report_failure "$@"
  exit "$2"
}

# report_failure OUT STATUS CMD [ARG...]: the message alone (a script that goes on to its
# other runs and exits non-zero at the end).
report_failure() {
  local out="$1" rc="$2"
  shift 2
  {
    echo "failed (exit $rc): $(printf '%q ' "$@")"
    echo "its output, last 20 lines:"
    tail -n 20 "$out" | sed 's/^/  /'
  } >&2
}

# run_row ROW OUT CMD...: runs CMD into OUT; on failure prints the table row ROW saying so
# and the failure's report, and returns 1, so a script reports that row and goes on.
run_row() {
  local row="$1" out="$2" rc=0
  shift 2
  "$@" > "$out" 2>&1 || rc=$?
  [ "$rc" = 0 ] && return 0
  echo "$row failed (exit $rc): below |"
  report_failure "$out" "$rc" "$@"
  return 1
}

# need_int FLAG VALUE MIN: VALUE an integer of at least MIN, else a message and exit 2.
# At most 9 digits: a longer number overflowed the shell's test, which then passed it.
need_int() {
  if ! [[ "$2" =~ ^[0-9]{1,9}$ ]] || [ "$2" -lt "$3" ]; then
    echo "$1: expected an integer of at least $3, found '$2'" >&2
    exit 2
  fi
}

# need_value FLAG ARGC: a flag given last, with no value, is named (exit 2); `set -u` had
# said "$2: unbound variable", exit 1. ARGC: the arguments left, the flag's included.
need_value() {
  [ "$2" -ge 2 ] || { echo "$1: expected a value after it" >&2; exit 2; }
}

# need_plans KNOWN PLANS: PLANS a non-empty list of names from KNOWN, else a message and exit 2.
need_plans() {
  [ -n "$2" ] || { echo "--plans: expected one or more of $1, found none" >&2; exit 2; }
  local p
  for p in $2; do
    [[ " $1 " == *" $p "* ]] || { echo "--plans: unknown plan '$p' (expected some of $1)" >&2; exit 2; }
  done
}
