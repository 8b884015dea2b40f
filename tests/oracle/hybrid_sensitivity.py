#!/usr/bin/env python3
"""Per-row bf16 sensitivity of the tiny hybrid fixtures (qwen3_next, qwen3_5_moe_text), the bounds
tests/cuda/test_hybrid_cuda.c holds the GPU engine to. CI never runs this; its outputs are committed.

    /tmp/venv/bin/pip install -r tests/oracle/requirements-convert.txt
    /tmp/venv/bin/python tests/oracle/hybrid_sensitivity.py [fixture ...]

Why. The GPU rounds to bf16 the input of every product (and a few other vectors, below); a random
fixture has rows where such roundings are amplified far beyond the typical row's ~1e-2: in
qwen3_5_moe_text cut after 2 layers, row 25's GDN head output nearly cancels and the per-head gated
RMSNorm scales the cancelled remainder back up, so a faithful bf16 emulation in torch moves that row's
logits by 0.24 (rel-L2) while ordinary rows move by 5e-3 - 2e-2. A fixed per-row bound either fails such
a row or is too loose for the rest; this script measures, per row, how far roundings of the GPU's size
move it, so the test can bound each row by its own conditioning.

What. For each fixture, one fp32 transformers forward (eager attention, use_cache=False) over the
prompt followed by the greedy tokens but the last (ref_prompt.npy, ref_greedy.npy): rows 0 .. P-1 are
the prompt's logits, row P-1+g is decode step g's (a decode step's logits are those of the forward
row of the token before it); ROWS = P + G - 1. The same for the model cut after L layers, L = 1 ..
layers (config num_hidden_layers = L; the final norm and the LM head read layer L's output, as the
test's check_layers does). Then, per model, SEEDS runs with relative noise x * (1 + u n), n ~ N(0, 1)
per element, u = 2^-9 (the RMS of bf16 round-to-nearest errors, the test header's u), at the GPU's
rounding sites:
  mix_in    the token mixer's input (the input of every q/k/v/gate or in_proj product)
  kv        an attention layer's keys and values (the bf16 KV cache)
  att_out   the attention output before its gate (att * sigmoid(gate) is the next site's)
  mix_out   the input of out_proj / o_proj (the GDN's gated norm output, the gated attention output)
  mlp_in    the MLP's input (router, shared expert, its gate, every routed expert, a dense MLP)
  mid       every intermediate: each routed expert's, the shared expert's, a dense MLP's (down's input)
  moe_out   the sparse-MoE block's output
  head_in   the LM head's input (after the final norm)
In the noisy runs every MoE layer takes the fp32 run's expert set for every row (the weights come from
the noisy router logits): the test holds a row to its bound only while the GPU's routing agrees with
the CPU's, and a changed expert set moves every later row by order one, so the sensitivity is that of
the agreed routing. Outputs, written into the fixture folder:
  ref_sensitivity.npy   float32 [layers + 1][ROWS]: index 0 the full model, index L the cut after L
                        layers; each row's max over the seeds of rel-L2(noisy logits, fp32 logits).
  ref_router_margin.npy float32 [layers][ROWS]: the fp32 run's router-logit gap between the k-th and
                        the (k+1)-th largest (the top-k boundary; a layer's first L layers are the same
                        in every cut); NaN for a dense MLP layer.
  ref_router_shift.npy  float32 [layers][ROWS]: the largest change, over every seed and cut, of any
                        difference of two router logits at that (layer, row) (max - min of the noisy minus
                        the fp32 logits); NaN for a dense MLP layer. A noisy run's router flips where this
                        change exceeds the margin; the test accepts a GPU-vs-CPU routing flip at (layer,
                        row) where the margin is at most twice it.
  ref_flip_margin.npy   float32 [1]: the largest fp32 margin at which a noisy run's router (its own top-k
                        of its noisy logits, while it follows the fp32 routing) chose another expert set,
                        over every seed, cut, layer and row. Informative only: it is set by the most
                        ill-conditioned row (qwen3_5_moe_text: 1.59 at row 25, layer 2, above two thirds
                        of all the margins), so a bound from it would accept almost any flip.
The sensitivity is a max over SEEDS draws; the GPU's roundings are one draw of errors of that size
(bf16 rounding errors are not Gaussian, but their RMS is u and they are independent across elements), so
the test allows 2x the row's sensitivity (and never less than its fixed bound).
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "fixtures", "models")
FIXTURES = ("qwen3_next", "qwen3_5_moe_text")
SEEDS = 16
U = 2.0 ** -9


class Noise:
    """The runs' shared state: the generator (None: the fp32 run), the routing to follow (None: the
    model's own) and what the routers chose."""
    gen = None
    route = None   # {layer: [rows, k] int64} expert ids to use
    chose = {}     # {layer: [rows, k]} the router's own top-k of this run
    logits = {}    # {layer: [rows, E]} router logits of this run
    hits = set()   # site names that took noise (a sanity check that every hook fires)


N = Noise()


def q(x, site):
    if N.gen is None:
        return x
    N.hits.add(site)
    return x * (1 + U * torch.randn(x.shape, generator=N.gen, dtype=x.dtype))


def router_forward(layer):
    def forward(self, hidden_states):
        h = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(h, self.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        val, idx = torch.topk(probs, self.top_k, dim=-1)
        N.chose[layer], N.logits[layer] = idx.clone(), logits.clone()
        if N.route is not None:
            idx = N.route[layer]
            val = probs.gather(1, idx)
        if getattr(self, "norm_topk_prob", True):
            val = val / val.sum(dim=-1, keepdim=True)
        return logits, val.to(logits.dtype), idx
    return forward


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        tok, pos = torch.where(top_k_index == e)
        if tok.numel() == 0:
            continue
        gate, up = F.linear(hidden_states[tok], self.gate_up_proj[e]).chunk(2, dim=-1)
        mid = q(self.act_fn(gate) * up, "mid")
        out.index_add_(0, tok, F.linear(mid, self.down_proj[e]) * top_k_weights[tok, pos, None])
    return out


def patch_attention(module, fn):
    """The eager attention of the model's module, its keys, values (the bf16 KV cache) and output
    through fn(x, site); a second call only changes fn."""
    if not hasattr(module, "_nf_site"):
        orig = module.eager_attention_forward

        def eager(mod, query, key, value, attention_mask, **kw):
            f = module._nf_site
            out, w = orig(mod, query, f(key, "kv"), f(value, "kv"), attention_mask, **kw)
            return f(out, "att_out"), w
        module.eager_attention_forward = eager
    module._nf_site = fn


def hook_sites(model, fn):
    """The GPU's rounding sites outside the MLP, through fn(x, site) (this script's q, or
    hybrid_w4a4.py's site): the attention's (patch_attention), each token mixer's input (mix_in) and
    its out_proj / o_proj input (mix_out), the head's input (head_in). The MLP's are the caller's."""
    patch_attention(sys.modules[type(model).__module__], fn)
    for layer in model.model.layers:
        mixer = layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn

        def mix_pre(mod, args, kwargs):
            if "hidden_states" in kwargs:
                kwargs["hidden_states"] = fn(kwargs["hidden_states"], "mix_in")
            else:
                args = (fn(args[0], "mix_in"),) + args[1:]
            return args, kwargs
        mixer.register_forward_pre_hook(mix_pre, with_kwargs=True)
        oproj = mixer.out_proj if hasattr(mixer, "out_proj") else mixer.o_proj
        oproj.register_forward_pre_hook(lambda m, a: (fn(a[0], "mix_out"),))
    model.lm_head.register_forward_pre_hook(lambda m, a: (fn(a[0], "head_in"),))


def load(folder, layers):
    cfg = transformers.AutoConfig.from_pretrained(folder)
    cfg.num_hidden_layers = layers
    cfg.layer_types = cfg.layer_types[:layers]
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, config=cfg, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    hook_sites(model, q)
    for l, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        mlp.register_forward_pre_hook(lambda m, a: (q(a[0], "mlp_in"),))
        if hasattr(mlp, "experts"):
            mlp.gate.forward = router_forward(l).__get__(mlp.gate)
            mlp.experts.forward = experts_forward.__get__(mlp.experts)
            mlp.shared_expert.down_proj.register_forward_pre_hook(lambda m, a: (q(a[0], "mid"),))
            mlp.register_forward_hook(lambda m, a, o: q(o, "moe_out"))
        else:
            mlp.down_proj.register_forward_pre_hook(lambda m, a: (q(a[0], "mid"),))
    return model


def forward(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def rel(a, b):
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def fixture(name):
    folder = os.path.join(MODELS, name)
    prompt = np.load(os.path.join(folder, "ref_prompt.npy")).astype(np.int64).tolist()
    greedy = np.load(os.path.join(folder, "ref_greedy.npy")).astype(np.int64).tolist()
    ids = prompt + greedy[:-1]
    P, G, rows = len(prompt), len(greedy), len(prompt) + len(greedy) - 1
    layers = transformers.AutoConfig.from_pretrained(folder).num_hidden_layers

    full = load(folder, layers)
    N.gen, N.route, N.chose, N.logits = None, None, {}, {}
    ref_full = forward(full, ids)
    want = np.concatenate([np.load(os.path.join(folder, "ref_logits.npy")),
                           np.load(os.path.join(folder, "ref_greedy_logits.npy"))[1:]])
    d = float(rel(ref_full, want).max())
    assert d < 1e-4, (name, "fp32 forward vs ref_logits / ref_greedy_logits", d)
    route, ref_router = dict(N.chose), dict(N.logits)
    k = next(iter(route.values())).shape[1]
    margin = np.full((layers, rows), np.nan, np.float32)
    for l, lg in N.logits.items():
        s = np.sort(lg.numpy(), axis=-1)[:, ::-1]
        margin[l] = s[:, k - 1] - s[:, k]
    del full

    sens = np.zeros((layers + 1, rows), np.float32)
    shift = np.where(np.isnan(margin), np.nan, 0).astype(np.float32)
    flip, flips = 0.0, []
    for cut in range(1, layers + 1):  # index 0, the full model, is the cut after every layer
        model = load(folder, cut)
        N.gen, N.route = None, None
        ref = forward(model, ids)
        N.route = {l: r for l, r in route.items() if l < cut}
        for seed in range(SEEDS):
            N.gen, N.chose, N.logits, N.hits = torch.Generator().manual_seed(1000 * cut + seed), {}, {}, set()
            sens[cut] = np.maximum(sens[cut], rel(forward(model, ids), ref))
            for l, idx in N.chose.items():
                d = (N.logits[l] - ref_router[l]).numpy()
                shift[l] = np.maximum(shift[l], d.max(-1) - d.min(-1))
                a, b = np.sort(idx.numpy(), -1), np.sort(route[l].numpy(), -1)
                for r in np.nonzero((a != b).any(-1))[0]:
                    flips.append((cut, seed, l, int(r), float(margin[l, r])))
                    flip = max(flip, float(margin[l, r]))
        print(f"{name} cut {cut}: sites {sorted(N.hits)}; sensitivity median {np.median(sens[cut]):.3g}, "
              f"max {sens[cut].max():.3g} at row {int(sens[cut].argmax())}")
    sens[0] = sens[layers]
    np.save(os.path.join(folder, "ref_sensitivity.npy"), sens)
    np.save(os.path.join(folder, "ref_router_margin.npy"), margin)
    np.save(os.path.join(folder, "ref_flip_margin.npy"), np.array([flip], np.float32))
    np.save(os.path.join(folder, "ref_router_shift.npy"), shift)
    print(f"{name}: {P} prompt rows + {G - 1} decode rows; noise flipped {len(flips)} (cut, seed, layer, row)s, "
          f"largest margin flipped {flip:.4g}; smallest fp32 margin {np.nanmin(margin):.4g}")
    for f in sorted(flips, key=lambda t: -t[4])[:8]:
        print(f"  flip: cut {f[0]} seed {f[1]} layer {f[2]} row {f[3]} margin {f[4]:.4g}")


def main():
    transformers.logging.set_verbosity_error()
    for name in sys.argv[1:] or FIXTURES:
        fixture(name)


if __name__ == "__main__":
    main()
