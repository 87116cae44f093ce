#!/usr/bin/env bash
# `baton simulate` end to end: exit codes (0 fine, 2 bad input), the example
# schedules, comparison and automatic modes, and the files it writes.
set -u
baton="$1"
examples="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
. "$(dirname "$0")/../cli_helpers.sh"

expect 0 "$baton" simulate --schedule 1f1b --stages 4 --micro-batches 8
contains "makespan 33"
contains "27.27%"
expect 0 "$baton" simulate --file "$examples/1f1b_p4_m8.txt" --costs "$examples/costs_example.json"
contains "valid"
expect 0 "$baton" simulate --file "$examples/1f1b_late_w_p4_m8.txt" --lower
contains "(with transfers)"
expect 0 "$baton" simulate --schedule gpipe,1f1b,zb-h1,zb-v,auto -p 4 -m 8 --memory-limit 4
contains "zb-v"
contains "auto"
expect 0 "$baton" simulate --schedule all -p 3 -m 4
contains "dualpipev            not defined"
expect 0 "$baton" simulate --schedule auto -p 4 -m 8 --memory-limit 3
contains "chosen:"
# The Zero Bubble paper's 6.2B row at ZB-2p's memory (its memory model, a limit in bytes),
# by span: the paper's heuristic wins with the paper's 0.29%.
expect 0 "$baton" simulate --schedule auto -p 8 -m 24 --costs "$examples/costs_zb_paper_6.2b.json" --memory-limit 4736KiB --objective span
contains "chosen: zb-greedy"
expect 0 "$baton" simulate -s zb-v -p 4 -m 8 --lower --svg "$tmp/t.svg" --trace "$tmp/t.json" -o "$tmp/s.json" --repeat 3
contains "timing:"
grep -q "<svg" "$tmp/t.svg" || { echo "FAIL: no SVG"; fails=$((fails + 1)); }
grep -q "traceEvents" "$tmp/t.json" || { echo "FAIL: no trace"; fails=$((fails + 1)); }
expect 0 "$baton" simulate --file "$tmp/s.json"
contains "(with transfers)"
# PyTorch's CSV: read (dialect detected or given), simulated, written.
torch_csv="$examples/../../tests/fixtures/torch_schedules"
expect 0 "$baton" simulate --file "$torch_csv/dualpipev_p4_m8.csv" -o "$tmp/d.csv"
contains "valid"
grep -q "OVERLAP_F_B" "$tmp/d.csv" || { echo "FAIL: no composite in the CSV written"; fails=$((fails + 1)); }
expect 0 "$baton" simulate --file "$torch_csv/zbv_p4_m8.csv" --dialect current
# PyTorch's GPipe dump comes back as it was: its WAIT_REDUCE_GRAD cells (without them
# PyTorch 2.15's runtime refuses the file) and its dialect.
expect 0 "$baton" simulate --file "$torch_csv/gpipe_p4_m8.csv" -o "$tmp/gpipe.csv"
cmp -s "$torch_csv/gpipe_p4_m8.csv" "$tmp/gpipe.csv" || { echo "FAIL: gpipe_p4_m8.csv written otherwise"; fails=$((fails + 1)); }
# A PyTorch RECV posts the receive (its runtime waits at the consumer): the lowered form
# of Interleaved1F1B simulates as its compute-only form does (it had been 20).
expect 0 "$baton" simulate --file "$torch_csv/interleaved1f1b_p2_m4.csv"
contains "makespan 13.5 "
expect 0 "$baton" simulate --file "$torch_csv/comms_without_fsdp/interleaved1f1b_p2_m4.csv"
contains "makespan 13.5 "
contains "(with transfers)"
# A share that rounds to zero prints 0.00% (torch's InterleavedZeroBubble p=3 v=3 m=6,
# rank 2's span bubble, had printed -0.00%).
printf '%s\r\n' \
  '0F0,0F1,0F2,3F0,3F1,3F2,6F0,6F1,,,6F2,6I0,6W0,0F3,6I1,6W1,0F4,6I2,6W2,0F5,3I0,3W0,3F3,3I1,3W1,3F4,3I2,3W2,3F5,0I0,0W0,6F3,0I1,0W1,6F4,0I2,0W2,6F5,6I3,6W3,6I4,6W4,6I5,6W5,3I3,3W3,3I4,3W4,3I5,3W5,0I3,0W3,0I4,0W4,0I5,0W5' \
  ',1F0,1F1,1F2,4F0,4F1,4F2,7F0,,7F1,7I0,7F2,7I1,7W0,1F3,7I2,7W1,1F4,4I0,7W2,1F5,4I1,4W0,4F3,4I2,4W1,4F4,1I0,4W2,4F5,1I1,1W0,7F3,1I2,1W1,7F4,7I3,1W2,7F5,7I4,7W3,7I5,7W4,4I3,7W5,4I4,4W3,4I5,4W4,1I3,4W5,1I4,1W3,1I5,1W4,1W5' \
  ',,2F0,2F1,2F2,5F0,5F1,5F2,8F0,8I0,8F1,8I1,8F2,8I2,8W0,2F3,5I0,8W1,2F4,5I1,8W2,2F5,5I2,5W0,5F3,2I0,5W1,5F4,2I1,5W2,5F5,2I2,2W0,8F3,8I3,2W1,8F4,8I4,2W2,8F5,8I5,8W3,5I3,8W4,5I4,8W5,5I5,5W3,2I3,5W4,2I4,5W5,2I5,2W3,2W4,2W5' \
  >"$tmp/izb_p3_v3_m6.csv"
expect 0 "$baton" simulate --file "$tmp/izb_p3_v3_m6.csv"
contains "0.00%"
lacks "-0.00%"
expect 0 "$baton" simulate --schedule v-half -p 4 -m 8
expect 0 "$baton" simulate --schedule v-zb,auto -p 4 -m 8 --memory-limit 4 --objective span
# "all" in a list: every training schedule and the others named.
expect 0 "$baton" simulate --schedule all,auto -p 4 -m 8
contains "zb-v"
contains "auto"
expect 2 "$baton" simulate --schedule all,1f1b -p 4 -m 8
contains "1f1b is listed twice (all holds every training schedule)"
# A comparison without --stages and --micro-batches (every row "not defined", exit 0), and
# two outputs under one name (the second had replaced the first).
expect 2 "$baton" simulate --schedule 1f1b,gpipe
expect 2 "$baton" simulate -s 1f1b -p 2 -m 4 --trace "$tmp/same.json" --svg "$tmp/same.json"
contains "is the same file as --svg"
# An output to standard output holds that file alone; the report goes to standard error
# (it had followed the schedule or the trace there).
"$baton" simulate -s 1f1b -p 2 -m 2 -o /dev/stdout >"$tmp/stdout-sched.txt" 2>"$tmp/stdout-report.txt"
expect 0 "$baton" simulate --file "$tmp/stdout-sched.txt"
grep -q "makespan" "$tmp/stdout-report.txt" || { echo "FAIL: simulate's report not on stderr"; fails=$((fails + 1)); }
if grep -q "makespan" "$tmp/stdout-sched.txt"; then echo "FAIL: simulate's report in its -o /dev/stdout"; fails=$((fails + 1)); fi
printf '{"version": 1, "model": "%s", "devices": 2, "parallel": {"dp": 1, "pp": 2, "tp": 1}, "batch": {"micro_batch_size": 1}, "schedule": {"name": "1f1b", "micro_batches": 2}, "optimizer": "sgd", "stages": [{"layers": [0, 2]}, {"layers": [2, 4]}]}' "$examples/../models/mlp.json" >"$tmp/pp2.json"
"$baton" trace predict --plan "$tmp/pp2.json" -o /dev/stdout >"$tmp/stdout-trace.json" 2>/dev/null
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/stdout-trace.json" || { echo "FAIL: trace predict -o /dev/stdout is no JSON"; fails=$((fails + 1)); }
# One new file under two spellings (n.json and ./n.json): the relative one had stayed
# relative, the two compared unequal, and the trace replaced the schedule, exit 0.
mkdir -p "$tmp/fresh"
cd "$tmp/fresh"
expect 2 "$baton" simulate -s 1f1b -p 2 -m 2 --out n.json --trace ./n.json
contains "--out n.json is the same file as --trace ./n.json"
expect 2 "$baton" simulate -s 1f1b -p 2 -m 2 --out n.json --svg "$tmp/fresh/n.json"
contains "--out n.json is the same file as --svg $tmp/fresh/n.json"
[ ! -e n.json ] || { echo "FAIL: n.json written"; fails=$((fails + 1)); }
cd - >/dev/null
# A dangling link to the other output: the writer follows it, so the check does too.
ln -sf "$tmp/target.json" "$tmp/link.json"
expect 2 "$baton" simulate -s 1f1b -p 2 -m 4 --trace "$tmp/target.json" --svg "$tmp/link.json"
contains "is the same file as --svg"

# Bad input: exit code 2 and a message that says what is wrong.
expect 2 "$baton" simulate --file "$torch_csv/zbv_p2_m4_comms.csv"
contains "UNSHARD/RESHARD"
expect 2 "$baton" simulate --file "$torch_csv/zbv_p4_m8.csv" --dialect legacy
contains "'I' (input gradient) is current"
expect 2 "$baton" simulate --schedule nope -p 4 -m 8
contains "unknown schedule 'nope'"
contains "; or auto, or all (the training schedules)"
expect 2 "$baton" simulate --schedule auto -p 4 -m 8 --objective fastest
contains "--objective: expected makespan or span"
# ... and so is a value of an option the schedule does not use.
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 2 --objective fastest
contains "--objective: expected makespan or span"
# A valid --objective without auto would do nothing: refused, not ignored.
expect 2 "$baton" simulate --schedule 1f1b -p 4 -m 8 --objective span
contains "--objective is what the auto schedule minimises; it needs --schedule auto"
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 2 --dialect newest
contains "expected legacy, current or detect, found 'newest'"
# --dialect is the CSV's: without a CSV --file it would do nothing, so it is refused.
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 2 --dialect legacy
contains "--dialect is the PyTorch CSV dialect of --file; it needs a --file ending in .csv, found --schedule 1f1b"
# --chunks is interleaved-1f1b's: 0 had read as its default 2, and a schedule with its own
# count took it without a word (auto ignored it), as --objective without auto is refused.
expect 2 "$baton" simulate -s interleaved-1f1b -p 2 -m 4 -v 0
contains "--chunks: expected 1 to 64 stages per rank, found 0"
expect 0 "$baton" simulate -s interleaved-1f1b -p 2 -m 4 -v 3
for s in 1f1b auto zb-v 1f1b,zb-h1; do
  expect 2 "$baton" simulate -s $s -p 2 -m 4 -v 1
  contains "--chunks is the stages per rank of interleaved-1f1b (the other schedules have their own); it needs --schedule interleaved-1f1b (alone or in a comparison), found --schedule $s"
done
expect 0 "$baton" simulate -s 1f1b,interleaved-1f1b -p 2 -m 4 -v 3
# A schedule listed twice (or by an alias beside its name) had been compared with itself.
expect 2 "$baton" simulate -s 1f1b,1f1b -p 2 -m 4
contains "--schedule 1f1b,1f1b: 1f1b is listed twice (expected each schedule once)"
expect 2 "$baton" simulate -s interleaved,interleaved-1f1b -p 2 -m 4
contains "interleaved-1f1b is listed twice"
# An empty value (an unset shell variable) had read as the flag's absence: -o "" saved
# nothing, --memory-limit "" set no limit.
for flag in file costs out svg trace; do
  expect 2 "$baton" simulate -s 1f1b -p 2 -m 4 --$flag ""
  contains "--$flag: expected a path, found an empty value (an unset shell variable?)"
done
expect 2 "$baton" simulate -s 1f1b -p 2 -m 4 -c "" -o "" --svg ""
contains "expected a path, found an empty value"
for flag in memory-limit objective dialect; do
  expect 2 "$baton" simulate -s auto -p 2 -m 4 --$flag ""
  contains "--$flag: expected a value, found an empty value (an unset shell variable?)"
done
expect 2 "$baton" simulate --schedule "" -p 2 -m 4
contains "--schedule: expected a value, found an empty value"
expect 2 "$baton" simulate --file "$examples/1f1b_p4_m8.txt" --dialect current
contains "found --file $examples/1f1b_p4_m8.txt"
# A schedule the CSV cannot hold names the file it was to be written to, and writes nothing.
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 2 --lower -o "$tmp/stepped.csv"
contains "stepped.csv: PyTorch CSV: rank 0"
contains "lower(s, step=False)"
[ ! -e "$tmp/stepped.csv" ] || { echo "FAIL: stepped.csv written"; fails=$((fails + 1)); }
printf 'name: a\nname: b\n0: 0F0 0BW0\n' >"$tmp/names.txt"
expect 2 "$baton" simulate --file "$tmp/names.txt"
contains "names.txt:2: name given twice"
expect 2 "$baton" simulate --schedule dualpipev -p 4 -m 3
contains "at least 2 x ranks = 8, found 3"
expect 2 "$baton" simulate --schedule 1f1b -p 4
contains "--stages"
# --lower checks the schedule as written: a STEP on rank 0 only had been taken out and put
# back on every rank, the file reported valid (plain simulate and train refuse it).
printf '0: 0F0 0F1 0BW0 0BW1 STEP\n1: 1F0 1BW0 1F1 1BW1\n' >"$tmp/partial_step.txt"
expect 2 "$baton" simulate --file "$tmp/partial_step.txt" --lower --out "$tmp/lowered.txt"
contains "partial_step.txt: invalid schedule: "
contains "STEP"
[ ! -e "$tmp/lowered.txt" ] || { echo "FAIL: a refused schedule lowered and written"; fails=$((fails + 1)); }
# A name that is not UTF-8 is refused where it is read (it had failed the trace's writer
# with nlohmann's raw type_error, exit 1, after the simulation).
printf 'name: bad\xff\n0: 0F0 0BW0\n' >"$tmp/badname.txt"
expect 2 "$baton" simulate --file "$tmp/badname.txt" --trace "$tmp/badname.json"
contains "badname.txt:1: name: not valid UTF-8 (byte 0xff at byte offset 9 of the line)"
[ ! -e "$tmp/badname.json" ] || { echo "FAIL: a trace of a refused name"; fails=$((fails + 1)); }
# An upper-case extension is the CSV form too (x.CSV had been read as text).
cp "$torch_csv/gpipe_p4_m8.csv" "$tmp/G.CSV"
expect 0 "$baton" simulate --file "$tmp/G.CSV" --dialect detect
contains "valid"
printf '0: 0F0 0W0 0B0\n' >"$tmp/bad.txt"
expect 2 "$baton" simulate --file "$tmp/bad.txt"
contains "W before its B"
printf '0: 0F0 0Q0\n' >"$tmp/bad2.txt"
expect 2 "$baton" simulate --file "$tmp/bad2.txt"
contains "bad2.txt:1"
printf '{"forward": 1}' >"$tmp/c.json"
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 2 --costs "$tmp/c.json"
contains "backward_input: missing"
# Per-rank values for another rank count: the file is named.
printf '{"forward": [1, 1, 1], "backward_input": 2, "backward_weight": 1}' >"$tmp/c3.json"
expect 2 "$baton" simulate --schedule 1f1b -p 4 -m 8 --costs "$tmp/c3.json"
contains "c3.json: "
# trace compare: a file without pipeline actions, a missing second file.
expect 0 "$baton" simulate --schedule 1f1b -p 2 -m 4 --trace "$tmp/t2.json"
echo '[]' >"$tmp/none.json"
expect 2 "$baton" trace compare "$tmp/t2.json" "$tmp/none.json"
contains "none.json: no pipeline action"
expect 2 "$baton" trace compare "$tmp/t2.json"
contains "missing argument 2 (PREDICTED)"
expect 0 "$baton" trace compare "$tmp/t2.json" "$tmp/t2.json"
contains "difference 0.000 ms"
# Costs whose sums would overflow are refused, and no trace is written (it had held "dur": inf).
printf '{"forward": 1e308, "backward_input": 1e308, "backward_weight": 1e308}' >"$tmp/huge.json"
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 4 --costs "$tmp/huge.json" --trace "$tmp/huge-trace.json"
contains "huge.json: $.forward: expected at most 1e9 s, found 1e+308"
[ ! -e "$tmp/huge-trace.json" ] || { echo "FAIL: a trace of overflowed costs"; fails=$((fails + 1)); }
# A trace with an absurd rank is refused naming the event's field (trace svg had drawn a
# row per rank up to it).
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
[e for e in d["traceEvents"] if e["ph"] == "X"][0]["pid"] = 1000000000
json.dump(d, open(sys.argv[2], "w"))' "$tmp/t2.json" "$tmp/pid.json"
expect 2 "$baton" trace svg "$tmp/pid.json" -o "$tmp/pid.svg"
contains ".pid: expected a rank from 0 to 1 (otherData.ranks is 2), found 1000000000"
# A trace holds times up to 1e15 us (Perfetto keeps 64-bit nanoseconds): 1e9 s costs,
# within what cost files allow, sum past it. Refused with nothing written (the trace had
# been written, then refused by trace svg and trace compare).
printf '{"forward": 1e9, "backward_input": 1e9, "backward_weight": 1e9}' >"$tmp/long.json"
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 4 --costs "$tmp/long.json" --trace "$tmp/long-trace.json" -o "$tmp/long-s.json"
contains "beyond 1e15 us (about 31 years)"
[ ! -e "$tmp/long-trace.json" ] && [ ! -e "$tmp/long-s.json" ] || { echo "FAIL: outputs beside a refused trace"; fails=$((fails + 1)); }
# trace compare: timelines of different plans are refused (they had given "F +1509%").
expect 0 "$baton" simulate --schedule 1f1b -p 4 -m 4 --trace "$tmp/t4.json"
expect 2 "$baton" trace compare "$tmp/t2.json" "$tmp/t4.json"
contains "t2.json has 2 pipeline ranks and $tmp/t4.json has 4: timelines of different plans"
# ... and a name's control characters are printed escaped, not sent to the terminal.
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
d["otherData"]["name"] = "x\u001b[2J\u0001\u009b"
json.dump(d, open(sys.argv[2], "w"))' "$tmp/t2.json" "$tmp/esc.json"
expect 0 "$baton" trace compare "$tmp/esc.json" "$tmp/t2.json"
contains 'esc.json: x\x1b[2J\x01\u009b'
if grep -q "$(printf '\033')" "$tmp/out"; then echo "FAIL: a raw ESC printed"; fails=$((fails + 1)); fi
expect 2 "$baton" trace compare --measured "$tmp/t2.json" "$tmp/t2.json"
contains "--measured given twice: by name and as argument 1 (MEASURED)"
# Every command takes --log-level; `baton help CMD` is CMD's --help, --version is version;
# a flag's prefix is no flag (simulate's --out had been read as --output, which it was
# then called).
expect 0 "$baton" trace compare "$tmp/t2.json" "$tmp/t2.json" --log-level warn
expect 0 "$baton" trace svg "$tmp/t2.json" -o "$tmp/t2.svg" --log-level warn
expect 0 "$baton" help simulate
contains "usage: baton simulate"
expect 2 "$baton" help no-such-command
contains "unknown command 'no-such-command'"
expect 0 "$baton" --version
contains "baton "
expect 0 "$baton" version --log-level warn
expect 0 "$baton" help help
contains "usage: baton <command>"
# An infinite limit (1e400) is no number of micro-batches: it had read as "fits".
expect 2 "$baton" simulate -s 1f1b -p 2 -m 4 --memory-limit 1e400
contains "--memory-limit: expected micro-batches (a number > 0) or a size such as 2GiB, found '1e400'"
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 4 --ou "$tmp/guessed.txt"
contains "unrecognised option '--ou'"
# A command of sub-commands given none: the error and usage on standard error alone (the
# usage had gone to standard output, read by a script as the command's output); an error
# names the sub-command it came from.
for group in data trace bench; do
  if [ -n "$("$baton" $group 2>/dev/null)" ]; then echo "FAIL: baton $group wrote to stdout"; fails=$((fails + 1)); fi
done
expect 2 "$baton" trace
contains "baton trace: error: expected a sub-command of trace (predict, compare or svg), found none"
contains "usage: baton trace predict"
expect 2 "$baton" trace draw
contains "expected a sub-command of trace (predict, compare or svg), found 'draw'"
expect 2 "$baton" trace svg "$tmp/t2.json" --bogus
contains "baton trace svg: error: unrecognised option '--bogus'"
expect 0 "$baton" trace --help
contains "usage: baton trace predict"
# trace predict checks both outputs before writing either (-o had been written, then
# --svg refused with exit 2).
printf '{"version": 1, "model": "%s", "devices": 1, "parallel": {"dp": 1, "pp": 1, "tp": 1}, "batch": {"micro_batch_size": 1}, "schedule": {"name": "gpipe", "micro_batches": 2}, "optimizer": "sgd"}' "$examples/../models/mlp.json" >"$tmp/pp1.json"
expect 2 "$baton" trace predict --plan "$tmp/pp1.json" -o "$tmp/p1.json" --svg "$tmp/no/such/p1.svg"
contains "--svg $tmp/no/such/p1.svg: no directory"
[ ! -e "$tmp/p1.json" ] || { echo "FAIL: -o written beside a refused --svg"; fails=$((fails + 1)); }
expect 0 "$baton" trace predict --plan "$tmp/pp1.json" -o "$tmp/p1.json" --svg "$tmp/p1.svg"
[ -s "$tmp/p1.json" ] && [ -s "$tmp/p1.svg" ] || { echo "FAIL: trace predict outputs"; fails=$((fails + 1)); }
expect 2 "$baton" simulate --schedule auto -p 4 -m 8 --memory-limit 0.5
contains "no schedule fits"
expect 2 "$baton" simulate --schedule 1f1b -p 2 -m 2 --svg "$tmp/no/such/dir.svg"
[ ! -e "$tmp/no" ] || { echo "FAIL: half-written output"; fails=$((fails + 1)); }

[ "$fails" -eq 0 ] && echo "all passed"
exit "$fails"
