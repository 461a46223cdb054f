#!/usr/bin/python3
"""Trains torchvision's resnet18 for a few steps on ImageNet-like data read
by cachew, through torch's DataLoader.

    make python
    build/cachew gen imagenet --out build/imagenet --images 256 --shards 4
    /usr/bin/python3 examples/pytorch_train.py build/imagenet --steps 4

The same program runs the pipeline in-process (the embedded service, the
default) or, unchanged, on a cachew service: set CACHEW_SERVICE to a
dispatcher's address (tcp://host:port) and its workers decode and crop
while this process trains. The loader's workers (--workers) each read a
disjoint share of every epoch: a shard of the input in-process, a shared
job through a service. The items are tuples of torch tensors that view
cachew's batches without a copy (DLPack).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

import torch  # noqa: E402
import torchvision  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import cachew  # noqa: E402
import cachew.torch  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def pipeline(data_dir, batch):
    """tfrecord shards -> (JPEG, label) -> random resized crop 224 (decoding
    only the crop) -> flip -> batches of f32 NCHW images and i64 labels."""
    return (cachew.tfrecord(os.path.join(data_dir, "*.tfrecord"))
            .parse_example(image="image/encoded:bytes", label="image/class/label:i64")
            .random_resized_crop(size=224, parallel=cachew.AUTO)
            .flip_left_right()
            .batch(batch, drop_remainder=True)
            .normalize(mean=MEAN, std=STD, channels_first=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", help="a directory of `cachew gen imagenet` shards")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--classes", type=int, default=1000)
    a = ap.parse_args()

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=a.classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = cachew.torch.IterableDataset(pipeline(a.data, a.batch), seed=0)
    loader = DataLoader(data, batch_size=None, num_workers=a.workers)
    where = os.environ.get("CACHEW_SERVICE") or "in-process"
    print("reading %s (%s), %d loader workers" % (a.data, where, a.workers))

    step = 0
    for epoch in range(a.epochs):
        data.set_epoch(epoch)
        t0 = time.monotonic()
        for batch in loader:  # named components (parse_example's): a dict
            images, labels = batch["image"], batch["label"] % a.classes
            opt.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            opt.step()
            step += 1
            print("epoch %d step %d: loss %.3f, images %s, %.2f s"
                  % (epoch, step, loss.item(), tuple(images.shape), time.monotonic() - t0))
            if step >= a.steps * (epoch + 1):
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
