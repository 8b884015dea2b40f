#!/usr/bin/env python3
"""Writes tests/fixtures/codec/: GGUF codec fixtures from llama.cpp's gguf-py (PyPI `gguf`).

  deq_<codec>.bin   encoded blocks and gguf.quants.dequantize of them (bit-exact decode oracle):
                    random blocks, all-zero blocks, extreme scales (+-65504), negative-zero scales,
                    subnormal f16 scales; f16: every one of the 65536 bit patterns. The import-only
                    codecs (q2_k, q3_k, iq4_xs, iq4_nl: gguf-py can only decode them, ninfer too) also
                    get blocks whose packed sub-block scale codes are all at either extreme (0 and
                    the largest code: 4-bit for q2_k, 6-bit for q3_k and iq4_xs), with ordinary and
                    +-65504 super-scales; they come from a second RNG stream so the older fixtures
                    keep their bytes.
  enc_<codec>.bin   f32 inputs and gguf.quants.quantize of them (byte-exact encode oracle) for the
                    codecs whose quantizer is defined bit-for-bit: q8_0, f16, bf16 (ties, f16
                    subnormals, overflow edges, signed zeros, inf, NaN).
  rows.bin          Gaussian and Student-t (3 dof) rows for the quantizer quality test.
  rmse.tsv          the oracle RMSE on those rows per codec: gguf.quants.quantize where gguf has a
                    quantizer (q8_0); for q4_k/q5_k/q6_k, which gguf can only decode, the reference
                    search below (a 10x finer, 2x wider search of the same block model), packed into
                    real blocks and decoded with gguf.quants.dequantize.

File format of deq_/enc_ (little-endian): "NFCX", u32 version = 1, u32 ggml_type, u32 block_elems,
u32 block_bytes, u32 n_blocks, u8 blocks[n_blocks * block_bytes], f32 values[n_blocks * block_elems].
rows.bin: "NFCR", u32 version = 1, u32 n_dists, u32 rows, u32 cols, f32 [n_dists][rows][cols].

Usage: python tests/oracle/gguf_codecs.py [--out tests/fixtures/codec]   (deterministic: fixed seeds)
"""
import argparse
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

RNG = np.random.default_rng(20240531)
RNG_IMPORT = np.random.default_rng(20261206)  # the import-only codecs' stream (added later)


def write_nfcx(path, qtype, blocks, values):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1, block_bytes)
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, block_elems)
    assert blocks.shape[0] == values.shape[0]
    with open(path, "wb") as f:
        f.write(b"NFCX" + struct.pack("<5I", 1, int(qtype), block_elems, block_bytes, blocks.shape[0]))
        f.write(blocks.tobytes())
        f.write(values.astype("<f4").tobytes())


def f16_bytes(vals):
    return np.asarray(vals, dtype=np.float16).view(np.uint8).reshape(-1, 2)


# Offsets of the f16 scale fields per block type: (d, dmin-or-m or None).
SCALE_FIELDS = {
    T.Q8_0: (0, None), T.Q4_0: (0, None), T.Q5_0: (0, None),
    T.Q4_1: (0, 2), T.Q5_1: (0, 2),
    T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208, None),
    T.Q2_K: (80, 82), T.Q3_K: (108, None), T.IQ4_NL: (0, None), T.IQ4_XS: (0, None),
}

# Where the packed sub-block scale codes sit (offset, bytes): q2_k's 16 bytes of 4-bit scale|min,
# q3_k's 12 bytes of 6-bit scales, iq4_xs's scales_h (u16) and scales_l[4]. All-0x00 is code 0 in
# every sub-block, all-0xFF the largest (15 / 63). iq4_nl has none.
SCALE_CODES = {T.Q2_K: (0, 16), T.Q3_K: (96, 12), T.IQ4_XS: (2, 6)}


def special_scales():
    """(d, dmin) pairs for the edge cases: extreme, negative zero, subnormal, max subnormal."""
    tiny = np.uint16(0x0001).view(np.float16)   # smallest subnormal 2^-24
    big_sub = np.uint16(0x03FF).view(np.float16)  # largest subnormal
    return [
        (65504.0, 65504.0), (-65504.0, 65504.0), (65504.0, -65504.0),
        (-0.0, -0.0), (-0.0, 1.0), (1.0, -0.0),
        (tiny, tiny), (big_sub, big_sub), (-tiny, big_sub), (big_sub, -tiny),
        (6.103515625e-05, 6.103515625e-05),  # smallest normal 2^-14
    ]


def quant_blocks(qtype, n_random=48, rng=RNG):
    """Random blocks with finite random f16 scales, all-zero blocks and the special scales (each on
    random payload bytes)."""
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    d_off, m_off = SCALE_FIELDS[qtype]
    specials = special_scales()
    n = n_random + 4 + len(specials)
    b = rng.integers(0, 256, size=(n, block_bytes), dtype=np.uint8)
    # finite random scales: magnitudes 2^-20 .. 2^4, random sign
    d = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-20, 4, n))).astype(np.float16)
    m = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-20, 4, n))).astype(np.float16)
    for i, (sd, sm) in enumerate(specials):
        d[n_random + 4 + i] = sd
        m[n_random + 4 + i] = sm
    b[:, d_off:d_off + 2] = f16_bytes(d)
    if m_off is not None:
        b[:, m_off:m_off + 2] = f16_bytes(m)
    b[n_random:n_random + 2] = 0  # all-zero blocks (d = 0, every level 0)
    # zero payload but nonzero scales: every value is the offset (or 0)
    keep = b[n_random + 2:n_random + 4].copy()
    b[n_random + 2:n_random + 4] = 0
    b[n_random + 2:n_random + 4, d_off:d_off + 2] = keep[:, d_off:d_off + 2]
    if m_off is not None:
        b[n_random + 2:n_random + 4, m_off:m_off + 2] = keep[:, m_off:m_off + 2]
    return b


def extreme_code_blocks(qtype, rng):
    """Blocks whose sub-block scale codes are all 0 or all at the maximum, each with a random, a
    +65504 and a -65504 super-scale (d and dmin alike) on random payload bytes."""
    _, block_bytes = GGML_QUANT_SIZES[qtype]
    d_off, m_off = SCALE_FIELDS[qtype]
    c_off, c_len = SCALE_CODES[qtype]
    scales = [float(np.float16(rng.uniform(1e-3, 1.0))), 65504.0, -65504.0]
    b = rng.integers(0, 256, size=(2 * len(scales), block_bytes), dtype=np.uint8)
    for i, (code, d) in enumerate((c, d) for c in (0x00, 0xFF) for d in scales):
        b[i, c_off:c_off + c_len] = code
        b[i, d_off:d_off + 2] = f16_bytes([d])[0]
        if m_off is not None:
            b[i, m_off:m_off + 2] = f16_bytes([d])[0]
    return b


def write_import_only_fixtures(out):
    """q2_k, q3_k, iq4_xs, iq4_nl: gguf-py has no quantizer for them, so every block is random
    bytes with chosen scale fields (quant_blocks' cases plus the extreme scale codes)."""
    names = {T.Q2_K: "q2_k", T.Q3_K: "q3_k", T.IQ4_XS: "iq4_xs", T.IQ4_NL: "iq4_nl"}
    for qtype, name in names.items():
        b = quant_blocks(qtype, rng=RNG_IMPORT)
        if qtype in SCALE_CODES:
            b = np.concatenate([b, extreme_code_blocks(qtype, RNG_IMPORT)])
        y = quants.dequantize(b, qtype)
        write_nfcx(os.path.join(out, f"deq_{name}.bin"), qtype, b, y)


def write_dequant_fixtures(out):
    names = {T.Q8_0: "q8_0", T.Q4_K: "q4_k", T.Q5_K: "q5_k", T.Q6_K: "q6_k",
             T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1"}
    for qtype, name in names.items():
        b = quant_blocks(qtype)
        y = quants.dequantize(b, qtype)
        write_nfcx(os.path.join(out, f"deq_{name}.bin"), qtype, b, y)
    # f16: every bit pattern
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    write_nfcx(os.path.join(out, "deq_f16.bin"), T.F16, h.view(np.uint8), quants.dequantize(h.view(np.uint8), T.F16))
    # bf16: every sign/exponent with random mantissas, plus all 256 patterns of the top byte's neighbours
    hb = np.concatenate([RNG.integers(0, 65536, 3840), np.arange(0, 65536, 256)]).astype(np.uint16)
    write_nfcx(os.path.join(out, "deq_bf16.bin"), T.BF16, hb.view(np.uint8), quants.dequantize(hb.view(np.uint8), T.BF16))


def f16_edge_inputs():
    """f32 values on and around every kind of f16 rounding edge."""
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65519.99, 65520.0, 65536.0, 1e30, -65520.0,
         2.0 ** -24, 2.0 ** -25, np.nextafter(np.float32(2.0 ** -25), np.float32(1)), 2.0 ** -26,
         3 * 2.0 ** -25, 5 * 2.0 ** -25, 2.0 ** -14, 2.0 ** -14 - 2.0 ** -25, 1e-45, -1e-45]
    v = np.array(v, dtype=np.float32)
    # midpoints between adjacent f16 values (ties), and one f32 ulp either side of them
    h = RNG.integers(0, 0x7BFF, 1000).astype(np.uint16)
    lo = h.view(np.float16).astype(np.float32)
    hi = (h + 1).view(np.float16).astype(np.float32)
    mid = ((lo.astype(np.float64) + hi.astype(np.float64)) / 2).astype(np.float32)
    ties = np.concatenate([mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])
    ties = ties * RNG.choice(np.array([-1, 1], dtype=np.float32), ties.size)
    wide = (RNG.standard_normal(1000) * np.exp2(RNG.uniform(-30, 17, 1000))).astype(np.float32)
    return np.concatenate([v, ties, wide]).astype(np.float32)


def bf16_edge_inputs():
    u = RNG.integers(0, 2 ** 32, 4000, dtype=np.uint64).astype(np.uint32)
    u[:1000] = (u[:1000] & 0xFFFF0000) | 0x8000  # exact ties
    u[1000:1100] = (u[1000:1100] & 0x807FFFFF) | 0x7F800000  # inf / NaN patterns
    v = u.view(np.float32)
    extra = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.4028235e38, -3.4028235e38, 1e-45], dtype=np.float32)
    return np.concatenate([v, extra]).astype(np.float32)


def write_encode_fixtures(out):
    x = f16_edge_inputs()
    write_nfcx(os.path.join(out, "enc_f16.bin"), T.F16, quants.quantize(x, T.F16).view(np.uint8), x)
    x = bf16_edge_inputs()
    write_nfcx(os.path.join(out, "enc_bf16.bin"), T.BF16, quants.quantize(x, T.BF16).view(np.uint8), x)
    # q8_0: Gaussian and heavy-tailed blocks at several magnitudes, zero blocks, one huge block
    blocks = [RNG.standard_normal((40, 32)) * np.exp2(RNG.uniform(-20, 10, (40, 1))),
              RNG.standard_t(3, (20, 32)), np.zeros((2, 32)), np.full((1, 32), -0.0),
              RNG.standard_normal((1, 32)) * 1e4, RNG.integers(-127, 128, (4, 32)) * 0.5]
    x = np.concatenate(blocks).astype(np.float32)
    write_nfcx(os.path.join(out, "enc_q8_0.bin"), T.Q8_0, quants.quantize(x, T.Q8_0), x)


# ---- the reference searches for the k-quants (gguf-py has no k-quant quantizer) -----------------
#
# The block model is the one the codec defines: per sub-block y = s*L - o (q4_k, q5_k: L in
# [0, nmax], s >= 0, o >= 0) or y = s*l (q6_k: l in [-32, 31]); the super-block then stores s and o
# as 6-bit (q4_k/q5_k) or int8 (q6_k) multiples of f16 super-scales, and every level is picked again
# against the decoded scales. The reference searches the sub-block fit far more finely than the C
# quantizer (candidate inverse scales every 0.01 level over +-2 levels around nmax, 401 candidates,
# least-squares refit for each, then up to 16 rounds of level/scale alternation), so it
# approximates the best sub-block fit this model admits; the super-block stage is the same.

GRID = np.arange(-200, 201) * 0.01


def fit_min_ref(x, nmax):
    """x: [B, n]. Returns scale [B], offset [B] (>= 0) for x ~ scale*L - offset."""
    mn = np.minimum(x.min(axis=1), 0.0)
    mx = x.max(axis=1)
    rng = mx - mn
    best_err = np.full(x.shape[0], np.inf)
    best_s = np.where(rng > 0, rng / nmax, 0.0)
    best_m = mn.copy()
    safe = np.where(rng > 0, rng, 1.0)

    def refit(L):
        n = x.shape[1]
        sl, sl2 = L.sum(1), (L * L).sum(1)
        sxl, sx = (x * L).sum(1), x.sum(1)
        D = n * sl2 - sl * sl
        ok = D > 0
        Dz = np.where(ok, D, 1.0)
        s = (n * sxl - sx * sl) / Dz
        m = (sl2 * sx - sl * sxl) / Dz
        pos = m > 0
        s = np.where(pos, sxl / np.where(sl2 > 0, sl2, 1.0), s)
        m = np.where(pos, 0.0, m)
        ok &= s > 0
        err = ((s[:, None] * L + m[:, None] - x) ** 2).sum(1)
        return np.where(ok, err, np.inf), s, m

    for t in GRID:
        iscale = (nmax + t) / safe
        L = np.clip(np.rint(iscale[:, None] * (x - mn[:, None])), 0, nmax)
        err, s, m = refit(L)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_m = np.where(better, m, best_m)
    for _ in range(16):
        ss = np.where(best_s > 0, best_s, 1.0)
        L = np.clip(np.rint((x - best_m[:, None]) / ss[:, None]), 0, nmax)
        err, s, m = refit(L)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_s = np.where(better, s, best_s)
        best_m = np.where(better, m, best_m)
    best_s = np.where(rng > 0, best_s, 0.0)
    return best_s, -best_m


def pack_k4_scales(ls, lm):
    """ls, lm: [B, 8] six-bit -> [B, 12] (get_scale_min_k4 layout)."""
    out = np.zeros((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (ls[:, :4] & 63) | ((ls[:, 4:] >> 4) << 6)
    out[:, 4:8] = (lm[:, :4] & 63) | ((lm[:, 4:] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    return out


def encode_k_min(x, nmax):
    """q4_k (nmax 15) / q5_k (nmax 31) super-blocks from x [B, 256]: header bytes [B, 16], levels [B, 256]."""
    B = x.shape[0]
    xs = x.reshape(B * 8, 32).astype(np.float64)
    s, o = fit_min_ref(xs, nmax)
    s, o = s.reshape(B, 8).astype(np.float32), o.reshape(B, 8).astype(np.float32)
    max_s, max_o = s.max(1), o.max(1)
    inv_s = np.where(max_s > 0, np.float32(63) / np.where(max_s > 0, max_s, 1), 0).astype(np.float32)
    inv_o = np.where(max_o > 0, np.float32(63) / np.where(max_o > 0, max_o, 1), 0).astype(np.float32)
    ls = np.clip(np.rint(inv_s[:, None] * s), 0, 63).astype(np.uint8)
    lm = np.clip(np.rint(inv_o[:, None] * o), 0, 63).astype(np.uint8)
    d = (max_s / np.float32(63)).astype(np.float16)
    dmin = (max_o / np.float32(63)).astype(np.float16)
    dd = d.astype(np.float32)[:, None] * ls.astype(np.float32)
    dm = dmin.astype(np.float32)[:, None] * lm.astype(np.float32)
    xr = x.reshape(B, 8, 32)
    L = np.where(dd[..., None] != 0,
                 np.clip(np.rint((xr + dm[..., None]) / np.where(dd != 0, dd, 1)[..., None]), 0, nmax), 0)
    head = np.concatenate([f16_bytes(d), f16_bytes(dmin), pack_k4_scales(ls, lm)], axis=1)
    return head, L.reshape(B, 256).astype(np.uint8)


def quantize_q4_k_ref(x):
    head, L = encode_k_min(x, 15)
    Lr = L.reshape(-1, 4, 2, 32)  # [B, pair p, half, l]
    qs = (Lr[:, :, 0, :] | (Lr[:, :, 1, :] << 4)).reshape(-1, 128)
    return np.concatenate([head, qs], axis=1)


def quantize_q5_k_ref(x):
    head, L = encode_k_min(x, 31)
    Lr = L.reshape(-1, 4, 2, 32)
    low = Lr & 0xF
    qs = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(-1, 128)
    hi = (Lr >> 4) & 1  # [B, p, half, l] -> bit 2p+half of qh[l]
    qh = np.zeros((L.shape[0], 32), dtype=np.uint8)
    for p in range(4):
        for h in range(2):
            qh |= (hi[:, p, h, :] << (2 * p + h)).astype(np.uint8)
    return np.concatenate([head, qh, qs], axis=1)


def fit_sym_ref(x, nmax=32):
    """x: [B, n] -> signed scale [B] for x ~ scale*l, l in [-nmax, nmax-1]."""
    amax_i = np.abs(x).argmax(1)
    mx = x[np.arange(x.shape[0]), amax_i]
    ok = np.abs(mx) > 1e-30
    safe = np.where(ok, mx, 1.0)
    best, best_s = np.full(x.shape[0], -1.0), np.zeros(x.shape[0])

    def score(iscale):
        l = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)
        slx, sl2 = (x * l).sum(1), (l * l).sum(1)
        good = sl2 > 0
        sl2z = np.where(good, sl2, 1.0)
        return np.where(good, slx * slx / sl2z, -1.0), slx / sl2z

    for t in GRID:
        for iscale in (-(nmax + t) / safe, (nmax - 1 + t) / safe):
            sc, s = score(iscale)
            better = sc > best
            best, best_s = np.where(better, sc, best), np.where(better, s, best_s)
    for _ in range(16):
        inv = np.where(best_s != 0, 1.0 / np.where(best_s != 0, best_s, 1.0), 0.0)
        sc, s = score(inv)
        better = sc > best
        best, best_s = np.where(better, sc, best), np.where(better, s, best_s)
    return np.where(ok, best_s, 0.0)


def quantize_q6_k_ref(x):
    B = x.shape[0]
    s = fit_sym_ref(x.reshape(B * 16, 16).astype(np.float64)).reshape(B, 16).astype(np.float32)
    imax = np.abs(s).argmax(1)
    max_s = s[np.arange(B), imax]
    ok = max_s != 0
    iscale = np.where(ok, np.float32(-128) / np.where(ok, max_s, 1), 0).astype(np.float32)
    d = np.where(ok, np.float32(1) / np.where(ok, iscale, 1), 0).astype(np.float16)
    sc = np.clip(np.rint(iscale[:, None] * s), -128, 127).astype(np.int8)
    dd = d.astype(np.float32)[:, None] * sc.astype(np.float32)
    xr = x.reshape(B, 16, 16)
    L = np.where(dd[..., None] != 0,
                 np.clip(np.rint(xr / np.where(dd != 0, dd, 1)[..., None]), -32, 31) + 32, 32).astype(np.uint8)
    L = L.reshape(B, 2, 4, 32)  # [B, half, quarter, l]: element 128*half + 32*quarter + l
    ql = np.concatenate([(L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4),
                         (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)], axis=2).reshape(B, 128)
    qh = ((L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)).reshape(B, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), f16_bytes(d)], axis=1).astype(np.uint8)


REF_QUANTIZERS = {T.Q4_K: quantize_q4_k_ref, T.Q5_K: quantize_q5_k_ref, T.Q6_K: quantize_q6_k_ref}


def write_rmse_fixtures(out, rows=8, cols=2048):
    data = np.stack([RNG.standard_normal((rows, cols)), RNG.standard_t(3, (rows, cols))]).astype(np.float32)
    with open(os.path.join(out, "rows.bin"), "wb") as f:
        f.write(b"NFCR" + struct.pack("<4I", 1, 2, rows, cols))
        f.write(data.astype("<f4").tobytes())
    lines = ["# codec\tdist\toracle_rmse\toracle (gguf quantize, or the reference search of gguf_codecs.py)"]
    for qtype, name in [(T.Q8_0, "q8_0"), (T.Q4_K, "q4_k"), (T.Q5_K, "q5_k"), (T.Q6_K, "q6_k")]:
        for di, dist in enumerate(["gauss", "student_t3"]):
            x = data[di]
            if qtype in REF_QUANTIZERS:
                blocks = REF_QUANTIZERS[qtype](x.reshape(-1, 256))
                kind = "reference-search"
            else:
                blocks = quants.quantize(x, qtype)
                kind = "gguf.quants.quantize"
            y = quants.dequantize(blocks.reshape(rows, -1), qtype)
            rmse = float(np.sqrt(np.mean((y.astype(np.float64) - x.astype(np.float64)) ** 2)))
            lines.append(f"{name}\t{dist}\t{rmse:.9g}\t{kind}")
            print(f"{name:5s} {dist:10s} rmse {rmse:.6g} ({kind})")
    with open(os.path.join(out, "rmse.tsv"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "codec"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    write_dequant_fixtures(a.out)
    write_encode_fixtures(a.out)
    write_rmse_fixtures(a.out)
    write_import_only_fixtures(a.out)


if __name__ == "__main__":
    main()
