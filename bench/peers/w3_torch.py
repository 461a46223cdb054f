#!/usr/bin/python3
"""W3 peer: text tokenization on torch.utils.data.DataLoader.

The lines of text files (written by `cachew gen text`) -> the same
tokenizer as cachew's tokenize, in Python: ASCII-lowercase, split on
whitespace (str.lower().split() on ASCII text), each word hashed to an id
in [0, 2^18) -> padded/truncated to 128 ids (pad 0) -> an int64 tensor
-> batch_size=256 with the default collate; num_workers 0 (or N).

The hash: Python's own hash() of a str is randomized per process, so the
peer uses zlib.crc32 of the word's UTF-8 bytes mod 2^18, a stable hash
implemented in C (cachew uses XXH3-64; the ids differ, the work per word
is comparable: one C call per word).

Prints one JSON line: {"documents", "batches", "seconds",
"documents_per_s", "workers", "torch", "tokens"}: `tokens` counts the
words before truncation, a check that both sides split alike.

Run with Debian's interpreter: /usr/bin/python3 (python3-torch 1.13).
"""
import argparse
import glob
import json
import sys
import time
import zlib

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

VOCAB = 1 << 18


class TokenizedLines(IterableDataset):
    def __init__(self, files, length):
        super().__init__()
        self.files = files
        self.length = length

    def __iter__(self):
        info = get_worker_info()
        files = self.files
        if info is not None:
            files = files[info.id::info.num_workers]
        n = self.length
        for path in files:
            with open(path, "rb") as f:
                for raw in f:
                    words = raw.decode("utf-8", "replace").lower().split()
                    ids = [zlib.crc32(w.encode()) % VOCAB for w in words]
                    count = len(ids)
                    ids = ids[:n] + [0] * (n - count)
                    yield torch.tensor(ids, dtype=torch.int64), count


def worker_init(_worker_id):
    torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="directory of *.txt")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--len", type=int, default=128)
    ap.add_argument("--expect", type=int, default=-1,
                    help="the number of documents there must be")
    args = ap.parse_args()
    files = sorted(glob.glob(f"{args.data}/*.txt"))
    if not files:
        print(f"w3_torch: no *.txt in {args.data}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    loader = DataLoader(TokenizedLines(files, args.len),
                        batch_size=args.batch, num_workers=args.workers,
                        worker_init_fn=worker_init if args.workers else None)
    documents = batches = tokens = 0
    t0 = time.perf_counter()
    for x, count in loader:
        documents += x.shape[0]
        batches += 1
        tokens += int(count.sum())
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "documents": documents, "batches": batches, "seconds": seconds,
        "documents_per_s": documents / seconds if seconds > 0 else 0.0,
        "workers": args.workers, "torch": torch.__version__,
        "tokens": tokens,
    }))
    if args.expect >= 0 and documents != args.expect:
        print(f"w3_torch: {documents} documents, expected {args.expect}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
