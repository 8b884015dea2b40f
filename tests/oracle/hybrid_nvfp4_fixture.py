#!/usr/bin/env python3
"""Writes tests/fixtures/convert/ct_nvfp4_hybrid/ and modelopt_nvfp4_hybrid/: a tiny Qwen3.5-MoE text
model (transformers' Qwen3_5MoeForCausalLM) quantized to compressed-tensors nvfp4-pack-quantized
weights only (llm-compressor's NVFP4A16: no input scales, so W4A16 on both engines) and the same
bytes under ModelOpt names with input scales (W4A4), the way published NVFP4 checkpoints of these hybrids are
laid out: the routed experts, the shared expert and the gated attention's projections in NVFP4, the
Gated DeltaNet projections (linear_attn.*), the routers, the shared expert's gate and lm_head left
in bf16 by the ignore list. CI never runs this.

    /tmp/venv/bin/pip install -r tests/oracle/requirements-convert.txt
    /tmp/venv/bin/python tests/oracle/hybrid_nvfp4_fixture.py

Geometry: hidden 256, 2 layers (layer 0 Gated DeltaNet, layer 1 gated attention: full_attention_interval
2), 4 experts top-2 of intermediate 128 and a shared expert of 128, 2 query heads and 2 KV heads of
head_dim 128 (q_proj 512 rows, each head's query and gate 128; k/v 256): every NVFP4 share is whole 128-row tiles,
so the GPU engine takes it. Weights as hybrid_models.py's init_hybrid; quantization through
compressed-tensors' own calculate_qparams + NVFP4PackedCompressor (convert_fixtures.py's ct_quantize).

In ct_nvfp4_hybrid/, tiny_models.py's reference files (ref_prompt.npy: 80 tokens, one full and one
ragged 64-token GDN chunk of transformers; ref_logits.npy, ref_greedy.npy, ref_greedy_logits.npy: 32
greedy steps) from transformers in fp32 with every NVFP4 matrix replaced by compressed-tensors' own
float32 dequantization of it; expected_hybrid.safetensors beside the folders: that dequantization for
two modules (<module>.dequant) to hold the imported planes to, bit for bit."""
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_fixtures as cf  # noqa: E402  (ct_quantize, ct_dequant)
import hybrid_models as hm  # noqa: E402  (init_hybrid)
import tiny_models as tm  # noqa: E402  (per_expert_state, fused_state, logits_of)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "convert")
PROMPT = 80
IGNORE = ["lm_head", "re:.*mlp\\.gate$", "re:.*shared_expert_gate$", "re:.*linear_attn\\..*"]


def config():
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=256, hidden_size=256, moe_intermediate_size=128, shared_expert_intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=128,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [6, 5, 5], "mrope_interleaved": True},
        tie_word_embeddings=False, attention_bias=False)


def quantized(key):
    """Whether a 2-D weight goes to NVFP4 (not in the ignore list)."""
    return (key.endswith("_proj.weight") and ".linear_attn." not in key and not key.startswith("lm_head")
            and "embed_tokens" not in key)


def main():
    torch.manual_seed(11)
    cfg = config()
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3_5MoeForCausalLM(cfg).eval().float()
    hm.init_hybrid(model, 11)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    flat = tm.per_expert_state(sd, None)
    rng = np.random.default_rng(11)
    ct, mo, deq_sd, expected = {}, {}, {}, {}
    for k, v in sorted(flat.items()):
        if not quantized(k):
            ct[k] = mo[k] = v
            deq_sd[k] = v.float()
            continue
        m = k[: -len(".weight")]
        w = v.float()
        n, kk = w.shape
        assert n % 128 == 0 and kk % 16 == 0, (k, w.shape)
        packed, scale8, gs = cf.ct_quantize(w)
        deq = cf.ct_dequant(packed, scale8, gs, n, kk)
        igs = torch.tensor([448.0 * 6.0 / float(rng.uniform(2.0, 8.0))], dtype=torch.float32)
        ct[m + ".weight_packed"], ct[m + ".weight_scale"] = packed, scale8
        ct[m + ".weight_global_scale"] = gs  # NVFP4A16: weights only
        mo[m + ".weight"], mo[m + ".weight_scale"] = packed, scale8
        mo[m + ".weight_scale_2"] = (torch.tensor(1.0, dtype=torch.float32) / gs[0]).reshape(())
        mo[m + ".input_scale"] = (torch.tensor(1.0) / igs[0]).reshape(())
        deq_sd[k] = deq
        if m in ("model.layers.0.mlp.experts.2.up_proj", "model.layers.1.mlp.shared_expert.down_proj"):
            expected[m + ".dequant"] = deq.contiguous()
    # the reference: transformers fp32 on the dequantized weights
    ref_model = transformers.Qwen3_5MoeForCausalLM(cfg).eval().float()
    fused = tm.fused_state({k: v.float() for k, v in deq_sd.items()})
    missing, unexpected = ref_model.load_state_dict(fused, strict=False)
    assert not unexpected and all("lm_head" not in x for x in missing) and not missing, (missing, unexpected)
    tm.PROMPT_LEN = PROMPT
    with torch.no_grad():
        prompt, logits, greedy, glog = tm.reference(ref_model, cfg.vocab_size, 12)
    ct_dir = os.path.join(OUT, "ct_nvfp4_hybrid")
    cf.write_pair(cfg, ct, mo, ct_dir, os.path.join(OUT, "modelopt_nvfp4_hybrid"), IGNORE,
                  ["lm_head", "*mlp.gate", "*shared_expert_gate", "*linear_attn*"], metadata={"format": "pt"})
    # the references beside the compressed-tensors copy (the ModelOpt one holds the same weights, its
    # divisors within an ulp)
    for f, v in (("ref_prompt", prompt), ("ref_logits", logits.astype(np.float32)), ("ref_greedy", greedy),
                 ("ref_greedy_logits", glog)):
        np.save(os.path.join(ct_dir, f + ".npy"), v)
    save_file(expected, os.path.join(OUT, "expected_hybrid.safetensors"))
    print("wrote", OUT, "logit std", float(logits.std()), "greedy", logits.argmax(-1)[:8].tolist())


if __name__ == "__main__":
    main()
