#!/usr/bin/env python3
"""tfrecord_ref.py - an independent, pure-Python TFRecord writer and reader
(with its own CRC-32C) that check_formats.c compares cachew against, byte
for byte. TensorFlow itself is not installable here; this follows the
framing of tensorflow/core/lib/io/record_writer.cc.

  tfrecord_ref.py write OUT N    writes the N records of sample(i)
  tfrecord_ref.py read IN        prints each record as a hex line
"""
import struct
import sys

_POLY = 0x82F63B78
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ _POLY if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ _TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def sample(i):
    """Record i of the shared test sequence (check_formats.c has the same)."""
    n = (i * 37) % 301
    return bytes(((i * 7 + j * 13) & 0xFF) for j in range(n))


def write(path, n):
    with open(path, "wb") as f:
        for i in range(n):
            rec = sample(i)
            hdr = struct.pack("<Q", len(rec))
            f.write(hdr + struct.pack("<I", masked(hdr)))
            f.write(rec + struct.pack("<I", masked(rec)))


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        hdr = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", hdr)
        (lcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if lcrc != masked(hdr):
            sys.exit("record at byte %d: length checksum mismatch" % pos)
        rec = data[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if len(rec) != length or dcrc != masked(rec):
            sys.exit("record at byte %d: data checksum mismatch" % pos)
        print(rec.hex())
        pos += 16 + length


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]))
    else:
        read(sys.argv[2])
