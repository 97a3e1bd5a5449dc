"""smelt serve against hostile clients (issue 24), over raw sockets so that no client library
normalizes the bytes:
- requests judged on their headers alone: 401 / 404 / 405 / 413 / 400 / 501 answered before
  a byte of the body is read, no 100 Continue, the connection closed;
- strict framing (RFC 9112 section 6.3): Content-Length with Transfer-Encoding, lengths that
  disagree, codings other than chunked, HTTP/1.0 with Transfer-Encoding, NUL / CR / LF /
  control bytes in headers, bare LF line ends, folded lines, Host; a request smuggled
  behind a refused one never runs;
- memory: unauthenticated large bodies cost none (64 and 1,024 connections), authenticated
  ones stay within --body-budget (503 past it);
- connections: a cap per client address, the header timeout, /health and /metrics on the
  admin port while the main port is at its connection limit;
- escaped text logs, error bodies that stay valid UTF-8, 400 for a request that could never
  be queued, a second SIGTERM, the API key from a file.
Loopback only, bounded in count and time. Run with -s to see the measured figures that
docs/server.md quotes."""
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import threading
import time

import pytest

from smelt_server import SANITIZED, SMELT, Server, make_tiny, parse_responses, raw_http, read_http

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

KEY = b"Authorization: Bearer k\r\n"
MIB = 1 << 20


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(str(tmp_path_factory.mktemp("models") / "tiny.gguf"))


@pytest.fixture(scope="module")
def srv(tiny):
    s = Server(tiny, "--api-key", "k", "--fake-forward", "--max-body", "1000000",
               "--timeout", "20", "-t", "1")
    yield s
    assert s.stop() == 0, s.log()


def exchange(s, data, timeout=5, **kw):
    """Sends data on a new connection; returns (responses, closed, seconds)."""
    t0 = time.time()
    got, closed = raw_http(s.host, s.port, data, timeout=timeout, **kw)
    return parse_responses(got), closed, time.time() - t0


def error_of(body):
    e = json.loads(body)["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    return e


def request_lines(s):
    return [l for l in s.lines if l.startswith("smelt: request ")]


def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"SKIP the open-file limit ({hard}) is below {n}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


# ---- refused on the headers ----

BIG = b"Content-Length: 10737418240\r\n"  # 10 GiB: never sent


@pytest.mark.parametrize("head,status", [
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + BIG, 401),                # no key
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer kX\r\n" + BIG, 401),
    (b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\n" + KEY + BIG, 404),
    (b"PUT /v1/completions HTTP/1.1\r\nHost: x\r\n" + KEY + BIG, 405),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + KEY + BIG, 413),              # takes no body
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + KEY + BIG, 413),        # over --max-body
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + KEY + BIG +
     b"Transfer-Encoding: chunked\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + KEY +
     b"Transfer-Encoding: gzip, chunked\r\n", 501),
])
def test_refused_on_headers_without_100_continue(srv, head, status):
    # the client asks before sending its body: it is refused at once, never told to go on
    rs, closed, took = exchange(srv, head + b"Expect: 100-continue\r\n\r\n")
    assert [r[0] for r in rs] == [status], rs
    assert closed and rs[0][1]["connection"] == ["close"]
    assert took < 2
    e = error_of(rs[0][2])
    if status == 401:
        assert rs[0][1]["www-authenticate"] == ["Bearer"] and e["type"] == "authentication_error"
    if status == 405:
        assert rs[0][1]["allow"] == ["POST"]


def test_expect_100_continue_when_accepted(srv):
    body = b'{"content": "hello"}'
    c = socket.create_connection((srv.host, srv.port), timeout=5)
    try:
        c.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + KEY + b"Expect: 100-continue\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body))
        assert c.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n")
        c.sendall(body)
        got, closed = read_http(c, 5, until_close=False)
        (st, h, data), = parse_responses(got)
        assert st == 200 and json.loads(data)["count"] > 0
    finally:
        c.close()


def test_refusal_without_expect_reaches_the_client(srv):
    # a client that sends its body anyway gets the answer at once (then a reset on its send)
    rs, closed, took = exchange(srv, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Length: %d\r\n\r\n" % (32 * MIB) + b"x" * (32 * MIB))
    assert [r[0] for r in rs] == [401] and closed and took < 3


# ---- strict framing ----

TOK = b'{"content": "hi"}'
POST = b"POST /tokenize HTTP/1.1\r\nHost: x\r\n" + KEY
GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
SMUGGLED = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n"


@pytest.mark.parametrize("name,data,status", [
    ("content-length and transfer-encoding",
     POST + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED, 400),
    ("two lengths", POST + b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % len(TOK) + TOK, 400),
    ("two lengths, the body's last",
     POST + b"Content-Length: %d\r\nContent-Length: 0\r\n\r\n" % len(TOK) + TOK, 400),
    ("gzip, chunked", POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    ("chunked, identity", POST + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
    ("identity", POST + b"Transfer-Encoding: identity\r\n\r\n" + TOK, 400),
    ("xchunked", POST + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
    ("chunked twice", POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("transfer-encoding in HTTP/1.0",
     b"POST /tokenize HTTP/1.0\r\n" + KEY + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("NUL in the key", GET + b"Authorization: Bearer k\x00junk\r\n\r\n", 400),
    ("NUL in a value", GET + KEY + b"X-A: a\x00b\r\n\r\n", 400),
    ("NUL in the target", b"GET /v1/models\x00x HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n", 400),
    ("ESC in the target", b"GET /v1/\x1b[2J HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n", 400),
    ("space in the target", b"GET /v1/mo dels HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n", 400),
    ("a lone CR", GET + KEY + b"X-A: a\rb\r\n\r\n", 400),
    ("a bare LF", GET + b"X-A: a\n" + KEY + b"\r\n", 400),
    ("a bare LF at the end", GET + KEY + b"\n", 400),
    ("a folded line", GET + b"X-A: a\r\n b\r\n" + KEY + b"\r\n", 400),
    ("ESC in a value", GET + KEY + b"X-A: a\x1b[31mb\r\n\r\n", 400),
    ("a bad name", GET + KEY + b"X@A: a\r\n\r\n", 400),
    ("a space in a name", GET + KEY + b"X A: a\r\n\r\n", 400),
    ("no Host", b"GET /v1/models HTTP/1.1\r\n" + KEY + b"\r\n", 400),
    ("two Hosts", GET + b"Host: y\r\n" + KEY + b"\r\n", 400),
    ("two keys", GET + KEY + KEY + b"\r\n", 400),
])
def test_framing_refused_and_closed(srv, name, data, status):
    before = len(request_lines(srv))
    rs, closed, took = exchange(srv, data)
    assert [r[0] for r in rs] == [status], (name, rs)   # one answer: nothing smuggled ran
    assert closed and rs[0][1]["connection"] == ["close"], name
    assert took < 2, name                                 # no wait for a timeout
    e = error_of(rs[0][2])
    assert e["code"] == ("not_implemented" if status == 501 else "bad_request"), e
    # the request log has a line for it (an earlier test's request may be logged after
    # `before` was read, so look among every new line, not only at the last)
    def logged():
        return any(f" {status} " in line for line in request_lines(srv)[before:])
    deadline = time.time() + 5
    while not logged() and time.time() < deadline:
        time.sleep(0.02)
    assert logged(), request_lines(srv)[before:]


@pytest.mark.parametrize("name,data,status", [
    ("a length that is not a number", POST + b"Content-Length: 5x\r\n\r\n", 400),
    ("a list of lengths", POST + b"Content-Length: 5, 5\r\n\r\n", 400),
    ("a length that overflows", POST + b"Content-Length: 99999999999999999999999\r\n\r\n", 413),
    ("headers over 32 KiB", GET + KEY + b"X-Big: " + b"a" * 40000 + b"\r\n\r\n", 431),
    ("a request line over 32 KiB", b"GET /v1/models/" + b"a" * 40000 + b" HTTP/1.1\r\n\r\n", 414),
    ("HTTP/2.0", b"GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n", 505),
])
def test_framing_refused_by_libmicrohttpd(srv, name, data, status):
    # libmicrohttpd answers these itself, before the handler (its own error body, whose
    # header block 0.9.75 writes twice), and closes
    rs, closed, took = exchange(srv, data)
    assert rs and rs[0][0] == status and closed and took < 2, (name, rs)


@pytest.mark.parametrize("name,data", [
    ("agreeing lengths", POST + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
     % (len(TOK), len(TOK)) + TOK),
    ("Chunked", POST + b"Transfer-Encoding: Chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(TOK), TOK)),
    ("HTTP/1.0 without Host", b"GET /v1/models HTTP/1.0\r\n" + KEY + b"\r\n"),
    ("a 30 KB header", GET + KEY + b"X-Big: " + b"a" * 30000 + b"\r\n\r\n"),
    ("cookies and a tab", GET + KEY + b"Cookie: a=b; c=d\r\nX-T: a\tb \r\n\r\n"),
    ("a query with %00", b"GET /v1/models?x=1&y=%00 HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n"),
    ("obs-text", GET + KEY + b"X-A: caf\xe9\r\n\r\n"),
])
def test_framing_accepted(srv, name, data):
    rs, closed, took = exchange(srv, data, until_close=False)
    assert [r[0] for r in rs] == [200], (name, rs)


def test_pipelined_requests_still_work(srv):
    one = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    rs, closed, took = exchange(srv, one * 3 + POST + b"Content-Length: %d\r\n\r\n" % len(TOK) + TOK
                                + b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + KEY
                                + b"Connection: close\r\n\r\n")
    assert [r[0] for r in rs] == [200] * 5 and closed


# ---- memory ----

def _flood(s, n, head, body_bytes):
    """n connections open at once: each sends head but its last CR LF and waits; once all
    are open, each ends its headers and sends up to body_bytes of body without blocking.
    Returns the statuses they got (None: closed with no answer)."""
    conns = []
    for i in range(n):
        c = socket.create_connection((s.host, s.port), timeout=10)
        c.sendall(head[:-2])
        conns.append(c)
    for c in conns:
        c.setblocking(False)
        try:
            c.send(head[-2:])
            c.send(b"x" * body_bytes)
        except OSError:
            pass
    out = []
    deadline = time.time() + 20
    for c in conns:
        c.setblocking(True)
        got, closed = read_http(c, max(0.1, deadline - time.time()))
        c.close()
        rs = parse_responses(got)
        out.append(rs[0][0] if rs else None)
    return out


@pytest.mark.parametrize("n", [64, 1024])
def test_unauthenticated_bodies_cost_no_memory(tiny, n):
    raise_fd_limit(n + 256)
    s = Server(tiny, "--api-key", "k", "--fake-forward", "-t", "1", "--max-connections", "4096",
               "--max-connections-per-client", "0", "--header-timeout", "30")
    try:
        assert s.request("GET", "/health")[0] == 200
        base = s.rss_kb()
        peak_ok = s.reset_peak_rss()
        t0 = time.time()
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                b"\r\nContent-Length: %d\r\n\r\n" % (32 * MIB))
        statuses = _flood(s, n, head, 256 * 1024)
        took = time.time() - t0
        peak = s.rss_kb("VmHWM" if peak_ok else "VmRSS")
        assert statuses.count(401) == n, {x: statuses.count(x) for x in set(statuses)}
        grew = (peak - base) / 1024
        print(f"\n{n} unauthenticated connections open at once, 32 MiB declared and 256 KiB "
              f"sent each: "
              f"all 401 in {took:.2f} s; RSS {base / 1024:.1f} MiB -> peak {peak / 1024:.1f} MiB "
              f"(+{grew:.1f} MiB)")
        # nothing of the bodies is buffered: what grows is per-connection bookkeeping
        # (libmicrohttpd's 32 KiB read buffer at most, our structs), far below one body
        assert SANITIZED or grew < 16 + n * 32 / 1024, grew
        m = s.metrics(headers={"Authorization": "Bearer k"})
        assert m['smelt_http_requests_total{status="401"}'] == n
    finally:
        s.stop()


def test_body_budget(tiny):
    # 3 bodies of 8 MiB fit a 28 MiB budget, a 4th does not: 503 on its headers; a chunked
    # body that would pass it (6 MiB, 4 MiB left) is cut with a 503 while it grows
    s = Server(tiny, "--api-key", "k", "--fake-forward", "-t", "1", "--max-body", str(8 * MIB),
               "--body-budget", str(28 * MIB), "--header-timeout", "30", "--timeout", "60")
    held = []
    try:
        assert s.request("GET", "/health")[0] == 200
        base = s.rss_kb()
        peak_ok = s.reset_peak_rss()
        head = POST + b"Content-Length: %d\r\n\r\n" % (8 * MIB)
        for i in range(3):
            c = socket.create_connection((s.host, s.port), timeout=10)
            c.sendall(head + b'{"content": "' + b"a" * (6 * MIB))  # most of it, then it stalls
            held.append(c)
        for c in held:
            c.setblocking(False)
            with pytest.raises(BlockingIOError):
                c.recv(100)           # no answer: the body is still coming
            c.setblocking(True)
        rs, closed, took = exchange(s, head + b"x" * MIB)
        assert [r[0] for r in rs] == [503] and closed and took < 2, rs
        assert rs[0][1]["retry-after"] == ["1"] and error_of(rs[0][2])["code"] == "server_busy"
        chunks = b"".join(b"%x\r\n%s\r\n" % (256 * 1024, b"b" * 256 * 1024) for _ in range(24))
        rs, closed, took = exchange(s, POST + b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
        assert [r[0] for r in rs] == [503] and closed, rs
        peak = s.rss_kb("VmHWM" if peak_ok else "VmRSS")
        grew = (peak - base) / 1024
        print(f"\nbody budget 28 MiB, 3 bodies of 8 MiB held (6 MiB sent each): RSS "
              f"{base / 1024:.1f} -> peak {peak / 1024:.1f} MiB (+{grew:.1f} MiB)")
        assert SANITIZED or grew < 28 + 16, grew
        # the held bodies end: their budget comes back
        for c in held:
            c.close()
        held = []
        deadline = time.time() + 5
        while time.time() < deadline:
            rs, closed, took = exchange(s, head + b"x" * 100, timeout=0.5)
            if not rs:
                break  # accepted: it waits for the rest of its body
            time.sleep(0.1)
        assert not rs, rs
    finally:
        for c in held:
            c.close()
        s.stop()


def _cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def test_tiny_chunks_cut_at_the_limit(tiny):
    # a chunked body that never ends, in 1-byte chunks (the costliest framing): cut with a
    # 413 at --max-body, not read until --timeout. SMELT_CHUNK_FLOOD_MIB=32 measures the
    # default limit (docs/server.md).
    mib = int(os.environ.get("SMELT_CHUNK_FLOOD_MIB", "1"))
    s = Server(tiny, "--fake-forward", "-t", "1", "--max-body", str(mib * MIB))
    try:
        c = socket.create_connection((s.host, s.port), timeout=10)
        c.sendall(POST.replace(KEY, b"") + b"Transfer-Encoding: chunked\r\n\r\n")
        blk = b"1\r\nx\r\n" * 100000
        cpu0, t0, sent = _cpu_s(s.p.pid), time.time(), 0
        try:
            while time.time() - t0 < 120:
                c.sendall(blk)
                sent += len(blk)
        except OSError:
            pass
        took, cpu = time.time() - t0, _cpu_s(s.p.pid) - cpu0
        got, closed = read_http(c, 5, until_close=False)
        c.close()
        print(f"\n{mib} MiB in 1-byte chunks ({sent / MIB:.0f} MiB sent on the wire): 413 after "
              f"{took:.1f} s, {cpu:.2f} s of server CPU")
        assert parse_responses(got)[0][0] == 413 and took < 60
    finally:
        s.stop()


# ---- connections ----

def test_per_client_cap(tiny):
    s = Server(tiny, "--fake-forward", "-t", "1", "--max-connections-per-client", "4",
               "--header-timeout", "30")
    conns = []
    try:
        for _ in range(4):
            conns.append(socket.create_connection((s.host, s.port), timeout=5))
        time.sleep(0.2)
        c = socket.create_connection((s.host, s.port), timeout=5)
        t0 = time.time()
        try:
            c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert c.recv(100) == b""       # closed at once
        except OSError:
            pass
        assert time.time() - t0 < 2
        c.close()
        # another address is not held back
        got, closed = raw_http(s.host, s.port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                               b"Connection: close\r\n\r\n", src="127.0.0.2")
        assert parse_responses(got)[0][0] == 200
    finally:
        for c in conns:
            c.close()
        s.stop()


def closed_after(c, seconds, trickle=b""):
    """Seconds until the server closes c (sending trickle a byte every 0.2 s), or None."""
    import select
    t0 = time.time()
    i = 0
    while time.time() - t0 < seconds:
        if trickle:
            try:
                c.send(trickle[i % len(trickle):i % len(trickle) + 1])
            except OSError:
                return time.time() - t0
            i += 1
        r, _, _ = select.select([c], [], [], 0.2)
        if r:
            try:
                if not c.recv(4096):
                    return time.time() - t0
            except OSError:
                return time.time() - t0
    return None


def test_header_timeout(tiny):
    s = Server(tiny, "--fake-forward", "-t", "1", "--header-timeout", "1", "--timeout", "8")
    try:
        idle = socket.create_connection((s.host, s.port), timeout=10)
        body = socket.create_connection((s.host, s.port), timeout=10)
        body.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        # an idle connection is closed after the header timeout...
        took = closed_after(idle, 5)
        assert took is not None and took < 2.5, took
        # ... one whose headers are in has the request timeout for its (slow) body
        assert closed_after(body, 1.5, b"b" * 1000) is None
        idle.close()
        body.close()
        # a kept-alive connection idle after its answer: the header timeout again
        k = socket.create_connection((s.host, s.port), timeout=10)
        k.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert k.recv(1000).startswith(b"HTTP/1.1 200")
        took = closed_after(k, 5)
        assert took is not None and took < 2.5, took
        k.close()
    finally:
        s.stop()


def test_admin_port_at_the_connection_limit(tiny):
    s = Server(tiny, "--fake-forward", "-t", "1", "--http-threads", "1", "--max-connections", "16",
               "--max-connections-per-client", "0", "--admin-port", "0", "--header-timeout", "30")
    conns = []
    try:
        assert s.admin_port and s.admin_port != s.port
        for _ in range(16):
            conns.append(socket.create_connection((s.host, s.port), timeout=5))
        time.sleep(0.3)
        # the main port is full: a new connection waits in the backlog, unanswered
        waiting = socket.create_connection((s.host, s.port), timeout=5)
        waiting.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        waiting.settimeout(0.5)
        with pytest.raises(socket.timeout):
            waiting.recv(100)
        # the admin port answers, fast
        times = []
        for _ in range(5):
            t0 = time.time()
            got, closed = raw_http(s.host, s.admin_port, b"GET /health HTTP/1.1\r\nHost: x\r\n"
                                   b"Connection: close\r\n\r\n", timeout=5)
            times.append(time.time() - t0)
            assert parse_responses(got)[0][0] == 200
        print(f"\n/health on the admin port with the main port at its connection limit (16): "
              f"{', '.join(f'{t * 1000:.1f}' for t in times)} ms")
        assert statistics.median(times) < 0.1, times
        got, closed = raw_http(s.host, s.admin_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                               b"Connection: close\r\n\r\n")
        (st, h, data), = parse_responses(got)
        assert st == 200 and b"smelt_http_connections" in data
        got, closed = raw_http(s.host, s.admin_port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                               b"Connection: close\r\n\r\n")
        assert parse_responses(got)[0][0] == 404   # the admin port serves those two only
        # a freed slot: the waiting connection is served
        conns.pop().close()
        waiting.settimeout(5)
        assert waiting.recv(100).startswith(b"HTTP/1.1 200")
        waiting.close()
    finally:
        for c in conns:
            c.close()
        s.stop()


# ---- logs and error bodies ----

def test_text_log_is_escaped(srv):
    before = len(srv.lines)
    for data in (b"GET /v1/x%0d%0asmelt:%20request%20forged%1b[31m HTTP/1.1\r\nHost: x\r\n\r\n",
                 b"GET /v1/x%0d%0asmelt:%20request%20forged%1b[31m HTTP/1.1\r\nHost: x\r\n" + KEY
                 + b"\r\n",
                 b"GET /v1/%ff%c3%9b%c2%9b HTTP/1.1\r\nHost: x\r\n" + KEY + b"\r\n",
                 b"G\x1bT /x HTTP/1.1\r\nHost: x\r\n\r\n"):
        exchange(srv, data + b"", timeout=2)
    deadline = time.time() + 5
    while len(srv.lines) < before + 4 and time.time() < deadline:
        time.sleep(0.02)
    new = srv.lines[before:]
    assert len(new) == 4, new                                  # no forged line
    for l in new:
        assert l.startswith("smelt: request ") and l.endswith("\n"), l
        assert not any(ord(ch) < 0x20 and ch != "\n" for ch in l), repr(l)
        assert not any(0x7F <= ord(ch) <= 0x9F for ch in l), repr(l)
    assert "/v1/x\\x0d\\x0asmelt: request forged\\x1b[31m 401" in new[0], new[0]
    assert " 404 " in new[1] and "\\x1b" in new[1]
    assert "/v1/\\xff\u00db\\xc2\\x9b 404" in new[2], new[2]     # invalid byte, valid é-like, C1
    assert "G\\x1bT /x 401" in new[3], new[3]


def test_json_log_is_escaped(tiny):
    s = Server(tiny, "--fake-forward", "-t", "1", "--log-format", "json")
    try:
        exchange(s, b"GET /v1/x%0d%0a%1b%ff HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.time() + 5
        while not any(l.startswith("{") for l in s.lines) and time.time() < deadline:
            time.sleep(0.02)
        (l,) = [json.loads(l) for l in s.lines if l.startswith("{")]
        assert l["path"] == "/v1/x\r\n\x1b\ufffd" and l["status"] == 404
    finally:
        s.stop()


def test_error_bodies_stay_utf8(srv):
    # invalid UTF-8 in a model id: a 404 naming it (U+FFFD), not a body saying "out of memory"
    rs, closed, took = exchange(srv, b"GET /v1/models/ab%ff%c3 HTTP/1.1\r\nHost: x\r\n" + KEY +
                                b"Connection: close\r\n\r\n")
    (st, h, data), = rs
    e = error_of(data)
    assert st == 404 and e["type"] == "invalid_request_error" and e["code"] == "model_not_found"
    assert "ab\ufffd\ufffd" in e["message"] and "memory" not in e["message"]
    # a long model name in a body is cut on a character boundary
    st, h, data = srv.request("POST", "/v1/completions", {"model": "\u00e9" * 150, "prompt": "x"},
                              headers={"Authorization": "Bearer k"})
    e = error_of(data)
    assert st == 404 and "'" + "\u00e9" * 100 + "'" in e["message"], e


def test_never_schedulable_is_400_not_429(tiny):
    s = Server(tiny, "--fake-forward", "-t", "1", "--max-waiting", "4")
    try:
        st, j = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 5})
        e = j["error"]
        assert st == 400 and e["param"] == "n" and e["code"] == "too_many_sequences", j
        assert "--max-waiting" in e["message"]
        st, j = s.post("/v1/completions", {"prompt": ["x", "y", "z"], "max_tokens": 1, "n": 2})
        assert st == 400 and j["error"]["param"] == "n", j
        st, j = s.post("/v1/completions", {"prompt": ["x", "y", "z", "w", "v"], "max_tokens": 1})
        assert st == 400 and j["error"]["param"] == "prompt", j
        st, j = s.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 4})
        assert st == 200 and len(j["choices"]) == 4
        # the case: 1,024 prompts x n 128 on the default queue (1,024)
        st, j = s.post("/v1/completions", {"prompt": ["x"] * 1024, "max_tokens": 1, "n": 128})
        assert st == 400 and j["error"]["code"] == "too_many_sequences", j
    finally:
        s.stop()


# ---- shutdown and the key ----

def test_second_sigterm_stops_at_once(tiny):
    s = Server(tiny, "--fake-forward", "--fake-step-ms", "20", "--grace", "60", "-t", "1")
    try:
        t, result = s.stream_in_thread("/v1/completions", {"prompt": "x", "max_tokens": 3000,
                                                            "stream": True, "ignore_eos": True})
        time.sleep(0.4)
        s.p.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        t0 = time.time()
        s.p.send_signal(signal.SIGTERM)
        t.join(10)
        assert s.p.wait(10) == 0
        took = time.time() - t0
        st, events, raw = result["r"]
        assert st == 200 and events[-1] == "[DONE]", raw[-400:]
        assert events[-3]["choices"][0]["finish_reason"] == "abort"
        assert events[-2]["error"]["code"] == "shutting_down"
        assert took < 3, took
        assert any("SIGTERM again" in l for l in s.lines), s.log()
    finally:
        s.stop()


def test_api_key_file(tiny, tmp_path):
    f = tmp_path / "key"
    f.write_text("from-file\n")
    s = Server(tiny, "--fake-forward", "-t", "1", "--api-key-file", str(f))
    try:
        assert s.request("GET", "/v1/models")[0] == 401
        assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer from-file"})[0] == 200
    finally:
        s.stop()
    empty = tmp_path / "empty"
    empty.write_text("")
    for args in (["--api-key", "a", "--api-key-file", str(f)], ["--api-key-file", str(empty)],
                 ["--api-key-file", str(tmp_path / "missing")], ["--api-key", "a b"]):
        p = subprocess.run([SMELT, "serve", tiny, "--fake-forward", "--port", "0", *args],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode in (1, 2) and "key" in p.stderr, (args, p.stderr)
    h = subprocess.run([SMELT, "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert "--api-key-file" in h.stdout and "SMELT_API_KEY" in h.stdout
