"""Helpers for the server tests: start `smelt serve` on a free port, talk raw HTTP to it,
read /metrics. Every server binds 127.0.0.1 with --port 0 and is stopped (SIGTERM, then
SIGKILL) when the test that owns it ends. Every call has a timeout."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMELT = os.environ.get("SMELT_BIN", os.path.join(ROOT, "build", "smelt"))
QWEN = os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf")


def _sanitized():
    try:
        with open(SMELT, "rb") as f:
            data = f.read()
        return b"AddressSanitizer" in data or b"ThreadSanitizer" in data
    except OSError:
        return False


# A sanitizer build (make asan / tsan): its allocator keeps freed memory and maps its own, so
# the server's RSS says nothing about what the server holds; memory bounds are checked on
# the release build only.
SANITIZED = _sanitized()


def make_tiny(path):
    """A tiny random llama model (vocab 1000, 2 layers): fast enough for load tests."""
    if not os.path.exists(path):
        subprocess.run([SMELT, "quantize", "--random", "tiny", path, "Q8_0"], check=True,
                       capture_output=True, timeout=120)
    return path


class Server:
    def __init__(self, model, *args, env=None, start_timeout=120):
        cmd = [SMELT, "serve", model, "--port", "0", *args]
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=e)
        self.lines = []
        self.port = None
        self.admin_port = None
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()
        if not self._ready.wait(start_timeout) or self.port is None:
            self.stop()
            raise RuntimeError("smelt serve did not start:\n" + "".join(self.lines[-30:]))
        self.host = "127.0.0.1"
        self.url = f"http://{self.host}:{self.port}"

    def _read(self):
        for line in self.p.stderr:
            self.lines.append(line)
            m = re.search(r"admin \(/health, /metrics\) on http://[^ ]+:(\d+)", line)
            if m:
                self.admin_port = int(m.group(1))
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    def log(self):
        return "".join(self.lines)

    def stop(self, timeout=20):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(10)
        self._t.join(5)
        bad = [l for l in self.lines if "AddressSanitizer" in l or "LeakSanitizer" in l
               or "ThreadSanitizer" in l or "runtime error:" in l]
        if bad:
            raise AssertionError("sanitizer report from smelt serve:\n" + self.log()[-6000:])
        return self.p.returncode

    # ---- raw HTTP ----
    def request(self, method, path, body=None, headers=None, timeout=60):
        """Returns (status, headers dict (lower-case names), body bytes)."""
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            h = {"Content-Type": "application/json"}
            h.update(headers or {})
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def post(self, path, obj, headers=None, timeout=60):
        st, h, data = self.request("POST", path, obj, headers, timeout)
        try:
            j = json.loads(data)
        except ValueError:
            j = None
        return st, j

    def stream_in_thread(self, path, obj, timeout=60):
        """Starts self.stream(path, obj) on a thread; returns (the thread, a dict whose "r"
        holds stream's result once the thread is done)."""
        out = {}
        t = threading.Thread(target=lambda: out.update(r=self.stream(path, obj, timeout)))
        t.start()
        return t, out

    def stream(self, path, obj, timeout=60):
        """POSTs a streaming request; returns (status, list of parsed data events, raw text).
        The final "[DONE]" is kept as the string "[DONE]"."""
        st, h, data = self.request("POST", path, obj, timeout=timeout)
        text = data.decode("utf-8")
        events = []
        for block in text.split("\n\n"):
            if not block.startswith("data: "):
                continue
            payload = block[6:]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        return st, events, text

    def metrics(self, headers=None):
        """/metrics as {series: value}. A series with a model label is also summed over the
        models under its name without that label (smelt_kv_blocks_used{model="m"} into
        smelt_kv_blocks_used), so a test of one model reads it either way."""
        st, h, data = self.request("GET", "/metrics", headers=headers)
        assert st == 200
        out = {}
        for line in data.decode().splitlines():
            if not line or line.startswith("#"):
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
            m = re.match(r'^([^{]+)\{(.*)\}$', name)
            if m and 'model="' in m.group(2):
                rest = re.sub(r'model="(?:[^"\\]|\\.)*",?', "", m.group(2)).rstrip(",")
                plain = m.group(1) + ("{" + rest + "}" if rest else "")
                out[plain] = out.get(plain, 0.0) + float(value)
        return out

    def wait_idle(self, timeout=20, streams=False):
        """Waits until no sequence runs or waits and no KV block is used (and, with streams, no
        streaming response is open: a dropped client's stream ends when the server notices the
        closed socket, which may come after its sequence left); returns metrics."""
        t0 = time.time()
        while True:
            m = self.metrics()
            if (m["smelt_num_requests_running"] == 0 and m["smelt_num_requests_waiting"] == 0
                    and m["smelt_kv_blocks_used"] == 0
                    and (not streams or m["smelt_http_streams"] == 0)):
                return m
            if time.time() - t0 > timeout:
                raise AssertionError(f"server not idle after {timeout} s: running "
                                     f"{m['smelt_num_requests_running']}, waiting "
                                     f"{m['smelt_num_requests_waiting']}, kv used "
                                     f"{m['smelt_kv_blocks_used']}, streams {m['smelt_http_streams']}")
            time.sleep(0.05)

    def rss_kb(self, field="VmRSS"):
        """The server's resident memory in KiB (field VmHWM: its peak since start, or since
        reset_peak_rss)."""
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def reset_peak_rss(self):
        """Resets VmHWM to the current RSS (Linux: 5 > /proc/PID/clear_refs); False if not
        allowed."""
        try:
            with open(f"/proc/{self.p.pid}/clear_refs", "w") as f:
                f.write("5")
            return True
        except OSError:
            return False


def raw_http(host, port, data, timeout=10, src=None, until_close=True):
    """Sends data (bytes) on a new connection, from source address src if given, and reads
    what comes back until the server closes the connection (or, with until_close False,
    until one whole response is in), or timeout seconds pass. The sending runs in a thread:
    a server that answers early and closes may cut it short (a reset or broken pipe there is
    not an error). Returns (the bytes received, whether the server closed)."""
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(timeout)
    if src:
        c.bind((src, 0))
    c.connect((host, port))

    def send():
        try:
            c.sendall(data)
        except OSError:
            pass
    t = threading.Thread(target=send, daemon=True)
    t.start()
    try:
        return read_http(c, timeout, until_close)
    finally:
        c.close()
        t.join(5)


def read_http(c, timeout=10, until_close=True):
    """Reads socket c until the server closes it (or, with until_close False, until one
    whole response is in), a reset, or timeout seconds. Returns (bytes, whether closed)."""
    got, closed = b"", False
    deadline = time.time() + timeout
    while time.time() < deadline:
        c.settimeout(max(0.01, deadline - time.time()))
        try:
            k = c.recv(65536)
        except socket.timeout:
            break
        except OSError:
            closed = True
            break
        if not k:
            closed = True
            break
        got += k
        if not until_close and parse_responses(got, complete_only=True):
            break
    return got, closed


def parse_responses(buf, complete_only=False):
    """Splits raw bytes into HTTP responses: a list of (status, headers (lower-case names,
    a list of values each), body). Interim 1xx responses are listed too. With complete_only,
    a response whose body is not all there is left out."""
    out = []
    while buf:
        head, sep, rest = buf.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        hdrs = {}
        for l in lines[1:]:
            k, _, v = l.partition(":")
            hdrs.setdefault(k.strip().lower(), []).append(v.strip())
        n = int(hdrs.get("content-length", ["0"])[0]) if status >= 200 else 0
        if complete_only and len(rest) < n:
            break
        out.append((status, hdrs, rest[:n]))
        buf = rest[n:]
    return out


def completion_text(events):
    """Concatenated text of choice 0 over streamed completion events."""
    return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict)
                   and e.get("choices"))
