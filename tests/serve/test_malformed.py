"""Thousands of malformed requests against `ninfer serve` over raw sockets: truncated and invalid
JSON, wrong types, huge numbers, invalid UTF-8, over-limit bodies (declared and chunked), broken
HTTP, slow partial requests, clients that vanish mid-request and mid-stream. Every answer must be a
4xx or a closed connection, a well-formed request must succeed between every few bad ones, and the
server must exit 0 on SIGTERM (under ASan: no leaks). Prints the count per kind."""
import concurrent.futures
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import Server  # noqa: E402

NINFER, MODEL = sys.argv[1], sys.argv[2]
ROUNDS = int(os.environ.get("NF_MALFORMED_ROUNDS", "1"))
rng = random.Random(1234)
counts = {}
bad = []

GOOD_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0.5,
             "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3, "stop": ["x", "yz"], "presence_penalty": 0.5,
             "frequency_penalty": 0.5, "repetition_penalty": 1.1, "logprobs": True, "top_logprobs": 2, "n": 1,
             "stream": False, "chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": False}
GOOD_COMP = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 2, "seed": 1, "stop": "q"}


def exchange(port, data, timeout=10.0):
    """Sends bytes, reads until the server closes; returns the status code, or 0 for a close."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        got = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
    except (ConnectionResetError, BrokenPipeError):
        got = b"" if not locals().get("got") else got
    finally:
        s.close()
    if not got.startswith(b"HTTP/1."):
        return 0
    return int(got.split(b" ", 2)[1])


def post(path, body, extra=b""):
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: application/json\r\n" +
            extra + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def expect_bad(srv, kind, data):
    st = exchange(srv.port, data)
    counts[kind] = counts.get(kind, 0) + 1
    if st == 505 and b" HTTP/9.9" in data[:40]:
        return  # libmicrohttpd's "HTTP Version Not Supported": the status HTTP prescribes there
    if not (st == 0 or 400 <= st < 500):
        bad.append((kind, st, data[:300]))


def expect_good(srv):
    body = json.dumps(GOOD_COMP if rng.random() < 0.5 else GOOD_CHAT)
    path = "/v1/completions" if '"prompt"' in body else "/v1/chat/completions"
    st = exchange(srv.port, post(path, body))
    counts["well-formed in between"] = counts.get("well-formed in between", 0) + 1
    if st != 200:
        bad.append(("well-formed", st, body))


def truncated():
    for src, path in ((GOOD_CHAT, "/v1/chat/completions"), (GOOD_COMP, "/v1/completions")):
        t = json.dumps(src)
        for cut in range(0, len(t) - 1):
            yield "truncated JSON", post(path, t[:cut])


def invalid_json():
    t = json.dumps(GOOD_CHAT)
    junk = ["{", "}", "[", "]", ",", ":", "\"", "\\", "nul", "tru", "0x10", "NaN", "'", "\x00", "//", "/*"]
    n = 0
    while n < 8000:
        at = rng.randrange(len(t))
        mut = t[:at] + rng.choice(junk) + t[at + rng.randrange(3):]
        try:
            json.loads(mut)
            continue  # still valid JSON: not this category
        except ValueError:
            n += 1
            yield "invalid JSON", post(rng.choice(["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]), mut)


WRONG = {
    "model": [1, [], {}, True], "messages": ["hi", 1, {}, [1], [{"role": 1, "content": "x"}], [{"role": "user", "content": 5}],
                                            [{"content": "x"}], [{"role": "user", "content": [{"type": "image"}]}], []],
    "max_tokens": ["3", 1.5, -1, 0, [], True], "max_completion_tokens": ["3", 0.5, {}], "temperature": ["1", [], -0.1, 2.5],
    "top_p": ["x", 1.5, -1], "top_k": ["x", 1.5, -2], "min_p": [2, "x"], "seed": ["1", 1.5, []], "stop": [1, [1], {}, ["a"] * 5],
    "presence_penalty": [3, "x"], "frequency_penalty": [-3, []], "repetition_penalty": [0, -1, "x"], "logprobs": ["yes", 1],
    "top_logprobs": [21, -1, "x", 1.5], "n": [2, 0, "1"], "stream": ["true", 1], "stream_options": ["x", 1],
    "chat_template_kwargs": [1, "x", {"enable_thinking": "yes"}], "ignore_eos": ["no", 0], "tools": [[{"type": "function"}]],
}


def wrong_types():
    for _ in range(3):
        for key, vals in WRONG.items():
            for v in vals:
                body = dict(GOOD_CHAT)
                body[key] = v
                if key == "top_logprobs":
                    body["logprobs"] = True
                yield "wrong types and values", post("/v1/chat/completions", json.dumps(body))
    for key, vals in (("prompt", [5, {}, [], [-1], [1.5], [9999999], ["a", "b"], [[1]], True, "", [""]]), ("logprobs", [6, -1, True]),
                      ("echo", [True]), ("stream_options", [{"include_usage": True}])):
        for v in vals:
            body = dict(GOOD_COMP)
            body[key] = v
            yield "wrong types and values", post("/v1/completions", json.dumps(body))
    for v in ("x", 1, [], {"content": 1}, {"tokens": "x"}, {"tokens": [-1]}, {"tokens": [1e12]}, {"tokens": [1.5]}):
        yield "wrong types and values", post("/tokenize", json.dumps(v))
        yield "wrong types and values", post("/detokenize", json.dumps(v))


def huge_numbers():
    nums = ["1e309", "-1e309", "1e300", "99999999999999999999999999", "-99999999999999999999", "1e-400", "4294967297",
            "9007199254740993", "18446744073709551616", "1" * 5000]
    for k in ("max_tokens", "temperature", "seed", "top_k", "top_logprobs", "top_p", "min_p", "presence_penalty", "n",
              "repetition_penalty", "max_completion_tokens"):
        for n in nums:
            if (n == "1e-400" and k not in ("max_tokens", "max_completion_tokens", "n", "repetition_penalty")) or \
               (n == "4294967297" and k == "seed"):
                continue  # a valid value after all (0, or a seed that fits)
            d = dict(GOOD_CHAT)
            d.pop(k, None)
            body = json.dumps(d)[:-1] + ', "%s": %s}' % (k, n)
            yield "huge numbers", post("/v1/chat/completions", body)
    for n in nums:
        if n == "1e-400":
            continue  # token id 0
        yield "huge numbers", post("/v1/completions", '{"prompt": [%s], "max_tokens": 2}' % n)


def invalid_utf8():
    seqs = [b"\xff", b"\xc3\x28", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80", b"\xfe\xfe"]
    for s in seqs:
        for where in range(4):
            chat = json.dumps(GOOD_CHAT).encode()
            at = {0: chat.index(b'"hi"') + 2, 1: chat.index(b'"x"') + 2, 2: chat.index(b'"tiny"') + 3, 3: 1}[where]
            body = chat[:at] + s + chat[at:]
            yield "invalid UTF-8", post("/v1/chat/completions", body)
            yield "invalid UTF-8", post("/tokenize", b'{"content": "a' + s + b'"}')
            yield "invalid UTF-8", post("/v1/completions", b'{"prompt": "' + s + b'", "max_tokens": 2}')


def over_limit():
    big = json.dumps({"messages": [{"role": "user", "content": "x" * 70000}]})
    for _ in range(20):
        yield "over-limit bodies", post("/v1/chat/completions", big)
        # declared too big, nothing sent: answered from the headers alone
        yield "over-limit bodies", (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                    b"Content-Length: 999999999\r\n\r\n")
        # chunked, no length: refused once the limit is passed
        chunk = b"x" * 8192
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(10)) + b"0\r\n\r\n"
        yield "over-limit bodies", (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                    b"Transfer-Encoding: chunked\r\n\r\n" + body)
        # chunked and far over: the server stops reading and closes
        endless = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(40)) + b"0\r\n\r\n"
        yield "over-limit bodies", (b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
                                    b"Transfer-Encoding: chunked\r\n\r\n" + endless)


def broken_http():
    lines = [b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\x00\x01\x02\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n\r\n",
             b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n",
             b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
             b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", b"GET / HTTP/1.1\r\nHost: t\r\nX: " + b"b" * 40000 + b"\r\n\r\n",
             b"DELETE /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
             b"PUT /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
             b"GET /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
             b"GET /../../etc/passwd HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
             b"GET /%ff%fe HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"]
    for _ in range(10):
        for line in lines:
            yield "broken HTTP", line
    for _ in range(1000):
        yield "broken HTTP", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))) + b"\r\n\r\n"


def slow_partial(srv, n):
    """n clients that send part of a request and stall: each must be closed by the timeout."""
    results = []

    def one(i):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        part = post("/v1/completions", json.dumps(GOOD_COMP))
        s.sendall(part[:rng.randrange(5, len(part) - 1)])
        t0 = time.time()
        try:
            got = s.recv(100)
        except OSError:
            got = b""
        results.append((got, time.time() - t0))
        s.close()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for got, dt in results:
        counts["slow partial requests"] = counts.get("slow partial requests", 0) + 1
        if got and not (got.startswith(b"HTTP/1.1 4")):
            bad.append(("slow partial", got, dt))
        if dt > 20:
            bad.append(("slow partial not closed by the timeout", dt, b""))


def vanishing(srv, n):
    """Clients that close mid-body or mid-stream."""
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        if i % 2:
            body = json.dumps({"prompt": [1], "max_tokens": 500, "stream": True})
            s.sendall(post("/v1/completions", body))
            try:
                s.recv(rng.randrange(1, 2000))
            except OSError:
                pass
        else:
            s.sendall(post("/v1/chat/completions", json.dumps(GOOD_CHAT))[:-rng.randrange(1, 20)])
        s.close()
        counts["vanishing clients"] = counts.get("vanishing clients", 0) + 1
        if i % 10 == 0:
            expect_good(srv)


def main():
    srv = Server(NINFER, MODEL, "--max-body", "65536", "--timeout", "2", "--max-conns", "64")
    t0 = time.time()
    try:
        for _ in range(ROUNDS):
            gens = [truncated(), invalid_json(), wrong_types(), huge_numbers(), invalid_utf8(), over_limit()]
            i = 0
            for g in gens:
                for kind, data in g:
                    expect_bad(srv, kind, data)
                    i += 1
                    if i % 25 == 0:
                        expect_good(srv)
            # broken HTTP may wait for the connection timeout: many at once, with well-formed ones among them
            with concurrent.futures.ThreadPoolExecutor(32) as pool:
                futs = [pool.submit(expect_bad, srv, kind, data) for kind, data in broken_http()]
                futs += [pool.submit(expect_good, srv) for _ in range(40)]
                for f in futs:
                    f.result()
            vanishing(srv, 200)
            slow_partial(srv, 20)
            expect_good(srv)
    finally:
        rc = srv.stop()
    total = sum(v for k, v in counts.items() if k != "well-formed in between")
    for k, v in sorted(counts.items()):
        print("%-28s %6d" % (k, v))
    print("malformed total %d in %.1f s; well-formed in between %d; problems %d; server exit %d" %
          (total, time.time() - t0, counts.get("well-formed in between", 0), len(bad), rc))
    for b in bad[:20]:
        print("PROBLEM:", b)
    return 0 if not bad and rc == 0 and total >= 10000 else 1


if __name__ == "__main__":
    sys.exit(main())
