#!/usr/bin/env python3
"""The W4A4 oracle of tests/fixtures/convert/modelopt_nvfp4_hybrid (imported by hybrid_nvfp4_fixture.py,
which writes its files; CI never runs this): ModelOpt's max calibration of the input scales, transformers
fp32 with the MoE experts' inputs fake-quantised to NVFP4 as the GPU's W4A4 prefill route encodes them,
and a noise model of the GPU's other roundings for the test's per-row allowances.

NVFP4 activation quantisation (compressed-tensors' TENSOR_GROUP fp4 with a static global scale, ModelOpt's
NVFP4 input quantizer, docs/sparse_moe.md "W4A4"; divisor g = 1 / input_scale): per block of 16
consecutive elements of a row, every step IEEE fp32,
    s   = e4m3_rne(min(g * (amax / 6), 448)), an s of 0 replaced by 0.125 (e4m3's eps, byte 0x20)
    eff = s / g
    q   = e2m1_rne(x / eff), e2m1 = {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign, ties to the even code, |q| <= 6
    x'  = q * eff.
`check_against_compressed_tensors` holds this function to compressed-tensors' own fake_quantize bit for
bit on random data (with blocks at the scale's extremes).

Where the GPU quantises (the engine's sparse-MoE prefill route, T > 12 tokens for an nvfp4 bank; its
decode and small-token routes and the gated attention's nvfp4 projections stay W4A16): the MoE block's
input x (bf16 on the GPU) with the layer's one gate/up divisor for every routed expert and the shared
expert; each routed expert's intermediate silu(gate) * up (fp32 on the GPU, encoded straight from the
GEMM's accumulators) with that expert's down divisor; the shared expert's intermediate with its own. The
router, the shared expert's sigmoid gate and everything outside the MoE block see x unquantised.
Divisors as the converter gives them (src/convert/plan_hf.c nvfp4_rules + plan.c unify_inputs):
float32(1 / input_scale) per module; gate/up: the smallest over the layer's routed experts' gate_proj and
up_proj and the shared expert's (one divisor for the bank, routed and shared alike); down: one per expert;
the shared down its own.

The noise model (`instrument`, `site`): tests/oracle/hybrid_sensitivity.py's, on this oracle: relative
noise x (1 + u n), u = 2^-9, at the GPU's bf16 rounding sites (mixer input and output, KV, attention
output, the MoE input before its encoding, the routed y plane, the MoE output, the head's input), the
oracle's routing kept; site "bf16" rounds there instead (an emulation of one GPU run). `test_rule` is
tests/cuda/test_hybrid_cuda.c's check_w4a4 decision, which the fixture script tries on such runs and on
the strength controls of BREAKS.
"""
import numpy as np
import torch
import torch.nn.functional as F

import hybrid_sensitivity as hs  # hook_sites: the rounding sites outside the MLP

U = 2.0 ** -9  # the RMS of bf16 round-to-nearest errors (tests/cuda/test_hybrid_cuda.c's u)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # the midpoints between neighbouring e2m1 magnitudes


def e2m1_rne(q):
    """q rounded to the nearest e2m1 value (ties to the even code, i.e. the even index of E2M1),
    magnitudes past 6 to 6."""
    a = q.abs()
    idx = torch.zeros(q.shape, dtype=torch.long)
    for j, m in enumerate(MIDS):  # at a tie between codes j and j + 1 the even one wins
        idx += ((a > m) | ((a == m) & (j % 2 == 1))).long()
    v = E2M1[idx]
    return torch.where(q < 0, -v, v)


def nvfp4_fake(x, g_enc, g_dec=None):
    """x [.., K] (K a multiple of 16) NVFP4-encoded with divisor g_enc and decoded with g_dec (the same
    unless a strength control breaks one side), in float32."""
    g_enc = torch.tensor(np.float32(g_enc))
    g_dec = g_enc if g_dec is None else torch.tensor(np.float32(g_dec))
    shp = x.shape
    b = x.float().reshape(*shp[:-1], shp[-1] // 16, 16)
    amax = b.abs().amax(-1, keepdim=True)
    s = torch.clamp(g_enc * (amax / 6.0), max=448.0).to(torch.float8_e4m3fn).float()
    s = torch.where(s == 0, torch.tensor(0.125), s)
    q = e2m1_rne(b / (s / g_enc))
    return (q * (s / g_dec)).reshape(shp)


def check_against_compressed_tensors():
    """nvfp4_fake equals compressed-tensors' fake_quantize with its calculate_qparams scales (the NVFP4
    scheme's input_activations arguments) bit for bit."""
    import copy
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.quant_scheme import NVFP4
    from compressed_tensors.quantization.utils.helpers import calculate_qparams
    args = QuantizationScheme(targets=["Linear"], **copy.deepcopy(NVFP4)).input_activations
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 256, generator=gen) * torch.exp(2 * torch.randn(64, 1, generator=gen))
    x[0, :16] = 0  # an all-zero block: scale 0 -> eps
    x[1, :16] *= 1e-6  # a scale that rounds to 0
    x[2, :16] = torch.tensor([6.0, 5.0, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25] * 2)  # e2m1 ties at eff = 1
    for g in (np.float32(2688.0 / 9.0), np.float32(1.0), np.float32(4471.3)):
        b = x.reshape(64, 16, 16)
        gs = torch.tensor([g], dtype=torch.float32)
        scale, zp = calculate_qparams(b.amin(-1), b.amax(-1), args, global_scale=gs)
        ref = fake_quantize(x, scale, zp, args, global_scale=gs)
        got = nvfp4_fake(x, g)
        assert torch.equal(ref, got), (g, float((ref - got).abs().max()))


class State:
    """The runs' shared state."""
    site = None    # None: the clean oracle; "noise": x (1 + U n), n ~ N(0, 1); "bf16": x rounded to bf16
    gen = None     # the noise's generator
    a4 = True      # False: the experts' inputs unquantised (W4A16 on the same model, for comparison)
    bf16_in = True  # the MoE block's input rounded to bf16 (the GPU's x) before anything reads it
    route = None   # None: each router's own top-k; else {layer: [rows, k]} expert ids to use
    brk = None     # a strength control (BREAKS), or None
    div = {}       # {layer: {"gu": g, "gu_hi": the largest of its group, "down": [E] g, "sd": g}}
    chose, logits, hits = {}, {}, set()


S = State()
BREAKS = {
    "enc1": "the encoder's divisor lost (g = 1), the epilogue divides by g",
    "dec1": "the epilogue's divisor lost (1), the encoder uses g",
    "both1": "g = 1 in the encoder and the epilogue",
    "inverted": "1 / g instead of g, in both",
    "down0": "every expert's down input divisor = expert 0's",
    "gu_hi": "the gate/up divisor the largest of the layer's, not the smallest",
    "a16": "no activation quantisation (the experts W4A16, as the CPU engine runs them)",
}


def site(x, name):
    if S.site is None:
        return x
    S.hits.add(name)
    if S.site == "bf16":
        return x.to(torch.bfloat16).float()
    return x * (1 + U * torch.randn(x.shape, generator=S.gen, dtype=x.dtype))


def fq(x, g, hi=None):
    """x as the GPU's W4A4 route feeds it to a product with input divisor g (hi: the largest divisor of
    the unified group, for the gu_hi control)."""
    b = S.brk
    if not S.a4 or b == "a16":
        return x
    if b == "gu_hi" and hi is not None:
        g = hi
    if b == "enc1":
        return nvfp4_fake(x, 1.0, g)
    if b == "dec1":
        return nvfp4_fake(x, g, 1.0)
    if b == "both1":
        return nvfp4_fake(x, 1.0)
    if b == "inverted":
        return nvfp4_fake(x, np.float32(1.0) / np.float32(g))
    return nvfp4_fake(x, g)


def moe_forward(layer):
    """Qwen3_5MoeSparseMoeBlock.forward with the W4A4 route's quantisation points."""
    def forward(self, hidden_states):
        B, T, H = hidden_states.shape
        x = site(hidden_states.reshape(-1, H), "mlp_in")
        if S.bf16_in:
            x = x.to(torch.bfloat16).float()
        logits = F.linear(x, self.gate.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        val, idx = torch.topk(probs, self.gate.top_k, dim=-1)
        S.chose[layer], S.logits[layer] = idx.clone(), logits.clone()
        if S.route is not None:
            idx = S.route[layer]
            val = probs.gather(1, idx)
        val = val / val.sum(dim=-1, keepdim=True)
        d = S.div[layer]
        xq = fq(x, d["gu"], d["gu_hi"])
        se = self.shared_expert
        mid = se.act_fn(F.linear(xq, se.gate_proj.weight)) * F.linear(xq, se.up_proj.weight)
        shared = F.linear(fq(mid, d["sd"]), se.down_proj.weight)
        shared = torch.sigmoid(F.linear(x, self.shared_expert_gate.weight)) * shared
        ex = self.experts
        out = torch.zeros_like(x)
        for e in range(ex.num_experts):
            tok, pos = torch.where(idx == e)
            if tok.numel() == 0:
                continue
            gate, up = F.linear(xq[tok], ex.gate_up_proj[e]).chunk(2, dim=-1)
            m = ex.act_fn(gate) * up
            y = F.linear(fq(m, d["down"][0 if S.brk == "down0" else e]), ex.down_proj[e])
            out.index_add_(0, tok, site(y, "y") * val[tok, pos, None])  # the routed y plane is bf16
        return site(out + shared, "moe_out").reshape(B, T, H)
    return forward


def instrument(model):
    """The W4A4 MoE blocks and the GPU's other bf16 rounding sites (tests/oracle/hybrid_sensitivity.py's
    list and hook_sites, with the MoE's as the W4A4 route has them: its input, the routed y plane, its
    output; the intermediates are encoded from fp32) on a Qwen3_5MoeForCausalLM."""
    hs.hook_sites(model, site)
    for l, layer in enumerate(model.model.layers):
        layer.mlp.forward = moe_forward(l).__get__(layer.mlp)
    return model


def forward(model, ids, **state):
    """Logits [rows][V] of one forward over ids with State fields set (and reset after)."""
    saved = {k: getattr(S, k) for k in state}
    for k, v in state.items():
        setattr(S, k, v)
    S.chose, S.logits = {}, {}
    try:
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
    finally:
        for k, v in saved.items():
            setattr(S, k, v)


def topk_sets(chose, layers):
    """[layers][rows][k] int32 expert ids, each row's set sorted ascending (the test compares sets)."""
    return np.stack([np.sort(chose[l].numpy(), -1) for l in range(layers)]).astype(np.int32)


def margins(logits, layers, k):
    out = []
    for l in range(layers):
        s = np.sort(logits[l].numpy(), axis=-1)[:, ::-1]
        out.append(s[:, k - 1] - s[:, k])
    return np.stack(out).astype(np.float32)


def rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


# ---- calibration ---------------------------------------------------------------------------------

def calibrate(model, ids):
    """ModelOpt's max calibration on one fp32 forward of the reference over ids: {module: amax of |input|}
    for every NVFP4 Linear. As ModelOpt's _QuantMoeSparseMoe does while calibrating, every token goes to
    every expert for the statistics (the model's own output keeps its top-k): each routed expert's
    gate_proj and up_proj see the whole MoE input, its down_proj its intermediate silu(gate) * up of
    every token. So no expert is left uncalibrated (ModelOpt's export would give one the largest amax of
    its siblings, set_expert_quantizer_amax)."""
    amax, hooks = {}, []

    def put(name, x):
        v = x.detach().abs().max().float()
        amax[name] = torch.maximum(amax[name], v) if name in amax else v

    for l, layer in enumerate(model.model.layers):
        pre = f"model.layers.{l}"

        def moe_pre(mod, args, pre=pre):
            x = args[0].reshape(-1, args[0].shape[-1])
            ex = mod.experts
            for e in range(ex.num_experts):
                put(f"{pre}.mlp.experts.{e}.gate_proj", x)
                put(f"{pre}.mlp.experts.{e}.up_proj", x)
                gate, up = F.linear(x, ex.gate_up_proj[e]).chunk(2, dim=-1)
                put(f"{pre}.mlp.experts.{e}.down_proj", ex.act_fn(gate) * up)
        hooks.append(layer.mlp.register_forward_pre_hook(moe_pre))
        linears = {"mlp.shared_expert.gate_proj": layer.mlp.shared_expert.gate_proj,
                   "mlp.shared_expert.up_proj": layer.mlp.shared_expert.up_proj,
                   "mlp.shared_expert.down_proj": layer.mlp.shared_expert.down_proj}
        if hasattr(layer, "self_attn"):
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                linears["self_attn." + p] = getattr(layer.self_attn, p)
        for n, mod in linears.items():
            hooks.append(mod.register_forward_pre_hook(lambda m, a, n=f"{pre}.{n}": put(n, a[0])))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    return amax


def input_scale(amax):
    """ModelOpt's NVFP4 input scale: amax / (6 * 448), float32."""
    return (amax.float() / (6.0 * 448.0)).reshape(())


def divisors(scales, layers, experts):
    """{layer: divisors} as the converter makes them from {module: input_scale}."""
    g = {k: np.float32(1.0) / np.float32(v.item()) for k, v in scales.items()}
    out = {}
    for l in range(layers):
        pre = f"model.layers.{l}.mlp"
        gu = [g[f"{pre}.experts.{e}.{p}"] for e in range(experts) for p in ("gate_proj", "up_proj")]
        gu += [g[f"{pre}.shared_expert.{p}"] for p in ("gate_proj", "up_proj")]
        out[l] = {"gu": min(gu), "gu_hi": max(gu), "down": [g[f"{pre}.experts.{e}.down_proj"] for e in range(experts)],
                  "sd": g[f"{pre}.shared_expert.down_proj"]}
    return out


# ---- the test's rule ------------------------------------------------------------------------------

EACH_BOUND, MEDIAN_BOUND, EXCLUDE_BOUND = 1e-1, 2.5e-2, 0.5


def first_flip(a, b):
    """The first row where two routings [layers][rows][k] choose different expert sets, and its layer
    (rows, -1 when none)."""
    layers, rows = a.shape[:2]
    for r in range(rows):
        d = [l for l in range(layers) if set(a[l, r]) != set(b[l, r])]
        if d:
            return r, d[0]
    return rows, -1


def test_rule(got, got_topk, ref, ref_topk, sens, margin, shift, w4a16=None, w4a16_topk=None):
    """What tests/cuda/test_hybrid_cuda.c's W4A4 check decides for a run (logits got [rows][V], its
    routing got_topk [layers][rows][k]): the first routing difference f against the oracle must be a
    near-tie (margin <= 2 shift there), the rows before it within max(EACH_BOUND, 2 sens_r) each (rows
    whose allowance passes EXCLUDE_BOUND not held), their median within max(MEDIAN_BOUND, 2 median
    sens); with w4a16 (the CPU engine's logits and routing; the cut), the run's median over the rows
    before either flip nearer the oracle than w4a16. Returns (passed, f, median, worst, rows over, why)."""
    f, fl = first_flip(got_topk, ref_topk)
    why = []
    if f < ref_topk.shape[1] and not margin[fl, f] <= 2 * shift[fl, f]:
        why.append(f"flip at row {f} layer {fl}: margin {margin[fl, f]:.3g} > 2 x {shift[fl, f]:.3g}")
    e = rel(got[:f], ref[:f])
    a = np.maximum(EACH_BOUND, 2 * sens[:f])
    held = a <= EXCLUDE_BOUND
    over = int(((e > a) & held).sum())
    med = float(np.sort(e)[f // 2]) if f else 0.0  # rows_vs's median: s[rows / 2] of the sorted values
    mb = max(MEDIAN_BOUND, 2 * float(np.sort(sens[:f])[f // 2])) if f else MEDIAN_BOUND
    if med > mb:
        why.append(f"median {med:.3g} > {mb:.3g}")
    if over:
        why.append(f"{over} rows over their allowance")
    if w4a16 is not None:
        n = min(f, first_flip(got_topk, w4a16_topk)[0])
        mo, mc = (float(np.median(rel(got[:n], x[:n]))) if n else 0.0 for x in (ref, w4a16))
        if not (n and mo < mc):
            why.append(f"nearer W4A16 ({mc:.3g}) than the oracle ({mo:.3g})")
    return not why, f, med, float(e.max()) if f else 0.0, over, "; ".join(why) or "pass"


def worst_share(got, ref, sens):
    """The largest rel-L2 / allowance of the held rows (1: at its allowance)."""
    if not len(got):
        return 0.0
    a = np.maximum(EACH_BOUND, 2 * sens)
    held = a <= EXCLUDE_BOUND
    return float((rel(got, ref) / a)[held].max()) if held.any() else 0.0
