#!/usr/bin/env python3
"""An independent .nf reader written from docs/artifact.md alone (standard library only).

It shows the specification is enough to read an artifact without ninfer's code, and it is the
oracle for tests/fixtures/format/ref_v1.json: test_artifact_fixture checks that the C reader sees
exactly what this reader sees in the committed artifact tests/fixtures/format/ref_v1.nf.

    python3 tests/oracle/artifact_reader.py tests/fixtures/format/ref_v1.nf > tests/fixtures/format/ref_v1.json

Values are rendered canonically so a C test can compare strings: integers in decimal, floats as
the hex of their IEEE bits, strings as hex bytes, arrays as their elements joined by ','.
"""
import json
import math
import struct
import sys

MAGIC = b"NINFER\x1a\n"
# codec: (block elems, block bytes); nvfp4 is planar
CODECS = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_k": (256, 144),
    "q5_k": (256, 176), "q6_k": (256, 210), "q4_0": (32, 18), "q4_1": (32, 20),
    "q5_0": (32, 22), "q5_1": (32, 24), "q2_k": (256, 84), "q3_k": (256, 110),
    "iq4_xs": (256, 136), "iq4_nl": (32, 18), "nvfp4": (16, None),
}
SCALARS = {1: ("u32", "<I"), 2: ("i32", "<i"), 3: ("u64", "<Q"), 4: ("i64", "<q"),
           5: ("f32", "<I"), 6: ("f64", "<Q"), 7: ("bool", "<B")}


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


class Bad(Exception):
    pass


class Cursor:
    def __init__(self, buf):
        self.b, self.p = buf, 0

    def take(self, n):
        if n > len(self.b) - self.p:
            raise Bad("index ends")
        v = self.b[self.p:self.p + n]
        self.p += n
        return v

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self, name=False, limit=0):
        n = self.u32()
        if name and not 1 <= n <= limit:
            raise Bad("name length %d" % n)
        s = self.take(n)
        if self.take(1) != b"\0":
            raise Bad("string not NUL-terminated")
        if name and any(c < 0x21 or c > 0x7E for c in s):
            raise Bad("name not printable ASCII")
        return s


def scalar(c, t):
    name, fmt = SCALARS[t]
    v = struct.unpack(fmt, c.take(struct.calcsize(fmt)))[0]
    if name == "bool" and v > 1:
        raise Bad("bool byte %d" % v)
    if name == "f32":
        return "0x%08x" % v
    if name == "f64":
        return "0x%016x" % v
    return str(v)


def value(c, t):
    if t in SCALARS:
        return SCALARS[t][0], scalar(c, t)
    if t == 8:
        return "string", c.string().hex()
    if t == 9:
        et, count = c.u32(), c.u64()
        if et not in SCALARS and et != 8:
            raise Bad("array element type %d" % et)
        elems = [c.string().hex() if et == 8 else scalar(c, et) for _ in range(count)]
        return "array of " + (SCALARS[et][0] if et in SCALARS else "string"), ",".join(elems)
    raise Bad("metadata type %d" % t)


def layout(codec, dims, d):
    """(payload bytes, planes) of docs/artifact.md, 'Codecs and payload sizes'."""
    rows = math.prod(dims[:-1])
    cols = dims[-1]
    be, bb = CODECS[codec]
    if cols % be:
        raise Bad("cols %d not a multiple of %d" % (cols, be))
    if codec != "nvfp4":
        if d != 1:
            raise Bad("divisors on %s" % codec)
        n = rows * (cols // be) * bb
        return n, [(0, n)]
    if rows % d or (d > 1 and (rows // d) % 128):
        raise Bad("nvfp4 divisor rule")
    data = rows * cols // 2
    so = (data + 255) // 256 * 256
    sb = -(-rows // 128) * -(-cols // 64) * 512
    do = so + sb
    return do + 4 * d, [(0, data), (so, sb), (do, 4 * d)]


def read(buf):
    if buf[:8] != MAGIC:
        raise Bad("magic")
    major, minor, hdr, align, flags = struct.unpack_from("<HHIII", buf, 8)
    data_off, io, ib, ick, reserved = struct.unpack_from("<QQQQQ", buf, 24)
    if major != 1:
        raise Bad("version %d.%d" % (major, minor))
    if hdr < 64 or hdr % 8 or align < 64 or align > 1 << 24 or align & (align - 1) or flags or reserved:
        raise Bad("header fields")
    if data_off % align or data_off < hdr or not data_off <= io <= len(buf) or io + ib != len(buf):
        raise Bad("placement")
    index = buf[io:io + ib]
    if fnv1a64(index) != ick:
        raise Bad("index checksum")
    c = Cursor(index)
    if c.take(4) != b"NFIX":
        raise Bad("index magic")
    nm, nt, res = c.u32(), c.u32(), c.u32()
    if res:
        raise Bad("index reserved")
    meta = []
    for _ in range(nm):
        key = c.string(True, 256).decode()
        t, v = value(c, c.u32())
        meta.append({"key": key, "type": t, "value": v})
    tensors, prev_end = [], data_off
    for _ in range(nt):
        name = c.string(True, 1024).decode()
        codec = c.string(True, 32).decode()
        if codec not in CODECS:
            raise Bad("codec " + codec)
        nd = c.u32()
        if not 1 <= nd <= 4:
            raise Bad("n_dims")
        dims = [c.u64() for _ in range(nd)]
        if 0 in dims:
            raise Bad("zero dim")
        d, fl, nin = c.u32(), c.u32(), c.u32()
        ins = ["0x%08x" % c.u32() for _ in range(nin)]
        planes = [(c.u64(), c.u64()) for _ in range(c.u32())]
        off, nbytes, ck = c.u64(), c.u64(), c.u64()
        want, want_planes = layout(codec, dims, d)
        if nbytes != want or planes != want_planes:
            raise Bad("%s: payload %d / planes %s, expected %d / %s" % (name, nbytes, planes, want, want_planes))
        if fl & ~3 or (fl & 1 and (codec != "nvfp4" or nin == 0)) or (nin and codec != "nvfp4"):
            raise Bad("%s: flags/policy" % name)
        if nin > 1 and not (nd == 3 and nin == dims[0]):
            raise Bad("%s: input divisor count" % name)
        if off % align or off < prev_end or off + nbytes > io:
            raise Bad("%s: placement" % name)
        prev_end = off + nbytes
        payload = buf[off:off + nbytes]
        if codec == "nvfp4":
            divs = struct.unpack_from("<%df" % d, payload, planes[2][0])
            if not all(math.isfinite(x) and x > 0 for x in divs):
                raise Bad("%s: divisor" % name)
        tensors.append({
            "name": name, "codec": codec, "dims": ",".join(map(str, dims)), "divisors": d, "flags": fl,
            "input_divisors": ",".join(ins), "planes": ",".join("%d:%d" % p for p in planes),
            "offset": off, "bytes": nbytes, "checksum": "%016x" % ck,
            "payload_fnv1a64": "%016x" % fnv1a64(payload),
        })
    if c.p != len(index):
        raise Bad("trailing index bytes")
    if len({m["key"] for m in meta}) != nm or len({t["name"] for t in tensors}) != nt:
        raise Bad("duplicate names")
    return {"major": major, "minor": minor, "alignment": align, "data_offset": data_off, "index_offset": io,
            "index_bytes": ib, "metadata": meta, "tensors": tensors}


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        print(json.dumps(read(f.read()), indent=1))
