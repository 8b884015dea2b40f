#!/usr/bin/env python3
"""Writes the fuzz_tokenizer_json seeds into tests/fuzz/seeds/tokenizer_json/ (committed; rerun only
to change them). A seed is tokenizer.json, then a NUL byte and tokenizer_config.json when there is
one (the input format of tests/fuzz/fuzz_tokenizer_json.c). Each is cut from the real Qwen3 files in
tests/fixtures/tokenizer/qwen3 down to a few hundred tokens, with the chat templates of
tests/fixtures/tokenizer/chat_cases.json, so every family nf_chat_detect knows is seeded."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "fixtures", "tokenizer")
OUT = os.path.join(HERE, "seeds", "tokenizer_json")


def small_qwen3(n_vocab, pair_merges):
    t = json.load(open(os.path.join(FIX, "qwen3", "tokenizer.json"), encoding="utf-8"))
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < n_vocab}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m.split(" ") if isinstance(m, str) else m
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b] if pair_merges else a + " " + b)
    added = []
    for i, a in enumerate(t["added_tokens"][:5]):
        a = dict(a, id=n_vocab + i)
        added.append(a)
    t["model"]["vocab"], t["model"]["merges"], t["added_tokens"] = vocab, merges, added
    t["post_processor"] = None
    return t, added


def write(name, tok, cfg=None):
    data = json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode()
    if cfg is not None:
        data += b"\0" + json.dumps(cfg, ensure_ascii=False).encode()
    assert len(data) <= 131072, (name, len(data))
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    templates = json.load(open(os.path.join(FIX, "chat_cases.json"), encoding="utf-8"))["templates"]
    tok, added = small_qwen3(400, pair_merges=False)
    write("qwen3_notemplate", tok)
    for name, text in sorted(templates.items()):
        cfg = {"bos_token": None, "eos_token": added[0]["content"], "pad_token": {"content": added[0]["content"]},
               "add_bos_token": False, "chat_template": text}
        write("qwen3_" + name, tok, cfg)
    # the other dialects: [left, right] merges, ByteLevel with its own regex, no normalizer, Digits, a
    # template list, add_bos_token with a bos
    tok, added = small_qwen3(300, pair_merges=True)
    tok["normalizer"] = None
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}]}
    cfg = {"bos_token": added[1]["content"], "eos_token": added[2]["content"], "add_bos_token": True,
           "add_eos_token": True,
           "chat_template": [{"name": "tool_use", "template": "x"},
                             {"name": "default", "template": next(iter(sorted(templates.values())))}]}
    write("gpt2_pairs", tok, cfg)


if __name__ == "__main__":
    main()
