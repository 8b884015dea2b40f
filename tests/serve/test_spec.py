"""`ninfer serve --spec ngram:3` against `ninfer serve` without it, over the tiny random model: the same
greedy requests, sent four at a time so that verifications share forwards with other requests, give
the same text and token counts from both servers; the speculating server's /metrics counts drafts,
some accepted (its prompts repeat, and so does a random model's greedy text) and some rejected, and
the plain one none; `ninfer bench serve` reports drafts accepted per verification from those
counters for the speculating server only. A --spec the server cannot parse is refused at the command line."""
import json
import os
import re
import subprocess
import sys
import threading
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

NINFER, MODEL = sys.argv[1], sys.argv[2]
PROMPTS = ["abcab" * 6, "the cat sat on the mat, the cat sat on the", "0123456789" * 3, "hello world",
           "xyzzy xyzzy xyzzy", "a b c d e f g h", "one two one two one", "!?!?!?!?"]


def complete(url, prompt):
    body = {"model": os.path.basename(MODEL)[:-3], "prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        out = json.loads(r.read())
    return out["choices"][0]["text"], out["usage"]["completion_tokens"]


def run_all(url):
    res = [None] * len(PROMPTS)

    def one(i):
        res[i] = complete(url, PROMPTS[i])

    for first in range(0, len(PROMPTS), 4):
        ts = [threading.Thread(target=one, args=(i,)) for i in range(first, min(first + 4, len(PROMPTS)))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    return res


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        m = re.search(r"^%s (\d+)$" % name, r.read().decode(), re.M)
    return int(m.group(1)) if m else -1


def served(*extra):
    s = Server(NINFER, MODEL, "--parallel", "4", *extra)
    try:
        res = run_all(s.url)
        counts = [metric(s.url, "ninfer_spec_" + n + "_total") for n in ("verifications", "drafts", "accepted")]
        bench = subprocess.run([NINFER, "bench", "serve", "--url", s.url, "--model", os.path.basename(MODEL)[:-3], "-c",
                                "4", "-n", "8", "--input-len", "30", "--id-max", "64", "--output-len", "32"],
                               capture_output=True, text=True, timeout=300)
    finally:
        rc = s.stop()
    return res, counts, rc, bench.stdout


plain, plain_counts, rc0, bench0 = served()
spec, spec_counts, rc1, bench1 = served("--spec", "ngram:3")
print(bench1)
bad = subprocess.run([NINFER, "serve", "-m", MODEL, "--spec", "ngram:0"], capture_output=True, text=True, timeout=60)
print("without:", plain_counts, "with --spec ngram:3 (verifications, drafts, accepted):", spec_counts)
ok = rc0 == 0 and rc1 == 0 and plain_counts == [0, 0, 0]
for i, (a, b) in enumerate(zip(plain, spec)):
    if a != b:
        print("prompt %d differs:\n  without: %r\n  with:    %r" % (i, a, b))
        ok = False
ok = ok and spec_counts[1] > spec_counts[2] > 0
# bench serve reports the speculating server's acceptance, and nothing for the plain one
ok = ok and "accepted per verification" in bench1 and "speculation" not in bench0
ok = ok and bad.returncode == 2 and "ngram:K" in bad.stderr
print("ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
