#!/usr/bin/env python3
"""Writes tiny random Gated-DeltaNet hybrid checkpoints (transformers' qwen3_next and Qwen3.5-MoE) and
their reference outputs under tests/fixtures/models/, as tiny_models.py does for the attention-only
models (same files, same meaning; read its docstring). CI never runs this.

    /tmp/venv/bin/pip install -r tests/oracle/requirements-convert.txt
    /tmp/venv/bin/python tests/oracle/hybrid_models.py

Models (bf16 safetensors + config.json, no tokenizer; vocab 256 and a 130-token prompt so the
reference stays small while the prompt spans three of transformers' 64-token GDN chunks, the last
one ragged):
  qwen3_next        Qwen3NextForCausalLM, 4 layers: full attention every 2nd (layers 1, 3), Gated
                    DeltaNet otherwise; the packed in_proj_qkvz / in_proj_ba dialect (head-group
                    order); 4 experts top-2 with a gated shared expert; layer 2 a dense MLP
                    (mlp_only_layers); untied LM head; per-expert keys.
  qwen3_next_moe    qwen3_next's geometry with every layer sparse (no mlp_only_layers: llama.cpp's qwen3next
                    has no dense MLP layers, so its converter cannot take qwen3_next), bf16 like the
                    rest, and an "architectures" entry (its converter detects the model by it); the
                    HF side of tests/fixtures/gguf/qwen3next.gguf. Built alone by
                    `hybrid_models.py qwen3_next_moe` (the others are unchanged); its mtp.* weights
                    (for qwen3next_mtp.gguf) by `hybrid_mtp.py qwen3_next_moe` after that.
  qwen3_5_moe_text  Qwen3_5MoeForCausalLM (model_type qwen3_5_moe_text), 4 layers: full attention
                    at layer 3 only (interval 4, the published ratio); the split in_proj_qkv /
                    in_proj_z / in_proj_b / in_proj_a dialect; 4 experts top-2 + shared expert;
                    tied embeddings; fused 3-D expert keys.
  qwen3_5_moe       the same weights in the multimodal Qwen3_5MoeForConditionalGeneration layout:
                    config.json with text_config + vision_config, language weights under
                    model.language_model., a tiny vision tower under model.visual. (to be skipped).
                    transformers is run on it and must give qwen3_5_moe_text's logits; only
                    reference.json is written ("same_weights_as").

Last, hybrid_mtp.py adds random mtp.* weights (one MTP block) to each folder and writes the torch
reference of the MTP step (its docstring).

Weights as tiny_models.py (std 0.15, routers 0.6, bf16-rounded), with the hybrid's own parameters
set so that every one of them matters: the zero-centred norms (weight used as 1 + w: input/post
layer norms, the final norm, q/k norms) get w ~ 0.2 N(0,1) (transformers initialises them to 0,
which would hide a missing "+1"); the GDN output norm (plain weight) 1 + 0.2 N; A_log = log U(0.05,
0.5) and dt_bias 0.3 N so the state decays slowly (a state that forgets within a token would not
test its carry-over); the conv kernel 0.4 N.
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_models as tm  # noqa: E402  (shared reference/save helpers)

PROMPT_LEN = 130
tm.PROMPT_LEN = PROMPT_LEN  # reference() and write_reference() read it


def qwen3_next_config():
    return transformers.Qwen3NextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        full_attention_interval=2, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[2], max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, attention_bias=False)


def qwen3_next_moe_config():
    cfg = qwen3_next_config()
    cfg.mlp_only_layers = []
    cfg.architectures = ["Qwen3NextForCausalLM"]
    return cfg


def qwen3_5_text_config():
    return transformers.Qwen3_5MoeTextConfig(
        vocab_size=256, hidden_size=64, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=4, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [1, 0, 1], "mrope_interleaved": True},
        tie_word_embeddings=True, attention_bias=False)


def init_hybrid(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.startswith("model.visual") or ".visual." in name:
                v = 0.05 * torch.randn(p.shape, generator=g)
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif "norm" in name and name.endswith("weight"):
                v = 0.2 * torch.randn(p.shape, generator=g)  # zero-centred: used as 1 + w
            elif name.endswith("A_log"):
                v = torch.log(0.05 + 0.45 * torch.rand(p.shape, generator=g))
            elif name.endswith("dt_bias"):
                v = 0.3 * torch.randn(p.shape, generator=g)
            elif name.endswith("conv1d.weight"):
                v = 0.4 * torch.randn(p.shape, generator=g)
            elif name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
                v = 0.6 * torch.randn(p.shape, generator=g)
            else:
                v = 0.15 * torch.randn(p.shape, generator=g)
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


def state_of(model, tied, fused):
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if tied:
        sd.pop("lm_head.weight", None)
    sd = tm.per_expert_state(sd, None)
    return tm.fused_state(sd) if fused else sd


def save_folder(folder, cfg, sd):
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    os.makedirs(folder)
    cfg.save_pretrained(folder)
    save_file(dict(sorted(sd.items())), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def check_reload(folder, cls, model, sd):
    back = load_file(os.path.join(folder, "model.safetensors"))
    assert set(back) == set(sd), set(back) ^ set(sd)
    m2 = cls.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ids = list(range(1, 17))
    a, b = tm.logits_of(model, ids), tm.logits_of(m2, ids)
    assert np.array_equal(a, b), (folder, float(np.abs(a - b).max()))


def fix_sizes(path):
    """tiny_models.write_reference describes a 64-token prompt; ours is PROMPT_LEN long."""
    with open(path) as f:
        text = f.read()
    text = text.replace("[64]", f"[{PROMPT_LEN}]").replace("ref_logits[63]", f"ref_logits[{PROMPT_LEN - 1}]")
    with open(path, "w") as f:
        f.write(text)


def build(name, cfg, cls, seed, tied, fused):
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval().float()
    init_hybrid(model, seed)
    ref = tm.reference(model, cfg.vocab_size, seed + 1)
    folder = os.path.join(tm.OUT, name)
    sd = state_of(model, tied, fused)
    save_folder(folder, cfg, sd)
    check_reload(folder, cls, model, sd)
    tm.write_reference(folder, cfg, ref, {"layout": "fused" if fused else "per_expert",
                                          "layer_types": list(cfg.layer_types)})
    fix_sizes(os.path.join(folder, "reference.json"))
    size = os.path.getsize(os.path.join(folder, "model.safetensors"))
    print(f"{name}: {size} bytes, greedy {ref[2][:8].tolist()}..., logit std {ref[1].std():.3f}")
    return model, ref


def build_multimodal(text_model, text_cfg, ref):
    """qwen3_5_moe_text's weights inside the multimodal layout, checked by transformers itself."""
    vis = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
           "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64,
           "num_position_embeddings": 16}
    cfg = transformers.Qwen3_5MoeConfig(text_config=text_cfg.to_dict(), vision_config=vis,
                                        tie_word_embeddings=True)
    cfg._attn_implementation = "eager"
    torch.manual_seed(7000)
    mm = transformers.Qwen3_5MoeForConditionalGeneration(cfg).eval().float()
    init_hybrid(mm, 7000)  # the vision tower's values; the language model's are copied next
    text_sd = text_model.state_dict()
    with torch.no_grad():
        for k, p in mm.named_parameters():
            if k.startswith("model.language_model."):
                p.copy_(text_sd["model." + k[len("model.language_model."):]])
            elif k == "lm_head.weight":
                p.copy_(text_sd["lm_head.weight"])
    prompt = ref[0].tolist()
    got = tm.logits_of(mm, prompt)
    d = float(np.abs(got - ref[1]).max())
    assert d <= 1e-5 * float(np.abs(ref[1]).max()), ("multimodal logits differ from the text model's", d)
    folder = os.path.join(tm.OUT, "qwen3_5_moe")
    sd = state_of(mm, True, True)
    assert any(k.startswith("model.visual.") for k in sd)
    save_folder(folder, cfg, sd)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"layout": "fused", "same_weights_as": "qwen3_5_moe_text",
                   "note": "reference data (ref_*.npy) is in ../qwen3_5_moe_text/; transformers' "
                           "Qwen3_5MoeForConditionalGeneration on this folder's weights gives those logits "
                           f"(max abs difference {d:.3g})"}, f, indent=1)
        f.write("\n")
    print(f"qwen3_5_moe: {os.path.getsize(os.path.join(folder, 'model.safetensors'))} bytes, max |d logits| {d:.3g}")


def main():
    os.makedirs(tm.OUT, exist_ok=True)
    if sys.argv[1:] == ["qwen3_next_moe"]:
        build("qwen3_next_moe", qwen3_next_moe_config(), transformers.Qwen3NextForCausalLM, 8100, tied=False, fused=False)
        return
    build("qwen3_next", qwen3_next_config(), transformers.Qwen3NextForCausalLM, 8000, tied=False, fused=False)
    tcfg = qwen3_5_text_config()
    tmodel, ref = build("qwen3_5_moe_text", tcfg, transformers.Qwen3_5MoeForCausalLM, 9000, tied=True, fused=True)
    build_multimodal(tmodel, tcfg, ref)
    import hybrid_mtp  # noqa: E402  (the mtp.* weights and the MTP reference, on the folders just written)
    hybrid_mtp.main()


if __name__ == "__main__":
    main()
