#!/usr/bin/env python3
"""Adds random MTP (multi-token prediction) weights to the hybrid fixtures that hybrid_models.py wrote and
writes a torch reference of the MTP step (docs/hybrid.md, "MTP"). CI never runs this; hybrid_models.py
calls it last, and it can run alone on the committed folders (the main weights are not touched):

    /tmp/venv/bin/python tests/oracle/hybrid_mtp.py
    /tmp/venv/bin/python tests/oracle/hybrid_mtp.py qwen3_next_moe   # that folder alone, weights only

qwen3_next_moe (the HF side of tests/fixtures/gguf/qwen3next*.gguf) gets mtp.* weights and config's
num_nextn_predict_layers only, no ref_mtp_*.npy (tests/engine/test_gguf_hybrid compares the MTP block of
the llama.cpp GGUF made from it, qwen3next_mtp.gguf, with this folder's, whose block arithmetic
test_mtp checks on the other two folders).

transformers builds no MTP module (Qwen3NextForCausalLM and Qwen3_5MoeForCausalLM ignore `^mtp.*` on
load), so the reference is written here, following vLLM's Qwen3NextMultiTokenPredictor (read, not
copied): for the hidden state h_p that the main model's final norm gives at position p and the token
t_{p+1} that follows it,

    x   = fc(cat(pre_fc_norm_embedding(embed(t_{p+1})), pre_fc_norm_hidden(h_p)))
    x   = decoder layer (full gated attention over the MTP's own keys/values at positions 0..p, rope at
          position p; then the MoE block with its shared expert), one transformers DecoderLayer
    h'  = norm(x)                      (every norm zero-centred: x / rms * (1 + w))
    logits = lm_head(h')               (the main model's head, tied or not)

Chained drafting feeds h' and the drafted token to the next position. Checkpoint keys: mtp.fc.weight
[H, 2H], mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight [H],
mtp.layers.0.* (a full-attention decoder layer's keys, experts in the folder's layout). The multimodal
qwen3_5_moe folder gets the same keys at top level ("mtp.", beside model.language_model.), as published.

Files written per model folder (qwen3_next, qwen3_5_moe_text):
  ref_mtp_logits.npy  float32 [130][vocab]: draft logits at every prompt position p, from (h_p, t_{p+1}),
                      where t_130 = ref_greedy[0]; row p predicts the token at p + 2
  ref_mtp_chain.npy   float32 [2][vocab]: the chained steps at positions 130 and 131, each fed the
                      previous step's h' and the argmax of its logits
  ref_mtp_chain_tokens.npy int32 [2]: those argmax tokens (the tokens fed at 130 and 131)
"""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_models as tm  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


class MTP(torch.nn.Module):
    """One MTP block with transformers' own decoder layer and RMSNorm classes."""

    def __init__(self, cfg, layer_cls, norm_cls):
        super().__init__()
        H = cfg.hidden_size
        one = type(cfg)(**{**cfg.to_dict(), "num_hidden_layers": 1, "layer_types": ["full_attention"],
                           "mlp_only_layers": []})
        one._attn_implementation = "eager"
        one._experts_implementation = getattr(cfg, "_experts_implementation", None) or "eager"
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = norm_cls(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(H, eps=cfg.rms_norm_eps)
        self.layers = torch.nn.ModuleList([layer_cls(one, 0)])
        self.norm = norm_cls(H, eps=cfg.rms_norm_eps)

    def forward(self, emb, hidden, pos_emb, mask):
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1))
        out = self.layers[0](x, position_embeddings=pos_emb, attention_mask=mask)
        x = out[0] if isinstance(out, tuple) else out
        return self.norm(x)


def causal(T):
    m = torch.full((T, T), float("-inf")).triu(1)
    return m[None, None]


def run_mtp(model, mtp, hidden, tokens):
    """MTP over positions 0..T-1: hidden [T][H] (fed), tokens [T] (the tokens after each position)."""
    T = len(tokens)
    ids = torch.tensor([tokens])
    emb = model.model.embed_tokens(ids)
    pos = torch.arange(T)[None]
    pe = model.model.rotary_emb(emb, pos)
    h = mtp(emb, hidden[None], pe, causal(T))
    return h[0], model.lm_head(h)[0]


def add_mtp(folder, cls, layer_cls, norm_cls, seed, fused, mm_folder=None, refs=True):
    model = cls.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    torch.manual_seed(seed)
    mtp = MTP(cfg, layer_cls, norm_cls).eval().float()
    import hybrid_models as hm  # noqa: E402 (its init rules; imported late: it imports this module's caller)
    hm.init_hybrid(mtp, seed)
    prompt = np.load(os.path.join(folder, "ref_prompt.npy")).tolist()
    greedy = np.load(os.path.join(folder, "ref_greedy.npy")).tolist()
    with torch.no_grad():
        hid = model.model(input_ids=torch.tensor([prompt]), use_cache=False).last_hidden_state[0]
        main = model.lm_head(hid).numpy()
        ref = np.load(os.path.join(folder, "ref_logits.npy"))
        assert np.abs(main - ref).max() <= 1e-4 * np.abs(ref).max(), "main model differs from its reference"
        nxt = prompt[1:] + [greedy[0]]
        hs, lg = run_mtp(model, mtp, hid, nxt)
        chain, chain_tok = [], []
        h_in, tok = hid, nxt
        for _ in range(2):  # positions 130, 131: the previous step's h' and argmax
            d = int(lg[-1].argmax())
            chain_tok.append(d)
            h_in = torch.cat([h_in, hs[-1:]], 0)
            tok = tok + [d]
            hs, lg = run_mtp(model, mtp, h_in, tok)
            chain.append(lg[-1].numpy())
        first = run_mtp(model, mtp, hid, nxt)[1].numpy()
    sd = {"mtp." + k: v.detach().to(torch.bfloat16).contiguous() for k, v in mtp.state_dict().items()}
    sd = tm.per_expert_state(sd, None)
    if fused:
        sd = tm.fused_state(sd)
    for f in [folder] + ([mm_folder] if mm_folder else []):
        path = os.path.join(f, "model.safetensors")
        old = {k: v for k, v in load_file(path).items() if not k.startswith("mtp.")}
        save_file(dict(sorted({**old, **sd}.items())), path, metadata={"format": "pt"})
        with open(os.path.join(f, "config.json")) as fh:
            c = json.load(fh)
        key = "num_nextn_predict_layers" if cls is transformers.Qwen3NextForCausalLM else "mtp_num_hidden_layers"
        (c["text_config"] if "text_config" in c else c)[key] = 1
        with open(os.path.join(f, "config.json"), "w") as fh:
            json.dump(c, fh, indent=2, sort_keys=True)
            fh.write("\n")
    if not refs:
        print(f"{os.path.basename(folder)}: {len(sd)} mtp tensors (no reference files)")
        return
    np.save(os.path.join(folder, "ref_mtp_logits.npy"), first.astype(np.float32))
    np.save(os.path.join(folder, "ref_mtp_chain.npy"), np.stack(chain).astype(np.float32))
    np.save(os.path.join(folder, "ref_mtp_chain_tokens.npy"), np.array(chain_tok, dtype=np.int32))
    print(f"{os.path.basename(folder)}: {len(sd)} mtp tensors, draft argmax {first[:8].argmax(-1).tolist()}..., "
          f"chain {chain_tok}, logit std {first.std():.3f}")


def main():
    out = tm.OUT
    next_cls = (transformers.Qwen3NextForCausalLM,
                transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextDecoderLayer,
                transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextRMSNorm)
    if sys.argv[1:] == ["qwen3_next_moe"]:
        add_mtp(os.path.join(out, "qwen3_next_moe"), *next_cls, 8200, fused=False, refs=False)
        return
    add_mtp(os.path.join(out, "qwen3_next"), transformers.Qwen3NextForCausalLM,
            transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextDecoderLayer,
            transformers.models.qwen3_next.modeling_qwen3_next.Qwen3NextRMSNorm, 8100, fused=False)
    add_mtp(os.path.join(out, "qwen3_5_moe_text"), transformers.Qwen3_5MoeForCausalLM,
            transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeDecoderLayer,
            transformers.models.qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeRMSNorm, 9100, fused=True,
            mm_folder=os.path.join(out, "qwen3_5_moe"))


if __name__ == "__main__":
    main()
