#!/usr/bin/env python3
"""A planted-break binary as a small file: the XOR of two same-size builds, xz-compressed.

usage: tools/xordelta.py make GOOD BROKEN OUT.xz     (on the developer machine)
       tools/xordelta.py apply GOOD OUT.xz BROKEN     (on the GPU machine, beside GOOD)

A test binary rebuilt with one deliberate bug differs from the good build in a few places (a host-only
change usually keeps the size: the fatbin is untouched), so GOOD ^ BROKEN is mostly zeros and compresses to
kilobytes where the binary is tens of megabytes: it travels with gpu-bundle.txz inside the device
tool's carry limit. Builds of different sizes are refused (the delta would not be small): plant a
break of the same code size, or carry the binary itself.
"""
import lzma
import os
import sys


def xor(a, b):
    return (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        sys.exit(f"xordelta: {path}: {e.strerror}")


def main(argv):
    if len(argv) != 4 or argv[0] not in ("make", "apply"):
        sys.exit(__doc__.strip())
    mode, good_path, second, out = argv
    good = read(good_path)
    if mode == "make":
        broken = read(second)
        if len(broken) != len(good):
            sys.exit(f"xordelta: {good_path} is {len(good)} bytes, {second} {len(broken)}: not the same size")
        data = lzma.compress(xor(good, broken), preset=9)
    else:
        try:
            delta = lzma.decompress(read(second))
        except lzma.LZMAError as e:
            sys.exit(f"xordelta: {second}: not an xz delta ({e})")
        if len(delta) != len(good):
            sys.exit(f"xordelta: {second} is a delta of a {len(delta)}-byte file, {good_path} is {len(good)} bytes")
        data = xor(good, delta)
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, os.stat(good_path).st_mode if mode == "apply" else 0o644)
    os.replace(tmp, out)
    print(f"xordelta: wrote {out} ({len(data)} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
