#!/usr/bin/env python3
"""Writes tiny random transformers checkpoints and their reference outputs under
tests/fixtures/models/. CI never runs this; the converter and the CPU engine tests read what it wrote.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install -r tests/oracle/requirements-convert.txt
    /tmp/venv/bin/python tests/oracle/tiny_models.py [qwen3_moe_256 | qwen2_moe_nobias]   (that one alone)

Models (all saved as bf16 safetensors with config.json, no tokenizer):
  qwen3_moe        2 layers, both sparse-MoE, 8 experts top-2, norm_topk_prob, q/k norm,
                   heads*head_dim (128) != hidden (64), untied LM head; per-expert keys
  qwen3_moe_fused  the same weights as qwen3_moe, saved with fused 3-D expert keys
                   (mlp.experts.gate_up_proj [E, 2I, H] gate first, mlp.experts.down_proj [E, H, I]);
                   (transformers 5 holds experts fused in memory but save_pretrained writes the
                   per-expert keys, so this file is written here; transformers loads it back to
                   the same logits, checked below). Its reference data is qwen3_moe's: only
                   reference.json is written there, with "same_weights_as": "qwen3_moe".
  qwen2_moe        3 layers, layer 1 dense (mlp_only_layers=[1]), 8 experts top-2 without
                   renormalisation, a shared expert with its sigmoid gate, q/k/v biases, tied embeddings
  qwen2_moe_nobias qwen2_moe's geometry with qkv_bias=False (Qwen2MoeConfig's key; default True):
                   no q/k/v biases in the checkpoint, "qkv_bias": false in config.json; own seed
  llama            2 layers dense, GQA, tied embeddings (SmolLM2-like)
  qwen3_moe_256    1 layer, 4 experts, hidden = moe_intermediate = 256 (rows that k-quants and
                   128-row nvfp4 tiles take, so the q4q6/q4q5/nvfp4 recipes are exercised instead
                   of their q8_0 fallback), vocab 256, tied embeddings, head_dim 64 (attn_output's
                   rows are 128 long: it stays on the q8_0 fallback on purpose). No reference
                   data (the converter tests compare against model.safetensors itself); 1.9 MB.

Weights are initialised wider than transformers' default (std 0.15, routers 0.6, norms 1 +- 0.2)
so routing and logits are not flat, then ROUNDED TO BF16; the float32 reference runs on the rounded
values, so an engine that reads the bf16 file exactly sees the same model.

Reference data (float32, eager attention, computed by transformers on CPU):
  ref_prompt.npy        int32 [64]            a fixed prompt of token ids
  ref_logits.npy        float32 [64][vocab]   logits of every prompt position
  ref_greedy.npy        int32 [32]            greedy continuation: greedy[i] = argmax(greedy_logits[i])
  ref_greedy_logits.npy float32 [32][vocab]   logits at the last position of prompt + greedy[:i]
                                              (so greedy_logits[0] == logits[63])
  reference.json        the above described, plus versions and the model's key sizes
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "models")
PROMPT_LEN = 64
GEN_LEN = 32


def qwen3_moe_config():
    return transformers.Qwen3MoeConfig(
        vocab_size=2048, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, attention_bias=False, use_sliding_window=False)


def qwen2_moe_config(qkv_bias=True):
    return transformers.Qwen2MoeConfig(qkv_bias=qkv_bias,
        vocab_size=2048, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
        decoder_sparse_step=1, mlp_only_layers=[1], max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False)


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=2048, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, attention_bias=False,
        mlp_bias=False)


def qwen3_moe_256_config():
    return transformers.Qwen3MoeConfig(
        vocab_size=256, hidden_size=256, intermediate_size=512, moe_intermediate_size=256,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, attention_bias=False, use_sliding_window=False)


def init_weights(model, seed):
    """Wide random weights, rounded to bf16 (kept as float32 values)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or "layernorm" in name or name.endswith("_norm.weight"):
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
                v = 0.6 * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=g)
            else:
                v = 0.15 * torch.randn(p.shape, generator=g)
            p.copy_(v.to(torch.bfloat16).to(torch.float32))


@torch.no_grad()
def logits_of(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def reference(model, vocab, seed):
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, PROMPT_LEN).astype(np.int32)
    logits = logits_of(model, prompt.tolist())
    seq = prompt.tolist()
    greedy, greedy_logits = [], []
    for _ in range(GEN_LEN):  # full recompute each step: no cache subtleties in the oracle
        last = logits_of(model, seq)[-1]
        tok = int(np.argmax(last))
        greedy.append(tok)
        greedy_logits.append(last)
        seq.append(tok)
    return prompt, logits, np.array(greedy, np.int32), np.stack(greedy_logits).astype(np.float32)


def per_expert_state(sd, cfg):
    """Fused 3-D expert tensors -> per-expert 2-D keys (the published-checkpoint layout)."""
    out = {}
    for k, v in sd.items():
        if k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            inter = v.shape[1] // 2
            for j in range(v.shape[0]):
                out[f"{pre}{j}.gate_proj.weight"] = v[j, :inter].contiguous()
                out[f"{pre}{j}.up_proj.weight"] = v[j, inter:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for j in range(v.shape[0]):
                out[f"{pre}{j}.down_proj.weight"] = v[j].contiguous()
        else:
            out[k] = v
    return out


def fused_state(sd):
    """Per-expert keys -> fused 3-D keys (gate rows first, then up rows)."""
    out, banks = {}, {}
    for k, v in sd.items():
        if ".mlp.experts." in k and not k.endswith("_proj"):
            pre, rest = k.split(".mlp.experts.")
            j, proj = rest.split(".")[:2]
            banks.setdefault(pre, {}).setdefault(proj, {})[int(j)] = v
        else:
            out[k] = v
    for pre, projs in banks.items():
        E = len(projs["gate_proj"])
        out[f"{pre}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([projs["gate_proj"][j], projs["up_proj"][j]], 0) for j in range(E)]).contiguous()
        out[f"{pre}.mlp.experts.down_proj"] = torch.stack([projs["down_proj"][j] for j in range(E)]).contiguous()
    return out


def save(model, cfg, folder, layout):
    """Saves config.json and model.safetensors in the chosen expert layout, bf16."""
    os.makedirs(folder, exist_ok=True)
    cfg.save_pretrained(folder)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    sd = per_expert_state(sd, cfg)  # normalise first (transformers 5 holds fused experts in memory)
    if layout == "fused":
        sd = fused_state(sd)
    save_file(dict(sorted(sd.items())), os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    return sd


def write_reference(folder, cfg, ref, extra):
    prompt, logits, greedy, glog = ref
    np.save(os.path.join(folder, "ref_prompt.npy"), prompt)
    np.save(os.path.join(folder, "ref_logits.npy"), logits.astype(np.float32))
    np.save(os.path.join(folder, "ref_greedy.npy"), greedy)
    np.save(os.path.join(folder, "ref_greedy_logits.npy"), glog)
    meta = {
        "oracle": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention, no KV cache",
        "weights": "bf16-rounded random init; model.safetensors holds exactly these values",
        "prompt_len": PROMPT_LEN, "gen_len": GEN_LEN, "vocab": cfg.vocab_size,
        "files": {
            "ref_prompt.npy": "int32 [64] prompt token ids",
            "ref_logits.npy": "float32 [64][vocab] logits at every prompt position",
            "ref_greedy.npy": "int32 [32] greedy continuation",
            "ref_greedy_logits.npy": "float32 [32][vocab] logits whose argmax is greedy[i]; row 0 == ref_logits[63]",
        },
        "greedy": greedy.tolist(),
        "logits_abs_max": float(np.abs(logits).max()),
        "logits_std": float(logits.std()),
    }
    meta.update(extra)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def check_reload(folder, model, sd_saved):
    """The saved file round-trips: same tensors, same values (guards the layout conversion)."""
    back = load_file(os.path.join(folder, "model.safetensors"))
    assert set(back) == set(sd_saved), (set(back) ^ set(sd_saved))
    for k in back:
        assert torch.equal(back[k], sd_saved[k]), k
    # and transformers itself loads the folder to the same logits
    m2 = type(model).from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    ids = list(range(1, 17))
    a, b = logits_of(model, ids), logits_of(m2, ids)
    assert np.array_equal(a, b), (folder, float(np.abs(a - b).max()))


def build(name, cfg, cls, seed, layouts, with_reference=True):
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval().float()
    init_weights(model, seed)
    if not with_reference:
        folder = os.path.join(OUT, name)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        sd = save(model, cfg, folder, layouts[0][1])
        check_reload(folder, model, sd)
        print(f"{name}: {os.path.getsize(os.path.join(folder, 'model.safetensors'))} bytes (no reference data)")
        return
    ref = reference(model, cfg.vocab_size, seed + 1)
    for folder_name, layout in layouts:
        folder = os.path.join(OUT, folder_name)
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        sd = save(model, cfg, folder, layout)
        check_reload(folder, model, sd)
        if folder_name == name:
            write_reference(folder, cfg, ref, {"layout": layout})
        else:  # same weights: point at the reference data instead of duplicating 768 KB
            with open(os.path.join(folder, "reference.json"), "w") as f:
                json.dump({"layout": layout, "same_weights_as": name,
                           "note": f"reference data (ref_*.npy) is in ../{name}/"}, f, indent=1)
                f.write("\n")
        size = os.path.getsize(os.path.join(folder, "model.safetensors"))
        print(f"{folder_name}: {size} bytes, greedy {ref[2][:8].tolist()}..., "
              f"logit std {ref[1].std():.3f}")


def build_qwen2_moe_nobias():
    cfg = qwen2_moe_config(qkv_bias=False)
    build("qwen2_moe_nobias", cfg, transformers.Qwen2MoeForCausalLM, 5000, [("qwen2_moe_nobias", "per_expert")])
    folder = os.path.join(OUT, "qwen2_moe_nobias")
    keys = load_file(os.path.join(folder, "model.safetensors")).keys()
    assert not any(k.endswith("_proj.bias") for k in keys), "qkv_bias=False still wrote biases"
    with open(os.path.join(folder, "config.json")) as f:
        assert json.load(f)["qkv_bias"] is False


def main():
    os.makedirs(OUT, exist_ok=True)
    only = sys.argv[1:]  # model names to (re)write; none: all
    if only == ["qwen3_moe_256"]:
        build("qwen3_moe_256", qwen3_moe_256_config(), transformers.Qwen3MoeForCausalLM, 4000,
              [("qwen3_moe_256", "per_expert")], with_reference=False)
        return
    if only == ["qwen2_moe_nobias"]:
        build_qwen2_moe_nobias()
        return
    build("qwen3_moe", qwen3_moe_config(), transformers.Qwen3MoeForCausalLM, 1000,
          [("qwen3_moe", "per_expert"), ("qwen3_moe_fused", "fused")])
    build("qwen2_moe", qwen2_moe_config(), transformers.Qwen2MoeForCausalLM, 2000, [("qwen2_moe", "per_expert")])
    build_qwen2_moe_nobias()
    build("llama", llama_config(), transformers.LlamaForCausalLM, 3000, [("llama", "dense")])
    build("qwen3_moe_256", qwen3_moe_256_config(), transformers.Qwen3MoeForCausalLM, 4000,
          [("qwen3_moe_256", "per_expert")], with_reference=False)


if __name__ == "__main__":
    main()
