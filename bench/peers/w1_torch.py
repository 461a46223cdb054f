#!/usr/bin/python3
"""W1 peer: per-element overhead of torch.utils.data.DataLoader.

range(N) -> x + 1 (per element, in Python, as a user would write it)
-> batch_size=64 with the default collate, num_workers 0 or 2.

Prints one JSON line: {"elements", "batches", "seconds", "elements_per_s",
"workers", "checksum"}. `elements` counts INPUT elements (N), as on the
cachew side. Exits non-zero when the count (always) or the sum of the
yielded values (with --verify) is not what range(N) + 1 gives.

Run with Debian's interpreter: /usr/bin/python3 (python3-torch 1.13).
"""
import argparse
import json
import sys
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info


class AddOne(IterableDataset):
    """Yields x + 1 for x in range(n); each DataLoader worker a disjoint
    strided shard, so that all workers together yield n elements."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            start, step = 0, 1
        else:
            start, step = info.id, info.num_workers
        for x in range(start, self.n, step):
            yield x + 1


def worker_init(_worker_id):
    torch.set_num_threads(1)


def run(n, workers, batch_size, verify):
    loader = DataLoader(AddOne(n), batch_size=batch_size,
                        num_workers=workers,
                        worker_init_fn=worker_init if workers else None)
    elements = 0
    batches = 0
    total = 0
    t0 = time.perf_counter()
    if verify:
        for batch in loader:
            elements += len(batch)
            batches += 1
            total += int(batch.sum())
    else:
        for batch in loader:
            elements += len(batch)
            batches += 1
    seconds = time.perf_counter() - t0
    return elements, batches, total, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True, help="elements (N)")
    ap.add_argument("--workers", type=int, default=0,
                    help="DataLoader num_workers (default 0)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--verify", action="store_true",
                    help="also check the sum of the values (slower loop)")
    args = ap.parse_args()
    if args.n < 0 or args.workers < 0 or args.batch < 1:
        ap.error("--n and --workers must be >= 0, --batch >= 1")

    torch.set_num_threads(1)
    elements, batches, total, seconds = run(
        args.n, args.workers, args.batch, args.verify)

    ok = True
    if elements != args.n:
        print(f"w1_torch: got {elements} elements, expected {args.n}",
              file=sys.stderr)
        ok = False
    expected_sum = args.n * (args.n + 1) // 2
    if args.verify and total != expected_sum:
        print(f"w1_torch: sum {total}, expected {expected_sum}",
              file=sys.stderr)
        ok = False
    print(json.dumps({
        "elements": elements,
        "batches": batches,
        "seconds": seconds,
        "elements_per_s": elements / seconds if seconds > 0 else 0.0,
        "workers": args.workers,
        "torch": torch.__version__,
        "checksum": total if args.verify else None,
    }))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
