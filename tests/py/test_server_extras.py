"""Two smaller gaps of the server, over raw HTTP:
- CORS (--cors-origins): preflights answered before the API key is checked, with the route's
  methods and the requested headers; answers to an allowed origin (errors and streams too)
  carry Access-Control-Allow-Origin, others none; `*`; off by default.
- /tokenize with_pieces: a piece that is not valid UTF-8 on its own comes as its byte
  values (llama.cpp's shape), so the pieces always rejoin to the text: on the byte-level
  test vocabulary and on both real test models (emoji, CJK, combining marks, rare scripts)."""
import os
import unicodedata

import pytest

from smelt_server import QWEN, ROOT, SMELT, Server

gguf = pytest.importorskip("gguf")

from test_server_tools import write_vocab  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

GEMMA = os.path.join(ROOT, "models", "gemma3-270m-q4_k_m.gguf")
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return write_vocab(str(tmp_path_factory.mktemp("extras") / "v.gguf"),
                       "{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.fixture
def serve(vocab):
    started = []

    def start(*args, model=None):
        s = Server(model or vocab, "--fake-forward", "--fake-reply", "ok", "--served-model-name",
                   "m", "--quiet", *args, start_timeout=120)
        started.append(s)
        return s
    yield start
    for s in started:
        assert s.stop() == 0, s.log()


def preflight(s, origin, path="/v1/chat/completions", req_headers="authorization, content-type"):
    h = {"Origin": origin, "Access-Control-Request-Method": "POST"}
    if req_headers:
        h["Access-Control-Request-Headers"] = req_headers
    return s.request("OPTIONS", path, headers=h)


def test_cors(serve):
    s = serve("--cors-origins", "https://a.example, https://B.example", "--api-key", "k")
    key = {"Authorization": "Bearer k"}
    # a preflight needs no key
    st, h, body = preflight(s, "https://a.example")
    assert st == 204 and body == b"", (st, h, body)
    assert h["access-control-allow-origin"] == "https://a.example" and h["vary"] == "Origin"
    assert h["access-control-allow-methods"] == "POST, OPTIONS"
    assert h["access-control-allow-headers"] == "authorization, content-type"
    assert int(h["access-control-max-age"]) > 0
    # origins compare without case; a GET route lists its methods; no requested headers
    st, h, _ = preflight(s, "https://b.example", "/v1/models", None)
    assert st == 204 and h["access-control-allow-origin"] == "https://b.example"
    assert h["access-control-allow-methods"] == "GET, HEAD, OPTIONS"
    assert "authorization" in h["access-control-allow-headers"].lower()
    assert "x-api-key" in h["access-control-allow-headers"].lower()
    # another origin: 403, no CORS headers; an unknown route: 404
    st, h, _ = preflight(s, "https://evil.example")
    assert st == 403 and "access-control-allow-origin" not in h
    st, h, _ = preflight(s, "https://a.example", "/v1/nope")
    assert st == 404
    # an OPTIONS that is not a preflight is an ordinary request: the key first
    st, h, _ = s.request("OPTIONS", "/v1/chat/completions", headers={"Origin": "https://a.example"})
    assert st == 401
    # answers to an allowed origin carry the header: success, errors, streams
    body = {"messages": USER, "max_tokens": 3}
    st, h, _ = s.request("POST", "/v1/chat/completions", body, dict(key, Origin="https://a.example"))
    assert st == 200 and h["access-control-allow-origin"] == "https://a.example"
    st, h, _ = s.request("POST", "/v1/chat/completions", body, {"Origin": "https://a.example"})
    assert st == 401 and h["access-control-allow-origin"] == "https://a.example"
    st, h, _ = s.request("POST", "/v1/chat/completions", dict(body, stream=True),
                         dict(key, Origin="https://a.example"))
    assert st == 200 and h["access-control-allow-origin"] == "https://a.example"
    st, h, _ = s.request("POST", "/v1/chat/completions", body, dict(key, Origin="https://evil.example"))
    assert st == 200 and "access-control-allow-origin" not in h
    st, h, _ = s.request("GET", "/v1/models", headers=key)
    assert st == 200 and "access-control-allow-origin" not in h
    m = s.metrics(headers=key)
    assert m['smelt_http_requests_total{status="204"}'] == 2
    assert m['smelt_http_requests_total{status="403"}'] == 1


def test_cors_any_and_off(serve):
    s = serve("--cors-origins", "*")
    st, h, _ = preflight(s, "https://anything.example")
    assert st == 204 and h["access-control-allow-origin"] == "*" and "vary" not in h
    st, h, _ = s.request("GET", "/v1/models", headers={"Origin": "https://x.example"})
    assert st == 200 and h["access-control-allow-origin"] == "*"
    off = serve()
    st, h, _ = preflight(off, "https://a.example")
    assert st == 405 and "access-control-allow-origin" not in h
    st, h, _ = off.request("GET", "/v1/models", headers={"Origin": "https://x.example"})
    assert st == 200 and "access-control-allow-origin" not in h


# ---- /tokenize pieces ----

# NFC text: Qwen's tokenizer normalizes to NFC (as Hugging Face's does), so a text in
# another form comes back composed; the pieces then rejoin to its NFC form
TEXTS = [unicodedata.normalize("NFC", t) for t in [
         "plain ascii", "caf\u00e9 na\u00efve", "\U0001F600 emoji \U0001F44D\U0001F3FD",
         "\U0001F469\u200D\U0001F4BB zwj", "\u4e2d\u6587\u5b57\u7b26 \u65e5\u672c\u8a9e",
         "e\u0301\u0308 combining", "\u0c95\u0ca8\u0ccd\u0ca8\u0ca1 \u1000\u103a\u1010",
         "\U0001D11E\U00010348\U0010FFFD rare", "\u00ff\u0100\ufffd\ufeff", "q\u0323\u0307"]]


def rejoin(tokens):
    out = b""
    for t in tokens:
        p = t["piece"]
        assert isinstance(p, (str, list)), t
        if isinstance(p, list):
            assert p and all(0 <= b < 256 for b in p), t
            # only pieces that are not UTF-8 on their own are given as bytes
            with pytest.raises(UnicodeDecodeError):
                bytes(p).decode("utf-8")
        out += p.encode("utf-8") if isinstance(p, str) else bytes(p)
    return out


def check_pieces(s):
    n_bytes = 0
    for text in TEXTS:
        st, j = s.post("/tokenize", {"content": text, "add_special": False, "with_pieces": True})
        assert st == 200, j
        assert rejoin(j["tokens"]) == text.encode("utf-8"), (text, j["tokens"])
        n_bytes += sum(isinstance(t["piece"], list) for t in j["tokens"])
        st, ids = s.post("/tokenize", {"content": text, "add_special": False})
        assert [t["id"] for t in j["tokens"]] == ids["tokens"]
    return n_bytes


def test_pieces_rejoin_byte_vocab(serve):
    s = serve()
    # every byte is a token: each non-ASCII character is split, its bytes given as numbers
    assert check_pieces(s) > 20
    st, j = s.post("/tokenize", {"content": "\u00e9", "add_special": False, "with_pieces": True})
    assert [t["piece"] for t in j["tokens"]] == [[0xC3], [0xA9]]


@pytest.mark.parametrize("path", [QWEN, GEMMA], ids=["qwen", "gemma"])
def test_pieces_rejoin_real_models(serve, path):
    if not os.path.exists(path):
        pytest.skip(f"model absent: {path} (make models)")
    s = serve(model=path)
    check_pieces(s)
