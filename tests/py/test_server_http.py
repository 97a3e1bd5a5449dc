"""smelt serve over raw HTTP on a tiny random model: routes, OpenAI error shapes and
statuses (hostile bodies included), auth, completions features (prompts, n, echo, stop,
seeds, logprobs, streaming, usage, cached tokens), disconnects, timeouts, shutdown.

The reference for "what the text should be" is the server itself run one request at a
time (greedy decoding is deterministic), and the tokenizer's own detokenize route; the
OpenAI shapes are checked field by field against the API reference."""
import json
import os
import signal
import socket
import threading
import time

import pytest

from smelt_server import SMELT, Server, completion_text, make_tiny, parse_responses, raw_http

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny(str(tmp_path_factory.mktemp("models") / "tiny.gguf"))


@pytest.fixture(scope="module")
def srv(tiny):
    s = Server(tiny, "-c", "256", "--max-body", "2000000", "--max-seqs", "32", "-t", "1")
    yield s
    assert s.stop() == 0, s.log()


def err_of(st, j, status, param=None, code=None):
    assert st == status, (st, j)
    e = j["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"]
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    return e


# ---- routes ----

def test_health_models_metrics(srv):
    st, h, body = srv.request("GET", "/health")
    assert st == 200 and json.loads(body) == {"status": "ok"}
    for path in ("/v1/models", "/models"):
        st, h, body = srv.request("GET", path)
        j = json.loads(body)
        assert st == 200 and j["object"] == "list"
        assert j["data"][0]["object"] == "model" and j["data"][0]["id"] == "tiny"
    st, h, body = srv.request("GET", "/v1/models/tiny")
    assert st == 200 and json.loads(body)["id"] == "tiny"
    st, j = srv.request("GET", "/v1/models/nope")[0], json.loads(srv.request("GET", "/v1/models/nope")[2])
    err_of(st, j, 404, code="model_not_found")
    m = srv.metrics()
    for name in ("smelt_num_requests_running", "smelt_num_requests_waiting", "smelt_kv_blocks_used",
                 "smelt_kv_blocks_cached", "smelt_prefix_cache_hit_rate", "smelt_prompt_tokens_total",
                 "smelt_generation_tokens_total", 'smelt_http_requests_total{status="200"}',
                 'smelt_time_to_first_token_seconds_bucket{le="+Inf"}',
                 "smelt_inter_token_latency_seconds_count"):
        assert name in m, name


def test_metrics_show_the_pool_before_any_request(tiny):
    # the KV gauges describe the pool from the start, not only after the first step
    s = Server(tiny, "-c", "256", "-t", "1")
    try:
        m = s.metrics()
        assert m["smelt_kv_blocks_total"] > 0
        assert m["smelt_kv_blocks_free"] == m["smelt_kv_blocks_total"]
        assert m["smelt_kv_blocks_used"] == 0
    finally:
        s.stop()


def test_unknown_route_and_method(srv):
    st, h, body = srv.request("GET", "/v1/nothing")
    err_of(st, json.loads(body), 404)
    before = srv.metrics().get('smelt_http_requests_total{status="405"}', 0)
    st, h, body = srv.request("GET", "/v1/completions")
    assert st == 405
    assert srv.metrics()['smelt_http_requests_total{status="405"}'] == before + 1
    st, j = srv.post("/v1/completions", {"model": "gpt-4", "prompt": "hi"})
    err_of(st, j, 404, param="model", code="model_not_found")


# ---- errors ----

@pytest.mark.parametrize("body,param", [
    (b'{"prompt": "hi"', None),                                  # malformed
    (b'{"prompt": "hi", "prompt": "again"}', None),              # duplicate keys
    (b'{"prompt": "a\\u0000b"}', None),                          # NUL in a string
    (b'{"prompt": "a\x00b"}', None),                             # raw NUL byte
    (b'{"prompt": "caf\xe9"}', None),                            # invalid UTF-8
    (b"[" * 100000 + b"]" * 100000, None),                       # deep nesting
    (b'"just a string"', None),
    (b'{"prompt": 5}', "prompt"),
    (b'{"prompt": "hi", "max_tokens": "ten"}', "max_tokens"),
    (b'{"prompt": "hi", "temperature": -1}', "temperature"),
    (b'{"prompt": "hi", "n": 1000}', "n"),
    (b'{"prompt": "hi", "top_logprobs": 2}', "top_logprobs"),    # a chat-only field
    (b'{"prompt": "hi", "response_format": {"type": "xml"}}', "response_format"),
    (b'{"prompt": "hi", "grammar": "root ::= nope"}', "grammar"),             # undefined rule
    (b'{"prompt": "hi", "json_schema": {"type": "object", "not": {}}}', "json_schema"),
    (b'{"prompt": [99999]}', "prompt"),
])
def test_bad_requests(srv, body, param):
    st, h, data = srv.request("POST", "/v1/completions", body)
    e = err_of(st, json.loads(data), 400, param=param)
    assert e["type"] == "invalid_request_error"


# hostile JSON for every JSON route; F is replaced by the route's own field
HOSTILE = [
    b'{"F": 1',                                  # malformed
    b'{"F": 1, "F": 2}',                         # duplicate keys
    b'{"F": "x\\u0000y"}',                       # NUL in a string (escaped)
    b'{"F": "x\x00y"}',                          # raw NUL byte
    b'{"F": "caf\xe9"}',                         # invalid UTF-8
    b'{"F": "\xed\xa0\x80"}',                    # a UTF-16 surrogate in UTF-8
    b"[" * 100000 + b"]" * 100000,               # deep nesting
    b'{"F":' * 50000 + b"1" + b"}" * 50000,
    b'"just a string"',
    b"",
]
BAD_STRINGS = [b'"x\\u0000y"', b'"x\x00y"', b'"caf\xe9"', b'"\xed\xa0\x80"']


@pytest.mark.parametrize("path,field", [
    ("/v1/chat/completions", "messages"), ("/tokenize", "content"), ("/detokenize", "tokens")])
@pytest.mark.parametrize("i", range(len(HOSTILE)))
def test_hostile_bodies_every_json_route(srv, path, field, i):
    st, h, data = srv.request("POST", path, HOSTILE[i].replace(b'"F"', b'"' + field.encode() + b'"'))
    e = err_of(st, json.loads(data), 400)
    assert e["type"] == "invalid_request_error"


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_hostile_strings_inside_chat_and_tokenize(srv, bad):
    for path, body in (
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ' + bad + b'}]}'),
            ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], '
                                     b'"tools": [{"type": "function", "function": {"name": ' +
                                     bad + b'}}]}'),
            ("/tokenize", b'{"messages": [{"role": "user", "content": ' + bad + b'}]}'),
            ("/tokenize", b'{"content": "ok", "with_pieces": ' + bad + b'}')):
        st, h, data = srv.request("POST", path, body)
        err_of(st, json.loads(data), 400)


def test_huge_strings_at_the_default_body_limit(tiny):
    # 10 MB strings under the default 32 MiB body limit are parsed, then refused cleanly
    s = Server(tiny, "-c", "256", "-t", "1")
    try:
        big = "y" * 10_000_000
        for path, body, param in (
                ("/v1/completions", {"prompt": big}, "prompt"),
                ("/v1/completions", {"prompt": "hi", "stop": big}, "stop"),
                ("/v1/completions", {"prompt": "hi", "user": "u", "junk": big}, "junk"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}]},
                 "messages"),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                          "tools": [{"type": "function", "function": {
                                              "name": "f", "description": big}}]}, "tools"),
                ("/tokenize", {"content": big}, "content"),
                ("/detokenize", {"tokens": big}, "tokens")):
            t0 = time.time()
            st, j = s.post(path, body, timeout=60)
            assert time.time() - t0 < 10, path
            e = err_of(st, j, 400, param=param)
            assert len(e["message"]) < 2000  # the string is not echoed back
        # large valid requests still work
        st, j = s.post("/detokenize", {"tokens": [5] * 500_000}, timeout=60)
        assert st == 200 and len(j["content"]) > 0
        st, j = s.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert st == 200
    finally:
        assert s.stop() == 0, s.log()


def test_prompt_too_long_names_both_counts(srv):
    import re
    # tokenized: ~1000 byte tokens in 1000 bytes
    st, j = srv.post("/v1/completions", {"prompt": "x " * 500, "max_tokens": 4})
    e = err_of(st, j, 400, param="prompt", code="context_length_exceeded")
    assert "256" in e["message"] and "exactly" in e["message"] and "estimate" not in e["message"]
    n = int(re.search(r"resulted in (\d+) tokens", e["message"]).group(1))
    assert n > 256
    st, t = srv.post("/tokenize", {"content": "x " * 500})
    assert t["count"] == n
    # refused by length before tokenizing: still both counts, said to be an estimate, and
    # the field named is the endpoint's own
    for path, body, param in (
            ("/v1/completions", {"prompt": "word " * 400, "max_tokens": 4}, "prompt"),
            ("/v1/completions", {"prompt": ["hi", "word " * 400]}, "prompt"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 400}]},
             "messages"),
            ("/tokenize", {"content": "word " * 400}, "content")):
        st, j = srv.post(path, body)
        e = err_of(st, j, 400, param=param, code="context_length_exceeded")
        m = re.search(r"maximum context length is (\d+) tokens.*at least (\d+) tokens",
                      e["message"])
        assert m and int(m.group(1)) == 256 and int(m.group(2)) >= 256, e["message"]
        assert "estimate" in e["message"] and "exactly" not in e["message"], e["message"]
    st, j = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 200}]})
    e = err_of(st, j, 400, param="messages", code="context_length_exceeded")
    assert "exactly" in e["message"]
    # prompt + max_tokens over the context
    st, j = srv.post("/v1/completions", {"prompt": "word " * 20, "max_tokens": 250})
    err_of(st, j, 400, param="max_tokens", code="context_length_exceeded")


def test_huge_string_and_body_limit(srv):
    # 1.5 MB string: under the body limit, far over the context (refused before tokenizing)
    t0 = time.time()
    st, j = srv.post("/v1/completions", {"prompt": "x" * 1_500_000})
    err_of(st, j, 400, code="context_length_exceeded")
    assert time.time() - t0 < 10
    # 10 MB: over the body limit, refused on its Content-Length before the body is read (a
    # client that sends it anyway has the answer waiting when its send is cut short)
    body = b'{"prompt": "' + b"y" * 10_000_000 + b'"}'
    got, closed = raw_http(srv.host, srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Length: %d\r\n\r\n" % len(body) + body)
    (st, h, data), = parse_responses(got)
    err_of(st, json.loads(data), 413)
    assert closed and h["connection"] == ["close"]
    # the same without Content-Length (chunked upload): refused once the limit is passed
    chunks = b"".join(b"%x\r\n%s\r\n" % (100_000, b"z" * 100_000) for _ in range(30))
    got, closed = raw_http(srv.host, srv.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
    (st, h, data), = parse_responses(got)
    err_of(st, json.loads(data), 413)
    assert closed


def test_auth(tiny):
    s = Server(tiny, "--api-key", "sekrit", "-t", "1")
    try:
        st, h, body = s.request("GET", "/health")
        assert st == 200
        st, h, body = s.request("GET", "/v1/models")
        e = err_of(st, json.loads(body), 401)
        assert e["type"] == "authentication_error"
        st, h, body = s.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert st == 401
        # a prefix, an extension, another case, an empty key, another scheme: all refused
        for h in ("Bearer sekritX", "Bearer sekri", "Bearer SEKRIT", "Bearer ", "Bearer",
                  "Basic sekrit", "sekrit", "Bearer sekrit\t", "Bearer " + "s" * 5000):
            st, _, body = s.request("GET", "/v1/models", headers={"Authorization": h})
            assert st == 401, h
        # the scheme is case-insensitive, spaces before the key are skipped
        for h in ("bearer sekrit", "Bearer   sekrit"):
            assert s.request("GET", "/v1/models", headers={"Authorization": h})[0] == 200, h
        st, h, body = s.request("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert st == 401
        st, h, body = s.request("GET", "/metrics")
        assert st == 401
        st, h, body = s.request("GET", "/v1/models", headers={"Authorization": "Bearer sekrit"})
        assert st == 200
    finally:
        s.stop()
    # the environment variable works too
    s = Server(tiny, "-t", "1", env={"SMELT_API_KEY": "envkey"})
    try:
        assert s.request("GET", "/v1/models")[0] == 401
        assert s.request("GET", "/v1/models", headers={"Authorization": "Bearer envkey"})[0] == 200
    finally:
        s.stop()


def test_queue_full_429(tiny):
    s = Server(tiny, "--fake-forward", "--fake-step-ms", "30", "--max-seqs", "1",
               "--max-waiting", "1", "-t", "1")
    try:
        results = []

        def one():
            results.append(s.request("POST", "/v1/completions",
                                     {"prompt": "hi", "max_tokens": 20, "ignore_eos": True}))
        ts = [threading.Thread(target=one) for _ in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        statuses = sorted(r[0] for r in results)
        assert 200 in statuses and 429 in statuses, statuses
        busy = [r for r in results if r[0] == 429][0]
        assert busy[1].get("retry-after") == "1"
        err_of(429, json.loads(busy[2]), 429, code="queue_full")
    finally:
        s.stop()


# ---- completions ----

def test_completion_shape_and_usage(srv):
    st, j = srv.post("/v1/completions", {"model": "tiny", "prompt": "Hello world", "max_tokens": 5,
                                         "temperature": 0, "ignore_eos": True})
    assert st == 200, j
    assert j["object"] == "text_completion" and j["id"].startswith("cmpl-")
    assert j["model"] == "tiny" and isinstance(j["created"], int) and j["system_fingerprint"]
    c = j["choices"][0]
    assert c["index"] == 0 and c["finish_reason"] == "length" and c["logprobs"] is None
    u = j["usage"]
    assert u["completion_tokens"] == 5 and u["total_tokens"] == u["prompt_tokens"] + 5
    assert set(u["prompt_tokens_details"]) == {"cached_tokens", "audio_tokens"}
    assert u["completion_tokens_details"] == {"reasoning_tokens": 0, "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0, "audio_tokens": 0}
    # the same text through the detokenizer: the completion is what its tokens decode to
    st, t = srv.post("/tokenize", {"content": "Hello world"})
    assert st == 200 and t["count"] == u["prompt_tokens"]


def test_prompt_forms_and_n(srv):
    base = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
    st, a = srv.post("/v1/completions", dict(base, prompt="alpha beta"))
    st, ids = srv.post("/tokenize", {"content": "alpha beta"})
    st, b = srv.post("/v1/completions", dict(base, prompt=ids["tokens"]))
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    st, m = srv.post("/v1/completions", dict(base, prompt=["alpha beta", "gamma", ids["tokens"]], n=2))
    assert st == 200 and len(m["choices"]) == 6
    assert [c["index"] for c in m["choices"]] == list(range(6))
    texts = [c["text"] for c in m["choices"]]
    assert texts[0] == texts[1] == texts[4] == texts[5] == a["choices"][0]["text"]
    assert m["usage"]["completion_tokens"] == 24
    # echo
    st, e = srv.post("/v1/completions", dict(base, prompt="alpha beta", echo=True))
    assert e["choices"][0]["text"] == "alpha beta" + a["choices"][0]["text"]


def test_stop_strings_never_leak(srv):
    base = {"prompt": "one two three", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    st, full = srv.post("/v1/completions", base)
    text = full["choices"][0]["text"]
    assert len(text) > 12
    # a stop that starts inside one token and ends inside a later one
    stop = text[5:12]
    cut = text.index(stop)
    st, j = srv.post("/v1/completions", dict(base, stop=[stop, "\u2603never"]))
    assert j["choices"][0]["text"] == text[:cut]
    assert j["choices"][0]["finish_reason"] == "stop"
    st, events, raw = srv.stream("/v1/completions", dict(base, stop=stop, stream=True))
    assert completion_text(events) == text[:cut]
    assert stop not in raw and stop[:-1] not in completion_text(events)[cut - len(stop) + 1:]
    assert events[-2]["choices"][0]["finish_reason"] == "stop" and events[-1] == "[DONE]"


def test_seeds_and_sampling(srv):
    base = {"prompt": "seed test", "max_tokens": 16, "temperature": 1.0, "ignore_eos": True}
    a = srv.post("/v1/completions", dict(base, seed=123))[1]["choices"][0]["text"]
    b = srv.post("/v1/completions", dict(base, seed=123))[1]["choices"][0]["text"]
    c = srv.post("/v1/completions", dict(base, seed=124))[1]["choices"][0]["text"]
    assert a == b
    assert a != c
    # n > 1 with a seed: choices differ from each other, the request repeats exactly
    r1 = srv.post("/v1/completions", dict(base, seed=5, n=3))[1]
    r2 = srv.post("/v1/completions", dict(base, seed=5, n=3))[1]
    t1 = [x["text"] for x in r1["choices"]]
    assert t1 == [x["text"] for x in r2["choices"]]
    assert len(set(t1)) > 1
    # logit_bias: the tiny vocab's word tokens are ids 259..999 ("\u2581t<i>"); with all of
    # them banned only byte tokens remain, so no " t<digits>" word can appear
    import re
    assert re.search(r" t\d", a)
    bias = {str(i): -100 for i in range(259, 1000)}
    r = srv.post("/v1/completions", dict(base, seed=123, logit_bias=bias))[1]
    assert not re.search(r" t\d", r["choices"][0]["text"])


def test_logprobs_legacy(srv):
    st, j = srv.post("/v1/completions", {"prompt": "log probs", "max_tokens": 3, "temperature": 0,
                                         "logprobs": 2, "ignore_eos": True})
    lp = j["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 3 and len(lp["token_logprobs"]) == 3
    assert len(lp["top_logprobs"]) == 3 and len(lp["text_offset"]) == 3
    for tok, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert l <= 0 and len(top) <= 2
        # greedy: the chosen token is the most likely one
        assert abs(max(top.values()) - l) < 1e-5
    assert "".join(lp["tokens"]) == j["choices"][0]["text"]
    assert lp["text_offset"][0] == 0


def test_echo_logprobs_prompt_scoring(srv):
    # lm-evaluation-harness's loglikelihood request: echo + logprobs, one generated token
    st, j = srv.post("/v1/completions", {"prompt": "score this prompt please", "max_tokens": 1,
                                         "temperature": 0, "echo": True, "logprobs": 1})
    assert st == 200, j
    n = j["usage"]["prompt_tokens"]
    lp = j["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == n + 1 and len(lp["token_logprobs"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(d) == 1 for d in lp["top_logprobs"][1:])
    # the generated (greedy) token is the most likely one
    assert abs(max(lp["top_logprobs"][-1].values()) - lp["token_logprobs"][-1]) < 1e-5
    # max_tokens 0: the prompt alone; the same numbers; a second time from the prefix cache
    for _ in range(2):
        st, k = srv.post("/v1/completions", {"prompt": "score this prompt please", "max_tokens": 0,
                                             "echo": True, "logprobs": 1})
        lq = k["choices"][0]["logprobs"]
        assert len(lq["tokens"]) == n and k["usage"]["completion_tokens"] == 0
        assert all(abs(a - b) < 1e-4 for a, b in zip(lq["token_logprobs"][1:], lp["token_logprobs"][1:n]))


def stream_choices(events):
    """Streamed completion events -> {index: (text, legacy logprobs merged, finish)}."""
    out = {}
    for e in events[:-1]:
        if not isinstance(e, dict):
            continue
        for c in e["choices"]:
            text, lp, fin = out.get(c["index"], ("", None, None))
            text += c["text"]
            if c["logprobs"] is not None:
                lp = lp or {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
                for k in lp:
                    lp[k] += c["logprobs"][k]
            out[c["index"]] = (text, lp, c["finish_reason"] or fin)
    return out


@pytest.mark.parametrize("max_tokens", [0, 1, 3])
def test_echo_logprobs_streamed_like_whole(srv, max_tokens):
    # OpenAI's legacy completions: the first chunk of each choice carries the prompt and
    # its tokens' logprobs (the first null), then the generated tokens follow
    body = {"prompt": ["score this prompt", "and this one too"], "max_tokens": max_tokens,
            "temperature": 0, "echo": True, "logprobs": 2, "n": 2, "ignore_eos": True}
    st, whole = srv.post("/v1/completions", body)
    assert st == 200, whole
    st, events, raw = srv.stream("/v1/completions", dict(body, stream=True,
                                                          stream_options={"include_usage": True}))
    assert st == 200 and events[-1] == "[DONE]"
    got = stream_choices(events)
    assert sorted(got) == [0, 1, 2, 3]
    for c in whole["choices"]:
        text, lp, fin = got[c["index"]]
        assert text == c["text"] and fin == c["finish_reason"]
        w = c["logprobs"]
        assert lp["tokens"] == w["tokens"] and lp["text_offset"] == w["text_offset"]
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(abs(a - b) < 1e-5 for a, b in zip(lp["token_logprobs"][1:], w["token_logprobs"][1:]))
        for a, b in zip(lp["top_logprobs"][1:], w["top_logprobs"][1:]):
            assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-5 for k in a)
    # as many tokens as the prompt has, plus the generated ones
    st, t = srv.post("/tokenize", {"content": "and this one too"})
    assert len(got[2][1]["tokens"]) == len(got[3][1]["tokens"]) == t["count"] + max_tokens
    assert events[-2]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == 4 * max_tokens


def test_stream_shape_and_usage(srv):
    body = {"prompt": "stream me", "max_tokens": 6, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    st, events, raw = srv.stream("/v1/completions", body)
    assert st == 200 and events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    chunks = events[:-2]
    assert all(e["object"] == "text_completion" and e["usage"] is None for e in chunks)
    assert len({e["id"] for e in events[:-1]}) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    st, whole = srv.post("/v1/completions", dict(body, stream=False, stream_options=None))
    assert completion_text(chunks) == whole["choices"][0]["text"]


def test_stream_many_choices(srv):
    body = {"prompt": ["first prompt", "second one"], "n": 2, "max_tokens": 5, "temperature": 0,
            "ignore_eos": True}
    st, whole = srv.post("/v1/completions", body)
    st, events, raw = srv.stream("/v1/completions", dict(body, stream=True))
    texts, finish = {}, {}
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    assert sorted(texts) == [0, 1, 2, 3] and all(v == "length" for v in finish.values())
    assert [texts[i] for i in range(4)] == [c["text"] for c in whole["choices"]]
    # chat: every choice opens with the role
    st, events, raw = srv.stream("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 3,
        "temperature": 0.9, "seed": 1, "stream": True})
    roles = [c["index"] for e in events[:-1] for c in e["choices"] if c["delta"].get("role")]
    assert sorted(roles) == [0, 1, 2]


def test_cached_tokens_on_repeated_prefix(srv):
    prefix = "shared system prompt " * 8
    body = {"prompt": prefix + "first", "max_tokens": 2, "temperature": 0}
    st, a = srv.post("/v1/completions", body)
    st, b = srv.post("/v1/completions", dict(body, prompt=prefix + "second question"))
    n_prompt = a["usage"]["prompt_tokens"]
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 16 and cached % 16 == 0 and cached <= n_prompt
    m = srv.metrics()
    assert m["smelt_prompt_cached_tokens_total"] >= cached
    assert m["smelt_prefix_cache_hits_total"] > 0


def test_tokenize_detokenize(srv):
    st, t = srv.post("/tokenize", {"content": "round trip text", "add_special": False,
                                   "with_pieces": True})
    ids = [p["id"] for p in t["tokens"]]
    st, d = srv.post("/detokenize", {"tokens": ids})
    # (the tiny vocab spells spaces as byte-fallback "\u2581": its decode keeps them)
    assert st == 200 and d["content"].replace("\u2581", " ").strip() == "round trip text"
    st, j = srv.post("/detokenize", {"tokens": [1, 99999]})
    err_of(st, j, 400, param="tokens")


def test_chat_with_default_template(srv):
    msgs = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    st, j = srv.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 3,
                                              "temperature": 0})
    assert st == 200, j
    assert j["object"] == "chat.completion" and j["id"].startswith("chatcmpl-")
    msg = j["choices"][0]["message"]
    assert msg["role"] == "assistant" and isinstance(msg["content"], str)
    st, events, raw = srv.stream("/v1/chat/completions", {
        "messages": msgs, "max_tokens": 3, "temperature": 0, "stream": True})
    first = events[0]["choices"][0]["delta"]
    assert first["role"] == "assistant"
    assert events[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == msg["content"]


def test_chat_template_rendering_options(srv):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
    def rendered(**kw):
        st, t = srv.post("/tokenize", dict({"messages": msgs}, **kw))
        assert st == 200, t
        st, d = srv.post("/detokenize", {"tokens": t["tokens"]})
        return d["content"].replace("\u2581", " ")
    # the default template is ChatML (the tiny model has none)
    full = rendered(add_generation_prompt=False)
    assert full.rstrip().endswith("<|im_end|>")
    cont = rendered(add_generation_prompt=False, continue_final_message=True)
    assert cont.endswith("Hello") and full.startswith(cont)
    gen = rendered()
    assert gen.rstrip().endswith("<|im_start|>assistant")
    st, j = srv.post("/tokenize", {"messages": msgs, "continue_final_message": True})
    err_of(st, j, 400, param="continue_final_message")


# ---- connections ----

def test_disconnect_mid_stream_frees_kv(srv):
    before = srv.metrics()
    s = socket.create_connection((srv.host, srv.port), timeout=10)
    body = json.dumps({"prompt": "long one", "max_tokens": 200, "temperature": 0, "stream": True,
                       "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        got += s.recv(4096)
    s.close()
    m = srv.wait_idle()
    assert m['smelt_request_finish_total{reason="cancelled"}'] > \
        before['smelt_request_finish_total{reason="cancelled"}']
    assert m["smelt_generation_tokens_total"] - before["smelt_generation_tokens_total"] < 200


def test_disconnect_while_waiting_cancels(tiny):
    # a non-streaming request (and a stream still waiting in the queue) whose client hangs up
    # is cancelled without waiting for its first write
    s = Server(tiny, "--fake-forward", "--fake-step-ms", "20", "--max-seqs", "1", "-t", "1")
    try:
        before = s.metrics()
        socks = []
        for body in ({"prompt": "long", "max_tokens": 400, "ignore_eos": True},
                     {"prompt": "queued", "max_tokens": 400, "ignore_eos": True, "stream": True}):
            c = socket.create_connection((s.host, s.port), timeout=10)
            data = json.dumps(body).encode()
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(data)).encode() +
                      b"\r\n\r\n" + data)
            socks.append(c)
        time.sleep(0.5)
        for c in socks:
            c.close()
        t0 = time.time()
        m = s.wait_idle(timeout=5)
        assert time.time() - t0 < 3  # 400 tokens at 20 ms would take 8 s each
        assert m['smelt_request_finish_total{reason="cancelled"}'] - \
            before['smelt_request_finish_total{reason="cancelled"}'] == 2
        assert m["smelt_generation_tokens_total"] < 100
        # (the log line is written when the connection closes, just after the engine is idle)
        t0 = time.time()
        while sum(1 for l in s.lines if " 499 " in l) < 2 and time.time() - t0 < 5:
            time.sleep(0.05)
        assert sum(1 for l in s.lines if " 499 " in l) == 2, s.log()
    finally:
        s.stop()


def test_half_close_is_a_disconnect(tiny):
    # a client that half-closes (shutdown(SHUT_WR)) after sending a request is treated as
    # gone, as nginx (499) and Go's net/http (context cancelled) do: a FIN cannot be told
    # from a client that closed its socket until a write fails (docs/server.md)
    s = Server(tiny, "--fake-forward", "--fake-step-ms", "20", "-t", "1")
    try:
        before = s.metrics()
        c = socket.create_connection((s.host, s.port), timeout=10)
        data = json.dumps({"prompt": "long", "max_tokens": 400, "ignore_eos": True}).encode()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
        time.sleep(0.3)
        c.shutdown(socket.SHUT_WR)
        t0 = time.time()
        c.settimeout(5)
        assert c.recv(100) == b""  # closed without an answer
        c.close()
        m = s.wait_idle(timeout=5)
        assert time.time() - t0 < 3  # 400 tokens at 20 ms would take 8 s
        assert m['smelt_request_finish_total{reason="cancelled"}'] - \
            before['smelt_request_finish_total{reason="cancelled"}'] == 1
        t0 = time.time()
        while sum(1 for l in s.lines if " 499 " in l) < 1 and time.time() - t0 < 5:
            time.sleep(0.05)
        assert sum(1 for l in s.lines if " 499 " in l) == 1, s.log()
        assert s.metrics()['smelt_http_requests_total{status="499"}'] == 1
    finally:
        s.stop()


def test_slow_client_times_out(tiny):
    s = Server(tiny, "--timeout", "1", "-t", "1")
    try:
        c = socket.create_connection((s.host, s.port), timeout=10)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never finishes
        t0 = time.time()
        c.settimeout(8)
        data = c.recv(100)  # the server closes the connection
        assert data == b"" or b"HTTP/1.1" in data
        assert time.time() - t0 < 6
        c.close()
    finally:
        s.stop()


def closed_within(c, seconds, trickle):
    """Sends trickle one byte every 0.25 s (cycling) until the server closes c; returns the
    seconds that took, or None if c is still open after `seconds`."""
    import select
    t0 = time.time()
    i = 0
    while time.time() - t0 < seconds:
        try:
            c.send(trickle[i % len(trickle):i % len(trickle) + 1])
        except OSError:  # reset or broken pipe: closed
            return time.time() - t0
        i += 1
        r, _, _ = select.select([c], [], [], 0.25)
        if r:
            try:
                data = c.recv(4096)
            except OSError:
                return time.time() - t0
            if not data:
                return time.time() - t0
    return None


def test_slow_request_deadline(tiny):
    # --timeout bounds the whole request: a client that trickles its headers or its body (one
    # byte at a time, never idle long enough for an idle timeout) is closed after it
    s = Server(tiny, "--timeout", "1", "--log-format", "json", "--fake-forward",
               "--fake-step-ms", "20", "-t", "1")
    try:
        # headers, one byte every 0.25 s
        c = socket.create_connection((s.host, s.port), timeout=10)
        took = closed_within(c, 6, b"POST /v1/completions HTTP/1.1\r\nX-Slow: " + b"a" * 200)
        c.close()
        assert took is not None and took < 2.5, took
        # the body: headers at once, then one byte every 0.25 s of a 1000-byte body
        c = socket.create_connection((s.host, s.port), timeout=10)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 1000\r\n\r\n")
        took = closed_within(c, 6, b'{"prompt": "' + b"b" * 900)
        c.close()
        assert took is not None and took < 2.5, took
        # a later request on a kept-alive connection gets its own deadline
        import http.client
        k = http.client.HTTPConnection(s.host, s.port, timeout=10)
        k.request("GET", "/health")
        assert k.getresponse().read()
        time.sleep(0.7)
        k.request("GET", "/health")
        assert k.getresponse().status == 200
        k.close()
        # answers that take longer than the timeout are not cut: only receiving is bounded
        st, events, raw = s.stream("/v1/completions", {"prompt": "x", "max_tokens": 100,
                                                        "stream": True, "ignore_eos": True})
        assert st == 200 and events[-1] == "[DONE]", raw[-300:]
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        st, j = s.post("/v1/completions", {"prompt": "x", "max_tokens": 100, "ignore_eos": True})
        assert st == 200 and j["usage"]["completion_tokens"] == 100
        # the request whose body was late is logged (408), the header trickle was no request
        deadline = time.time() + 5
        while time.time() < deadline:
            logs = [json.loads(l) for l in s.lines if l.startswith("{")]
            if any(l["status"] == 408 for l in logs):
                break
            time.sleep(0.05)
        assert [l["path"] for l in logs if l["status"] == 408] == ["/v1/completions"], s.log()
        assert s.metrics()['smelt_http_requests_total{status="408"}'] == 1
    finally:
        s.stop()


def test_idle_connections_do_not_block(srv):
    conns = []
    try:
        for _ in range(300):
            conns.append(socket.create_connection((srv.host, srv.port), timeout=10))
        st, j = srv.post("/v1/completions", {"prompt": "still here", "max_tokens": 2})
        assert st == 200
    finally:
        for c in conns:
            c.close()


def test_log_json_and_sigterm_drains(tiny):
    s = Server(tiny, "--log-format", "json", "--fake-forward", "--fake-step-ms", "20", "-t", "1")
    try:
        t, result = s.stream_in_thread("/v1/completions", {"prompt": "x", "max_tokens": 40,
                                                            "stream": True, "ignore_eos": True})
        import http.client
        keep = http.client.HTTPConnection(s.host, s.port, timeout=10)  # keep-alive connections
        keep2 = http.client.HTTPConnection(s.host, s.port, timeout=10)
        for k in (keep, keep2):
            k.request("GET", "/health")
            assert k.getresponse().read() and True
        time.sleep(0.3)
        s.p.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # an open connection still gets answers: 503 with Retry-After for new work (refused on
        # its headers, so its body is not read: the connection closes after the answer)
        keep.request("POST", "/v1/completions", body=json.dumps({"prompt": "x"}),
                     headers={"Content-Type": "application/json"})
        r = keep.getresponse()
        assert r.status == 503 and r.getheader("Retry-After") == "1"
        assert r.getheader("Connection") == "close"
        assert json.loads(r.read())["error"]["code"] == "shutting_down"
        keep.close()
        keep2.request("GET", "/health")
        r = keep2.getresponse()
        assert r.status == 503
        r.read()
        keep2.close()
        # no new connections once shutting down
        with pytest.raises(OSError):
            socket.create_connection((s.host, s.port), timeout=2).recv(1)
            raise OSError("accepted")
        t.join(30)
        st, events, raw = result["r"]
        assert st == 200 and events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"   # it finished, not cut
        assert s.p.wait(30) == 0
        logs = [json.loads(line) for line in s.lines if line.startswith("{")]
        req = [l for l in logs if l.get("msg") == "request" and l["path"] == "/v1/completions"]
        assert sorted(l["status"] for l in req) == [200, 503]
        req = [l for l in req if l["status"] == 200]
        assert req[0]["completion_tokens"] == 40
        assert req[0]["ttft_s"] is not None and req[0]["id"].startswith("cmpl-")
    finally:
        s.stop()


def json_logs(s, want, path=None, timeout=5):
    """The server's JSON request lines (of path, if given), once at least `want` are there (a
    line is written when its connection is done with the request, just after the answer)."""
    t0 = time.time()
    while True:
        logs = [json.loads(l) for l in s.lines if l.startswith("{")]
        logs = [l for l in logs if l.get("msg") == "request" and path in (None, l["path"])]
        if len(logs) >= want or time.time() - t0 > timeout:
            return logs
        time.sleep(0.05)


def test_request_log_every_status(tiny):
    import re
    s = Server(tiny, "--log-format", "json", "--api-key", "k", "--max-body", "1000",
               "--fake-forward", "--fake-step-ms", "40", "-t", "1")
    key = {"Authorization": "Bearer k"}
    try:
        t_start = time.time()
        st, j = s.post("/v1/completions", {"prompt": "x", "max_tokens": 8, "ignore_eos": True},
                       headers=key)
        assert st == 200 and j["usage"]["completion_tokens"] == 8
        assert s.request("GET", "/v1/models")[0] == 401                          # no key
        assert s.request("POST", "/v1/completions", {"prompt": "x"})[0] == 401
        assert s.request("GET", "/v1/nothing", headers=key)[0] == 404
        assert s.request("POST", "/v1/completions", {"prompt": "y" * 2000}, headers=key)[0] == 413
        assert s.request("GET", "/v1/completions", headers=key)[0] == 405
        logs = json_logs(s, 6)
        # (in the order the requests ended: a line is written once the answer is sent)
        logs.sort(key=lambda l: [200, 401, 404, 413, 405].index(l["status"]))
        assert [l["status"] for l in logs] == [200, 401, 401, 404, 413, 405], s.log()
        for l in logs:
            assert set(l) == {"ts", "level", "msg", "id", "method", "path", "route", "status",
                              "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_s",
                              "total_s"}, l
            assert abs(l["ts"] - t_start) < 60 and l["total_s"] >= 0
        # ts has millisecond precision (it was %.9g: 10-second steps)
        ts = [re.search(r'"ts":(\d+\.\d{3}),', l).group(1) for l in s.lines if l.startswith("{")]
        assert len(ts) == 6
        ok = logs[0]
        assert ok["id"].startswith("cmpl-") and ok["route"] == "completions"
        assert ok["prompt_tokens"] > 0 and ok["completion_tokens"] == 8
        # non-streamed: the first token came one step after the start, the answer after 8
        assert ok["ttft_s"] is not None and 0 < ok["ttft_s"] < ok["total_s"] / 2, ok
        assert sorted(l["route"] for l in logs[1:3]) == ["completions", "models"]
        assert [l["route"] for l in logs[3:]] == ["/v1/nothing", "completions", "completions"]
        assert all(l["ttft_s"] is None and l["id"] == "-" for l in logs[1:4])
    finally:
        s.stop()


def test_shutdown_cancel_finishes_with_abort(tiny):
    # a stream still running when the grace period ends is cut: its choice says "abort"
    # (not "stop", which would make the truncated text look complete), then the error event
    s = Server(tiny, "--log-format", "json", "--fake-forward", "--fake-step-ms", "20",
               "--grace", "0.3", "-t", "1")
    try:
        t, result = s.stream_in_thread("/v1/completions", {"prompt": "x", "max_tokens": 400,
                                                            "stream": True, "ignore_eos": True})
        time.sleep(0.3)
        s.p.send_signal(signal.SIGTERM)
        t.join(30)
        st, events, raw = result["r"]
        assert st == 200 and events[-1] == "[DONE]", raw[-500:]
        assert events[-3]["choices"][0]["finish_reason"] == "abort", raw[-500:]
        assert events[-2]["error"]["code"] == "shutting_down"
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-3])
        assert s.p.wait(30) == 0
        req = json_logs(s, 1, "/v1/completions")
        assert [l["status"] for l in req] == [503], s.log()
    finally:
        s.stop()


def test_engine_error_after_stream_began(tiny):
    # the engine fails at position 12 (--fake-fail-at): a stream has sent its headers and
    # first tokens by then; it ends with finish_reason "error" and an error event, and is
    # logged (error level) and counted as a 500, not a 200
    s = Server(tiny, "--log-format", "json", "--fake-forward", "--fake-fail-at", "12", "-t", "1")
    try:
        before = s.metrics()
        st, events, raw = s.stream("/v1/completions", {"prompt": "x", "max_tokens": 40,
                                                        "stream": True, "ignore_eos": True})
        assert st == 200 and events[-1] == "[DONE]", raw[-500:]
        assert completion_text(events[:-3])  # some text came first
        assert events[-3]["choices"][0]["finish_reason"] == "error", raw[-500:]
        err = events[-2]["error"]
        assert err["type"] == "server_error" and "fake forward" in err["message"]
        # not streamed: a 500 answer
        st, j = s.post("/v1/completions", {"prompt": "x", "max_tokens": 40, "ignore_eos": True})
        err_of(st, j, 500)
        m = s.metrics()
        assert m['smelt_http_requests_total{status="500"}'] - \
            before['smelt_http_requests_total{status="500"}'] == 2
        assert m['smelt_http_requests_total{status="200"}'] == \
            before['smelt_http_requests_total{status="200"}'] + 1  # the first /metrics
        req = json_logs(s, 2, "/v1/completions")
        assert [l["status"] for l in req] == [500, 500], s.log()
        assert sum("the engine failed after the stream began" in l for l in s.lines) == 1, s.log()
    finally:
        s.stop()
