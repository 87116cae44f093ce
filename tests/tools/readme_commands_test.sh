#!/usr/bin/env bash
# The README's command lines, run as a newcomer pastes them from the repository root:
# every line of its code blocks that starts with ./build/release/baton or
# build/release/baton (with its continuation lines), in order, in a scratch folder that
# holds the build and examples/ (they write sp.model, corpus, plan.json, ckpt, ...). The
# JSON block the LLaMA commands read is written to tiny-llama.json, their --model. Lines
# for an installed `baton` (the long-run example, 100,000 steps on a corpus.txt) are not
# run. Any command that fails fails the test, naming it.
#   readme_commands_test.sh <baton binary's folder> <source root>
set -u
bin="$1"
root="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/build"
ln -s "$bin" "$tmp/build/release"
ln -s "$root/examples" "$tmp/examples"

python3 - "$root/README.md" "$tmp" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
out = sys.argv[2]
commands = []
for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
    if lang == "json" and '"tiny-llama"' in body:
        open(out + "/tiny-llama.json", "w").write(body)
        continue
    line = ""
    for raw in body.splitlines():
        line += raw
        if line.endswith("\\"):
            line = line[:-1] + " "
            continue
        cmd = line.split("  #")[0].strip()  # the README's trailing comments
        if cmd.startswith(("./build/release/baton ", "build/release/baton ")):
            commands.append(cmd)
        line = ""
open(out + "/commands", "w").write("\n".join(commands) + "\n")
PY
n=$(wc -l < "$tmp/commands")
[ "$n" -ge 15 ] || { echo "FAIL: found $n README commands, expected 15 or more"; exit 1; }
[ -s "$tmp/tiny-llama.json" ] || { echo "FAIL: no tiny-llama JSON block in the README"; exit 1; }
cd "$tmp"
fails=0
while IFS= read -r cmd; do
  if ! bash -c "$cmd" > out 2>&1; then
    echo "FAIL: $cmd"
    tail -5 out
    fails=$((fails + 1))
  fi
done < commands
echo "ran $n README commands, $fails failed"
[ "$fails" -eq 0 ]
