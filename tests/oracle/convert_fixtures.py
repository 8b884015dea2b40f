#!/usr/bin/env python3
"""Writes tests/fixtures/convert/: a tiny qwen3_moe checkpoint quantized to compressed-tensors
nvfp4-pack-quantized W4A4 (ct_nvfp4/), the same bytes under ModelOpt names (modelopt_nvfp4/), and
the expected dequantized values (expected.safetensors). CI never runs this.

    /tmp/venv/bin/python tests/oracle/convert_fixtures.py   (requirements-convert.txt)

Every Linear but lm_head and the routers (the `ignore` list) goes through compressed-tensors'
own calculate_qparams + NVFP4PackedCompressor.compress (as tests/oracle/nvfp4_compressed_tensors.py).
Then, for experts 1 and 3, the up_proj global scale is halved and its e4m3 block scales halved
with it (exact: a power of two, every block scale stays a normal e4m3), so gate and up divisors DIFFER while
the dequantized weight is unchanged (asserted). Input global scales (W4A4) are set per module from
a seeded calibrated amax, so they differ per expert and the converter must unify them per layer.
expected.safetensors holds, per module, compressed-tensors' float32 dequantization
("<module>.dequant"), and per ModelOpt module the divisor ninfer must store, float32(1 / weight_scale_2)
("<module>.mo_divisor")."""
import copy
import json
import os
import shutil

import numpy as np
import torch
import transformers
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.quantization import QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import dequantize
from compressed_tensors.quantization.quant_scheme import NVFP4
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "convert")
SCHEME = QuantizationScheme(targets=["Linear"], **copy.deepcopy(NVFP4))
ARGS = SCHEME.weights


def ct_quantize(w):
    n, k = w.shape
    g = generate_gparam(w.min(), w.max())
    groups = w.reshape(n, k // 16, 16)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), ARGS, global_scale=g)
    sd = {"weight": w.clone(), "weight_scale": scale, "weight_global_scale": g, "weight_zero_point": zp}
    out = NVFP4PackedCompressor.compress(sd, SCHEME)
    return out["weight_packed"], out["weight_scale"], g.reshape(1).float()


def ct_dequant(packed, scale8, g, n, k):
    return dequantize(x_q=unpack_fp4_from_uint8(packed, n, k, dtype=torch.float32), scale=scale8.to(torch.float32),
                      args=ARGS, global_scale=g, dtype=torch.float32)


def write_pair(cfg, ct, mo, ct_dir, mo_dir, ignore, exclude, metadata=None):
    """The compressed-tensors folder (config.json's quantization_config with `ignore`) and the ModelOpt one
    (hf_quant_config.json with `exclude`), each config.json from cfg and its tensors in model.safetensors."""
    for d, tensors, is_ct in ((ct_dir, ct, True), (mo_dir, mo, False)):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        cfg.save_pretrained(d)
        c = json.load(open(os.path.join(d, "config.json")))
        c.pop("_attn_implementation", None)
        if is_ct:
            c["quantization_config"] = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                        "ignore": ignore}
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
        if not is_ct:
            json.dump({"producer": {"name": "modelopt"}, "quantization": {
                "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": exclude}},
                open(os.path.join(d, "hf_quant_config.json"), "w"), indent=1)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(d, "model.safetensors"), metadata=metadata)


def main():
    torch.manual_seed(7)
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=256, intermediate_size=256, moe_intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(7)
    sd = {}
    for k, v in model.state_dict().items():
        std = 0.6 if k.endswith("mlp.gate.weight") else 0.15
        val = (1 + 0.2 * torch.randn(v.shape, generator=g)) if "norm" in k else std * torch.randn(v.shape, generator=g)
        sd[k] = val.to(torch.bfloat16)
    # per-expert keys (the published layout)
    flat = {}
    for k, v in sd.items():
        if k.endswith("experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            for j in range(v.shape[0]):
                flat[f"{pre}{j}.gate_proj.weight"] = v[j, :128].contiguous()
                flat[f"{pre}{j}.up_proj.weight"] = v[j, 128:].contiguous()
        elif k.endswith("experts.down_proj"):
            pre = k[: -len("down_proj")]
            for j in range(v.shape[0]):
                flat[f"{pre}{j}.down_proj.weight"] = v[j].contiguous()
        else:
            flat[k] = v
    rng = np.random.default_rng(7)
    ct, mo, expected = {}, {}, {}
    for k, v in sorted(flat.items()):
        m = k[: -len(".weight")]
        quant = v.dim() == 2 and not k.startswith("lm_head") and not k.endswith("mlp.gate.weight") \
            and "embed_tokens" not in k
        if not quant:
            ct[k] = v
            mo[k] = v
            continue
        w = v.float()
        n, kk = w.shape
        packed, scale8, gs = ct_quantize(w)
        deq = ct_dequant(packed, scale8, gs, n, kk)
        if m.endswith("experts.1.up_proj") or m.endswith("experts.3.up_proj"):
            nz = scale8.float()[scale8.float() > 0]
            assert nz.min() >= 2.0 ** -5  # halving stays a normal e4m3: exact
            scale8 = (scale8.float() * 0.5).to(torch.float8_e4m3fn)
            gs = gs * 0.5
            assert torch.equal(ct_dequant(packed, scale8, gs, n, kk), deq), m
        amax_in = float(rng.uniform(2.0, 8.0))
        igs = torch.tensor([448.0 * 6.0 / amax_in], dtype=torch.float32)
        ct[m + ".weight_packed"] = packed
        ct[m + ".weight_scale"] = scale8
        ct[m + ".weight_global_scale"] = gs
        ct[m + ".input_global_scale"] = igs
        mo[m + ".weight"] = packed
        mo[m + ".weight_scale"] = scale8
        ws2 = (torch.tensor(1.0, dtype=torch.float32) / gs[0]).reshape(())
        mo[m + ".weight_scale_2"] = ws2
        mo[m + ".input_scale"] = (torch.tensor(1.0) / igs[0]).reshape(())
        expected[m + ".dequant"] = deq.contiguous()
        expected[m + ".mo_divisor"] = (torch.tensor(1.0, dtype=torch.float32) / ws2).reshape(1)
        expected[m + ".global"] = gs
        expected[m + ".input_global"] = igs
    write_pair(cfg, ct, mo, os.path.join(OUT, "ct_nvfp4"), os.path.join(OUT, "modelopt_nvfp4"),
               ["lm_head", "re:.*mlp.gate$"], ["lm_head", "*mlp.gate"])
    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
