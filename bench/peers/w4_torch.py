#!/usr/bin/python3
"""W4 peer: the second epoch of W2 from pre-decoded uint8 crops on
torch.utils.data.DataLoader.

The crops are 224x224x3 uint8 arrays stored as .npy files, one file per
image (crop_00000.npy, ...) plus labels.npy, the usual layout of a
pre-decoded image set; with --layout shard the same crops are read from
one [N, 224, 224, 3] .npy per shard, memory-mapped. Each item is flipped
with torchvision's RandomHorizontalFlip on the uint8 CHW tensor, then
converted to float, divided by 255 and normalized with the ImageNet
mean/std (torchvision Normalize) -> batch_size=64, default collate: the
same f32 [64, 3, 224, 224] batches cachew's normalize(channels_first=true)
gives. num_workers 0 or N.

--prepare writes the crops once (untimed): the JPEG bytes of the W2
shards (the same pure-Python TFRecord reader as w2_torch.py) -> PIL
decode -> torchvision RandomResizedCrop(224) with a fixed seed -> uint8.

Prints one JSON line: {"images", "batches", "seconds", "images_per_s",
"workers", "torch", "checksum"}; checksum is the sum of the labels. Exits
non-zero when the image count is not --expect (if given).

Run with Debian's interpreter: /usr/bin/python3 (python3-torch 1.13).
"""
import argparse
import glob
import io
import json
import os
import sys
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import w2_torch  # noqa: E402  (the TFRecord + Example reader)

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
SHARD_IMAGES = 500


def prepare(data, out):
    """Decodes and crops every image of the W2 shards in `data` into
    `out` (written to a temporary directory, renamed when complete)."""
    files = sorted(glob.glob(f"{data}/*.tfrecord"))
    if not files:
        raise SystemExit(f"w4_torch: no *.tfrecord in {data}")
    tmp = out + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    torch.manual_seed(1)
    crop = transforms.RandomResizedCrop(224)
    labels, shard, nshard, i = [], [], 0, 0
    for path in files:
        for record in w2_torch.tfrecords(path):
            jpeg, label = w2_torch.parse_example(record)
            img = crop(Image.open(io.BytesIO(jpeg)).convert("RGB"))
            arr = np.asarray(img, dtype=np.uint8)
            np.save(os.path.join(tmp, f"crop_{i:05d}.npy"), arr)
            shard.append(arr)
            if len(shard) == SHARD_IMAGES:
                np.save(os.path.join(tmp, f"shard_{nshard:03d}.npy"),
                        np.stack(shard))
                shard, nshard = [], nshard + 1
            labels.append(label)
            i += 1
    if shard:
        np.save(os.path.join(tmp, f"shard_{nshard:03d}.npy"), np.stack(shard))
    np.save(os.path.join(tmp, "labels.npy"), np.asarray(labels, np.int64))
    os.rename(tmp, out)
    print(json.dumps({"images": i, "out": out}))


class Crops(Dataset):
    """One item per crop: the uint8 [224, 224, 3] array -> flip ->
    normalize -> f32 [3, 224, 224], and the label."""

    def __init__(self, d, layout):
        self.labels = np.load(os.path.join(d, "labels.npy"))
        self.layout = layout
        if layout == "image":
            self.paths = [os.path.join(d, f"crop_{i:05d}.npy")
                          for i in range(len(self.labels))]
        else:
            self.shard_paths = sorted(glob.glob(os.path.join(d,
                                                             "shard_*.npy")))
            self.shards = None  # opened per worker (mmap)
        self.flip = transforms.RandomHorizontalFlip()
        self.norm = transforms.Normalize(MEAN, STD)

    def __len__(self):
        return len(self.labels)

    def crop(self, i):
        if self.layout == "image":
            return np.load(self.paths[i])
        if self.shards is None:
            self.shards = [np.load(p, mmap_mode="r")
                           for p in self.shard_paths]
        return np.array(self.shards[i // SHARD_IMAGES][i % SHARD_IMAGES])

    def __getitem__(self, i):
        x = torch.from_numpy(self.crop(i)).permute(2, 0, 1)  # uint8 CHW
        x = self.flip(x)
        x = self.norm(x.float().div_(255))
        return x, int(self.labels[i])


def worker_init(_worker_id):
    torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepare", action="store_true",
                    help="write the .npy crops of --data into --npy")
    ap.add_argument("--data", help="W2 shards (with --prepare)")
    ap.add_argument("--npy", required=True, help="directory of .npy crops")
    ap.add_argument("--layout", choices=["image", "shard"], default="image")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--expect", type=int, default=-1,
                    help="the number of images there must be")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.prepare:
        if not args.data:
            ap.error("--prepare needs --data")
        prepare(args.data, args.npy)
        return 0
    torch.manual_seed(1)
    loader = DataLoader(Crops(args.npy, args.layout), batch_size=args.batch,
                        num_workers=args.workers,
                        worker_init_fn=worker_init if args.workers else None)
    images = batches = checksum = 0
    t0 = time.perf_counter()
    for x, y in loader:
        if x.shape[1:] != (3, 224, 224) or x.dtype != torch.float32:
            print(f"w4_torch: batch {tuple(x.shape)} {x.dtype}",
                  file=sys.stderr)
            return 1
        images += x.shape[0]
        batches += 1
        checksum += int(y.sum())
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "images": images, "batches": batches, "seconds": seconds,
        "images_per_s": images / seconds if seconds > 0 else 0.0,
        "workers": args.workers, "torch": torch.__version__,
        "checksum": checksum,
    }))
    if args.expect >= 0 and images != args.expect:
        print(f"w4_torch: {images} images, expected {args.expect}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
