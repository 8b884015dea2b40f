#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/: tiny GGUF files written with llama.cpp's gguf-py (PyPI `gguf`) for
tests/convert/test_convert_gguf.c, and gguf-py's dequantization of every tensor as the oracle.

  qwen3moe.gguf   a 2-layer qwen3moe model with llama.cpp tensor names and the qwen3moe.* keys
                  llama.cpp's convert_hf_to_gguf.py writes (Qwen2MoeModel.set_gguf_parameters and
                  TextModel's): layer 0 sparse (ffn_gate_inp, ffn_{gate,up,down}_exps), layer 1 a
                  dense MLP (no router), untied output.
  qwen2moe.gguf   a 2-layer qwen2moe model with the keys and names convert_hf_to_gguf.py's
                  Qwen2MoeModel writes: q/k/v biases (attn_{q,k,v}.bias), layer 0 sparse with a
                  shared expert (ffn_{gate,up,down}_shexp, ffn_gate_inp_shexp [1, H] as HF's
                  shared_expert_gate.weight converts), expert_shared_feed_forward_length; layer 1 a
                  dense MLP; tied embeddings. The shared gate/up are stacked here (gate rows, then up).
  qwen3moe_lowbit.gguf
                  a 2-layer qwen3moe in the import-only codecs, mixed as llama.cpp's low-bit types
                  mix them: token_embd q3_k, output q6_k; layer 0 (sparse) attn_q/k iq4_xs, attn_v
                  q6_k, attn_output iq4_nl (32-wide rows), ffn_{gate,up}_exps q2_k, ffn_down_exps
                  iq4_nl; layer 1 (dense) attn_q/k q3_k, attn_v q5_k, attn_output q8_0, ffn_gate
                  q3_k, ffn_up q2_k, ffn_down q8_0. Blocks are random bytes with scales chosen per
                  type (SANE) so weights stay around 0.05-0.1 and the model's activations finite
                  (gguf-py has no quantizer for these types). With .expected.safetensors, .meta.txt
                  and .fnv1a64 as qwen3moe's.
  gate_up_mix.gguf
                  a 1-layer qwen3moe whose ffn_gate_exps is q2_k and ffn_up_exps q3_k: the stacked
                  gate_up bank cannot be carried over (one codec per tensor) and is re-encoded.
  llama.gguf      a 2-layer llama (GQA, tied embeddings); attn_q/attn_k rows are in llama.cpp's
                  permuted rotary order, as convert_hf_to_gguf.py's LlamaModel.permute leaves them.
  *.expected.safetensors
                  f32, one entry per ARTIFACT tensor name (docs/model_schema.md) in artifact shape:
                  gguf.quants.dequantize of the source bytes; expert gate/up banks stacked here per
                  expert (gate rows, then up rows); llama q/k un-permuted here with numpy (the inverse
                  of llama.cpp's permute); plus "<name>.src_rows" (i32): for llama q/k, the GGUF row
                  each artifact row comes from.
  *.meta.txt      the metadata the artifact must carry, one key a line: `TYPE KEY VALUE...` with
                  TYPE in u32 i32 bool f32 f64 str i32[] str[]; strings hex-encoded (UTF-8 bytes).
  *.fnv1a64      FNV-1a 64 of the .gguf file's bytes (hex): provenance.source_hash under --hash-bytes.
  bad_type.gguf   a llama whose token_embd is IQ2_XXS (ggml type 16, which ninfer cannot decode).
  missing.gguf    a tiny llama without blk.0.ffn_up.weight.
  bad_shape.gguf  a tiny llama whose blk.0.attn_k.weight has 4 heads' rows while head_count_kv = 2.
  bad_arch.gguf   general.architecture = phi3.
  yarn.gguf       a tiny llama with rope.scaling.type yarn, factor 4, original context 32768.
  partial_rope.gguf  a tiny llama with rope.dimension_count 4 < head_dim 8 (refused).
  bad_tok.gguf    a tiny llama whose tokenizer.ggml.pre is llama.cpp's "default" (not a pre-tokenizer
                  ninfer has).

gguf-py has no k-quant (nor q2_k/q3_k/iq4) quantizer: quantized tensors are random blocks (sane fp16 scales) written as
raw bytes with the declared ggml type (add_tensor(..., raw_dtype=)).

Usage: python tests/oracle/gguf_fixture.py [--out tests/fixtures/gguf]   (deterministic: fixed seed)
"""
import argparse
import json
import os
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

RNG = np.random.default_rng(20250805)

# Offsets of each block type's fp16 scale fields (ggml's block structs): random bytes elsewhere.
SCALES = {T.Q8_0: (0,), T.Q4_1: (0, 2), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.IQ2_XXS: (0,)}


def random_blocks(qtype, rows, cols, rng=None, sane=None):
    """[rows][row_bytes] uint8 of random blocks with fp16 scales in [2e-3, 2e-2), or with `sane`'s
    per-type ((offset, lo, hi), ...) ranges when given."""
    rng = RNG if rng is None else rng
    be, bb = GGML_QUANT_SIZES[qtype]
    assert cols % be == 0, (qtype, cols)
    nb = rows * cols // be
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    fields = sane[qtype] if sane else [(off, 2e-3, 2e-2) for off in SCALES[qtype]]
    for off, lo, hi in fields:
        d = rng.uniform(lo, hi, size=nb).astype(np.float16)
        b[:, off:off + 2] = d.view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, cols // be * bb)


class Model:
    """Collects tensors (GGUF name -> (numpy data for the writer, raw_dtype, dequantized f32))."""

    def __init__(self, rng=None, sane=None):
        self.tensors = {}
        self.rng = RNG if rng is None else rng
        self.sane = sane

    def add(self, name, qtype, shape, suffix=".weight"):
        """shape outermost first ([E][rows][cols] or [rows][cols] or [n]); returns the f32 values."""
        cols = shape[-1]
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        if qtype == T.F32:
            data = self.rng.standard_normal(size=shape).astype(np.float32) * 0.5
            raw = None
        elif qtype == T.F16:
            data = (self.rng.standard_normal(size=shape) * 0.1).astype(np.float16)
            raw = None
        else:
            data = random_blocks(qtype, rows, cols, self.rng, self.sane).reshape(*shape[:-1], -1)
            raw = qtype
        deq = gguf.quants.dequantize(data, qtype if raw else (T.F32 if qtype == T.F32 else T.F16))
        deq = np.asarray(deq, dtype=np.float32).reshape(shape)
        self.tensors[name + suffix] = (data, raw, deq)
        return deq

    def write(self, path, arch, kv):
        w = gguf.GGUFWriter(path, arch)
        kv(w)
        for name, (data, raw, _) in self.tensors.items():
            if raw is None:
                w.add_tensor(name, data)
            else:
                w.add_tensor(name, data, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


# ---- tokenizer metadata (gpt2 byte-level BPE) ----------------------------------------------------

def tokenizer(vocab, pre, with_eot):
    """A small vocab of `vocab` tokens: 3 control tokens, byte-level letters, merged tokens."""
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    base = list("abcdefghij") + ["\u0120"]  # \u0120 = GPT-2's byte-level space
    merges = ["a b", "\u0120 a", "c d", "ab c", "\u0120a b", "e f"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = special + base + merged
    tokens += ["x%d" % i for i in range(vocab - len(tokens) - 2)] + ["<tool>", "\u00e9t\u00e9"]
    assert len(tokens) == vocab
    types = [3, 3, 3] + [1] * (vocab - 5) + [4, 1]
    tok = dict(model="gpt2", pre=pre, tokens=tokens, types=types, merges=merges, bos=0, eos=2,
               pad=0, eot=1 if with_eot else None, add_bos=not with_eot,
               template="{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


def add_tokenizer(w, t):
    w.add_tokenizer_model(t["model"])
    w.add_tokenizer_pre(t["pre"])
    w.add_token_list(t["tokens"])
    w.add_token_types(t["types"])
    w.add_token_merges(t["merges"])
    w.add_bos_token_id(t["bos"])
    w.add_eos_token_id(t["eos"])
    w.add_pad_token_id(t["pad"])
    if t["eot"] is not None:
        w.add_eot_token_id(t["eot"])
    w.add_add_bos_token(t["add_bos"])
    w.add_chat_template(t["template"])


def tokenizer_meta(t):
    eos_ids = [t["eos"]] + ([t["eot"]] if t["eot"] is not None and t["eot"] != t["eos"] else [])
    return [("str", "tokenizer.model", t["model"]), ("str", "tokenizer.pre", t["pre"]),
            ("str[]", "tokenizer.tokens", t["tokens"]), ("i32[]", "tokenizer.token_type", t["types"]),
            ("str[]", "tokenizer.merges", t["merges"]), ("i32", "tokenizer.bos_id", t["bos"]),
            ("i32", "tokenizer.eos_id", t["eos"]), ("i32", "tokenizer.pad_id", t["pad"]),
            ("i32[]", "tokenizer.eos_ids", eos_ids), ("bool", "tokenizer.add_bos", int(t["add_bos"])),
            ("str", "tokenizer.chat_template", t["template"])]


# ---- output files --------------------------------------------------------------------------------

def write_safetensors(path, arrays):
    """The safetensors layout (8-byte header length, JSON header, raw little-endian data)."""
    header, blobs, off = {}, [], 0
    for k, a in arrays.items():
        a = np.ascontiguousarray(a)
        dt = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}[a.dtype]
        header[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        blobs.append(a.astype(a.dtype.newbyteorder("<")).tobytes())
        off += a.nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def write_meta(path, entries):
    def enc(s):
        return s.encode("utf-8").hex() or "-"
    with open(path, "w") as f:
        for typ, key, v in entries:
            if typ == "str":
                f.write("%s %s %s\n" % (typ, key, enc(v)))
            elif typ == "str[]":
                f.write("%s %s %d %s\n" % (typ, key, len(v), " ".join(enc(x) for x in v)))
            elif typ == "i32[]":
                f.write("%s %s %d %s\n" % (typ, key, len(v), " ".join(str(int(x)) for x in v)))
            elif typ in ("f32", "f64"):
                f.write("%s %s %s\n" % (typ, key, float(v).hex()))
            else:
                f.write("%s %s %d\n" % (typ, key, int(v)))


# ---- the models ----------------------------------------------------------------------------------

def qwen3moe(out):
    H, V, L, NH, NKV, HD, D, E, K, I = 256, 32, 2, 2, 1, 16, 32, 4, 2, 32
    m, exp = Model(), {}
    exp["token_embd"] = m.add("token_embd", T.Q8_0, [V, H])
    codecs = [dict(q=T.Q4_K, k=T.Q5_K, v=T.Q6_K, o=T.Q4_1),
              dict(q=T.Q6_K, k=T.Q4_K, v=T.Q8_0, o=T.F16)]
    for i in range(L):
        c = codecs[i]
        b = "blk.%d." % i
        exp[b + "attn_norm"] = m.add(b + "attn_norm", T.F32, [H])
        exp[b + "attn_q"] = m.add(b + "attn_q", c["q"], [NH * HD, H])
        exp[b + "attn_k"] = m.add(b + "attn_k", c["k"], [NKV * HD, H])
        exp[b + "attn_v"] = m.add(b + "attn_v", c["v"], [NKV * HD, H])
        exp[b + "attn_output"] = m.add(b + "attn_output", c["o"], [H, NH * HD])
        exp[b + "attn_q_norm"] = m.add(b + "attn_q_norm", T.F32, [HD])
        exp[b + "attn_k_norm"] = m.add(b + "attn_k_norm", T.F32, [HD])
        exp[b + "ffn_norm"] = m.add(b + "ffn_norm", T.F32, [H])
        if i == 0:  # the sparse-MoE block
            exp[b + "ffn_gate_inp"] = m.add(b + "ffn_gate_inp", T.F32, [E, H])
            gate = m.add(b + "ffn_gate_exps", T.Q4_K, [E, I, H])
            up = m.add(b + "ffn_up_exps", T.Q4_K, [E, I, H])
            exp[b + "ffn_gate_up_exps"] = np.concatenate([gate, up], axis=1)  # [E][2I][H]: gate_j, up_j
            exp[b + "ffn_down_exps"] = m.add(b + "ffn_down_exps", T.Q8_0, [E, H, I])
        else:  # a dense MLP layer (mlp_only_layers)
            exp[b + "ffn_gate"] = m.add(b + "ffn_gate", T.Q5_K, [D, H])
            exp[b + "ffn_up"] = m.add(b + "ffn_up", T.Q4_1, [D, H])
            exp[b + "ffn_down"] = m.add(b + "ffn_down", T.F16, [H, D])
    exp["output_norm"] = m.add("output_norm", T.F32, [H])
    exp["output"] = m.add("output", T.Q6_K, [V, H])
    tok = tokenizer(V, "qwen2", with_eot=False)
    eps, theta, ctx = 1e-6, 1000000.0, 4096

    def kv(w):  # the keys convert_hf_to_gguf.py's TextModel + Qwen2MoeModel write for Qwen3-MoE
        w.add_block_count(L)
        w.add_context_length(ctx)
        w.add_embedding_length(H)
        w.add_feed_forward_length(D)
        w.add_head_count(NH)
        w.add_head_count_kv(NKV)
        w.add_rope_freq_base(theta)
        w.add_layer_norm_rms_eps(eps)
        w.add_expert_used_count(K)
        w.add_key_length(HD)
        w.add_value_length(HD)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
        w.add_expert_count(E)
        w.add_expert_feed_forward_length(I)
        add_tokenizer(w, tok)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    m.write(os.path.join(out, "qwen3moe.gguf"), "qwen3moe", kv)
    write_safetensors(os.path.join(out, "qwen3moe.expected.safetensors"), exp)
    meta = [("str", "model.arch", "qwen3_moe"), ("u32", "model.hidden", H), ("u32", "model.layers", L),
            ("u32", "model.heads", NH), ("u32", "model.kv_heads", NKV), ("u32", "model.head_dim", HD),
            ("u32", "model.vocab", V), ("f32", "model.rms_eps", np.float32(eps)), ("f64", "model.rope_theta", theta),
            ("str", "model.rope_scaling", "none"), ("u32", "model.max_ctx", ctx),
            ("bool", "model.tie_embeddings", 0), ("bool", "model.qkv_bias", 0), ("bool", "model.qk_norm", 1),
            ("u32", "model.dense_inter", D), ("u32", "model.experts", E), ("u32", "model.top_k", K),
            ("u32", "model.moe_inter", I), ("u32", "model.shared_inter", 0), ("bool", "model.norm_topk", 1),
            ("i32[]", "model.moe_layers", [1, 0])]
    write_meta(os.path.join(out, "qwen3moe.meta.txt"), meta + tokenizer_meta(tok))


def qwen2moe(out):
    H, V, L, NH, NKV, HD, D, E, K, I, S = 256, 32, 2, 2, 1, 16, 32, 4, 2, 32, 64
    m, exp = Model(), {}
    exp["token_embd"] = m.add("token_embd", T.Q8_0, [V, H])  # tied: no output tensor
    codecs = [dict(q=T.Q5_K, k=T.Q8_0, v=T.Q4_K, o=T.Q4_1), dict(q=T.F16, k=T.Q6_K, v=T.Q8_0, o=T.Q8_0)]
    for i in range(L):
        c = codecs[i]
        b = "blk.%d." % i
        exp[b + "attn_norm"] = m.add(b + "attn_norm", T.F32, [H])
        for n, rows in (("attn_q", NH * HD), ("attn_k", NKV * HD), ("attn_v", NKV * HD)):
            exp[b + n] = m.add(b + n, c[n[-1]], [rows, H])
            exp[b + n + "_bias"] = m.add(b + n, T.F32, [rows], suffix=".bias")
        exp[b + "attn_output"] = m.add(b + "attn_output", c["o"], [H, NH * HD])
        exp[b + "ffn_norm"] = m.add(b + "ffn_norm", T.F32, [H])
        if i == 0:  # sparse MoE with the shared expert
            exp[b + "ffn_gate_inp"] = m.add(b + "ffn_gate_inp", T.F32, [E, H])
            gate = m.add(b + "ffn_gate_exps", T.Q8_0, [E, I, H])
            up = m.add(b + "ffn_up_exps", T.Q8_0, [E, I, H])
            exp[b + "ffn_gate_up_exps"] = np.concatenate([gate, up], axis=1)
            exp[b + "ffn_down_exps"] = m.add(b + "ffn_down_exps", T.Q8_0, [E, H, I])
            sg = m.add(b + "ffn_gate_shexp", T.Q6_K, [S, H])
            su = m.add(b + "ffn_up_shexp", T.Q6_K, [S, H])
            exp[b + "ffn_gate_up_shexp"] = np.concatenate([sg, su], axis=0)  # [2S][H]: gate rows, then up
            exp[b + "ffn_down_shexp"] = m.add(b + "ffn_down_shexp", T.Q8_0, [H, S])
            exp[b + "ffn_gate_inp_shexp"] = m.add(b + "ffn_gate_inp_shexp", T.F32, [1, H]).reshape(H)
        else:
            exp[b + "ffn_gate"] = m.add(b + "ffn_gate", T.Q4_K, [D, H])
            exp[b + "ffn_up"] = m.add(b + "ffn_up", T.F16, [D, H])
            exp[b + "ffn_down"] = m.add(b + "ffn_down", T.Q4_1, [H, D])
    exp["output_norm"] = m.add("output_norm", T.F32, [H])
    tok = tokenizer(V, "qwen2", with_eot=True)
    eps, theta, ctx = 1e-6, 1000000.0, 4096

    def kv(w):  # TextModel + Qwen2MoeModel.set_gguf_parameters
        w.add_block_count(L)
        w.add_context_length(ctx)
        w.add_embedding_length(H)
        w.add_feed_forward_length(D)
        w.add_head_count(NH)
        w.add_head_count_kv(NKV)
        w.add_rope_freq_base(theta)
        w.add_layer_norm_rms_eps(eps)
        w.add_expert_used_count(K)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
        w.add_expert_count(E)
        w.add_expert_feed_forward_length(I)
        w.add_expert_shared_feed_forward_length(S)
        # Qwen2-MoE's config.json has no head_dim, so real files leave key_length out (head_dim =
        # hidden / heads, exercised by the tiny llamas); written here to keep q/o small.
        w.add_key_length(HD)
        w.add_value_length(HD)
        add_tokenizer(w, tok)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    m.write(os.path.join(out, "qwen2moe.gguf"), "qwen2moe", kv)
    write_safetensors(os.path.join(out, "qwen2moe.expected.safetensors"), exp)
    meta = [("str", "model.arch", "qwen2_moe"), ("u32", "model.hidden", H), ("u32", "model.layers", L),
            ("u32", "model.heads", NH), ("u32", "model.kv_heads", NKV), ("u32", "model.head_dim", HD),
            ("u32", "model.vocab", V), ("f32", "model.rms_eps", np.float32(eps)), ("f64", "model.rope_theta", theta),
            ("str", "model.rope_scaling", "none"), ("u32", "model.max_ctx", ctx),
            ("bool", "model.tie_embeddings", 1), ("bool", "model.qkv_bias", 1), ("bool", "model.qk_norm", 0),
            ("u32", "model.dense_inter", D), ("u32", "model.experts", E), ("u32", "model.top_k", K),
            ("u32", "model.moe_inter", I), ("u32", "model.shared_inter", S), ("bool", "model.norm_topk", 0),
            ("i32[]", "model.moe_layers", [1, 0])]
    write_meta(os.path.join(out, "qwen2moe.meta.txt"), meta + tokenizer_meta(tok))


# Per-type scale ranges (field offset, low, high) for the low-bit fixture: each gives weights of
# typical magnitude 0.05-0.1 given the codec's level and sub-scale ranges (q2_k: d*sc*q - dmin*m
# with sc, m < 16, q < 4; q3_k: d*sc*q, |sc| <= 32, |q| <= 4; iq4_xs: d*ls*kv, |ls| <= 32, |kv| <= 127;
# iq4_nl: d*kv; q4_k/q5_k: 6-bit sc, 4/5-bit q; q6_k: int8 sc, |q| <= 32; q8_0: |q| <= 127). Lower
# bounds stay above f16's smallest normal (6.1e-5).
SANE = {
    T.Q2_K: ((80, 2e-3, 8e-3), (82, 1e-3, 4e-3)), T.Q3_K: ((108, 1e-3, 3e-3),),
    T.IQ4_XS: ((0, 6.2e-5, 1.5e-4),), T.IQ4_NL: ((0, 5e-4, 2e-3),),
    T.Q4_K: ((0, 1e-4, 3e-4), (2, 1e-4, 3e-4)), T.Q5_K: ((0, 6.2e-5, 1.5e-4), (2, 6.2e-5, 1.5e-4)),
    T.Q6_K: ((208, 6.2e-5, 1e-4),), T.Q8_0: ((0, 5e-4, 1.5e-3),),
}


def qwen3moe_kv(w, L, H, NH, NKV, HD, D, E, K, I, tok, eps, theta, ctx, ftype):
    """The keys convert_hf_to_gguf.py's TextModel + Qwen2MoeModel write for Qwen3-MoE."""
    w.add_block_count(L)
    w.add_context_length(ctx)
    w.add_embedding_length(H)
    w.add_feed_forward_length(D)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_expert_used_count(K)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_file_type(ftype)
    w.add_expert_count(E)
    w.add_expert_feed_forward_length(I)
    add_tokenizer(w, tok)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


def qwen3moe_lowbit(out):
    H, V, L, NH, NKV, HD, D, E, K, I = 256, 32, 2, 2, 1, 16, 32, 4, 2, 32
    m, exp = Model(np.random.default_rng(20261207), SANE), {}
    exp["token_embd"] = m.add("token_embd", T.Q3_K, [V, H])
    attn = [dict(q=T.IQ4_XS, k=T.IQ4_XS, v=T.Q6_K, o=T.IQ4_NL), dict(q=T.Q3_K, k=T.Q3_K, v=T.Q5_K, o=T.Q8_0)]
    for i in range(L):
        c, b = attn[i], "blk.%d." % i
        exp[b + "attn_norm"] = m.add(b + "attn_norm", T.F32, [H])
        exp[b + "attn_q"] = m.add(b + "attn_q", c["q"], [NH * HD, H])
        exp[b + "attn_k"] = m.add(b + "attn_k", c["k"], [NKV * HD, H])
        exp[b + "attn_v"] = m.add(b + "attn_v", c["v"], [NKV * HD, H])
        exp[b + "attn_output"] = m.add(b + "attn_output", c["o"], [H, NH * HD])
        exp[b + "attn_q_norm"] = m.add(b + "attn_q_norm", T.F32, [HD])
        exp[b + "attn_k_norm"] = m.add(b + "attn_k_norm", T.F32, [HD])
        exp[b + "ffn_norm"] = m.add(b + "ffn_norm", T.F32, [H])
        if i == 0:  # sparse: q2_k experts' gate/up, iq4_nl down (its 32-wide rows take no k-quant)
            exp[b + "ffn_gate_inp"] = m.add(b + "ffn_gate_inp", T.F32, [E, H])
            gate = m.add(b + "ffn_gate_exps", T.Q2_K, [E, I, H])
            up = m.add(b + "ffn_up_exps", T.Q2_K, [E, I, H])
            exp[b + "ffn_gate_up_exps"] = np.concatenate([gate, up], axis=1)
            exp[b + "ffn_down_exps"] = m.add(b + "ffn_down_exps", T.IQ4_NL, [E, H, I])
        else:  # dense: gate and up stay separate tensors, so their codecs may differ and still carry
            exp[b + "ffn_gate"] = m.add(b + "ffn_gate", T.Q3_K, [D, H])
            exp[b + "ffn_up"] = m.add(b + "ffn_up", T.Q2_K, [D, H])
            exp[b + "ffn_down"] = m.add(b + "ffn_down", T.Q8_0, [H, D])
    exp["output_norm"] = m.add("output_norm", T.F32, [H])
    exp["output"] = m.add("output", T.Q6_K, [V, H])
    tok = tokenizer(V, "qwen2", with_eot=False)
    eps, theta, ctx = 1e-6, 1000000.0, 4096
    m.write(os.path.join(out, "qwen3moe_lowbit.gguf"), "qwen3moe",
            lambda w: qwen3moe_kv(w, L, H, NH, NKV, HD, D, E, K, I, tok, eps, theta, ctx,
                                  gguf.LlamaFileType.MOSTLY_Q3_K_M))
    write_safetensors(os.path.join(out, "qwen3moe_lowbit.expected.safetensors"), exp)
    meta = [("str", "model.arch", "qwen3_moe"), ("u32", "model.hidden", H), ("u32", "model.layers", L),
            ("u32", "model.heads", NH), ("u32", "model.kv_heads", NKV), ("u32", "model.head_dim", HD),
            ("u32", "model.vocab", V), ("f32", "model.rms_eps", np.float32(eps)), ("f64", "model.rope_theta", theta),
            ("str", "model.rope_scaling", "none"), ("u32", "model.max_ctx", ctx),
            ("bool", "model.tie_embeddings", 0), ("bool", "model.qkv_bias", 0), ("bool", "model.qk_norm", 1),
            ("u32", "model.dense_inter", D), ("u32", "model.experts", E), ("u32", "model.top_k", K),
            ("u32", "model.moe_inter", I), ("u32", "model.shared_inter", 0), ("bool", "model.norm_topk", 1),
            ("i32[]", "model.moe_layers", [1, 0])]
    write_meta(os.path.join(out, "qwen3moe_lowbit.meta.txt"), meta + tokenizer_meta(tok))
    with open(os.path.join(out, "qwen3moe_lowbit.fnv1a64"), "w") as f:
        f.write(fnv1a64(os.path.join(out, "qwen3moe_lowbit.gguf")) + "\n")


def gate_up_mix(out):
    """One sparse layer whose expert gate is q2_k and up q3_k; the rest q8_0 / f32 (no oracle file:
    the test checks the plan, the warning and the q8_0 re-encode against the decoded source)."""
    H, V, NH, NKV, HD, E, K, I = 256, 32, 2, 1, 16, 2, 1, 32
    m = Model(np.random.default_rng(20261208), SANE)
    m.add("token_embd", T.Q8_0, [V, H])
    b = "blk.0."
    for n, shape in (("attn_q", [NH * HD, H]), ("attn_k", [NKV * HD, H]), ("attn_v", [NKV * HD, H]),
                     ("attn_output", [H, NH * HD])):
        m.add(b + n, T.Q8_0, shape)
    for n, shape in (("attn_norm", [H]), ("ffn_norm", [H]), ("attn_q_norm", [HD]), ("attn_k_norm", [HD]),
                     ("ffn_gate_inp", [E, H])):
        m.add(b + n, T.F32, shape)
    m.add(b + "ffn_gate_exps", T.Q2_K, [E, I, H])
    m.add(b + "ffn_up_exps", T.Q3_K, [E, I, H])
    m.add(b + "ffn_down_exps", T.Q8_0, [E, H, I])
    m.add("output_norm", T.F32, [H])
    tok = tokenizer(V, "qwen2", with_eot=False)
    m.write(os.path.join(out, "gate_up_mix.gguf"), "qwen3moe",
            lambda w: qwen3moe_kv(w, 1, H, NH, NKV, HD, 32, E, K, I, tok, 1e-6, 1000000.0, 4096,
                                  gguf.LlamaFileType.MOSTLY_Q2_K))


def llama_permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF rows -> llama.cpp's rotary row order."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_unpermute(w, n_head):
    """The inverse, written independently: rows (head, pair, half) back to (head, half, pair)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama(out):
    H, V, L, NH, NKV, HD, D = 256, 32, 2, 4, 2, 8, 32
    m, exp = Model(), {}
    exp["token_embd"] = m.add("token_embd", T.F16, [V, H])  # tied: no output tensor
    codecs = [dict(q=T.Q4_K, k=T.Q5_K, v=T.Q8_0, o=T.Q4_1, g=T.Q6_K, u=T.Q4_K, d=T.Q8_0),
              dict(q=T.Q4_1, k=T.F32, v=T.F16, o=T.Q8_0, g=T.Q4_K, u=T.Q4_K, d=T.F32)]
    for i in range(L):
        c = codecs[i]
        b = "blk.%d." % i
        exp[b + "attn_norm"] = m.add(b + "attn_norm", T.F32, [H])
        for n, heads, rows in (("attn_q", NH, NH * HD), ("attn_k", NKV, NKV * HD)):
            g = m.add(b + n, c[n[-1]], [rows, H])  # as stored: permuted rows
            exp[b + n] = llama_unpermute(g, heads)
            hf_of_gguf = llama_permute(np.arange(rows), heads)  # gguf row g holds HF row hf_of_gguf[g]
            src = np.empty(rows, dtype=np.int32)
            src[hf_of_gguf] = np.arange(rows, dtype=np.int32)
            assert np.array_equal(g[src], exp[b + n])
            exp[b + n + ".src_rows"] = src
        exp[b + "attn_v"] = m.add(b + "attn_v", c["v"], [NKV * HD, H])
        exp[b + "attn_output"] = m.add(b + "attn_output", c["o"], [H, NH * HD])
        exp[b + "ffn_norm"] = m.add(b + "ffn_norm", T.F32, [H])
        exp[b + "ffn_gate"] = m.add(b + "ffn_gate", c["g"], [D, H])
        exp[b + "ffn_up"] = m.add(b + "ffn_up", c["u"], [D, H])
        exp[b + "ffn_down"] = m.add(b + "ffn_down", c["d"], [H, D])
    exp["output_norm"] = m.add("output_norm", T.F32, [H])
    tok = tokenizer(V, "smollm", with_eot=True)
    eps, theta, ctx = 1e-5, 100000.0, 8192

    def kv(w):  # TextModel + LlamaModel.set_gguf_parameters
        w.add_block_count(L)
        w.add_context_length(ctx)
        w.add_embedding_length(H)
        w.add_feed_forward_length(D)
        w.add_head_count(NH)
        w.add_head_count_kv(NKV)
        w.add_rope_freq_base(theta)
        w.add_layer_norm_rms_eps(eps)
        w.add_key_length(HD)  # TextModel writes these when config.json has head_dim
        w.add_value_length(HD)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
        w.add_vocab_size(V)
        w.add_rope_dimension_count(HD)
        add_tokenizer(w, tok)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    m.write(os.path.join(out, "llama.gguf"), "llama", kv)
    write_safetensors(os.path.join(out, "llama.expected.safetensors"), exp)
    meta = [("str", "model.arch", "llama"), ("u32", "model.hidden", H), ("u32", "model.layers", L),
            ("u32", "model.heads", NH), ("u32", "model.kv_heads", NKV), ("u32", "model.head_dim", HD),
            ("u32", "model.vocab", V), ("f32", "model.rms_eps", np.float32(eps)), ("f64", "model.rope_theta", theta),
            ("str", "model.rope_scaling", "none"), ("u32", "model.max_ctx", ctx),
            ("bool", "model.tie_embeddings", 1), ("bool", "model.qkv_bias", 0), ("bool", "model.qk_norm", 0),
            ("u32", "model.dense_inter", D), ("u32", "model.experts", 0), ("u32", "model.top_k", 0),
            ("u32", "model.moe_inter", 0), ("u32", "model.shared_inter", 0), ("bool", "model.norm_topk", 0),
            ("i32[]", "model.moe_layers", [0] * L)]
    write_meta(os.path.join(out, "llama.meta.txt"), meta + tokenizer_meta(tok))


def tiny_llama(path, arch="llama", skip=(), k_rows=None, embd_type=T.F32, tok=None, extra=None):
    """A minimal 1-layer llama-shaped GGUF for the refusal tests (f32; token_embd of embd_type, with
    256-element rows when that is a block type, which the reader refuses before any shape check)."""
    H, V, NH, NKV, HD, D = 32, 8, 4, 2, 8, 32
    m = Model()
    m.add("token_embd", embd_type, [V, H if embd_type == T.F32 else 256])
    names = dict(attn_norm=[H], attn_q=[NH * HD, H], attn_k=[k_rows or NKV * HD, H], attn_v=[NKV * HD, H],
                 attn_output=[H, NH * HD], ffn_norm=[H], ffn_gate=[D, H], ffn_up=[D, H], ffn_down=[H, D])
    for n, shape in names.items():
        if n not in skip:
            m.add("blk.0." + n, T.F32, shape)
    m.add("output_norm", T.F32, [H])

    def kv(w):
        w.add_block_count(1)
        w.add_context_length(256)
        w.add_embedding_length(H)
        w.add_feed_forward_length(D)
        w.add_head_count(NH)
        w.add_head_count_kv(NKV)
        w.add_layer_norm_rms_eps(1e-5)
        if tok:
            add_tokenizer(w, tok)
        if extra:
            extra(w)
    m.write(path, arch, kv)


def fnv1a64(path):
    h = 0xcbf29ce484222325
    for b in open(path, "rb").read():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "fixtures", "gguf"))
    out = ap.parse_args().out
    os.makedirs(out, exist_ok=True)
    qwen3moe(out)
    llama(out)
    for stem in ("qwen3moe", "llama"):
        with open(os.path.join(out, stem + ".fnv1a64"), "w") as f:
            f.write(fnv1a64(os.path.join(out, stem + ".gguf")) + "\n")
    tiny_llama(os.path.join(out, "bad_type.gguf"), embd_type=T.IQ2_XXS)
    tiny_llama(os.path.join(out, "missing.gguf"), skip=("ffn_up",))
    tiny_llama(os.path.join(out, "bad_shape.gguf"), k_rows=4 * 8)
    tiny_llama(os.path.join(out, "bad_arch.gguf"), arch="phi3")
    tiny_llama(os.path.join(out, "bad_tok.gguf"), tok=tokenizer(32, "default", with_eot=False))

    def yarn(w):  # as Qwen2MoeModel.set_gguf_parameters writes a yarn rope_scaling
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(32768)
    tiny_llama(os.path.join(out, "yarn.gguf"), extra=yarn)
    tiny_llama(os.path.join(out, "partial_rope.gguf"), extra=lambda w: w.add_rope_dimension_count(4))
    qwen2moe(out)  # last: the files above keep the bytes they had before it was added (one RNG stream)
    with open(os.path.join(out, "qwen2moe.fnv1a64"), "w") as f:
        f.write(fnv1a64(os.path.join(out, "qwen2moe.gguf")) + "\n")
    qwen3moe_lowbit(out)  # own RNG streams: the files above keep their bytes
    gate_up_mix(out)
    for f in sorted(os.listdir(out)):
        print("%8d %s" % (os.path.getsize(os.path.join(out, f)), f))


if __name__ == "__main__":
    main()
