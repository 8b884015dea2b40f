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
two modules (<module>.dequant) to hold the imported planes to, bit for bit.

The ModelOpt copy's input scales are ModelOpt's max calibration (hybrid_w4a4.calibrate): input_scale =
amax(|input|) / (6 * 448) of each NVFP4 Linear over one fp32 forward of that reference on ref_prompt.npy,
every token through every routed expert for the statistics as ModelOpt's MoE calibration does (so each
expert's gate_proj / up_proj see the whole MoE input and their scales equal the shared expert's; each
down_proj its intermediate of all 80 tokens; no expert is left uncalibrated). The weights are those of
the compressed-tensors copy, byte for byte.

In modelopt_nvfp4_hybrid/, the W4A4 oracle of tests/cuda/test_hybrid_cuda.c's check_w4a4 (hybrid_w4a4.py:
the reference with the MoE block's input rounded to bf16 and every routed and shared expert matrix's
input fake-quantised to NVFP4 with the divisor the converter gives it, as the GPU's prefill route runs
them; the prompt in one forward), for the whole model and for the model cut after layer 0:
  ref_prompt.npy              int32 [80]           the prompt (ct_nvfp4_hybrid's)
  ref_logits_w4a4.npy         float32 [80][vocab]  the whole model's W4A4 logits
  ref_logits_w4a4_cut1.npy    float32 [80][vocab]  the model cut after layer 0 (the head on its output)
  ref_topk_w4a4.npy           int32 [layers][80][k] each (layer, row)'s expert set, ascending
  ref_sensitivity_w4a4.npy    float32 [layers + 1][80] index 0 the whole model, c the cut after c layers:
                              each row's largest rel-L2 over 16 runs of hybrid_sensitivity.py's noise model
                              (relative noise of RMS 2^-9 at the GPU's rounding sites, the MoE input's before
                              its encoding) on the oracle's routing
  ref_router_margin_w4a4.npy  float32 [layers][80] the oracle's k-th minus (k+1)-th router logit
  ref_router_shift_w4a4.npy   float32 [layers][80] the noise model's largest change of a router-logit
                              difference there
The script prints the input divisors (they must equal `ninfer convert --plan`'s), the oracle against
W4A16 (what four-bit activations do to this model), the noise model's allowances, and the test's rules
tried on runs like the GPU's (every one must pass) and on broken divisors (strength controls)."""
import copy
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_fixtures as cf  # noqa: E402  (ct_quantize, ct_dequant)
import hybrid_models as hm  # noqa: E402  (init_hybrid)
import hybrid_w4a4 as w4  # noqa: E402  (calibration, the W4A4 oracle, the noise model)
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


SEEDS = 16        # the noise model's runs per model (hybrid_sensitivity.py's count)
CHECK_SEEDS = 8   # free-routing noisy runs the test's rule is tried on (seeds apart from the model's)


def build_cut(cfg, fused, layers):
    """The reference model cut after `layers` layers (the final norm and the head read that layer's
    output, as the test's check_layers does), instrumented for the W4A4 oracle."""
    c = copy.deepcopy(cfg)
    c.num_hidden_layers, c.layer_types = layers, cfg.layer_types[:layers]
    model = transformers.Qwen3_5MoeForCausalLM(c).eval().float()
    model.load_state_dict({k: v for k, v in fused.items()
                           if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}, strict=True)
    return w4.instrument(model)


def w4a4_oracle(cfg, fused, prompt, scales, w4a16_logits, out_dir):
    """The W4A4 oracle, its noise model and the test's rule tried on runs like the GPU's and on broken
    divisors (tests/oracle/hybrid_w4a4.py); writes the ref_*w4a4* files (module docstring)."""
    w4.check_against_compressed_tensors()
    L, E, k, P = cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok, len(prompt)
    w4.S.div = w4.divisors(scales, L, E)
    for l, d in w4.S.div.items():
        print(f"layer {l} input divisors: gate/up {d['gu']:.6g} (the layer's {d['gu']:.6g} .. {d['gu_hi']:.6g}), "
              "down " + " ".join(f"{x:.6g}" for x in d["down"]) + f", shared down {d['sd']:.6g}")
    ids = prompt.tolist()
    models = {c: build_cut(cfg, fused, c) for c in range(1, L + 1)}  # c: cut after c layers; L: whole
    refs, route, rlog = {}, {}, {}
    for c in range(1, L + 1):
        refs[c] = w4.forward(models[c], ids)
        if c == L:
            route, rlog = dict(w4.S.chose), dict(w4.S.logits)
    topk = w4.topk_sets(route, L)
    margin = w4.margins(rlog, L, k)
    for c in range(1, L):  # a cut's routing is the whole model's first c layers'
        w4.forward(models[c], ids)
        assert all(torch.equal(w4.S.chose[l], route[l]) for l in range(c)), c
    a16, a16_topk = {}, {}  # W4A16 as the CPU engine runs it: transformers fp32, nothing rounded
    for c in range(1, L + 1):
        a16[c] = w4.forward(models[c], ids, a4=False, bf16_in=False)
        a16_topk[c] = w4.topk_sets(w4.S.chose, c)
    d = float(np.abs(a16[L] - w4a16_logits).max())
    assert d < 1e-4, ("W4A16 through the instrumented model vs ct_nvfp4_hybrid/ref_logits.npy", d)
    for c in range(1, L + 1):
        e = w4.rel(refs[c], a16[c])
        print(f"W4A4 oracle vs W4A16 (transformers fp32; the whole model's is ct_nvfp4_hybrid/ref_logits.npy), cut "
              f"after {c} of {L} layers: rel-L2 median {np.median(e):.3g}, max {e.max():.3g}; routing differs at "
              f"{int((a16_topk[c] != topk[:c]).any(-1).sum())} of {c * P} (layer, row)s")

    # the noise model: SEEDS runs per cut, every site noised, the oracle's routing kept
    sens = np.zeros((L + 1, P), np.float32)
    shift = np.zeros((L, P), np.float32)
    for c in range(1, L + 1):
        w4.S.hits = set()
        for seed in range(SEEDS):
            got = w4.forward(models[c], ids, site="noise", gen=torch.Generator().manual_seed(1000 * c + seed),
                             route={l: route[l] for l in range(c)})
            sens[c] = np.maximum(sens[c], w4.rel(got, refs[c]))
            for l, lg in w4.S.logits.items():
                d = (lg - rlog[l]).numpy()
                shift[l] = np.maximum(shift[l], d.max(-1) - d.min(-1))
        a = np.maximum(w4.EACH_BOUND, 2 * sens[c])
        print(f"noise model, cut after {c} of {L} layers: sites {sorted(w4.S.hits)}; sensitivity median "
              f"{np.median(sens[c]):.3g}, max {sens[c].max():.3g} at row {int(sens[c].argmax())}; allowances "
              f"max(0.1, 2 s_r) from {a.min():.3g} to {a.max():.3g}, {int((a > w4.EXCLUDE_BOUND).sum())} rows past "
              f"0.5 (not held); median allowance {max(w4.MEDIAN_BOUND, 2 * np.sort(sens[c])[P // 2]):.3g}")
    sens[0] = sens[L]
    for l in range(L):
        print(f"layer {l} router: margin median {np.median(margin[l]):.3g} (min {margin[l].min():.3g}), shift under "
              f"the noise median {np.median(shift[l]):.3g} (max {shift[l].max():.3g}); rows with margin <= 2 shift: "
              f"{int((margin[l] <= 2 * shift[l]).sum())} of {P}")

    def rule(c, got, what):
        ok, f, med, worst, over, why = w4.test_rule(got, w4.topk_sets(w4.S.chose, c), refs[c], topk[:c], sens[c],
                                                    margin[:c], shift[:c], *((a16[c], a16_topk[c]) if c < L else ()))
        print(f"  {what}, cut after {c}: rel-L2 median of all rows {np.median(w4.rel(got, refs[c])):.3g} (to W4A16 "
              f"{np.median(w4.rel(got, a16[c])):.3g}); first flip row {f}, held rows median {med:.3g}, worst "
              f"{worst:.3g}, largest share of its allowance {w4.worst_share(got[:f], refs[c][:f], sens[c][:f]):.3g}: {why}")
        return ok

    print("the test's rule on runs like the GPU's (free routing):")
    for c in range(1, L + 1):
        good = [rule(c, w4.forward(models[c], ids, site="bf16"), "bf16 roundings at every site")]
        for seed in range(CHECK_SEEDS):
            good.append(rule(c, w4.forward(models[c], ids, site="noise",
                                           gen=torch.Generator().manual_seed(77000 + 100 * c + seed)), f"noise seed {seed}"))
        assert all(good), ("the test's rule fails a run like the GPU's", c)
    print("strength controls (bf16 roundings at every site, free routing):")
    for b, what in w4.BREAKS.items():
        print(f" {b}: {what}")
        caught = [rule(c, w4.forward(models[c], ids, brk=b, site="bf16"), " ") is False for c in range(1, L + 1)]
        assert caught[0] or b not in ("enc1", "dec1", "inverted", "a16"), ("the cut's rule misses", b)

    np.save(os.path.join(out_dir, "ref_prompt.npy"), prompt.astype(np.int32))
    np.save(os.path.join(out_dir, "ref_logits_w4a4.npy"), refs[L].astype(np.float32))
    for c in range(1, L):
        np.save(os.path.join(out_dir, f"ref_logits_w4a4_cut{c}.npy"), refs[c].astype(np.float32))
    np.save(os.path.join(out_dir, "ref_topk_w4a4.npy"), topk)
    np.save(os.path.join(out_dir, "ref_sensitivity_w4a4.npy"), sens)
    np.save(os.path.join(out_dir, "ref_router_margin_w4a4.npy"), margin)
    np.save(os.path.join(out_dir, "ref_router_shift_w4a4.npy"), shift)


def main():
    torch.manual_seed(11)
    cfg = config()
    cfg._attn_implementation = "eager"
    model = transformers.Qwen3_5MoeForCausalLM(cfg).eval().float()
    hm.init_hybrid(model, 11)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    flat = tm.per_expert_state(sd, None)
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
        ct[m + ".weight_packed"], ct[m + ".weight_scale"] = packed, scale8
        ct[m + ".weight_global_scale"] = gs  # NVFP4A16: weights only
        mo[m + ".weight"], mo[m + ".weight_scale"] = packed, scale8
        mo[m + ".weight_scale_2"] = (torch.tensor(1.0, dtype=torch.float32) / gs[0]).reshape(())
        mo[m + ".input_scale"] = None  # calibrated below
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
    # ModelOpt's input scales: max calibration of the reference over the prompt
    scales = {m: w4.input_scale(a) for m, a in w4.calibrate(ref_model, prompt.tolist()).items()}
    for k in mo:
        if k.endswith(".input_scale"):
            mo[k] = scales[k[: -len(".input_scale")]]
    assert len(scales) == sum(k.endswith(".input_scale") for k in mo), sorted(scales)
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
    w4a4_oracle(cfg, fused, prompt, scales, logits, os.path.join(OUT, "modelopt_nvfp4_hybrid"))


if __name__ == "__main__":
    main()
