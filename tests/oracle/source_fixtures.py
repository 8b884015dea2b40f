#!/usr/bin/env python3
"""Writes the fixtures for the source readers (src/format/safetensors.c, src/format/gguf.c) and the
config reader (src/convert/hf_config.c) under tests/fixtures/sources/, with a manifest of what the
Python reference libraries say the files hold. CI never runs this; it reads what it wrote.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install -r tests/oracle/requirements-sources.txt
    /tmp/venv/bin/python tests/oracle/source_fixtures.py

Oracles: `safetensors` (Hugging Face's writer and reader), `gguf` (llama.cpp's gguf-py writer,
reader and Q8_0 quantizer), `transformers` (config classes that write config.json).
Everything is seeded: rerunning rewrites byte-identical files (transformers' configs aside, which
record the library version)."""
import json
import os
import shutil
import struct
import sys

import gguf
import ml_dtypes
import numpy as np
import safetensors
from safetensors import safe_open
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "sources")


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---- safetensors ---------------------------------------------------------------------------------

def st_tensors(rng):
    """One tensor of every dtype safetensors defines with a whole-byte size, plus a scalar and an
    empty tensor; values are random so a misplaced byte shows."""
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    return {
        "f32.weight": f(3, 5),
        "f16.weight": f(4, 8).astype(np.float16),
        "bf16.weight": f(2, 3, 4).astype(ml_dtypes.bfloat16),
        "u8.packed": rng.integers(0, 256, (6, 8), dtype=np.uint8),
        "i8.q": rng.integers(-128, 128, (7,), dtype=np.int8),
        "i16.x": rng.integers(-30000, 30000, (5,), dtype=np.int16),
        "u16.x": rng.integers(0, 65535, (5,), dtype=np.uint16),
        "i32.ids": rng.integers(-2**31, 2**31 - 1, (2, 2), dtype=np.int32),
        "u32.x": rng.integers(0, 2**32 - 1, (3,), dtype=np.uint32),
        "i64.ids": rng.integers(-2**62, 2**62, (3,), dtype=np.int64),
        "u64.x": rng.integers(0, 2**63, (2,), dtype=np.uint64),
        "f64.x": rng.standard_normal((2, 2)),
        "bool.mask": rng.integers(0, 2, (4,)).astype(bool),
        "f8.weight_scale": (np.abs(f(4, 2)) * 10).astype(ml_dtypes.float8_e4m3fn),
        "f8e5m2.x": f(8).astype(ml_dtypes.float8_e5m2),
        "scalar.weight_global_scale": np.array(448.0 * 6 / 1.7, dtype=np.float32),
        "empty.bias": np.zeros((0, 4), dtype=np.float32),
    }


DTYPE_NAME = {  # numpy dtype name -> safetensors header dtype (as the library writes it)
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "uint8": "U8", "int8": "I8",
    "int16": "I16", "uint16": "U16", "int32": "I32", "uint32": "U32", "int64": "I64",
    "uint64": "U64", "float64": "F64", "bool": "BOOL", "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


def header_of(path):
    """The header as the file holds it (the library's own writer decided offsets and order)."""
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        return json.loads(fh.read(n)), 8 + n


def st_manifest(path, tensors):
    header, data_start = header_of(path)
    out = {"metadata": header.get("__metadata__", {}), "data_start": data_start, "tensors": {}}
    with safe_open(path, framework="np") as f:
        names = set(f.keys())
    assert names == set(tensors), (names, set(tensors))
    for name, a in tensors.items():
        h = header[name]
        assert h["dtype"] == DTYPE_NAME[a.dtype.name] and h["shape"] == list(a.shape)
        raw = np.ascontiguousarray(a).tobytes()
        with open(path, "rb") as fh:  # the bytes in the file are exactly the array's bytes
            fh.seek(data_start + h["data_offsets"][0])
            assert fh.read(len(raw)) == raw
        out["tensors"][name] = {"dtype": h["dtype"], "shape": h["shape"],
                                "offset": data_start + h["data_offsets"][0],
                                "nbytes": len(raw), "fnv1a64": fnv1a64(raw)}
    return out


def write_safetensors(manifest):
    rng = np.random.default_rng(5)
    t = st_tensors(rng)
    p = os.path.join(OUT, "dtypes.safetensors")
    save_file(t, p, metadata={"format": "pt", "producer": "source_fixtures.py"})
    manifest["dtypes.safetensors"] = st_manifest(p, t)

    # A checkpoint sharded the way transformers saves one: shards plus an index whose weight_map
    # names each tensor's file.
    d = os.path.join(OUT, "sharded")
    os.makedirs(d, exist_ok=True)
    layers = {f"model.layers.{i}.mlp.gate_proj.weight": rng.standard_normal((8, 16)).astype(ml_dtypes.bfloat16)
              for i in range(3)}
    layers["model.embed_tokens.weight"] = rng.standard_normal((10, 16)).astype(ml_dtypes.bfloat16)
    layers["model.norm.weight"] = np.ones(16, dtype=np.float32)
    names = sorted(layers)
    shards = [names[:2], names[2:]]
    weight_map, total = {}, 0
    for i, part in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: layers[k] for k in part}, os.path.join(d, fn), metadata={"format": "pt"})
        for k in part:
            weight_map[k] = fn
            total += layers[k].nbytes
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2, sort_keys=True)
    manifest["sharded"] = {"tensors": {k: {"shard": weight_map[k], "dtype": DTYPE_NAME[layers[k].dtype.name],
                                           "shape": list(layers[k].shape),
                                           "fnv1a64": fnv1a64(layers[k].tobytes())} for k in names}}
    d1 = os.path.join(OUT, "single")
    os.makedirs(d1, exist_ok=True)
    save_file({k: layers[k] for k in names}, os.path.join(d1, "model.safetensors"))
    manifest["single"] = st_manifest(os.path.join(d1, "model.safetensors"), {k: layers[k] for k in names})


# ---- GGUF ----------------------------------------------------------------------------------------

T = gguf.GGMLQuantizationType
V = gguf.GGUFValueType


def kv_all_types(w):
    """Metadata of every GGUF value type, scalars and arrays, with edge values."""
    w.add_uint8("test.u8", 255)
    w.add_int8("test.i8", -128)
    w.add_uint16("test.u16", 65535)
    w.add_int16("test.i16", -32768)
    w.add_uint32("test.u32", 4294967295)
    w.add_int32("test.i32", -2147483648)
    w.add_float32("test.f32", 0.1)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "h\u00e9llo, \u4e16\u754c")
    w.add_uint64("test.u64", 2**64 - 1)
    w.add_int64("test.i64", -2**63)
    w.add_float64("test.f64", 1e300)
    w.add_string("test.empty_str", "")
    w.add_key_value("test.arr_u8", [0, 1, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.arr_i8", [-128, 0, 127], V.ARRAY, sub_type=V.INT8)
    w.add_key_value("test.arr_u16", [1, 65535], V.ARRAY, sub_type=V.UINT16)
    w.add_key_value("test.arr_i16", [-32768, 7], V.ARRAY, sub_type=V.INT16)
    w.add_key_value("test.arr_u32", [4294967295, 3], V.ARRAY, sub_type=V.UINT32)
    w.add_key_value("test.arr_i32", [-5, 2147483647], V.ARRAY, sub_type=V.INT32)
    w.add_key_value("test.arr_u64", [2**63 - 1, 9], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("test.arr_i64", [-2**63, 2**63 - 1], V.ARRAY, sub_type=V.INT64)
    w.add_key_value("test.arr_f32", [1.5, -0.1, 3e38], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("test.arr_f64", [2.5, -1e-300], V.ARRAY, sub_type=V.FLOAT64)
    w.add_key_value("test.arr_bool", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    # A tokenizer vocabulary as llama.cpp writes one.
    tokens = ["<unk>", "<s>", "</s>", "", "\u0120the", "\u4e16\u754c", "a b", "\n"] + [f"tok{i}" for i in range(40)]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(["\u0120 t", "h e"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_context_length(4096)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)


def q4k_like(rng, rows, cols, nbytes_per_block):
    """Q4_K / Q6_K bytes: gguf-py has no quantizer for these, so the blocks are random bytes with
    a small finite fp16 super-scale; the reader only moves bytes, and the hash is of these bytes."""
    blocks = rng.integers(0, 256, (rows, cols // 256, nbytes_per_block), dtype=np.uint8)
    return blocks


def gguf_tensors(rng):
    f32 = rng.standard_normal((3, 64)).astype(np.float32)
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0)
    q8_3d = gguf.quants.quantize(rng.standard_normal((3, 4, 64)).astype(np.float32), T.Q8_0)
    q4k = q4k_like(rng, 2, 512, 144)
    q4k[:, :, 0:4] = np.frombuffer(np.array([0.01, 0.002], dtype=np.float16).tobytes(), np.uint8)
    q6k = q4k_like(rng, 2, 256, 210)
    q6k[:, :, 208:210] = np.frombuffer(np.array([0.01], dtype=np.float16).tobytes(), np.uint8)
    bf16 = rng.standard_normal((2, 32)).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint8)
    return [
        ("token_embd.weight", f32, None),
        ("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32), None),
        ("blk.0.attn_q.weight", rng.standard_normal((2, 64)).astype(np.float16), None),
        ("blk.0.attn_k.weight", q8, T.Q8_0),
        ("blk.0.ffn_gate_exps.weight", q8_3d.reshape(3, 4, -1), T.Q8_0),
        ("blk.0.ffn_up_exps.weight", q4k.reshape(2, -1), T.Q4_K),
        ("blk.0.ffn_down_exps.weight", q6k.reshape(2, -1), T.Q6_K),
        ("output.weight", bf16.reshape(2, -1), T.BF16),
    ]


def write_gguf(path, tensors, alignment=None, all_kv=True):
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_name("ninfer source fixture")
    if all_kv:
        kv_all_types(w)
    for name, a, raw in tensors:
        w.add_tensor(name, a, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


INT_TYPES = {V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64}


def kv_value(field):
    """The value as gguf-py reads it. 64-bit integers do not survive a JSON double, so integer
    values are also given as decimal text ("text"), which the C test compares exactly."""
    main, last = field.types[0], field.types[-1]
    v = field.contents()
    e = {"type": "array", "elem": last.name.lower()} if main == V.ARRAY else {"type": main.name.lower()}
    e["value"] = v
    if last in INT_TYPES:
        e["text"] = [str(int(x)) for x in v] if main == V.ARRAY else str(int(v))
    return e


def gguf_manifest(path):
    r = gguf.GGUFReader(path)
    out = {"version": int(r.fields["GGUF.version"].contents()), "alignment": int(r.alignment),
           "data_offset": int(r.data_offset), "kv": {}, "tensors": []}
    for name, field in r.fields.items():
        if name.startswith("GGUF."):
            continue
        e = kv_value(field)
        e["offset"] = int(field.offset)
        out["kv"][name] = e
    for t in r.tensors:
        raw = np.ascontiguousarray(t.data).view(np.uint8).tobytes()
        info = int(t.field.offset)
        name_len = len(t.name.encode())
        out["tensors"].append({
            "name": t.name, "ne": [int(x) for x in t.shape], "type": int(t.tensor_type),
            "type_name": t.tensor_type.name, "offset": int(t.data_offset) - int(r.data_offset),
            "nbytes": int(t.n_bytes), "fnv1a64": fnv1a64(raw),
            # where the tensor info sits, and its ggml type field, for targeted corruption tests
            "info_offset": info, "type_field_offset": info + 8 + name_len + 4 + 8 * len(t.shape),
        })
    return out


def write_gguf_fixtures(manifest):
    rng = np.random.default_rng(7)
    tensors = gguf_tensors(rng)
    p = os.path.join(OUT, "model.gguf")
    write_gguf(p, tensors)
    manifest["model.gguf"] = gguf_manifest(p)

    p64 = os.path.join(OUT, "align64.gguf")
    write_gguf(p64, tensors[:4], alignment=64, all_kv=False)
    manifest["align64.gguf"] = gguf_manifest(p64)

    # Version 2 has the same little-endian layout as 3 (3 added big-endian files): the same bytes
    # with the version field set to 2, which gguf-py's reader also accepts.
    p2 = os.path.join(OUT, "v2.gguf")
    data = bytearray(open(p64, "rb").read())
    data[4:8] = struct.pack("<I", 2)
    open(p2, "wb").write(bytes(data))
    manifest["v2.gguf"] = gguf_manifest(p2)
    assert manifest["v2.gguf"]["version"] == 2

    # IQ4_NL (32 elements in 18 bytes): once a type ninfer had no codec for, now an import-only codec
    # (test_gguf reads it in full; bad_type.gguf of gguf_fixture.py is the unsupported case).
    pu = os.path.join(OUT, "iq4nl.gguf")
    iq = rng.integers(0, 256, (2, 64 // 32 * 18), dtype=np.uint8)
    write_gguf(pu, [("token_embd.weight", rng.standard_normal((2, 32)).astype(np.float32), None),
                    ("blk.0.ffn_down.weight", iq, T.IQ4_NL)], all_kv=False)
    manifest["iq4nl.gguf"] = gguf_manifest(pu)


# ---- config.json ------------------------------------------------------------------------------

# Published checkpoints' config.json, transformers-4 dialect (top-level rope_theta / rope_scaling,
# torch_dtype, num_experts), as the model cards' files have them (Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B,
# SmolLM2-135M-Instruct, and a Llama-3.1-style rope_scaling). config.json is the specification here;
# the expected values are what transformers 5 reads from these files.
PUBLISHED = {
    "published_qwen3_moe.json": {
        "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
        "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
        "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
        "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936},
    "published_qwen2_moe.json": {
        "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21,
        "model_type": "qwen2_moe", "num_attention_heads": 16, "num_hidden_layers": 24,
        "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
        "use_cache": True, "use_sliding_window": False, "vocab_size": 151936, "decoder_sparse_step": 1,
        "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
        "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
        "router_aux_loss_coef": 0.001},
    "published_llama_smollm2.json": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
        "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
        "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
        "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
        "use_cache": True, "vocab_size": 49152},
    "published_llama_rope_llama3.json": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
        "max_position_embeddings": 131072, "model_type": "llama", "num_attention_heads": 4,
        "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128},
}


def tiny_configs():
    """transformers-5 dialect: written by the config classes themselves (to_json_file, as
    save_pretrained does)."""
    from transformers import LlamaConfig, Qwen2MoeConfig, Qwen3MoeConfig
    return {
        "tiny_qwen3_moe.json": Qwen3MoeConfig(
            hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            vocab_size=256, intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=True, decoder_sparse_step=2, mlp_only_layers=[3], rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, max_position_embeddings=512,
            tie_word_embeddings=False, dtype="bfloat16"),
        "tiny_qwen2_moe.json": Qwen2MoeConfig(
            hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, vocab_size=256,
            intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=6,
            num_experts_per_tok=2, norm_topk_prob=False, rms_norm_eps=1e-6, max_position_embeddings=256,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, dtype="float32"),
        "tiny_llama.json": LlamaConfig(
            hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, vocab_size=100,
            intermediate_size=96, rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
            dtype="float16"),
    }


def config_expected(c):
    """What transformers makes of a config: the values the C reader must produce."""
    rp = c.rope_parameters
    n_exp = getattr(c, "num_experts", 0) or 0
    e = {"model_type": c.model_type, "hidden_size": c.hidden_size, "n_layers": c.num_hidden_layers,
         "n_heads": c.num_attention_heads, "n_kv_heads": c.num_key_value_heads,
         "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
         "vocab_size": c.vocab_size, "intermediate_size": c.intermediate_size,
         "max_position": c.max_position_embeddings, "rms_eps": c.rms_norm_eps,
         "rope_theta": float(rp["rope_theta"]), "rope_type": rp.get("rope_type", "default"),
         "rope_factor": float(rp.get("factor") or 0),
         "rope_original_max_position": float(rp.get("original_max_position_embeddings") or 0),
         "rope_low_freq_factor": float(rp.get("low_freq_factor") or 0),
         "rope_high_freq_factor": float(rp.get("high_freq_factor") or 0),
         "n_experts": n_exp, "n_experts_used": getattr(c, "num_experts_per_tok", 0) if n_exp else 0,
         "moe_intermediate_size": getattr(c, "moe_intermediate_size", 0) if n_exp else 0,
         "shared_intermediate_size": getattr(c, "shared_expert_intermediate_size", 0) or 0,
         "norm_topk_prob": bool(getattr(c, "norm_topk_prob", False)),
         "decoder_sparse_step": getattr(c, "decoder_sparse_step", 1) if n_exp else 0,
         "mlp_only_layers": list(getattr(c, "mlp_only_layers", []) or []),
         "tie_word_embeddings": bool(c.tie_word_embeddings), "dtype": str(c.dtype or "")}
    return e


def write_configs(manifest):
    import transformers
    from transformers import AutoConfig
    d = os.path.join(OUT, "configs")
    os.makedirs(d, exist_ok=True)
    out = {}
    for fn, c in tiny_configs().items():
        c.to_json_file(os.path.join(d, fn))
    for fn, j in PUBLISHED.items():
        with open(os.path.join(d, fn), "w") as fh:
            json.dump(j, fh, indent=2, sort_keys=True)
            fh.write("\n")
    for fn in sorted(os.listdir(d)):
        out[fn] = config_expected(AutoConfig.from_pretrained(os.path.join(d, fn)))
    manifest["configs"] = out
    manifest["versions"]["transformers"] = transformers.__version__


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    manifest = {"generator": "tests/oracle/source_fixtures.py",
                "versions": {"safetensors": safetensors.__version__, "gguf": "see requirements-sources.txt",
                             "numpy": np.__version__}}
    write_safetensors(manifest)
    write_gguf_fixtures(manifest)
    if "--no-configs" not in sys.argv:
        write_configs(manifest)
    with open(os.path.join(OUT, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True, ensure_ascii=True)
        fh.write("\n")
    total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
