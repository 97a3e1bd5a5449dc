"""The web chat's files over raw HTTP (docs/server.md, "Web chat"): GET and HEAD / and
/webui/NAME, their Content-Type, Content-Security-Policy, nosniff and caching headers; a 304
for an If-None-Match that names the ETag (a list, weak tags, *), with no body, so the next
request on the connection is read right; the embedded files byte for byte against their
sources (src/server/webui/ and Debian's packages, the independent reference for what was
embedded); the page needs no API key while the API routes still do; --no-webui; the admin
port does not serve it; 304s counted in /metrics. The browser side is test_webui_browser.py."""
import os
import re
import socket

import pytest

from smelt_server import ROOT, SMELT, Server, make_tiny, read_http

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
WEBUI = os.path.join(ROOT, "src", "server", "webui")
# where each embedded file comes from (CMakeLists.txt's SMELT_WEBUI_* defaults: Debian's paths)
SOURCES = {
    "/": os.path.join(WEBUI, "index.html"),
    "/webui/app.js": os.path.join(WEBUI, "app.js"),
    "/webui/app.css": os.path.join(WEBUI, "app.css"),
    "/webui/marked.js": "/usr/share/javascript/marked/marked.min.js",
    "/webui/highlight.js": "/usr/share/javascript/highlight.js/highlight.min.js",
    "/webui/purify.js": "/usr/share/nodejs/dompurify/dist/purify.min.js",
    "/webui/hljs-light.css": "/usr/share/javascript/highlight.js/styles/atom-one-light.css",
    "/webui/hljs-dark.css": "/usr/share/javascript/highlight.js/styles/atom-one-dark.css",
}
TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(str(tmp_path_factory.mktemp("webui") / "tiny.gguf"))


@pytest.fixture
def serve(tiny):
    started = []

    def start(*args, env=None):
        s = Server(tiny, "--fake-forward", "--served-model-name", "m", *args, env=env,
                   start_timeout=60)
        started.append(s)
        return s
    yield start
    for s in started:
        assert s.stop() == 0, s.log()


def check_headers(h, path):
    assert h["content-security-policy"] == CSP
    assert "'unsafe-inline'" not in h["content-security-policy"]
    assert h["x-content-type-options"] == "nosniff"
    assert h["x-frame-options"] == "DENY" and h["referrer-policy"] == "no-referrer"
    assert h["cache-control"] == "no-cache"
    assert re.fullmatch(r'"[0-9a-f]{24}"', h["etag"]), h["etag"]


def test_page_and_files(serve):
    s = serve()
    assert any("web chat at http://127.0.0.1:" in l for l in s.lines)
    st, h, page = s.request("GET", "/")
    assert st == 200 and h["content-type"] == "text/html; charset=utf-8"
    check_headers(h, "/")
    assert page.startswith(b"<!doctype html>")
    # everything the page loads is served, and nothing inline runs
    refs = re.findall(rb'(?:src|href)="(/webui/[^"]+)"', page)
    assert sorted(r.decode() for r in refs) == sorted(p for p in SOURCES if p != "/")
    assert not re.search(rb"<script>|<script [^>]*>[^<]|<style|\son[a-z]+=", page)
    etags = set()
    for path, src in SOURCES.items():
        st, h, body = s.request("GET", path)
        assert st == 200, path
        if path != "/":
            assert h["content-type"] == TYPES[os.path.splitext(path)[1]], path
        check_headers(h, path)
        etags.add(h["etag"])
        if os.path.exists(src):  # the file as embedded, byte for byte
            with open(src, "rb") as f:
                assert body == f.read(), path
        else:
            assert len(body) > 100, path
        # HEAD: the same headers and length, no body
        st2, h2, body2 = s.request("HEAD", path)
        assert st2 == 200 and body2 == b"" and h2["content-length"] == str(len(body))
        assert h2["etag"] == h["etag"]
    assert len(etags) == len(SOURCES)  # one per file
    # a query string changes nothing; other methods and names are refused
    st, h, body = s.request("GET", "/?utm=1")
    assert st == 200 and body == page
    st, h, _ = s.request("POST", "/", b"x")
    assert st == 405 and h["allow"] == "GET, HEAD"
    for bad in ("/webui/nope.js", "/webui/", "/webui/../v1/models", "/index.htm"):
        st, h, body = s.request("GET", bad)
        assert st == 404, bad
        assert b"Unknown route" in body


def test_etag_304(serve):
    s = serve()
    st, h, body = s.request("GET", "/webui/app.js")
    tag = h["etag"]
    for inm in (tag, f"W/{tag}", f'"nope", {tag}', f'"a,b" , W/{tag}', "*"):
        st, h2, body2 = s.request("GET", "/webui/app.js", headers={"If-None-Match": inm})
        assert st == 304 and body2 == b"", inm
        assert h2["etag"] == tag and h2["cache-control"] == "no-cache"
        # RFC 9110 8.6: a 304's Content-Length, when sent, is the 200's
        assert h2.get("content-length", str(len(body))) == str(len(body))
    for inm in ('"nope"', tag[:-2] + '"', tag.strip('"'), "W/", '"', ","):
        st, h2, body2 = s.request("GET", "/webui/app.js", headers={"If-None-Match": inm})
        assert st == 200 and body2 == body, inm
    # another file's tag is not this one's
    _, hp, _ = s.request("GET", "/")
    st, _, _ = s.request("GET", "/webui/app.js", headers={"If-None-Match": hp["etag"]})
    assert st == 200
    # a 304 sends no body: the next request on the connection is read right
    c = socket.create_connection((s.host, s.port), timeout=10)
    try:
        c.sendall(f"GET / HTTP/1.1\r\nHost: x\r\nIf-None-Match: {hp['etag']}\r\n\r\n"
                  "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got, closed = read_http(c, timeout=10)
    finally:
        c.close()
    first, _, rest = got.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 304 ")
    assert rest.startswith(b"HTTP/1.1 200 ") and rest.endswith(b'{"status":"ok"}'), got
    m = s.metrics()
    assert m['smelt_http_requests_total{status="304"}'] == 6


def test_api_key_guards_the_api_not_the_page(serve):
    s = serve("--api-key", "sesame", "--cors-origins", "https://a.example")
    for path in SOURCES:
        st, h, body = s.request("GET", path)
        assert st == 200 and body, path
        assert "access-control-allow-origin" not in h  # (no Origin: the page's own load)
    # --cors-origins: the files carry the CORS headers too, their CSP unchanged; a preflight is
    # answered without the key with the route's methods
    st, h, _ = s.request("GET", "/webui/app.js", headers={"Origin": "https://a.example"})
    assert st == 200 and h["access-control-allow-origin"] == "https://a.example"
    check_headers(h, "/webui/app.js")
    st, h, _ = s.request("OPTIONS", "/", headers={"Origin": "https://a.example",
                                                  "Access-Control-Request-Method": "GET"})
    assert st == 204 and h["access-control-allow-methods"] == "GET, HEAD, OPTIONS"
    # a body on the page's routes is refused on the headers, as on every route that takes none
    st, _, _ = s.request("GET", "/", b"x" * 10)
    assert st == 413
    key = {"Authorization": "Bearer sesame"}
    st, _, _ = s.request("GET", "/v1/models")
    assert st == 401
    st, _, _ = s.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert st == 401
    st, _, _ = s.request("GET", "/v1/models", headers=key)
    assert st == 200
    st, _, _ = s.request("POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
                         headers=key)
    assert st == 200
    # an unknown path still needs the key first (only the web chat's own files are open)
    st, _, _ = s.request("GET", "/webuix")
    assert st == 401


def test_no_webui_and_admin_port(serve):
    s = serve("--no-webui", "--admin-port", "0")
    assert not any("web chat" in l for l in s.lines)
    for path in SOURCES:
        st, h, body = s.request("GET", path)
        assert st == 404 and b"Unknown route" in body, path
        assert "content-security-policy" not in h
    st, _, _ = s.request("GET", "/v1/models")
    assert st == 200
    # the settings table's other layers: the environment, and a flag over it
    off = serve(env={"SMELT_NO_WEBUI": "1"})
    assert off.request("GET", "/")[0] == 404
    back = serve("--no-webui=false", env={"SMELT_NO_WEBUI": "1"})
    assert back.request("GET", "/")[0] == 200
    on = serve("--admin-port", "0")
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", on.admin_port, timeout=10)
    c.request("GET", "/")
    r = c.getresponse()
    r.read()
    c.close()
    assert r.status == 404  # the admin port serves /health and /metrics only
