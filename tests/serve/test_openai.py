"""`ninfer serve` driven by the official openai client (PyPI): chat and completions, streaming and
not, stop strings, seeds, usage, logprobs, and each error status mapped to the client's exception
class. The model is random (tiny synth, byte tokenizer), so properties are checked, not texts:
streamed deltas join to the non-streamed text, a stop string cuts at its first occurrence in the
unstopped greedy text, a greedy logprob is the top alternative's, usage matches /tokenize."""
import json
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

NINFER, MODEL = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def raw(url, path, body=None, method=None, headers=None):
    req = urllib.request.Request(url + path, data=None if body is None else body.encode(), method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def chat_and_stream(c):
    msgs = [{"role": "user", "content": "hi"}]
    r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    check(r.object == "chat.completion" and r.choices[0].message.role == "assistant", "chat object and role")
    check(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12, "chat length and usage")
    rendered = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # ChatML: the model has no template
    _, tk = raw(c.base_url_str, "/tokenize", json.dumps({"content": rendered}))
    check(r.usage.prompt_tokens == len(json.loads(tk)["tokens"]), "prompt_tokens = /tokenize of the rendered ChatML")
    check(r.usage.total_tokens == r.usage.prompt_tokens + 12, "total_tokens")
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    r2 = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": parts}], max_tokens=12, temperature=0)
    check(r2.choices[0].message.content == text, "content parts join to the same prompt")
    chunks = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    check(chunks[0].choices[0].delta.role == "assistant", "first chunk carries the role")
    joined = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check(joined == text, "streamed deltas join to the non-streamed text")
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(finals == ["length"], "exactly one finish_reason chunk")
    check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12, "usage chunk last")
    check(all(ch.usage is None for ch in chunks[:-1]), "usage null before the last chunk")
    plain = list(c.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, temperature=0, stream=True))
    check(all(ch.usage is None for ch in plain), "no usage chunk unless asked")


def completions(c):
    r = c.completions.create(model="tiny", prompt=[10, 20, 30, 40, 50], max_tokens=16, temperature=0)
    check(r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 16, "completions usage for a token prompt")
    text = r.choices[0].text
    s = list(c.completions.create(model="tiny", prompt=[10, 20, 30, 40, 50], max_tokens=16, temperature=0, stream=True))
    check("".join(ch.choices[0].text for ch in s if ch.choices) == text, "completions stream joins to the text")
    r = c.completions.create(model="tiny", prompt="abc", max_tokens=4, temperature=0)
    check(r.usage.prompt_tokens == 3, "string prompt: 3 byte tokens")
    return text


def stops(c, text):
    # a stop string from the middle of the greedy text: the reply is cut at its first occurrence
    for k in range(3, len(text) - 2):
        stop = text[k:k + 2]
        cut = text.find(stop)
        if cut > 0:
            break
    else:
        check(False, "greedy text too short for a stop test: %r" % text)
        return
    r = c.completions.create(model="tiny", prompt=[10, 20, 30, 40, 50], max_tokens=16, temperature=0, stop=[stop, "\x00zz"])
    check(r.choices[0].text == text[:cut] and r.choices[0].finish_reason == "stop", "stop cuts at the first occurrence")
    s = list(c.completions.create(model="tiny", prompt=[10, 20, 30, 40, 50], max_tokens=16, temperature=0, stop=stop,
                                  stream=True))
    check("".join(ch.choices[0].text for ch in s if ch.choices) == text[:cut], "streamed stop: same cut")


def seeds(c):
    def one(seed):
        return c.completions.create(model="tiny", prompt=[1, 2, 3], max_tokens=24, temperature=1.0, seed=seed).choices[0].text
    a, b = one(42), one(42)
    check(a == b, "the same seed gives the same text")
    check(len({one(s) for s in (1, 2, 3, 4)}) > 1, "different seeds give different texts")


def logprobs(c):
    r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=6, temperature=0,
                                  logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    check(len(lp) == 6, "one logprob entry per token")
    for e in lp:
        check(e.logprob <= 0 and len(e.top_logprobs) == 3, "logprob <= 0, 3 alternatives")
        check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6, "greedy token is the top alternative")
        check(sum(2.718281828 ** t.logprob for t in e.top_logprobs) <= 1.0001, "alternatives' mass <= 1")
    r = c.completions.create(model="tiny", prompt=[5, 6], max_tokens=4, temperature=0, logprobs=2)
    l2 = r.choices[0].logprobs
    check(len(l2.token_logprobs) == 4 and all(len(t) <= 2 for t in l2.top_logprobs), "completions logprobs shape")


def errors(c, url):
    nr = c.with_options(max_retries=0)
    cases = [
        (openai.BadRequestError, dict(max_tokens=5000), "1024"),
        (openai.BadRequestError, dict(n=2), None),
        (openai.BadRequestError, dict(temperature=7), None),
        (openai.NotFoundError, dict(model="no-such-model"), None),
    ]
    for exc, kw, text in cases:
        args = dict(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2)
        args.update(kw)
        try:
            nr.chat.completions.create(**args)
            check(False, "%s: no error" % kw)
        except exc as e:
            check(text is None or text in str(e), "%s: message names %s: %s" % (kw, text, e))
        except Exception as e:  # noqa: BLE001
            check(False, "%s: %r instead of %s" % (kw, e, exc.__name__))
    try:
        nr.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 70000}], max_tokens=2)
        check(False, "413: no error")
    except openai.APIStatusError as e:
        check(e.status_code == 413, "over-limit body: 413, got %d" % e.status_code)
    st, body = raw(url, "/v1/chat/completions", method="GET")
    check(st == 405 and "error" in json.loads(body), "GET on a POST route: 405")
    st, _ = raw(url, "/v2/nothing")
    check(st == 404, "unknown route: 404")


def auth():
    with tempfile.NamedTemporaryFile("w", suffix=".key", delete=False) as f:
        f.write("s3cret-key\n")
    s = Server(NINFER, MODEL, "--api-key-file", f.name)
    try:
        good = openai.OpenAI(base_url=s.url + "/v1", api_key="s3cret-key", max_retries=0)
        check(len(good.models.list().data) == 1, "the right key lists the model")
        for key in ("wrong-key!", "s3cret-ke", "s3cret-key2"):
            try:
                openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0).models.list()
                check(False, "key %s accepted" % key)
            except openai.AuthenticationError:
                pass
        st, _ = raw(s.url, "/health")
        check(st == 200, "/health needs no key")
    finally:
        os.unlink(f.name)
        check(s.stop() == 0, "server with a key exits 0")


def busy():
    # no waiting room: while a long request runs in the one sequence slot, another gets 503 (the
    # client's InternalServerError)
    s = Server(NINFER, MODEL, "--queue", "0", "--parallel", "1")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0)
        seen = False
        for _ in range(20):
            wait_idle(s.url)
            long = c.completions.create(model="tiny", prompt=[1], max_tokens=1000, temperature=0, stream=True)
            next(iter(long))
            try:
                c.completions.create(model="tiny", prompt=[1], max_tokens=1)
            except openai.InternalServerError as e:
                seen = e.status_code == 503 and e.response.headers.get("retry-after") == "1"
            long.close()
            if seen:
                break
        check(seen, "503 with Retry-After when the queue is full")
    finally:
        check(s.stop() == 0, "busy server exits 0")


def wait_idle(url):
    for _ in range(200):
        if metric(url, "ninfer_requests_running") == 0 and metric(url, "ninfer_requests_waiting") == 0:
            return
        time.sleep(0.05)


def metric(url, name):
    _, t = raw(url, "/metrics")
    for line in t.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def disconnect_and_stop(c, url):
    # a client that leaves mid-stream: its request ends early and the next one is served
    before = metric(url, "ninfer_generation_tokens_total")
    sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    body = json.dumps({"prompt": [1], "max_tokens": 1000, "temperature": 0, "stream": True})
    sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    sock.recv(100)
    sock.close()
    r = c.completions.create(model="tiny", prompt=[2], max_tokens=3, temperature=0)
    check(r.usage.completion_tokens == 3, "served after a client vanished")
    wait_idle(url)
    check(metric(url, "ninfer_requests_running") == 0, "nothing running after the vanished client")
    check(metric(url, "ninfer_requests_cancelled_total") >= 1, "the vanished client's request was cancelled")
    print("tokens streamed to the vanished 1000-token request: %g" % (metric(url, "ninfer_generation_tokens_total") - before - 3))
    _, m = raw(url, "/metrics")
    for name in ("ninfer_requests_total{status=\"200\"}", "ninfer_time_to_first_token_seconds_bucket",
                 "ninfer_inter_token_latency_seconds_count", "ninfer_requests_waiting", "ninfer_kv_pages_free"):
        check(name in m, "metrics has " + name)
    st, tk = raw(url, "/tokenize", json.dumps({"content": "héllo"}))
    st2, dt = raw(url, "/detokenize", json.dumps({"tokens": json.loads(tk)["tokens"]}))
    check(st == 200 and st2 == 200 and json.loads(dt)["content"] == "héllo", "tokenize/detokenize round trip")
    st, page = raw(url, "/")
    check(st == 200 and "/v1/chat/completions" in page and "tokens/s" in page, "the chat page")


def graceful_stop():
    # SIGTERM mid-stream: the stream still ends with a finish chunk and [DONE]; exit status 0
    s = Server(NINFER, MODEL)
    sock = socket.create_connection(("127.0.0.1", s.port))
    body = json.dumps({"messages": [{"role": "user", "content": "go"}], "max_tokens": 900, "stream": True})
    sock.sendall(("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
    got = sock.recv(200)
    s.proc.terminate()
    sock.settimeout(30)
    while True:
        b = sock.recv(65536)
        if not b:
            break
        got += b
    sock.close()
    text = got.decode(errors="replace")
    check("data: [DONE]" in text and '"finish_reason":"' in text, "SIGTERM: the stream got its final chunk and [DONE]")
    check(s.proc.wait(timeout=60) == 0, "SIGTERM: exit status 0")


def utf8_chunks(url):
    # the byte tokenizer samples raw bytes, so characters span tokens: every SSE data line must be
    # valid UTF-8 by itself (a character is never split across chunks) and some must hold
    # multi-byte characters, or the check proves nothing
    # (which bytes a seed samples depends on the model's numerics: seeds are tried in turn until one
    # stream holds a multi-byte character; every stream's chunks are checked)
    multi = 0
    for seed in range(5, 13):
        body = json.dumps({"prompt": [195], "max_tokens": 400, "temperature": 1.0, "seed": seed, "stream": True})
        req = urllib.request.Request(url + "/v1/completions", data=body.encode(), headers={"Content-Type": "application/json"})
        raw_bytes = urllib.request.urlopen(req, timeout=60).read()
        for line in raw_bytes.split(b"\n"):
            if not line.startswith(b"data: {"):
                continue
            try:
                text = json.loads(line[6:].decode("utf-8", "strict"))["choices"][0]["text"]
            except UnicodeDecodeError:
                check(False, "an SSE chunk is not valid UTF-8: %r" % line[:120])
                return
            multi += any(ord(ch) > 127 and ch != "\ufffd" for ch in text)
        if multi:
            break
    print("chunks with a multi-byte character (not U+FFFD): %d" % multi)
    check(multi > 0, "some chunks carry multi-byte characters")


def keep_alive(url):
    # one connection carries a GET, a streamed completion (chunked) and a plain one in turn
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", int(url.rsplit(":", 1)[1]), timeout=30)
    socks = []
    for method, path, body in (("GET", "/health", None),
                               ("POST", "/v1/completions", {"prompt": [1], "max_tokens": 3, "stream": True}),
                               ("POST", "/v1/completions", {"prompt": [1], "max_tokens": 3}), ("GET", "/v1/models", None)):
        conn.request(method, path, body=json.dumps(body) if body else None, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        check(r.status == 200 and (r.getheader("Connection") or "").lower() != "close", "keep-alive: %s %s" % (method, path))
        if body and body.get("stream"):
            check(r.getheader("Transfer-Encoding") == "chunked" and data.endswith(b"data: [DONE]\n\n"), "SSE is chunked")
        socks.append(conn.sock)
    check(len(set(map(id, socks))) == 1, "one connection for all four requests")
    conn.close()


def pool_full(s, what):
    # after the requests end every page is back: none held, all allocatable (free or cached prefix)
    wait_idle(s.url)
    used, free = metric(s.url, "ninfer_kv_pages_used"), metric(s.url, "ninfer_kv_pages_free")
    check(used == 0 and free == s.kv_pages(), "%s: the page pool is full again (used %s, free %s of %d)" %
          (what, used, free, s.kv_pages()))


def concurrent_clients(what, max_tokens, *server_args):
    # 64 streaming clients at once: every request completes, each greedy text equals the same request
    # sent alone, the forwards carried several sequences (fewer steps than tokens: a one-at-a-time
    # worker needs a step per token), and the pool is full again afterwards
    import concurrent.futures
    s = Server(NINFER, MODEL, *server_args)
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        prompts = [[1 + i, 7, 3 + 2 * i, 40] for i in range(64)]

        def alone(p):
            return c.completions.create(model="tiny", prompt=p, max_tokens=max_tokens, temperature=0).choices[0].text

        together = threading.Barrier(64)  # the requests arrive within moments of each other

        def streamed(p):
            together.wait()
            st = c.completions.create(model="tiny", prompt=p, max_tokens=max_tokens, temperature=0, stream=True,
                                      stream_options={"include_usage": True})
            text, used = "", 0
            for ch in st:
                text += "".join(x.text for x in ch.choices)
                used = ch.usage.completion_tokens if ch.usage else used
            return text, used
        want = [alone(p) for p in prompts]
        steps0 = metric(s.url, "ninfer_scheduler_steps_total")
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            got = list(pool.map(streamed, prompts))
        steps = metric(s.url, "ninfer_scheduler_steps_total") - steps0
        tokens = sum(u for _, u in got)
        check([t for t, _ in got] == want, "%s: 64 concurrent greedy streams equal the requests sent alone" % what)
        batch = metric(s.url, "ninfer_batch_sequences_max")
        print("%s: %d tokens in %d steps, largest batch %d sequences, %d preemptions" %
              (what, tokens, steps, batch, metric(s.url, "ninfer_preemptions_total")))
        # a one-at-a-time worker takes a step per token (1281 for 1280) and a batch of 1; how much the
        # requests overlap beyond that depends on how fast the clients connect (a loaded CI machine
        # saw 718 steps), so the check is the strict one
        check(batch > 1 and steps < tokens, "%s: requests are batched (%d steps for %d tokens, largest batch %d)" %
              (what, steps, tokens, batch))
        pool_full(s, what)
        return s, metric(s.url, "ninfer_preemptions_total")
    finally:
        check(s.stop() == 0, "%s: server exits 0" % what)


def vanishing_clients():
    # streaming clients that leave after their first chunk, with requests that would run for ~30000
    # tokens: their sequences are cancelled and their pages return within moments, not at the end
    s = Server(NINFER, MODEL, "--ctx", "32768", "--parallel", "4")
    try:
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 30000, "temperature": 0, "ignore_eos": True, "stream": True})
        socks = []
        for _ in range(4):
            sock = socket.create_connection(("127.0.0.1", s.port))
            sock.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: %d\r\n\r\n%s" % (len(body), body)).encode())
            sock.recv(100)
            socks.append(sock)
        t0 = time.time()  # the headers come before the first step: wait until all four run
        while time.time() - t0 < 30 and metric(s.url, "ninfer_requests_running") < 4:
            time.sleep(0.02)
        check(metric(s.url, "ninfer_requests_running") == 4 and metric(s.url, "ninfer_kv_pages_used") > 0,
              "vanishing clients: their sequences run and hold pages")
        t0 = time.time()
        for sock in socks:
            sock.close()

        def gone():
            return (metric(s.url, "ninfer_requests_running") == 0 and metric(s.url, "ninfer_kv_pages_used") == 0 and
                    metric(s.url, "ninfer_requests_cancelled_total") == 4)
        while time.time() - t0 < 3 and not gone():
            time.sleep(0.02)
        print("vanishing clients: cancelled, pages back %.2f s after the clients left" % (time.time() - t0))
        check(gone(), "vanishing clients: 4 requests cancelled within 3 s, their pages back")
        pool_full(s, "vanishing clients")
    finally:
        check(s.stop() == 0, "vanishing clients: server exits 0")


def main():
    s = Server(NINFER, MODEL, "--max-body", "65536")
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused")
        c.base_url_str = s.url
        check([m.id for m in c.models.list().data] == ["tiny"], "/v1/models lists the model")
        chat_and_stream(c)
        text = completions(c)
        stops(c, text)
        seeds(c)
        logprobs(c)
        utf8_chunks(s.url)
        keep_alive(s.url)
        errors(c, s.url)
        disconnect_and_stop(c, s.url)
    finally:
        check(s.stop() == 0, "server exits 0 on SIGTERM")
    concurrent_clients("64 sequences at once", 20, "--parallel", "64")
    # a pool of 16 pages for 64 sequences of 164 tokens (3 pages each): admission waits for pages and
    # decode growth preempts; recomputed sequences must still equal their requests alone. Long enough
    # that the first admitted are still growing when the last clients connect, however fast the
    # forward is (with 84 tokens the int8 CPU kernels finished them first on an idle machine)
    _, preempted = concurrent_clients("scarce pages", 160, "--parallel", "64", "--kv-pages", "16")
    check(preempted > 0, "scarce pages: sequences were preempted (%s)" % preempted)
    vanishing_clients()
    auth()
    busy()
    graceful_stop()
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
