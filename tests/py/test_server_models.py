"""Several models in one `smelt serve` (docs/server.md, "Several models"): routing by the
request's "model", /v1/models with each model's state, loading on demand in the loader thread
(other models' requests go on meanwhile; a request waits for its model's load, up to
--timeout), unloading the least recently used idle model (--max-loaded-models), pinned
models, a model that fails to load, concurrent requests to two models, metrics per model.

The models are tiny random llamas (tiny_llama.py) with different vocabularies (300, 500 and
700 tokens), so a request served by the wrong model shows: a prompt token id that only the
larger vocabularies hold is refused by the smaller, and /tokenize counts differ."""
import json
import os
import re
import threading
import time

import pytest

from smelt_server import SMELT, Server

pytest.importorskip("gguf")
from tiny_llama import write_tiny_llama  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    paths = {
        "v300": write_tiny_llama(str(d / "v300.gguf"), 300, seed=1, n_ctx=1024),
        "v500": write_tiny_llama(str(d / "v500.gguf"), 500, seed=2, n_ctx=2048),
        "v700": write_tiny_llama(str(d / "v700.gguf"), 700, seed=3, n_ctx=4096),
    }
    paths["dir"] = str(d)
    (d / "bad").mkdir()
    broken = d / "bad" / "broken.gguf"
    broken.write_bytes(b"GGUF but not really")
    paths["broken"] = str(broken)
    return paths


def config(tmp_path, text):
    p = tmp_path / "smelt.yaml"
    p.write_text(text)
    return str(p)


def serve(*args, env=None):
    e = {"XDG_CONFIG_HOME": "/nonexistent"}
    e.update(env or {})
    return Server(*args, "-t", "1", "--quiet", env=e, start_timeout=60)


def complete(s, model, prompt="hello t5 t6", n=8, **kw):
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, **kw}
    return s.post("/v1/completions", body, timeout=60)


def models_state(s):
    st, h, body = s.request("GET", "/v1/models")
    assert st == 200
    return {m["id"]: m["status"]["value"] for m in json.loads(body)["data"]}


def test_routing_by_model_field(tiny, tmp_path):
    s = serve(tiny["v300"], tiny["v700"])
    try:
        # the first model is loaded at start, the other on its first request
        assert models_state(s) == {"v300": "loaded", "v700": "unloaded"}
        # token 650 exists only in the 700-token vocabulary: the route decides the answer
        st, j = complete(s, "v700", prompt=[5, 650])
        assert st == 200 and j["model"] == "v700", j
        st, j = complete(s, "v300", prompt=[5, 650])
        assert st == 400 and "(0..299)" in j["error"]["message"], j
        assert models_state(s) == {"v300": "loaded", "v700": "loaded"}
        # the file as given names the model too (not listed)
        st, j = complete(s, tiny["v700"], prompt=[5, 650])
        assert st == 200 and j["model"] == "v700"
        # no "model": the default (first) model
        st, j = s.post("/v1/completions", {"prompt": [5, 250], "max_tokens": 2})
        assert st == 200 and j["model"] == "v300"
        # /tokenize and /detokenize route too (the two files' contexts differ)
        st, a = s.post("/tokenize", {"model": "v700", "content": "t400"})
        st2, b = s.post("/tokenize", {"model": "v300", "content": "t400"})
        assert st == st2 == 200 and (a["max_model_len"], b["max_model_len"]) == (4096, 1024)
        st, d = s.post("/detokenize", {"model": "v300", "tokens": [650]})
        assert st == 400 and d["error"]["param"] == "tokens"
        st, d = s.post("/detokenize", {"model": "v700", "tokens": [650]})
        assert st == 200 and d["content"] == "t391", d
        # chat routes by the same field (the ChatML default template: no template in the files)
        st, j = s.post("/v1/chat/completions", {"model": "v700", "max_tokens": 3,
                                                "messages": [{"role": "user", "content": "hi"}]})
        assert st == 200 and j["model"] == "v700"
        # the same greedy text from the same model, whichever order
        t1 = complete(s, "v700")[1]["choices"][0]["text"]
        t2 = complete(s, "v300")[1]["choices"][0]["text"]
        assert complete(s, "v700")[1]["choices"][0]["text"] == t1 and t1 != t2
    finally:
        assert s.stop() == 0


def test_unknown_model_404(tiny):
    s = serve(tiny["v300"], tiny["v500"])
    try:
        for path, body in (("/v1/completions", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                           ("/tokenize", {"content": "x"})):
            st, j = s.post(path, {"model": "gpt-4", **body})
            assert st == 404 and j["error"]["code"] == "model_not_found", j
            assert j["error"]["param"] == "model" and "'v300' and 'v500'" in j["error"]["message"]
        st, h, body = s.request("GET", "/v1/models/gpt-4")
        assert st == 404 and json.loads(body)["error"]["code"] == "model_not_found"
        st, h, body = s.request("GET", "/v1/models/v500")
        j = json.loads(body)
        assert st == 200 and j["id"] == "v500" and j["status"] == {"value": "unloaded"}
        assert models_state(s)["v500"] == "unloaded"  # neither 404 nor a listing loads it
    finally:
        assert s.stop() == 0


def test_lru_unload_and_reload(tiny, tmp_path):
    s = serve(tiny["v300"], tiny["v500"], tiny["v700"], "--max-loaded-models", "2")
    try:
        first = {m: complete(s, m)[1]["choices"][0]["text"] for m in ("v300", "v500")}
        assert models_state(s) == {"v300": "loaded", "v500": "loaded", "v700": "unloaded"}
        # v700 needs room: v300 is the least recently used
        assert complete(s, "v700")[0] == 200
        assert models_state(s) == {"v300": "unloaded", "v500": "loaded", "v700": "loaded"}
        # using v500 makes v700 the least recently used one
        assert complete(s, "v500")[0] == 200
        st, j = complete(s, "v300")
        assert st == 200 and j["choices"][0]["text"] == first["v300"]  # reloaded, same model
        assert models_state(s) == {"v300": "loaded", "v500": "loaded", "v700": "unloaded"}
        m = s.metrics()
        assert m['smelt_model_unloads_total{model="v300"}'] == 1
        assert m['smelt_model_unloads_total{model="v700"}'] == 1
        assert m['smelt_model_loads_total{model="v300"}'] == 2
        assert m['smelt_model_loaded{model="v700"}'] == 0
        # counters run across unloads: v300 generated its tokens in two loads
        assert m['smelt_generation_tokens_total{model="v300"}'] == 16
        assert m["smelt_generation_tokens_total"] == 16 + 16 + 8
    finally:
        assert s.stop() == 0


def test_pinned_model_stays(tiny, tmp_path):
    cfg = config(tmp_path, f"""
max_loaded_models: 2
models:
  - model: {tiny["v300"]}
  - model: {tiny["v500"]}
  - model: {tiny["v700"]}
    pinned: true
""")
    s = serve("--config=" + cfg)
    try:
        # loaded at start: the default model and the pinned one
        assert models_state(s) == {"v300": "loaded", "v500": "unloaded", "v700": "loaded"}
        for m in ("v500", "v300", "v500"):
            assert complete(s, m)[0] == 200
            assert models_state(s)["v700"] == "loaded"
        assert models_state(s) == {"v300": "unloaded", "v500": "loaded", "v700": "loaded"}
    finally:
        assert s.stop() == 0


def wait_state(s, model, want, limit=5.0):
    """Seconds until model's state is want (polling /v1/models), or fails after limit."""
    t0 = time.time()
    while models_state(s)[model] != want:
        assert time.time() - t0 < limit, (model, want, models_state(s))
        time.sleep(0.02)
    return time.time() - t0


def test_load_unload_endpoints_and_ttl(tiny, tmp_path):
    # llama.cpp router's POST /models/load and /models/unload; llama-swap's per-model ttl
    cfg = config(tmp_path, f"""
models:
  - model: {tiny["v300"]}
  - model: {tiny["v500"]}
    ttl: 0.6
  - model: {tiny["v700"]}
    pinned: true
    ttl: 0.01
""")
    s = serve("--config=" + cfg)
    try:
        assert models_state(s) == {"v300": "loaded", "v500": "unloaded", "v700": "loaded"}
        # load answers once the model is loaded; loading a loaded one is a no-op
        for _ in range(2):
            st, j = s.post("/models/load", {"model": "v500"})
            assert st == 200 and j == {"success": True}, j
            assert models_state(s)["v500"] == "loaded"
        # v500's ttl runs from its last request: used every 0.2 s it stays loaded ...
        for _ in range(5):
            assert complete(s, "v500", n=2)[0] == 200
            s.metrics()  # (a scrape is not a use)
            time.sleep(0.2)
        m = s.metrics()
        assert m['smelt_model_loads_total{model="v500"}'] == 1
        assert m['smelt_model_unloads_total{model="v500"}'] == 0
        # ... and idle it is unloaded (logged), then loaded again by the next request
        t = wait_state(s, "v500", "unloaded")
        assert t < 3 and "model v500: unloading (idle for its ttl)" in s.log()
        assert complete(s, "v500", n=2)[0] == 200
        # unload: the default model too; the next request loads it again (same text)
        text = complete(s, "v300")[1]["choices"][0]["text"]
        st, j = s.post("/v1/models/unload", {"model": "v300"})
        assert st == 200 and j == {"success": True}, j
        wait_state(s, "v300", "unloaded")
        assert "model v300: unloading (asked for)" in s.log()
        st, j = s.post("/models/unload", {"model": "v300"})  # not loaded: nothing to do
        assert st == 200 and j == {"success": True}
        assert complete(s, "v300")[1]["choices"][0]["text"] == text
        # the pinned one stays, whatever its ttl; refusals name the field
        st, j = s.post("/models/unload", {"model": "v700"})
        assert st == 400 and j["error"]["code"] == "model_pinned" and "v700" in j["error"]["message"]
        assert models_state(s)["v700"] == "loaded"
        for body, status, param in (({"model": "gpt-4"}, 404, "model"), ({}, 400, "model"),
                                    ({"model": 3}, 400, "model")):
            for path in ("/models/load", "/models/unload"):
                st, j = s.post(path, body)
                assert st == status and j["error"]["param"] == param, (path, body, j)
        st, h, body = s.request("GET", "/models/load")
        assert st == 405
        st, h, body = s.request("POST", "/models/unload", b"[1]")
        assert st == 400 and json.loads(body)["error"]["param"] is None
    finally:
        assert s.stop() == 0


def test_load_failure_is_reported_and_isolated(tiny, tmp_path):
    cfg = config(tmp_path, f"""
models:
  - model: {tiny["v300"]}
  - model: {tiny["broken"]}
    name: broken
""")
    s = serve("--config=" + cfg)
    try:
        for attempt in (1, 2):  # each request tries again
            st, j = complete(s, "broken")
            assert st == 500 and j["error"]["code"] == "model_load_failed", j
            assert "broken" in j["error"]["message"] and "GGUF" in j["error"]["message"], j
            assert s.metrics()['smelt_model_load_failures_total{model="broken"}'] == attempt
        st, h, body = s.request("GET", "/v1/models/broken")
        status = json.loads(body)["status"]
        assert status["value"] == "unloaded" and status["failed"] and "GGUF" in status["error"]
        assert complete(s, "v300")[0] == 200  # the other model is unaffected
        deadline = time.time() + 5
        while "the load failed" not in s.log() and time.time() < deadline:
            time.sleep(0.05)
        assert re.search(r"model broken: the load failed: .*GGUF", s.log()), s.log()
    finally:
        assert s.stop() == 0


def test_loading_blocks_no_other_model(tiny, tmp_path):
    # v700 takes 1.5 s to load: v300's requests are answered meanwhile, v700's wait for it
    cfg = config(tmp_path, f"""
models:
  - model: {tiny["v300"]}
  - model: {tiny["v700"]}
    fake_load_ms: 1500
""")
    s = serve("--config=" + cfg)
    try:
        out = {}
        t0 = time.time()
        th = threading.Thread(target=lambda: out.update(r=complete(s, "v700", prompt=[5, 650]),
                                                         t=time.time() - t0))
        th.start()
        time.sleep(0.3)
        assert models_state(s)["v700"] == "loading"
        times = []
        for _ in range(5):
            t = time.time()
            assert complete(s, "v300")[0] == 200
            times.append(time.time() - t)
        th.join(30)
        assert out["r"][0] == 200 and out["t"] >= 1.4, out
        assert max(times) < 1.0 and time.time() - t0 < out["t"] + 1, times
    finally:
        assert s.stop() == 0


def test_waiting_is_bounded_by_the_timeout(tiny, tmp_path):
    cfg = config(tmp_path, f"""
timeout: 1
header_timeout: 1
models:
  - model: {tiny["v300"]}
  - model: {tiny["v500"]}
    fake_load_ms: 3000
""")
    s = serve("--config=" + cfg)
    try:
        t = time.time()
        st, j = complete(s, "v500")
        took = time.time() - t
        assert st == 503 and j["error"]["code"] == "model_loading", j
        assert 0.9 < took < 2.5, took
        # the load goes on; a later request gets the model
        deadline = time.time() + 10
        while models_state(s)["v500"] != "loaded" and time.time() < deadline:
            time.sleep(0.1)
        assert complete(s, "v500")[0] == 200
    finally:
        assert s.stop() == 0


def test_client_gone_while_waiting(tiny, tmp_path):
    import socket
    cfg = config(tmp_path, f"""
log_format: json
models:
  - model: {tiny["v300"]}
  - model: {tiny["v500"]}
    fake_load_ms: 1500
""")
    s = Server("--config=" + cfg, "-t", "1", env={"XDG_CONFIG_HOME": "/nonexistent"})
    try:
        body = json.dumps({"model": "v500", "prompt": "x", "max_tokens": 2}).encode()
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.3)
        c.close()
        deadline = time.time() + 5
        while not any('"status":499' in l for l in s.lines) and time.time() < deadline:
            time.sleep(0.05)
        assert any('"status":499' in l for l in s.lines), s.log()
        # the load itself finishes, and serves the next request
        st, j = complete(s, "v500")
        assert st == 200
    finally:
        assert s.stop() == 0


def test_concurrent_requests_to_two_models(tiny):
    s = serve(tiny["v300"], tiny["v700"])
    try:
        prompts = {m: [f"t{i} t{i + 1} hello" for i in range(6)] for m in ("v300", "v700")}
        solo, n_solo = {}, {"v300": 0, "v700": 0}
        for m in prompts:
            for p in prompts[m]:
                st, j = complete(s, m, prompt=p, n=12)
                solo[(m, p)] = j["choices"][0]["text"]
                n_solo[m] += j["usage"]["completion_tokens"]
        got = {}

        def one(m, p):
            st, evs, _ = s.stream("/v1/completions", {"model": m, "prompt": p, "max_tokens": 12,
                                                      "temperature": 0, "stream": True})
            got[(m, p)] = (st, "".join(e["choices"][0]["text"] for e in evs
                                       if isinstance(e, dict) and e.get("choices")))
        ths = [threading.Thread(target=one, args=(m, p)) for m in prompts for p in prompts[m]]
        for t in ths:
            t.start()
        for t in ths:
            t.join(60)
        assert len(got) == 12
        for k, (st, text) in got.items():
            assert st == 200 and text == solo[k], (k, text, solo[k])
        m = s.metrics()
        assert m['smelt_generation_tokens_total{model="v300"}'] == 2 * n_solo["v300"]
        assert m['smelt_generation_tokens_total{model="v700"}'] == 2 * n_solo["v700"]
    finally:
        assert s.stop() == 0


def test_models_dir_and_aliases(tiny, tmp_path):
    s = serve("--models-dir=" + tiny["dir"])
    try:
        # every GGUF of the folder, sorted, none loaded before it is asked for (the folder
        # bad/ holds a file named .gguf too: a folder holding one is a model)
        st, h, body = s.request("GET", "/v1/models")
        ids = [m["id"] for m in json.loads(body)["data"]]
        assert ids == ["bad", "v300", "v500", "v700"], ids
        assert set(models_state(s).values()) == {"unloaded"}
        assert complete(s, "v500")[0] == 200
        assert complete(s, "bad")[0] == 500
    finally:
        assert s.stop() == 0
    cfg = config(tmp_path, f"""
models:
  - model: {tiny["v300"]}
    name: small
    aliases: [gpt-4o-mini]
  - model: {tiny["v700"]}
    name: large
""")
    s = serve("--config=" + cfg)
    try:
        st, h, body = s.request("GET", "/v1/models")
        assert [m["id"] for m in json.loads(body)["data"]] == ["small", "gpt-4o-mini", "large"]
        st, j = complete(s, "gpt-4o-mini", prompt=[5, 650])
        assert st == 400  # the alias is the small model
        st, j = complete(s, tiny["v700"], prompt=[5, 650])  # a named model: by its names only
        assert st == 404
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("args,want", [
    (["{v300}", "{v300}"], "the model name 'v300' is given twice"),
    (["{v300}", "{v500}", "--served-model-name", "x"], "--served-model-name names one model"),
    (["--models-dir", "/nonexistent"], "--models-dir /nonexistent"),
])
def test_refused_at_start(tiny, args, want):
    import subprocess
    args = [a.format(**tiny) for a in args]
    r = subprocess.run([SMELT, "serve", *args, "--port", "0"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "XDG_CONFIG_HOME": "/nonexistent"})
    assert r.returncode != 0 and want in r.stderr, r.stderr
