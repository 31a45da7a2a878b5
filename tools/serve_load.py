"""Load, fuzz and memory check of `specwire serve`: a server that degrades, never breaks.

Starts `specwire serve` (built-in target and shipped draft unless --serve-args say otherwise) with
`--max-queue 8` on a free loopback port, or checks a server already running (--url, with --pid for
the memory check), and runs three phases over real HTTP:

  burst    --clients clients at once, each asking for --tokens tokens (half of them streamed): every
           one must get a complete answer or a 429 with a Retry-After header; then the refused ones
           retry after the time the server named, until all have an answer;
  fuzz     every body of MALFORMED (deep nesting, unpaired surrogates, invalid UTF-8, wrong types,
           huge numbers, non-object JSON, empty bodies, wrong content types, ...) to its endpoint: each
           must get its expected 4xx with an OpenAI error body within --fuzz-timeout seconds;
  memory   --rss-requests requests in turn (completions, chat, streams, dropped streams, malformed
           bodies), the server's resident memory read from /proc every 50: it must stay within 10%
           of its value after the first 50.

Prints a report (or --json) and exits 1 when a check fails.

    python tools/serve_load.py                                      # the built-in target
    python tools/serve_load.py --serve-args "--target DIR --no-draft" --rss-requests 200
    python tools/serve_load.py --url http://127.0.0.1:8000 --pid 1234   # a server already running
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
JSON = "application/json"


def _deep(n: int, open_: str, close: str, inner: str = "1") -> bytes:
    return (open_ * n + inner + close * n).encode()


def _j(obj) -> bytes:
    return json.dumps(obj).encode()


# (name, path, body, content type, expected status). Every one is malformed or refused by design.
MALFORMED: list[tuple[str, str, bytes, str, int]] = [
    ("empty body", CMPL, b"", JSON, 400),
    ("whitespace body", CHAT, b" \n\t ", JSON, 400),
    ("json null", CMPL, b"null", JSON, 400),
    ("json array", CMPL, b"[]", JSON, 400),
    ("json list of ints", CHAT, b"[1, 2, 3]", JSON, 400),
    ("json string", CMPL, b'"hello"', JSON, 400),
    ("json number", CHAT, b"42", JSON, 400),
    ("json true", CMPL, b"true", JSON, 400),
    ("unterminated object", CMPL, b'{"prompt": "hi"', JSON, 400),
    ("trailing comma", CMPL, b'{"prompt": "hi",}', JSON, 400),
    ("single quotes", CHAT, b"{'messages': []}", JSON, 400),
    ("comment in json", CMPL, b'{"prompt": "hi" /* c */}', JSON, 400),
    ("bad escape", CMPL, b'{"prompt": "\\x41"}', JSON, 400),
    ("nested arrays 100k deep", CMPL, _deep(100_000, "[", "]"), JSON, 400),
    ("nested objects 50k deep", CHAT, _deep(50_000, '{"a":', "}"), JSON, 400),
    ("prompt nested 100 deep", CMPL, b'{"prompt": ' + _deep(100, "[", "]") + b"}", JSON, 400),
    ("unpaired high surrogate in prompt", CMPL, b'{"prompt": "abc \\ud800 def"}', JSON, 400),
    ("unpaired low surrogate in chat", CHAT, b'{"messages": [{"role": "user", "content": "\\udc00"}]}', JSON, 400),
    ("surrogate in a key", CMPL, b'{"prompt": "hi", "\\ud83d": 1}', JSON, 400),
    ("surrogate in stop", CMPL, b'{"prompt": "hi", "stop": ["\\udfff"]}', JSON, 400),
    ("invalid utf-8 bytes", CMPL, b'{"prompt": "\xff\xfe\xfd"}', JSON, 400),
    ("truncated utf-8 sequence", CHAT, b'{"messages": [{"role": "user", "content": "\xe2\x82"}]}', JSON, 400),
    ("overlong utf-8", CMPL, b'{"prompt": "\xc0\xaf"}', JSON, 400),
    ("utf-16 body", CMPL, '{"prompt": "hi"}'.encode("utf-16"), JSON, 400),
    ("nul bytes", CMPL, b"\x00\x00\x00\x00", JSON, 400),
    ("NaN max_tokens", CMPL, b'{"prompt": "hi", "max_tokens": NaN}', JSON, 400),
    ("Infinity temperature", CMPL, b'{"prompt": "hi", "temperature": Infinity}', JSON, 400),
    ("5000-digit max_tokens", CMPL, b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", JSON, 400),
    ("max_tokens 1e100 (int)", CMPL, _j({"prompt": "hi", "max_tokens": 10 ** 100}), JSON, 400),
    ("temperature 1e400", CMPL, b'{"prompt": "hi", "temperature": 1e400}', JSON, 400),
    ("temperature 10**400 (int)", CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1'
     + b"0" * 400 + b"}", JSON, 400),
    ("temperature 1e-320", CMPL, _j({"prompt": "hi", "temperature": 1e-320}), JSON, 400),
    ("negative max_tokens", CMPL, _j({"prompt": "hi", "max_tokens": -5}), JSON, 400),
    ("zero max_tokens", CMPL, _j({"prompt": "hi", "max_tokens": 0}), JSON, 400),
    ("negative max_completion_tokens", CHAT, _j({"messages": [{"role": "user", "content": "hi"}],
                                                 "max_completion_tokens": -1}), JSON, 400),
    ("string max_tokens", CMPL, _j({"prompt": "hi", "max_tokens": "16"}), JSON, 400),
    ("bool max_tokens", CMPL, _j({"prompt": "hi", "max_tokens": True}), JSON, 400),
    ("float max_tokens", CMPL, _j({"prompt": "hi", "max_tokens": 1.5}), JSON, 400),
    ("negative temperature", CMPL, _j({"prompt": "hi", "temperature": -1}), JSON, 400),
    ("top_p 0", CMPL, _j({"prompt": "hi", "top_p": 0}), JSON, 400),
    ("top_p string", CHAT, _j({"messages": [{"role": "user", "content": "hi"}], "top_p": "x"}), JSON, 400),
    ("negative top_k", CMPL, _j({"prompt": "hi", "top_k": -1}), JSON, 400),
    ("float top_k", CMPL, _j({"prompt": "hi", "top_k": 1.5}), JSON, 400),
    ("seed 1e30", CMPL, _j({"prompt": "hi", "seed": 10 ** 30}), JSON, 400),
    ("string seed", CMPL, _j({"prompt": "hi", "seed": "abc"}), JSON, 400),
    ("prompt number", CMPL, _j({"prompt": 5}), JSON, 400),
    ("prompt null", CMPL, _j({"prompt": None}), JSON, 400),
    ("prompt empty list", CMPL, _j({"prompt": []}), JSON, 400),
    ("prompt negative id", CMPL, _j({"prompt": [-1]}), JSON, 400),
    ("prompt id 1e30", CMPL, _j({"prompt": [10 ** 30]}), JSON, 400),
    ("prompt mixed list", CMPL, _j({"prompt": ["a", 1]}), JSON, 400),
    ("prompt list of lists", CMPL, _j({"prompt": [[1, 2]]}), JSON, 400),
    ("prompt past the context", CMPL, _j({"prompt": "word " * 40_000}), JSON, 400),
    ("stream string", CMPL, _j({"prompt": "hi", "stream": "yes"}), JSON, 400),
    ("stream_options string", CMPL, _j({"prompt": "hi", "stream": True, "stream_options": "x"}), JSON, 400),
    ("stop number", CMPL, _j({"prompt": "hi", "stop": 5}), JSON, 400),
    ("five stop strings", CMPL, _j({"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}), JSON, 400),
    ("empty stop string", CMPL, _j({"prompt": "hi", "stop": [""]}), JSON, 400),
    ("user object", CMPL, _j({"prompt": "hi", "user": {"id": 1}}), JSON, 400),
    ("messages string", CHAT, _j({"messages": "hi"}), JSON, 400),
    ("messages empty", CHAT, _j({"messages": []}), JSON, 400),
    ("messages missing", CHAT, _j({"max_tokens": 4}), JSON, 400),
    ("message not an object", CHAT, _j({"messages": [5]}), JSON, 400),
    ("unknown role", CHAT, _j({"messages": [{"role": "robot", "content": "hi"}]}), JSON, 400),
    ("content number", CHAT, _j({"messages": [{"role": "user", "content": 5}]}), JSON, 400),
    ("image content part", CHAT, _j({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}), JSON, 400),
    ("prompt sent to chat", CHAT, _j({"prompt": "hi"}), JSON, 400),
    ("messages sent to completions", CMPL, _j({"messages": [{"role": "user", "content": "hi"}]}), JSON, 400),
    ("unsupported logit_bias", CMPL, _j({"prompt": "hi", "logit_bias": {"1": 5}}), JSON, 400),
    ("n = 2", CHAT, _j({"messages": [{"role": "user", "content": "hi"}], "n": 2}), JSON, 400),
    ("unknown model", CMPL, _j({"prompt": "hi", "model": "gpt-4"}), JSON, 404),
    ("text/plain garbage", CMPL, b"hello there", "text/plain", 400),
    ("form-encoded", CMPL, b"prompt=hi&max_tokens=5", "application/x-www-form-urlencoded", 400),
    ("multipart", CHAT, b"--xx\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n--xx--\r\n",
     "multipart/form-data; boundary=xx", 400),
    ("9 MB body", CMPL, b'{"prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}', JSON, 413),
]


# ---- HTTP with the standard library (no client dependencies) ------------------------------------------------

@dataclass
class Reply:
    status: int  # 0: no answer (connection error or timeout)
    headers: dict
    body: bytes
    seconds: float
    error: str = ""

    def json(self):
        return json.loads(self.body)


def request(base: str, method: str, path: str, body: bytes | None = None, *, content_type: str = JSON,
            timeout: float = 120.0) -> Reply:
    u = urlsplit(base)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        headers = {"Content-Type": content_type} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, data, time.perf_counter() - t0)
    except (OSError, http.client.HTTPException) as e:
        return Reply(0, {}, b"", time.perf_counter() - t0, f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def stream_request(base: str, path: str, obj: dict, *, timeout: float = 120.0, drop_after: int | None = None,
                   on_event=None) -> Reply:
    """POST with stream=true; reads the events (or only `drop_after` of them, then hangs up). Body: the events
    as a JSON list of strings. on_event(n) is called after the n-th event."""
    u = urlsplit(base)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request("POST", path, body=_j({**obj, "stream": True}), headers={"Content-Type": JSON})
        r = conn.getresponse()
        headers = {k.lower(): v for k, v in r.getheaders()}
        if r.status != 200:
            return Reply(r.status, headers, r.read(), time.perf_counter() - t0)
        events = []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if line.startswith(b"data: "):
                events.append(line[6:].decode())
                if on_event is not None:
                    on_event(len(events))
                if events[-1] == "[DONE]" or (drop_after is not None and len(events) >= drop_after):
                    break
        return Reply(200, headers, json.dumps(events).encode(), time.perf_counter() - t0)
    except (OSError, http.client.HTTPException) as e:
        return Reply(0, {}, b"", time.perf_counter() - t0, f"{type(e).__name__}: {e}")
    finally:
        conn.close()  # for a dropped stream: the hang-up


def complete(reply: Reply, streamed: bool) -> bool:
    """A complete answer: 200 with a finish_reason (streams: a finish chunk, then [DONE])."""
    if reply.status != 200:
        return False
    try:
        if not streamed:
            return reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
        events = reply.json()
        if events[-1:] != ["[DONE]"]:
            return False
        chunks = [json.loads(e) for e in events[:-1]]
        return any(c.get("choices") and c["choices"][0].get("finish_reason") for c in chunks) and \
            not any("error" in c for c in chunks)
    except (ValueError, KeyError, IndexError, TypeError):
        return False


def retry_after(reply: Reply) -> int | None:
    v = reply.headers.get("retry-after", "")
    return int(v) if v.isdigit() else None


# ---- the phases --------------------------------------------------------------------------------------------

@dataclass
class Burst:
    clients: int
    tokens: int
    complete_first: int = 0  # complete answers at the first attempt
    refused_429: int = 0  # 429 with a valid Retry-After at the first attempt
    other_first: list = field(default_factory=list)  # anything else at the first attempt: a failure
    complete_eventually: int = 0  # after retrying the refused ones as Retry-After says
    retries: int = 0
    retry_after_s: list = field(default_factory=list)  # the distinct Retry-After values seen
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.other_first and self.complete_first + self.refused_429 == self.clients \
            and self.complete_eventually == self.clients


def burst(base: str, *, clients: int = 32, tokens: int = 64, max_retries: int = 200) -> Burst:
    """`clients` at once (a barrier releases them together); half stream. Refused ones retry as told."""
    res = Burst(clients, tokens)
    lock = threading.Lock()
    gate = threading.Barrier(clients)
    t0 = time.perf_counter()

    def client(i: int) -> None:
        streamed = i % 2 == 1
        obj = {"prompt": f"Tell me a short story about the number {i}.", "max_tokens": tokens, "temperature": 0}
        gate.wait()
        for attempt in range(max_retries + 1):
            r = stream_request(base, CMPL, obj) if streamed else request(base, "POST", CMPL, _j(obj))
            ok, wait = complete(r, streamed), retry_after(r)
            with lock:
                if attempt == 0:
                    if ok:
                        res.complete_first += 1
                    elif r.status == 429 and wait is not None and wait >= 1:
                        res.refused_429 += 1
                    else:
                        res.other_first.append((i, r.status, r.error or r.body[:200].decode("utf-8", "replace")))
                if r.status == 429 and wait is not None:
                    res.retries += 1
                    if wait not in res.retry_after_s:
                        res.retry_after_s.append(wait)
                if ok:
                    res.complete_eventually += 1
            if ok or r.status != 429 or wait is None:
                return
            time.sleep(wait)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res.seconds = time.perf_counter() - t0
    res.retry_after_s.sort()
    return res


@dataclass
class Fuzz:
    bodies: int = 0
    as_expected: int = 0
    server_errors: list = field(default_factory=list)  # 5xx: a failure
    no_answer: list = field(default_factory=list)  # timeouts / connection errors: a failure (a hang)
    unexpected: list = field(default_factory=list)  # another status, or a body that is not an OpenAI error
    slowest_s: float = 0.0
    healthy_after: bool = False

    @property
    def ok(self) -> bool:
        return not (self.server_errors or self.no_answer or self.unexpected) and self.healthy_after


def fuzz(base: str, *, timeout: float = 30.0, bodies=None) -> Fuzz:
    res = Fuzz()
    for name, path, body, ctype, expected in bodies or MALFORMED:
        r = request(base, "POST", path, body, content_type=ctype, timeout=timeout)
        res.bodies += 1
        res.slowest_s = max(res.slowest_s, r.seconds)
        if r.status == 0:
            res.no_answer.append((name, r.error))
        elif r.status >= 500:
            res.server_errors.append((name, r.status, r.body[:200].decode("utf-8", "replace")))
        else:
            try:
                err = r.json()["error"]
                shaped = isinstance(err["message"], str) and err["message"] and "type" in err and "param" in err
            except (ValueError, KeyError, TypeError):
                shaped = False
            if r.status == expected and shaped:
                res.as_expected += 1
            else:
                res.unexpected.append((name, r.status, r.body[:200].decode("utf-8", "replace")))
    res.healthy_after = request(base, "GET", "/health").status == 200
    return res


def rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclass
class Memory:
    requests: int
    samples_kb: list = field(default_factory=list)  # (requests done, RSS kB), every 50
    failures: list = field(default_factory=list)  # requests that did not get their expected answer
    seconds: float = 0.0

    @property
    def spread(self) -> float | None:
        """Largest relative distance from the first sample (taken after 50 requests)."""
        if len(self.samples_kb) < 2:
            return None
        base = self.samples_kb[0][1]
        return max(abs(kb - base) / base for _, kb in self.samples_kb)

    @property
    def ok(self) -> bool:
        return not self.failures and self.spread is not None and self.spread <= 0.10


def memory(base: str, pid: int, *, requests: int = 500, tokens: int = 8) -> Memory:
    """`requests` in turn, cycling through every kind of request; RSS of `pid` every 50 requests."""
    res = Memory(requests)
    t0 = time.perf_counter()
    malformed = [m for m in MALFORMED if len(m[2]) < 100_000]
    for k in range(requests):
        kind = k % 5
        prompt = f"Count to {k % 17} and say why."
        if kind == 0:
            r = request(base, "POST", CMPL, _j({"prompt": prompt, "max_tokens": tokens}))
            ok = complete(r, False)
        elif kind == 1:
            r = request(base, "POST", CHAT, _j({"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens}))
            ok = complete(r, False)
        elif kind == 2:
            r = stream_request(base, CHAT, {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens})
            ok = complete(r, True)
        elif kind == 3:
            r = stream_request(base, CMPL, {"prompt": prompt, "max_tokens": 4 * tokens}, drop_after=2)
            ok = r.status == 200  # hung up after two events
        else:
            name, path, body, ctype, expected = malformed[(k // 5) % len(malformed)]
            r = request(base, "POST", path, body, content_type=ctype)
            ok = r.status == expected
        if not ok:
            res.failures.append((k, kind, r.status, r.error or r.body[:120].decode("utf-8", "replace")))
        if (k + 1) % 50 == 0:
            res.samples_kb.append((k + 1, rss_kb(pid)))
    res.seconds = time.perf_counter() - t0
    return res


# ---- running a server --------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, proc: subprocess.Popen | None = None, timeout: float = 600.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode} before answering /health")
        if request(base, "GET", "/health", timeout=2.0).status == 200:
            return
        time.sleep(0.25)
    raise RuntimeError(f"no answer from {base}/health after {timeout:.0f} s")


def start_server(serve_args: list[str], *, port: int | None = None, env: dict | None = None,
                 log=subprocess.DEVNULL) -> tuple[subprocess.Popen, str]:
    """`python -m specwire serve ARGS --port P` (its PID is the server's); returns (process, base url)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "specwire", "serve", *serve_args, "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env={**os.environ, **(env or {})})
    return proc, f"http://127.0.0.1:{port}"


def stop_server(proc: subprocess.Popen, timeout: float = 60.0) -> int:
    """SIGTERM, then the exit status (the server drains and exits 0)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def run_all(base: str, pid: int | None, *, clients: int, tokens: int, rss_requests: int,
            fuzz_timeout: float) -> dict:
    request(base, "POST", CMPL, _j({"prompt": "warm up", "max_tokens": tokens}))  # first-call costs out of the way
    b = burst(base, clients=clients, tokens=tokens)
    f = fuzz(base, timeout=fuzz_timeout)
    m = memory(base, pid, requests=rss_requests) if pid and rss_requests else None
    metrics = request(base, "GET", "/metrics").body.decode()
    out = {"burst": {**asdict(b), "ok": b.ok}, "fuzz": {**asdict(f), "ok": f.ok},
           "memory": {**asdict(m), "spread": m.spread, "ok": m.ok} if m else None,
           "metrics": [line for line in metrics.splitlines() if line.startswith(
               ("specwire_rejected", "specwire_request_errors", "specwire_requests_total", "specwire_queue"))]}
    out["ok"] = b.ok and f.ok and (m is None or m.ok)
    return out


def render(rep: dict) -> str:
    b, f, m = rep["burst"], rep["fuzz"], rep["memory"]
    lines = [
        f"burst: {b['clients']} clients x {b['tokens']} tokens at once: {b['complete_first']} complete, "
        f"{b['refused_429']} refused with 429 + Retry-After, {len(b['other_first'])} other; after retrying as told "
        f"({b['retries']} retries, Retry-After {b['retry_after_s']} s): {b['complete_eventually']}/{b['clients']} "
        f"complete, {b['seconds']:.1f} s  [{'ok' if b['ok'] else 'FAIL'}]",
        f"fuzz: {f['bodies']} malformed bodies: {f['as_expected']} got their expected 4xx with an OpenAI error body, "
        f"{len(f['server_errors'])} 5xx, {len(f['no_answer'])} without an answer, {len(f['unexpected'])} unexpected; "
        f"slowest {f['slowest_s']:.2f} s; healthy after: {f['healthy_after']}  [{'ok' if f['ok'] else 'FAIL'}]",
    ]
    if m:
        kb = [s[1] for s in m["samples_kb"]]
        lines.append(f"memory: {m['requests']} requests in {m['seconds']:.0f} s, RSS every 50: "
                     f"{', '.join(f'{x / 1024:.0f}' for x in kb)} MiB; largest change from the first sample "
                     f"{100 * m['spread']:.1f}% (limit 10%); {len(m['failures'])} failed  "
                     f"[{'ok' if m['ok'] else 'FAIL'}]")
    for name in ("other_first",):
        for x in b[name][:5]:
            lines.append(f"  burst failure: {x}")
    for name in ("server_errors", "no_answer", "unexpected"):
        for x in f[name][:10]:
            lines.append(f"  fuzz {name}: {x}")
    if m:
        for x in m["failures"][:10]:
            lines.append(f"  memory failure: {x}")
    lines += ["server metrics after the run:"] + ["  " + x for x in rep["metrics"]]
    lines.append("ALL OK" if rep["ok"] else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start `specwire serve` here)")
    ap.add_argument("--pid", type=int, default=None, help="its process id, for the memory phase (with --url)")
    ap.add_argument("--serve-args", default="", help="extra `specwire serve` arguments (default: built-in target "
                    "and shipped draft)")
    ap.add_argument("--max-queue", type=int, default=8, help="--max-queue of the started server (default: %(default)s)")
    ap.add_argument("--clients", type=int, default=32, help="concurrent clients (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens each client asks for (default: %(default)s)")
    ap.add_argument("--rss-requests", type=int, default=500, help="requests of the memory phase (default: %(default)s)")
    ap.add_argument("--fuzz-timeout", type=float, default=30.0, help="seconds a malformed body may take (a hang "
                    "past it fails; default: %(default)s)")
    ap.add_argument("--log", default=None, help="file for the started server's output (default: discarded)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)

    proc, exit_status = None, None
    if args.url:
        base, pid = args.url.rstrip("/"), args.pid
    else:
        log = open(args.log, "w") if args.log else subprocess.DEVNULL
        serve_args = ["--max-queue", str(args.max_queue), *shlex.split(args.serve_args)]
        proc, base = start_server(serve_args, log=log)
        pid = proc.pid
        print(f"started: specwire serve {' '.join(serve_args)} on {base} (pid {pid})", file=sys.stderr)
        wait_healthy(base, proc)
    try:
        rep = run_all(base, pid, clients=args.clients, tokens=args.tokens, rss_requests=args.rss_requests,
                      fuzz_timeout=args.fuzz_timeout)
    finally:
        if proc is not None:
            exit_status = stop_server(proc)
    if proc is not None:
        rep["exit_status_after_sigterm"] = exit_status
        rep["ok"] = rep["ok"] and exit_status == 0
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(render(rep))
        if proc is not None:
            print(f"SIGTERM: the server exited with status {exit_status}")
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
