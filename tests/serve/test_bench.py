"""`ninfer bench serve` against `ninfer serve`: every request completes, and with ignore_eos every
request yields exactly --output-len tokens (from the usage chunks); with --prompt-file the prompts
are the file's lines, sent as text (quotes, backslashes, tabs and UTF-8 escaped into JSON), and the
total token rate counts the prompt tokens the server's usage reports; an empty file is refused."""
import os
import re
import subprocess
import sys
import tempfile
import json
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

NINFER, MODEL = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp()
prompts, empty = os.path.join(tmp, "prompts.txt"), os.path.join(tmp, "empty.txt")
with open(prompts, "w", encoding="utf-8") as f:
    f.write('say "hi"\n\nback\\slash\tand tab\r\ncaf\u00e9 \u4e2d\u6587\n')  # 3 prompts, an empty line skipped
with open(empty, "w") as f:
    f.write("\n\n")


def tokens(url, text):
    """The prompt's length as /v1/completions counts it (BOS as the tokenizer says)."""
    req = urllib.request.Request(url + "/tokenize", data=json.dumps({"content": text, "add_special": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["tokens"]


def bench(url, *extra):
    return subprocess.run([NINFER, "bench", "serve", "--url", url, "--model", "tiny", "-c", "4", "-n", "12",
                           "--output-len", "16", *extra], capture_output=True, text=True, timeout=300)


s = Server(NINFER, MODEL)
try:
    out = bench(s.url, "--input-len", "40", "--id-max", "500")
    pf = bench(s.url, "--prompt-file", prompts)
    tok = [tokens(s.url, p) for p in ['say "hi"', "back\\slash\tand tab", "caf\u00e9 \u4e2d\u6587"]]
finally:
    rc = s.stop()
bad = bench("http://127.0.0.1:9", "--prompt-file", empty)
print(out.stdout, out.stderr, pf.stdout, pf.stderr, bad.stderr)


def completed(o, n):
    m = re.search(r"completed (\d+), failed (\d+), duration ([\d.]+) s, output tokens (\d+)", o.stdout)
    return o.returncode == 0 and m and m.group(1) == str(n) and m.group(2) == "0" and m.group(4) == str(n * 16), m


ok, m = completed(out, 12)
ok = ok and rc == 0
for name in ("TTFT", "TPOT", "ITL", "E2EL"):
    ok = ok and re.search(r"^%s\s+ms\s+mean" % name, out.stdout, re.M) is not None
# the prompt file: requests cycle through its 3 lines; total = output + the prompts' tokenized lengths
okp, mp = completed(pf, 12)
ok = ok and okp and "prompts: the 3 lines of" in pf.stdout
tr = re.search(r"output ([\d.]+) tokens/s, total ([\d.]+) tokens/s", pf.stdout)
if ok and tr:  # total / output = (192 + prompt tokens) / 192, both rates over the same duration
    n_in = sum(len(tok[(4 + i) % 3]) for i in range(12))  # the 4 warm-up requests take indices 0..3
    got = 12 * 16 * (float(tr.group(2)) / float(tr.group(1)) - 1)
    ok = abs(got - n_in) <= 0.5
    print("prompt tokens in the total rate: %.2f, /tokenize says %d" % (got, n_in))
ok = ok and tr is not None and bad.returncode != 0 and "no prompts" in bad.stderr
print("ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
