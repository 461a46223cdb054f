#!/usr/bin/env python3
"""fingerprint_ref.py - an independent implementation of the pipeline
fingerprint, written from docs/graph-format.md section 5 alone (with its
own XXH3-128 and msgpack reader), that check_graph.c compares cachew
against, byte for byte.

  fingerprint_ref.py GRAPH...   prints the fingerprint of each serialized
                                graph's root as a hex line

Each GRAPH is a file holding a graph document (section 2). Local files of
file sources are stat()ed here; s3:// and gs:// globs are refused (this
script does not list buckets).
"""
import glob
import os
import struct
import sys

# ---- XXH3-128, seed 0, default secret (xxHash spec v0.2.0) -----------------

M64 = (1 << 64) - 1
P32_1, P32_2, P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
P64_1, P64_2 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F
P64_3, P64_4 = 0x165667B19E3779F9, 0x85EBCA77C2B2AE63
P64_5 = 0x27D4EB2F165667C5
PMX1, PMX2 = 0x165667919E3779F9, 0x9FB21C651E98DF25
SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")


def r64(b, i):
    return int.from_bytes(b[i:i + 8], "little")


def r32(b, i):
    return int.from_bytes(b[i:i + 4], "little")


def bswap64(x):
    return int.from_bytes(x.to_bytes(8, "little"), "big")


def avalanche(x):
    x ^= x >> 37
    x = (x * PMX1) & M64
    return x ^ (x >> 32)


def avalanche64(x):
    x ^= x >> 33
    x = (x * P64_2) & M64
    x ^= x >> 29
    x = (x * P64_3) & M64
    return x ^ (x >> 32)


def mul_fold(a, b):
    m = a * b
    return (m & M64) ^ (m >> 64)


def mix16(d, i, s, seed=0):
    return mul_fold(r64(d, i) ^ ((r64(SECRET, s) + seed) & M64),
                    r64(d, i + 8) ^ ((r64(SECRET, s + 8) - seed) & M64))


def mix32(acc, d, i1, i2, s, seed=0):
    lo = (acc[0] + mix16(d, i1, s, seed)) & M64
    hi = (acc[1] + mix16(d, i2, s + 16, seed)) & M64
    lo ^= (r64(d, i2) + r64(d, i2 + 8)) & M64
    hi ^= (r64(d, i1) + r64(d, i1 + 8)) & M64
    return [lo, hi]


def xxh3_small(d):
    n = len(d)
    if n == 0:
        return (avalanche64(r64(SECRET, 64) ^ r64(SECRET, 72)),
                avalanche64(r64(SECRET, 80) ^ r64(SECRET, 88)))
    if n <= 3:
        c = d[n - 1] | n << 8 | d[0] << 16 | d[n >> 1] << 24
        sw = int.from_bytes(c.to_bytes(4, "little"), "big")
        rot = ((sw << 13) | (sw >> 19)) & 0xFFFFFFFF
        return (avalanche64((r32(SECRET, 0) ^ r32(SECRET, 4)) ^ c),
                avalanche64((r32(SECRET, 8) ^ r32(SECRET, 12)) ^ rot))
    if n <= 8:
        combined = r32(d, 0) | r32(d, n - 4) << 32
        v = (r64(SECRET, 16) ^ r64(SECRET, 24)) ^ combined
        m = v * ((P64_1 + (n << 2)) & M64)
        hi, lo = m >> 64, m & M64
        hi = (hi + (lo << 1)) & M64
        lo ^= hi >> 3
        lo ^= lo >> 35
        lo = (lo * PMX2) & M64
        lo ^= lo >> 28
        return (lo, avalanche(hi))
    first, last = r64(d, 0), r64(d, n - 8)
    v1 = (r64(SECRET, 32) ^ r64(SECRET, 40)) ^ first ^ last
    v2 = (r64(SECRET, 48) ^ r64(SECRET, 56)) ^ last
    m = v1 * P64_1
    lo = ((m & M64) + ((n - 1) << 54)) & M64
    hi = ((m >> 64) + v2 + (v2 & 0xFFFFFFFF) * (P32_2 - 1)) & M64
    lo ^= bswap64(hi)
    m = lo * P64_2
    lo, hi = m & M64, ((m >> 64) + hi * P64_2) & M64
    return (avalanche(lo), avalanche(hi))


def xxh3_medium(d):
    n = len(d)
    acc = [(n * P64_1) & M64, 0]
    if n <= 128:
        for i in range((n - 1) // 32, -1, -1):
            acc = mix32(acc, d, 16 * i, n - 16 * i - 16, 32 * i)
    else:
        for i in range(4):
            acc = mix32(acc, d, 32 * i, 32 * i + 16, 32 * i)
        acc = [avalanche(acc[0]), avalanche(acc[1])]
        for i in range(4, n // 32):
            acc = mix32(acc, d, 32 * i, 32 * i + 16, 32 * (i - 4) + 3)
        acc = mix32(acc, d, n - 16, n - 32, 103)
    lo = (acc[0] + acc[1]) & M64
    hi = (acc[0] * P64_1 + acc[1] * P64_4 + n * P64_2) & M64
    return (avalanche(lo), (-avalanche(hi)) & M64)


def accumulate(acc, d, i, s):
    for k in range(8):
        v = r64(d, i + 8 * k)
        x = v ^ r64(SECRET, s + 8 * k)
        acc[k ^ 1] = (acc[k ^ 1] + v) & M64
        acc[k] = (acc[k] + (x & 0xFFFFFFFF) * (x >> 32)) & M64


def merge(acc, init, s):
    r = init
    for k in range(4):
        r += mul_fold(acc[2 * k] ^ r64(SECRET, s + 16 * k),
                      acc[2 * k + 1] ^ r64(SECRET, s + 16 * k + 8))
    return avalanche(r & M64)


def xxh3_large(d):
    n = len(d)
    stripes = (len(SECRET) - 64) // 8
    block = 64 * stripes
    acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1]
    nblocks = (n - 1) // block
    for b in range(nblocks):
        for k in range(stripes):
            accumulate(acc, d, b * block + 64 * k, 8 * k)
        for k in range(8):
            a = acc[k] ^ (acc[k] >> 47) ^ r64(SECRET, len(SECRET) - 64 + 8 * k)
            acc[k] = (a * P32_1) & M64
    base = nblocks * block
    for k in range((n - base - 1) // 64):
        accumulate(acc, d, base + 64 * k, 8 * k)
    accumulate(acc, d, n - 64, len(SECRET) - 71)
    return (merge(acc, (n * P64_1) & M64, 11),
            merge(acc, ~(n * P64_2) & M64, len(SECRET) - 75))


def xxh3_128(d):
    """(high64, low64) of XXH3-128 of d, seed 0."""
    n = len(d)
    lo, hi = (xxh3_small(d) if n <= 16 else
              xxh3_medium(d) if n <= 240 else xxh3_large(d))
    return hi, lo


# ---- msgpack, the subset a graph document uses (section 1) ------------------

class Tuple(list):
    pass


def unpack(b, i=0):
    """(value, next offset); strings stay bytes, maps keep their order."""
    t = b[i]
    i += 1
    if t <= 0x7F:
        return t, i
    if t >= 0xE0:
        return t - 256, i
    if 0x80 <= t <= 0x8F:
        return unpack_map(b, i, t & 0x0F)
    if 0x90 <= t <= 0x9F:
        return unpack_list(b, i, t & 0x0F)
    if 0xA0 <= t <= 0xBF:
        return b[i:i + (t & 0x1F)], i + (t & 0x1F)
    if t in (0xC0, 0xC2, 0xC3):
        return {0xC0: None, 0xC2: False, 0xC3: True}[t], i
    if t == 0xCA:
        return struct.unpack(">f", b[i:i + 4])[0], i + 4
    if t == 0xCB:
        return struct.unpack(">d", b[i:i + 8])[0], i + 8
    fixed = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
             0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q"}
    if t in fixed:
        size = struct.calcsize(fixed[t])
        return struct.unpack(fixed[t], b[i:i + size])[0], i + size
    lens = {0xD9: ">B", 0xDA: ">H", 0xDB: ">I", 0xDC: ">H", 0xDD: ">I",
            0xDE: ">H", 0xDF: ">I", 0xC7: ">B", 0xC8: ">H", 0xC9: ">I"}
    if t in lens:
        size = struct.calcsize(lens[t])
        n = struct.unpack(lens[t], b[i:i + size])[0]
        i += size
        if t <= 0xDB and t >= 0xD9:
            return b[i:i + n], i + n
        if t in (0xDC, 0xDD):
            return unpack_list(b, i, n)
        if t in (0xDE, 0xDF):
            return unpack_map(b, i, n)
        return unpack_tuple(b, i + 1, b[i])
    if 0xD4 <= t <= 0xD8:
        return unpack_tuple(b, i + 1, b[i])
    raise ValueError("msgpack: byte 0x%02x at %d is not in a graph"
                     % (t, i - 1))


def unpack_list(b, i, n):
    out = []
    for _ in range(n):
        v, i = unpack(b, i)
        out.append(v)
    return out, i


def unpack_map(b, i, n):
    out = {}
    for _ in range(n):
        k, i = unpack(b, i)
        out[k], i = unpack(b, i)
    return out, i


def unpack_tuple(b, i, ext_type):
    if ext_type != 1:
        raise ValueError("msgpack: ext type %d" % ext_type)
    items, i = unpack(b, i)
    return Tuple(items), i


# ---- the fingerprint (section 5) ---------------------------------------------

VERSION = b"cachew-fp-2"
# Section 5.3, from docs/operators.md: the parameters marked "performance
# only" (those of operators that pass data through never count), the
# operators that pass data through and those that read files.
PERF = {"map": {"parallel"}, "interleave": {"parallel"},
        "tfrecord": {"buffer_size"}, "text_lines": {"buffer_size"},
        "fixed_length_records": {"buffer_size"}}
PASSTHROUGH = {"prefetch", "autocache", "cache_put", "cache"}
FILE_SOURCES = {"list_files", "text_lines", "fixed_length_records",
                "tfrecord"}
FP_PARAM = {"cache_get"}


def item(tag, data):
    return tag + struct.pack("<Q", len(data)) + data


def value(v):
    if v is None:
        return item(b"n", b"")
    if isinstance(v, bool):
        return item(b"b", bytes([v]))
    if isinstance(v, int):
        return item(b"i", struct.pack("<q", v))
    if isinstance(v, float):
        bits = 0x7FF8000000000000 if v != v else \
            struct.unpack("<Q", struct.pack("<d", v))[0]
        return item(b"f", struct.pack("<Q", bits))
    if isinstance(v, bytes):
        return item(b"s", v)
    if isinstance(v, list):
        out = item(b"t" if isinstance(v, Tuple) else b"l",
                   struct.pack("<Q", len(v)))
        return out + b"".join(value(x) for x in v)
    out = item(b"m", struct.pack("<Q", len(v)))
    for k in sorted(v):
        out += item(b"k", k) + value(v[k])
    return out


def file_identity(path):
    """p and F items of one local file, or of a URL (text, no metadata)."""
    meta = (0, 0, 0)
    name = path
    if b"://" not in path:
        name = os.path.realpath(path)
        st = os.stat(path)
        meta = (st.st_size, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9)
    return item(b"p", name) + item(b"F", struct.pack("<QQQ", *meta))


def files(patterns):
    """The identity of every file, or None if a pattern matches nothing."""
    out = b""
    for pat in [patterns] if isinstance(patterns, bytes) else patterns:
        parts = pat.split(b"/", 3)
        if pat.startswith((b"s3://", b"gs://")) and len(parts) == 4 and \
                any(c in parts[3] for c in b"*?["):
            raise ValueError("bucket listings are not implemented here")
        if b"://" in pat:
            paths = [pat]
        elif any(c in pat for c in b"*?["):
            paths = sorted(glob.glob(pat))
        else:
            paths = [pat] if os.path.exists(pat) else []
        if not paths:
            return None
        out += b"".join(file_identity(p) for p in paths)
    return out


def fingerprint(nodes, k, memo):
    if k in memo:
        return memo[k]
    node = nodes[k]
    op, params = node[b"op"].decode(), node[b"params"]
    inputs = [fingerprint(nodes, i, memo) for i in node[b"inputs"]]
    if op in FP_PARAM:
        fp = params[b"fingerprint"].decode().lower()
    elif op in PASSTHROUGH and len(inputs) == 1:
        fp = inputs[0]
    else:
        data = item(b"V", VERSION) + item(b"O", op.encode())
        for key in sorted(params):
            if key.decode() in PERF.get(op, ()):
                continue
            data += item(b"k", key)
            ident = files(params[key]) if op in FILE_SOURCES and \
                key == b"files" else None
            data += ident if ident is not None else value(params[key])
        plugin = node.get(b"plugin")
        if plugin is not None:
            h = bytes.fromhex(plugin[b"hash"].decode())
            data += item(b"P", plugin[b"name"]) + \
                item(b"R", plugin[b"version"]) + \
                item(b"H", h[:8][::-1] + h[8:][::-1])
        for fp_in in inputs:
            data += item(b"I", bytes.fromhex(fp_in)[:8][::-1] +
                         bytes.fromhex(fp_in)[8:][::-1])
        hi, lo = xxh3_128(data)
        fp = "%016x%016x" % (hi, lo)
    memo[k] = fp
    return fp


def main(argv):
    for path in argv[1:]:
        with open(path, "rb") as f:
            doc, _ = unpack(f.read())
        nodes = doc[b"nodes"]
        print(fingerprint(nodes, doc[b"root"], {}))


if __name__ == "__main__":
    main(sys.argv)
