#!/usr/bin/python3
"""W2 peer: the ImageNet input pipeline on torch.utils.data.DataLoader.

TFRecord shards of tf.train.Example (written by `cachew gen imagenet`) ->
the JPEG bytes and label of each record -> decode, random resized crop
224, random horizontal flip, to float, Normalize(ImageNet mean/std) ->
batch_size=64, default collate; num_workers 0 or N. Three decoders, the
CPU paths a PyTorch user would pick (--decoder):

  pil        PIL decode + torchvision RandomResizedCrop(224),
             RandomHorizontalFlip(), ToTensor(), Normalize: the tutorial's
  pil-draft  the crop box drawn first (RandomResizedCrop.get_params), then
             PIL's Image.draft() asks libjpeg for the smallest DCT scale
             (1/2, 1/4, 1/8) that still gives the box at least 224 pixels
             a side, and one Image.resize(box=) crops and scales: the
             reduced decode fast loaders use, as cachew's fused crop does
  tvio       torchvision.io.decode_jpeg (libjpeg-turbo into a uint8 CHW
             tensor), then the same transforms on the tensor:
             RandomResizedCrop(224), RandomHorizontalFlip(),
             ConvertImageDtype(float32), Normalize

The records are read by a small pure-Python TFRecord reader (length,
length CRC, data, data CRC; the CRCs are skipped, as
tf.data's reader does without verification) and a minimal protobuf
decoder for the two features used, so both sides read the SAME bytes from
the SAME files. Each DataLoader worker reads a disjoint set of shards
(shard i goes to worker i % num_workers).

Prints one JSON line: {"images", "batches", "seconds", "images_per_s",
"workers", "decoder", "torch", "checksum"}; checksum is the sum of the
labels.
Exits non-zero when the image count is not --expect (if given).

Run with Debian's interpreter: /usr/bin/python3 (python3-torch 1.13).
"""
import argparse
import glob
import io
import json
import struct
import sys
import time

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from torchvision import transforms
from torchvision.io import ImageReadMode, decode_jpeg

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def tfrecords(path):
    """Yields the records of one TFRecord file (CRCs not verified)."""
    with open(path, "rb") as f:
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) != 12:
                raise ValueError(f"{path}: truncated record header")
            (length,) = struct.unpack("<Q", head[:8])
            data = f.read(length)
            if len(data) != length or len(f.read(4)) != 4:
                raise ValueError(f"{path}: truncated record")
            yield data


def varint(buf, pos):
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def fields(buf):
    """(field number, wire type, value) of a protobuf message; value is
    bytes for length-delimited fields, an int for varints."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            val, pos = varint(buf, pos)
        elif wt == 2:
            n, pos = varint(buf, pos)
            val = buf[pos:pos + n]
            pos += n
        elif wt == 5:
            val = buf[pos:pos + 4]
            pos += 4
        elif wt == 1:
            val = buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"wire type {wt}")
        yield num, wt, val


def parse_example(record):
    """The image/encoded bytes and image/class/label of an Example."""
    image = label = None
    for num, _, features in fields(record):  # Example.features = 1
        if num != 1:
            continue
        for fnum, _, entry in fields(features):  # Features.feature = 1
            if fnum != 1:
                continue
            key = value = None
            for enum, _, ev in fields(entry):  # map entry: key 1, value 2
                if enum == 1:
                    key = bytes(ev)
                elif enum == 2:
                    value = ev
            if key == b"image/encoded":
                for vnum, _, lst in fields(value):  # bytes_list = 1
                    if vnum == 1:
                        for _, _, b in fields(lst):
                            image = bytes(b)
            elif key == b"image/class/label":
                for vnum, _, lst in fields(value):  # int64_list = 3
                    if vnum == 3:
                        for _, wt, v in fields(lst):
                            if wt == 2:  # packed
                                label, _ = varint(v, 0)
                            else:
                                label = v
    return image, label


SIZE = 224
DCT_SCALES = (8, 4, 2)  # libjpeg's reductions, largest first


def pil_draft(jpeg, crop, flip):
    """Decodes at the smallest DCT scale that keeps the random crop box at
    least SIZE pixels a side, then crops and resizes it in one step."""
    img = Image.open(io.BytesIO(jpeg))
    i, j, h, w = crop.get_params(img, crop.scale, crop.ratio)
    full_w, full_h = img.size
    for r in DCT_SCALES:
        if w // r >= SIZE and h // r >= SIZE:
            img.draft("RGB", (-(-full_w // r), -(-full_h // r)))
            break
    img = img.convert("RGB")
    fx, fy = img.size[0] / full_w, img.size[1] / full_h
    img = img.resize((SIZE, SIZE), Image.BILINEAR,
                     box=(j * fx, i * fy, (j + w) * fx, (i + h) * fy))
    return flip(img)


class ImageNetRecords(IterableDataset):
    def __init__(self, files, decoder):
        super().__init__()
        self.files = files
        self.decoder = decoder
        self.crop = transforms.RandomResizedCrop(SIZE)
        self.flip = transforms.RandomHorizontalFlip()
        if decoder == "tvio":
            self.transform = transforms.Compose([
                self.crop, self.flip,
                transforms.ConvertImageDtype(torch.float32),
                transforms.Normalize(MEAN, STD),
            ])
        elif decoder == "pil-draft":
            self.transform = transforms.Compose([
                transforms.ToTensor(), transforms.Normalize(MEAN, STD),
            ])
        else:
            self.transform = transforms.Compose([
                self.crop, self.flip, transforms.ToTensor(),
                transforms.Normalize(MEAN, STD),
            ])

    def image(self, jpeg):
        if self.decoder == "tvio":
            data = torch.frombuffer(jpeg, dtype=torch.uint8)
            return self.transform(decode_jpeg(data, ImageReadMode.RGB))
        if self.decoder == "pil-draft":
            return self.transform(pil_draft(jpeg, self.crop, self.flip))
        img = Image.open(io.BytesIO(jpeg)).convert("RGB")
        return self.transform(img)

    def __iter__(self):
        info = get_worker_info()
        files = self.files
        if info is not None:
            files = files[info.id::info.num_workers]
        for path in files:
            for record in tfrecords(path):
                jpeg, label = parse_example(record)
                yield self.image(jpeg), label


def worker_init(_worker_id):
    torch.set_num_threads(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="directory of shards")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--decoder", choices=["pil", "pil-draft", "tvio"],
                    default="pil", help="how images are decoded (above)")
    ap.add_argument("--expect", type=int, default=-1,
                    help="the number of images there must be")
    args = ap.parse_args()
    files = sorted(glob.glob(f"{args.data}/*.tfrecord"))
    if not files:
        print(f"w2_torch: no *.tfrecord in {args.data}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    torch.manual_seed(1)
    loader = DataLoader(ImageNetRecords(files, args.decoder),
                        batch_size=args.batch,
                        num_workers=args.workers,
                        worker_init_fn=worker_init if args.workers else None)
    images = batches = checksum = 0
    t0 = time.perf_counter()
    for x, y in loader:
        if x.shape[1:] != (3, 224, 224) or x.dtype != torch.float32:
            print(f"w2_torch: batch {tuple(x.shape)} {x.dtype}",
                  file=sys.stderr)
            return 1
        images += x.shape[0]
        batches += 1
        checksum += int(y.sum())
    seconds = time.perf_counter() - t0
    print(json.dumps({
        "images": images, "batches": batches, "seconds": seconds,
        "images_per_s": images / seconds if seconds > 0 else 0.0,
        "workers": args.workers, "decoder": args.decoder,
        "torch": torch.__version__,
        "checksum": checksum,
    }))
    if args.expect >= 0 and images != args.expect:
        print(f"w2_torch: {images} images, expected {args.expect}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
