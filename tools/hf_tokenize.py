#!/usr/bin/env python3
"""Tokenizes a corpus with a Hugging Face tokenizer.json into Megatron-LM's indexed
dataset format (PREFIX.bin + PREFIX.idx), the format `baton train --data PREFIX` reads and
`baton data prepare` writes with SentencePiece. One document per line of a text file, or
per JSON record of a .jsonl or .json (JSON Lines; field --json-key, default "text"), with
prepare's line rules: a line ends at "\n" (a CRLF line's "\r" is no part of it), and a
line or text of only whitespace is no document.

Needs the `tokenizers` and `numpy` packages (optional: baton's tests never use it):
    pip install tokenizers numpy
    tools/hf_tokenize.py --tokenizer tokenizer.json --input corpus.jsonl --out data/corpus [--append-eod]
The format is described in docs/formats/data.md.
"""
import argparse
import json
import os
import struct
import sys

import numpy
from tokenizers import Tokenizer

MAGIC = b"MMIDIDX\x00\x00"
CODES = {numpy.uint16: 8, numpy.int32: 4}


def fail(message):
    """Bad input, as baton reports it: the message and exit code 2."""
    print(message, file=sys.stderr)
    sys.exit(2)


def describe(value):
    """A JSON value for a message, as baton names it: its type and (short) text."""
    kind = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "a null"}.get(type(value), "a number")
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return f"{kind} ({text[:37] + '...' if len(text) > 40 else text})"


class _Pairs(list):
    """A JSON object's (key, value) pairs as read, a repeated key kept."""


class _BadJson(Exception):
    pass


def _no_constant(name):
    raise _BadJson(f"{name} (JSON has no NaN nor Infinity)")


def _no_infinity(text):
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # As prepare's reader: a number too large for a double is no number.
        raise _BadJson(f"number overflow parsing '{text}' (JSON has no Infinity)")
    return value


MAX_DEPTH = 256


def _too_deep(line):
    """The column (from 1) where `line` opens its (MAX_DEPTH + 1)th level of nesting, or
    None: looked for without recursion before Python's parser, which had taken 300
    levels that prepare refuses and failed with a RecursionError from about 900."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(line):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return i + 1
        elif ch in "]}":
            depth -= 1
    return None


def _strict(value, where="$"):
    """The record with its objects as dicts. A key repeated in one object is an error, as
    for `baton data prepare` (Python keeps the last, other readers the first)."""
    if isinstance(value, _Pairs):
        out = {}
        for k, v in value:
            if k in out:
                raise _BadJson(f"{where}.{k}: the field '{k}' appears twice in one object "
                               "(readers differ on which one counts)")
            out[k] = _strict(v, f"{where}.{k}")
        return out
    if isinstance(value, list):
        return [_strict(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def documents(path, key):
    """(line number, text) of each line or record, with `baton data prepare`'s rules: lines
    end at "\n" only (Python's universal newlines had split a line at a lone "\r"), and a
    CRLF line's "\r" is dropped (a byte-level BPE had ended every document of a CRLF file
    with a "\r" token). A blank JSON line is no record."""
    jsonl = os.path.splitext(path)[1].lower() in (".jsonl", ".json", ".ndjson")
    try:
        f = open(path, "rb")
    except OSError as e:
        fail(f"{path}: cannot open file (missing or unreadable): {e.strerror}")
    with f:
        for n, raw in enumerate(f, 1):
            raw = raw[:-1] if raw.endswith(b"\n") else raw
            raw = raw[:-1] if raw.endswith(b"\r") else raw
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                fail(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start})")
            if jsonl:
                if not line.strip(" \t\r"):
                    continue
                # A byte order mark may start the file, as for prepare, and no later line
                # (Python's json had refused it on the first line too).
                if line.startswith("\ufeff"):
                    if n > 1:
                        fail(f"{path}:{n}: expected a JSON object per line, found invalid JSON: "
                             "a UTF-8 byte order mark at column 1 (only the file's first line "
                             "may start with one)")
                    line = line[1:]
                column = _too_deep(line)
                if column is not None:
                    fail(f"{path}:{n}: nested deeper than {MAX_DEPTH} levels (at column {column})")
                try:
                    record = _strict(json.loads(line, object_pairs_hook=_Pairs,
                                                parse_constant=_no_constant,
                                                parse_float=_no_infinity))
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: expected a JSON object per line, found invalid JSON: "
                         f"{e.msg} at column {e.colno}")
                except _BadJson as e:
                    message = str(e)
                    fail(f"{path}:{n}: " + (message if message.startswith("$") else
                                            "expected a JSON object per line, found invalid "
                                            f"JSON: {message}"))
                # Python reads an unpaired surrogate escape ("\ud800"), which no UTF-8
                # text holds: the tokenizer had failed on it with a traceback.
                try:
                    json.dumps(record, ensure_ascii=False).encode("utf-8")
                except UnicodeEncodeError as e:
                    fail(f"{path}:{n}: expected a JSON object per line, found invalid JSON: an "
                         f"unpaired surrogate escape (\\u{ord(e.object[e.start]):04x}), which is no character")
                if not isinstance(record, dict):
                    fail(f"{path}:{n}: expected a JSON object per line, found {describe(record)}")
                if key not in record:
                    fail(f'{path}:{n}: no field "{key}" (--json-key names the field holding the text)')
                if not isinstance(record[key], str):
                    fail(f"{path}:{n}: $.{key}: expected a string (--json-key), found {describe(record[key])}")
                line = record[key]
            yield n, line


def write_durably(f):
    f.flush()
    os.fsync(f.fileno())


def replace_pair(out, tmp_bin, tmp_idx):
    """As baton's IndexedDatasetWriter: the earlier index steps aside until the new .bin is
    in place (put back if that fails), so no reader pairs a new .bin with an old .idx and a
    failure never loses the earlier pair."""
    idx, old = out + ".idx", out + ".idx.old"
    had_idx = os.path.lexists(idx)
    if had_idx:
        os.replace(idx, old)
    try:
        os.replace(tmp_bin, out + ".bin")
    except OSError:
        if had_idx:
            os.replace(old, idx)
        raise
    os.replace(tmp_idx, idx)
    # Whether or not this run set it aside: one an interrupted run left is stale now.
    if os.path.lexists(old):
        os.remove(old)
    dir_fd = os.open(os.path.dirname(out) or ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    ap.add_argument("--input", required=True, help="corpus.txt or corpus.jsonl")
    ap.add_argument("--out", required=True, help="output prefix")
    ap.add_argument("--json-key", default="text")
    ap.add_argument("--append-eod", action="store_true",
                    help="end each document with the end-of-text token (--eod-token)")
    ap.add_argument("--eod-token", default=None,
                    help="the end-of-document token's text (default: <|endoftext|>, </s> or <eos>)")
    args = ap.parse_args()
    # Alone it had been ignored, even naming a token the tokenizer lacks.
    if args.eod_token is not None and not args.append_eod:
        fail(f"--eod-token {args.eod_token}: names the token --append-eod appends; give --append-eod too")
    # "--out tok.bin" names the pair's data file: its prefix is tok (tok.bin.bin had been
    # written, which --data tok.bin did not find).
    name = os.path.basename(args.out)
    prefix_dir = args.out[:len(args.out) - len(name)]
    if name in (".bin", ".idx", "..bin", "..idx"):
        fail(f"--out {args.out}: expected a prefix ending in a file name "
             f"({prefix_dir}NAME writes {prefix_dir}NAME.bin and {prefix_dir}NAME.idx)")
    if name.endswith((".bin", ".idx")):  # lower case, as --data finds the pair by its .bin
        args.out = args.out[:-4]
    out_dir = os.path.dirname(args.out)
    if out_dir and not os.path.isdir(out_dir):
        fail(f"--out {args.out}: no directory {out_dir}")
    for ext in (".bin", ".idx", ".bin.tmp", ".idx.tmp", ".idx.old"):
        if os.path.exists(args.out + ext) and not os.path.isfile(args.out + ext):
            fail(f"--out {args.out}: {args.out + ext} is not a regular file, expected a file to write (or none)")

    try:
        tok = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # tokenizers raises its own Exception types
        fail(f"{args.tokenizer}: not a Hugging Face tokenizer.json (--tokenizer): {e}")
    # The largest id + 1, not the count of tokens: an added token's id may lie beyond the
    # rest (an id of 70000 among 200 tokens had overflowed uint16).
    vocab = max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    dtype = numpy.uint16 if vocab < 65500 else numpy.int32
    eod = None
    if args.append_eod:
        names = [args.eod_token] if args.eod_token else ["<|endoftext|>", "</s>", "<eos>"]
        ids = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if not ids:
            fail(f"{args.tokenizer}: no end-of-document token among {names} (--eod-token)")
        eod = ids[0]

    lengths = []
    skipped = 0
    tmp_bin, tmp_idx = args.out + ".bin.tmp", args.out + ".idx.tmp"
    try:
        with open(tmp_bin, "wb") as bin_file:
            for n, text in documents(args.input, args.json_key):
                # Only whitespace: no document, as SentencePiece encodes it to nothing for
                # prepare (a byte-level BPE had made documents of blanks).
                if not text.strip():
                    skipped += 1
                    continue
                ids = tok.encode(text, add_special_tokens=False).ids
                # A text that encodes to nothing: skipped, as `baton data prepare` and
                # Megatron's preprocess_data.py do, not a document of only the EOD token.
                if not ids:
                    skipped += 1
                    continue
                if eod is not None:
                    ids.append(eod)
                bin_file.write(numpy.asarray(ids, dtype=dtype).tobytes())
                lengths.append(len(ids))
            write_durably(bin_file)
        if not lengths:
            fail(f"{args.input}: no documents (every line empty or blank)")
        item = numpy.dtype(dtype).itemsize
        pointers = numpy.concatenate([[0], numpy.cumsum(numpy.asarray(lengths, dtype=numpy.int64) * item)[:-1]])
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", 1))
            f.write(struct.pack("<B", CODES[dtype]))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(lengths) + 1))
            f.write(numpy.asarray(lengths, dtype="<i4").tobytes())
            f.write(numpy.asarray(pointers, dtype="<i8").tobytes())
            f.write(numpy.arange(len(lengths) + 1, dtype="<i8").tobytes())
            write_durably(f)
        replace_pair(args.out, tmp_bin, tmp_idx)
    except BaseException:
        # Any failure (bad input, a full disk, Ctrl-C) leaves no temporary file behind.
        for p in (tmp_bin, tmp_idx):
            if os.path.isfile(p):
                os.remove(p)
        raise
    print(f"{args.out}.bin, {args.out}.idx: {len(lengths)} documents, {sum(lengths)} tokens "
          f"({numpy.dtype(dtype).name}, vocabulary {vocab})"
          + (f"; {skipped} blank lines skipped" if skipped else ""))


if __name__ == "__main__":
    main()
