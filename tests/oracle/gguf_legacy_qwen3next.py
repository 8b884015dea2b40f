#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/qwen3next_legacy.gguf: tests/fixtures/gguf/qwen3next.gguf (llama.cpp's
converter output, see tests/fixtures/gguf/README.md) in the older qwen3next layout, where each Gated
DeltaNet layer has `blk.N.ssm_in.weight` (transformers' in_proj_qkvz as it is: per k head
[q | k | v | z]) instead of `attn_qkv.weight` + `attn_gate.weight`. llama.cpp's loader still reads
that form (src/models/qwen3next.cpp: "ssm_in is used by legacy GGUF", the graph's legacy path splits
it per k-head group). ssm_in is the HF checkpoint's in_proj_qkvz (tests/fixtures/models/qwen3_next_moe,
bf16) byte for byte; every other key and tensor is copied from qwen3next.gguf. CI never runs this.

    /tmp/venv/bin/pip install -r tests/oracle/requirements-gguf.txt
    /tmp/venv/bin/python tests/oracle/gguf_legacy_qwen3next.py
"""
import json
import os
import struct

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures")


def load_bf16(path):
    """A safetensors file's BF16 tensors as uint16 arrays (numpy has no bfloat16)."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    head = json.loads(buf[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__" or v["dtype"] != "BF16":
            continue
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(buf[8 + n + b:8 + n + e], dtype=np.uint16).reshape(v["shape"])
    return out


def main():
    src = os.path.join(FIX, "gguf", "qwen3next.gguf")
    out = os.path.join(FIX, "gguf", "qwen3next_legacy.gguf")
    hf = load_bf16(os.path.join(FIX, "models", "qwen3_next_moe", "model.safetensors"))
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vt, sub_type=sub)
    replaced = 0
    for t in r.tensors:
        name = t.name
        if name.endswith(".attn_gate.weight") and any(x.name == name.replace("attn_gate", "attn_qkv") for x in r.tensors):
            continue  # the z rows are in ssm_in
        if name.endswith(".attn_qkv.weight"):
            layer = int(name.split(".")[1])
            qkvz = hf[f"model.layers.{layer}.linear_attn.in_proj_qkvz.weight"]  # [rows][H], bf16 bits
            raw = np.ascontiguousarray(qkvz).view(np.uint8)  # [rows][2 H] bytes: the writer's byte shape
            w.add_tensor(f"blk.{layer}.ssm_in.weight", raw, raw_dtype=gguf.GGMLQuantizationType.BF16)
            replaced += 1
            continue
        shape = [int(x) for x in reversed(t.shape)]  # numpy order, outermost first
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, np.asarray(t.data).reshape(shape))
        else:  # bytes, [..., row bytes]
            w.add_tensor(name, np.asarray(t.data).reshape(shape[:-1] + [-1]), raw_dtype=t.tensor_type)
    assert replaced == 2, replaced
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(out, os.path.getsize(out))


if __name__ == "__main__":
    main()
