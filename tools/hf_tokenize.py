#!/usr/bin/env python3
"""Tokenizes a corpus with a Hugging Face tokenizer.json into Megatron-LM's indexed
dataset format (PREFIX.bin + PREFIX.idx), the format `baton train --data PREFIX` reads and
`baton data prepare` writes with SentencePiece. One document per non-empty line of a text
file, or per JSON record of a .jsonl (field --json-key, default "text").

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


def documents(path, key):
    jsonl = path.endswith(".jsonl") or path.endswith(".json")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if jsonl:
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get(key), str):
                    sys.exit(f"{path}:{n}: expected a JSON object with a string field '{key}'")
                text = record[key]
            else:
                text = line.rstrip("\n")
            if text:
                yield text


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
    out_dir = os.path.dirname(args.out)
    if out_dir and not os.path.isdir(out_dir):
        sys.exit(f"--out {args.out}: no directory {out_dir}")

    tok = Tokenizer.from_file(args.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = numpy.uint16 if vocab < 65500 else numpy.int32
    eod = None
    if args.append_eod:
        names = [args.eod_token] if args.eod_token else ["<|endoftext|>", "</s>", "<eos>"]
        ids = [tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None]
        if not ids:
            sys.exit(f"{args.tokenizer}: no end-of-document token among {names} (--eod-token)")
        eod = ids[0]

    lengths = []
    tmp_bin, tmp_idx = args.out + ".bin.tmp", args.out + ".idx.tmp"
    with open(tmp_bin, "wb") as bin_file:
        for text in documents(args.input, args.json_key):
            ids = tok.encode(text, add_special_tokens=False).ids
            if eod is not None:
                ids.append(eod)
            if not ids:
                continue
            bin_file.write(numpy.asarray(ids, dtype=dtype).tobytes())
            lengths.append(len(ids))
    if not lengths:
        os.remove(tmp_bin)
        sys.exit(f"{args.input}: no documents")
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
    os.replace(tmp_bin, args.out + ".bin")
    os.replace(tmp_idx, args.out + ".idx")
    print(f"{args.out}.bin, {args.out}.idx: {len(lengths)} documents, {sum(lengths)} tokens "
          f"({numpy.dtype(dtype).name}, vocabulary {vocab})")


if __name__ == "__main__":
    main()
