#!/usr/bin/env python3
"""tools/hf_tokenize.py with a stand-in for the `tokenizers` package (whitespace words,
ids from a fixed vocabulary): lines end at "\\n" only, as `baton data prepare` reads them
(a lone "\\r" had split a line); blank lines are skipped, with --append-eod too; a
malformed JSON line is exit 2 naming FILE:LINE (it had been a traceback) and leaves no
temporary file; the pair it writes replaces an earlier one and `baton data inspect`
reads it. With a byte-level stand-in (every whitespace character a token) a CRLF file's
"\r" ends no document and blank lines are no documents, as for `baton data prepare`; an
unpaired surrogate escape in a JSON line is exit 2 naming FILE:LINE (a traceback with the
real package), and so are a repeated key and NaN or Infinity (accepted, where `baton data
prepare` refuses them); an added token's id beyond the count of tokens picks the dtype. Arguments: the baton binary, the source tree.
"""
import os
import subprocess
import sys
import tempfile

baton, src = sys.argv[1], sys.argv[2]
try:
    import numpy  # noqa: F401  (hf_tokenize.py needs it)
except ImportError:
    print("skipped: no numpy for", sys.executable)
    sys.exit(77)

STUB = '''
import json
import re
class _Encoding:
    def __init__(self, ids):
        self.ids = ids
class Tokenizer:
    def __init__(self, vocab, byte_level=False):
        self.vocab = vocab
        self.byte_level = byte_level
    @staticmethod
    def from_file(path):
        with open(path) as f:
            j = json.load(f)
        return Tokenizer(j["vocab"], j.get("byte_level", False))
    def get_vocab_size(self, with_added_tokens=True):
        return len(self.vocab)
    def get_vocab(self, with_added_tokens=True):
        return dict(self.vocab)
    def token_to_id(self, t):
        return self.vocab.get(t)
    def encode(self, text, add_special_tokens=True):
        words = re.findall(r"\\S+|\\s", text) if self.byte_level else text.split()
        return _Encoding([self.vocab.get(w, 0) for w in words])
'''
failures = 0


def check(ok, what, out=""):
    global failures
    if not ok:
        failures += 1
        print(f"FAIL: {what}\n{out}")


with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "tokenizers.py"), "w") as f:
        f.write(STUB)
    tok = os.path.join(d, "tok.json")
    with open(tok, "w") as f:
        f.write('{"vocab": {"<unk>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "d": 5, "last": 6}}')
    env = dict(os.environ, PYTHONPATH=d)

    def run(*args, tokenizer=tok):
        return subprocess.run([sys.executable, os.path.join(src, "tools/hf_tokenize.py"), "--tokenizer",
                               tokenizer, *args], capture_output=True, text=True, env=env)

    def inspect(prefix):
        return subprocess.run([baton, "data", "inspect", prefix, "--samples", "5"], capture_output=True,
                              text=True).stdout

    corpus = os.path.join(d, "c.txt")
    with open(corpus, "wb") as f:
        f.write(b"a b\rc d\r\n\r\n  \nlast\n")
    out = os.path.join(d, "out")
    r = run("--input", corpus, "--out", out, "--append-eod")
    check(r.returncode == 0, "hf_tokenize.py on text", r.stdout + r.stderr)
    shown = inspect(out)
    check("documents  2\n" in shown, "a lone CR splits no line; blank lines are no documents", shown)
    check("document 0 (5 tokens): 2 3 4 5 1" in shown, "the first line whole, then </s>", shown)
    check("document 1 (2 tokens): 6 1" in shown, "the last line", shown)
    check("2 blank lines skipped" in r.stdout, "blank lines counted", r.stdout)

    # Written again under the same name: the new pair, no temporary or set-aside file.
    with open(corpus, "wb") as f:
        f.write(b"c c c\n")
    r = run("--input", corpus, "--out", out)
    check(r.returncode == 0, "hf_tokenize.py again", r.stdout + r.stderr)
    shown = inspect(out)
    check("documents  1\n" in shown and "document 0 (3 tokens): 4 4 4" in shown, "the new pair", shown)
    left = sorted(n for n in os.listdir(d) if n.startswith("out."))
    check(left == ["out.bin", "out.idx"], f"only the pair is left, found {left}")

    # --eod-token alone had been ignored, even naming a token the tokenizer lacks.
    r = run("--input", corpus, "--out", out, "--eod-token", "<nosuch>")
    check(r.returncode == 2 and "give --append-eod too" in r.stderr, "--eod-token without --append-eod",
          r.stdout + r.stderr)

    jsonl = os.path.join(d, "bad.jsonl")
    with open(jsonl, "w") as f:
        f.write('{"text": "a b"}\n{"text": "c\n')
    r = run("--input", jsonl, "--out", os.path.join(d, "bad"))
    check(r.returncode == 2, f"a malformed JSON line: exit 2, found {r.returncode}", r.stderr)
    check(f"{jsonl}:2: expected a JSON object per line" in r.stderr, "names FILE:LINE", r.stderr)
    check("Traceback" not in r.stderr, "no traceback", r.stderr)
    left = sorted(n for n in os.listdir(d) if n.startswith("bad."))
    check(left == ["bad.jsonl"], f"no temporary file left, found {left}")

    # A byte-level tokenizer sees every whitespace character: a CRLF line's "\r" is no part
    # of the line, and lines of blanks are no documents (each had been one).
    byte_tok = os.path.join(d, "byte.json")
    with open(byte_tok, "w") as f:
        f.write('{"byte_level": true, "vocab": {"<unk>": 0, "</s>": 1, "a": 2, "b": 3, "last": 6, '
                '" ": 7, "\\r": 8}}')
    crlf = os.path.join(d, "crlf.txt")
    with open(crlf, "wb") as f:
        f.write(b"a b\r\n\r\n   \r\nlast\r\n\r\n")
    r = run("--input", crlf, "--out", os.path.join(d, "crlf"), "--append-eod", tokenizer=byte_tok)
    check(r.returncode == 0, "hf_tokenize.py on a CRLF file", r.stdout + r.stderr)
    shown = inspect(os.path.join(d, "crlf"))
    check("documents  2\n" in shown, "blank CRLF lines are no documents", shown)
    check("document 0 (4 tokens): 2 7 3 1\n" in shown, "no \\r token before </s>", shown)
    check("document 1 (2 tokens): 6 1\n" in shown, "the last line", shown)
    check("3 blank lines skipped" in r.stdout, "blank lines counted", r.stdout)

    # JSON that Python reads but that holds no UTF-8 text, and a field of another type.
    for name, text, message in [
            ("sur", '{"text": "a"}\n{"text": "b\\ud800"}\n',
             ":2: expected a JSON object per line, found invalid JSON: an unpaired surrogate escape "
             "(\\ud800)"),
            ("num", '{"text": 3}\n', ':1: $.text: expected a string (--json-key), found a number (3)'),
            ("arr", '[1, 2]\n', ":1: expected a JSON object per line, found an array ([1,2])")]:
        path = os.path.join(d, name + ".jsonl")
        with open(path, "w") as f:
            f.write(text)
        r = run("--input", path, "--out", os.path.join(d, name), tokenizer=byte_tok)
        check(r.returncode == 2, f"{name}: exit 2, found {r.returncode}", r.stderr)
        check(path + message in r.stderr, f"{name}: names FILE:LINE and what was found", r.stderr)
        check("Traceback" not in r.stderr, f"{name}: no traceback", r.stderr)

    # JSON that Python reads and `baton data prepare` refuses: a repeated key (Python had
    # kept the last), NaN and Infinity.
    for name, text, message in [
            ("dup", '{"text": "a", "text": "b"}\n',
             ":1: $.text: the field 'text' appears twice in one object"),
            ("dupin", '{"text": "a", "m": [{"k": 1, "k": 2}]}\n',
             ":1: $.m[0].k: the field 'k' appears twice in one object"),
            ("nan", '{"text": "a", "n": NaN}\n',
             ":1: expected a JSON object per line, found invalid JSON: NaN"),
            ("inf", '{"text": "a", "n": -Infinity}\n',
             ":1: expected a JSON object per line, found invalid JSON: -Infinity"),
            ("big", '{"text": "a", "n": 1e999}\n',
             ":1: expected a JSON object per line, found invalid JSON: number overflow parsing "
             "'1e999'"),
            # Deeper than prepare's 256 levels: had been read, and a RecursionError from
            # about 900 levels.
            ("deep", '{"text": "a", "x": ' + "[" * 300 + "]" * 300 + "}\n",
             ":1: nested deeper than 256 levels (at column 275)"),
            ("deeper", '{"text": "a", "x": ' + "[" * 5000 + "]" * 5000 + "}\n",
             ":1: nested deeper than 256 levels"),
            ("bom", '{"text": "a"}\n\ufeff{"text": "b"}\n',
             ":2: expected a JSON object per line, found invalid JSON: a UTF-8 byte order mark")]:
        path = os.path.join(d, name + ".jsonl")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        r = run("--input", path, "--out", os.path.join(d, name))
        check(r.returncode == 2, f"{name}: exit 2, found {r.returncode}", r.stderr)
        check(path + message in r.stderr, f"{name}: names FILE:LINE and what was found", r.stderr)
        check("Traceback" not in r.stderr, f"{name}: no traceback", r.stderr)

    # A byte order mark may start the file (Python's json had refused it), as for prepare.
    path = os.path.join(d, "bom1.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.write('\ufeff{"text": "a"}\n{"text": "b"}\n')
    r = run("--input", path, "--out", os.path.join(d, "bom1"))
    check(r.returncode == 0, "a byte order mark at the file's start", r.stdout + r.stderr)

    # An added token's id beyond the count of tokens: the dtype follows the largest id (the
    # count, 3, had chosen uint16 and id 70000 had overflowed it).
    gap_tok = os.path.join(d, "gap.json")
    with open(gap_tok, "w") as f:
        f.write('{"vocab": {"<unk>": 0, "a": 2, "</s>": 70000}}')
    r = run("--input", corpus, "--out", os.path.join(d, "gap"), "--append-eod", tokenizer=gap_tok)
    check(r.returncode == 0, "hf_tokenize.py with an id beyond the count", r.stdout + r.stderr)
    check("(int32, vocabulary 70001)" in r.stdout, "int32 for an id of 70000", r.stdout)
    shown = inspect(os.path.join(d, "gap"))
    check("document 0 (4 tokens): 0 0 0 70000" in shown, "the id read back whole", shown)

if failures:
    sys.exit(1)
print("ok")
