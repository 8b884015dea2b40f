#!/usr/bin/env python3
"""Writes tests/fixtures/nvfp4/: NVFP4 matrices quantized by compressed-tensors (the published
`nvfp4-pack-quantized` format), for tests/codec/test_nvfp4_oracle.c.

Each source matrix (fp32 weights, as a model loaded in fp32 would give the observer) goes through
compressed-tensors' own pieces in the order llm-compressor calls them:
  global  = generate_gparam(min, max)                        (448*6/amax in fp32)
  scales  = calculate_qparams(group mins, group maxes, NVFP4 weight args, global)
  packed  = NVFP4PackedCompressor.compress({weight, weight_scale, weight_global_scale, ...})
  dequant = dequantize(unpack_fp4_from_uint8(packed, fp32), weight_scale as fp32, global, fp32)
Only the observer's min/max (torch amin/amax) is ours. A stacked case quantizes several sources
separately and stacks them, one global scale per source, as MoE checkpoints are.

The swizzled scale plane is also written, built the way vLLM / FlashInfer swizzle block scales
(pad rows to 128 and scale columns to 4, reshape to [M/128, 4, 32, K/4, 4], permute to
[M/128, K/4, 32, 4, 4]): an independent statement of the 128x4 layout.

Files per case NAME (little-endian, row-major), listed in cases.txt as "NAME rows cols divisors":
  NAME.input.f32    [rows][cols]      the weights quantized
  NAME.packed.u8    [rows][cols/2]    weight_packed (element 2i in the low nibble)
  NAME.scales.u8    [rows][cols/16]   weight_scale, float8_e4m3fn bytes, NOT swizzled
  NAME.global.f32   [divisors]        weight_global_scale of each source (the divisor)
  NAME.dequant.f32  [rows][cols]      compressed-tensors' dequantization in float32
  NAME.swizzled.u8  [ceil(rows/128)*128 * ceil(cols/64)*4]  the 128x4 swizzled scale plane

Run: python3 -m venv /tmp/v && /tmp/v/bin/pip install -r tests/oracle/requirements-nvfp4.txt
     /tmp/v/bin/python tests/oracle/nvfp4_compressed_tensors.py
"""
import copy
import os
import sys

import numpy as np
import torch
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import dequantize
from compressed_tensors.quantization.quant_scheme import NVFP4A16
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "nvfp4")
SCHEME = QuantizationScheme(targets=["Linear"], **copy.deepcopy(NVFP4A16))
ARGS = SCHEME.weights


def ct_quantize(w):
    """One source matrix through compressed-tensors; returns packed, scale bytes, global, dequant."""
    n, k = w.shape
    g = generate_gparam(w.min(), w.max())
    groups = w.reshape(n, k // 16, 16)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), ARGS, global_scale=g)
    sd = {"weight": w.clone(), "weight_scale": scale, "weight_global_scale": g, "weight_zero_point": zp}
    out = NVFP4PackedCompressor.compress(sd, SCHEME)
    packed, scale8 = out["weight_packed"], out["weight_scale"]
    assert packed.dtype == torch.uint8 and scale8.dtype == torch.float8_e4m3fn
    deq = dequantize(
        x_q=unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32),
        scale=scale8.to(torch.float32),
        args=ARGS,
        global_scale=g,
        dtype=torch.float32,
    )
    return packed, scale8.view(torch.uint8), g.reshape(1), deq


def swizzle(scales_u8):
    """[M][K/16] e4m3 bytes -> the 128x4 plane, by padding, reshape and permute (vLLM's recipe)."""
    m, kb = scales_u8.shape
    mp, kp = -(-m // 128) * 128, -(-kb // 4) * 4
    padded = torch.zeros(mp, kp, dtype=torch.uint8)
    padded[:m, :kb] = scales_u8
    t = padded.reshape(mp // 128, 4, 32, kp // 4, 4).permute(0, 3, 2, 1, 4)
    return t.contiguous().flatten()


def write_case(name, sources, manifest):
    parts = [ct_quantize(w) for w in sources]
    w = torch.cat(sources)
    packed = torch.cat([p[0] for p in parts])
    scales = torch.cat([p[1] for p in parts])
    glob = torch.cat([p[2] for p in parts]).to(torch.float32)
    deq = torch.cat([p[3] for p in parts])
    files = {
        "input.f32": w,
        "packed.u8": packed,
        "scales.u8": scales,
        "global.f32": glob,
        "dequant.f32": deq,
        "swizzled.u8": swizzle(scales),
    }
    for ext, t in files.items():
        t.contiguous().numpy().astype("<" + t.numpy().dtype.str[1:]).tofile(os.path.join(OUT, f"{name}.{ext}"))
    manifest.append(f"{name} {w.shape[0]} {w.shape[1]} {len(sources)}")
    print(f"{name}: {w.shape[0]} x {w.shape[1]}, divisors {[float(x) for x in glob]}", file=sys.stderr)


def gauss_case(gen):
    """160 x 96 (rows not a multiple of 128, 6 scale columns: both paddings), row magnitudes
    log-uniform over 1e-5..1e2 so block scales span e4m3 subnormals to 448."""
    mag = torch.exp(torch.empty(160, 1).uniform_(np.log(1e-5), np.log(1e2), generator=gen))
    return [torch.randn(160, 96, generator=gen) * mag]


def special_case():
    """16 x 64 (64 blocks) with the global scale a power of two: amax 10.5 -> global 256 exactly,
    so chosen block maxima give exact e4m3 scales and exact e2m1 ties."""
    blocks = []
    e = 2.0**-7  # effective scale (scale / global) of a block whose scale is 2.0
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]

    def blk(vals):
        v = list(vals) + [0.0] * (16 - len(vals))
        blocks.append(v[:16])

    # The tensor maximum: scale 448 (e4m3 limit), values at the e2m1 limit 6 and its tie 5.
    blk([10.5, -10.5, 8.75, 5.25, 1.75, -0.4375, 0.21875, 0.0])
    # Exact ties, both signs, with 6*e as the block maximum (scale exactly 2.0).
    blk([6 * e] + [t * e for t in ties] + [-t * e for t in ties] + [-6 * e])
    # The neighbours of each tie (one fp32 ulp either side).
    for sgn in (1.0, -1.0):
        below = [sgn * float(np.nextafter(np.float32(t * e), np.float32(0))) for t in ties]
        above = [sgn * float(np.nextafter(np.float32(t * e), np.float32(1))) for t in ties]
        blk([6 * e] + below + above)
    # All zero; negative zeros; tiny negatives (-> nibble 0x8) next to a small positive.
    blk([0.0] * 16)
    blk([-0.0] * 16)
    blk([-1e-3 * e, 1e-3 * e, -0.1 * e, 6 * e, -0.0, 0.0, -0.26 * e, 0.26 * e])
    # e4m3 scale subnormal (3 * 2^-9), a subnormal tie (1.5 * 2^-9 -> 2 * 2^-9), the smallest
    # subnormal (2^-9), the zero tie (2^-10 -> 0 -> eps 0.125), just above it, and below it.
    for s in (3 * 2.0**-9, 1.5 * 2.0**-9, 2.0**-9, 2.0**-10, 2.0**-10 * 1.0001, 2.0**-11, 5 * 2.0**-9):
        a = s * 6 / 256
        blk([a, -a / 2, a / 3, -a / 5, a / 7, a * 0.75, -a * 0.25, a * 0.6])
    # e4m3 normal ties: 1.0625 -> 1.0 (even), 1.1875 -> 1.25, 17 -> 16, 416 -> 416 (exact), and the
    # values then clamp at 6 because the scale rounded down.
    for s in (1.0625, 1.1875, 17.0, 416.0, 440.0):
        a = s * 6 / 256
        blk([a, -a, a * 0.99, a / 2, -a / 3, a / 6, a / 12, -a / 24])
    rng = np.random.default_rng(7)
    while len(blocks) < 64:  # the rest: random blocks of mixed magnitude
        m = 10.0 ** rng.uniform(-3, 1)
        blk(list((rng.standard_normal(16) * m).clip(-10.5, 10.5)))
    w = torch.tensor(blocks, dtype=torch.float32).reshape(16, 64)
    assert float(w.abs().max()) == 10.5
    return [w]


def stacked_case(gen):
    """4 sources of 128 rows x 32 cols quantized separately: amax 1, 2, 3, 4 (divisors over a
    fourfold range), like gate/up/... of experts stacked into one plane."""
    srcs = []
    for amax in (1.0, 2.0, 3.0, 4.0):
        w = torch.randn(128, 32, generator=gen)
        srcs.append(w / w.abs().max() * amax)
    return srcs


def main():
    os.makedirs(OUT, exist_ok=True)
    gen = torch.Generator().manual_seed(20240611)
    manifest = []
    write_case("gauss", gauss_case(gen), manifest)
    write_case("special", special_case(), manifest)
    write_case("zero", [torch.zeros(16, 32)], manifest)
    write_case("stacked", stacked_case(gen), manifest)
    with open(os.path.join(OUT, "cases.txt"), "w") as f:
        f.write("# name rows cols divisors (written by tests/oracle/nvfp4_compressed_tensors.py)\n")
        f.write("\n".join(manifest) + "\n")


if __name__ == "__main__":
    main()
