"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) through `smelt serve`,
over raw HTTP and the official `anthropic` SDK, with exactly the model text each case needs.

The model is test_server_tools' byte-level vocabulary (written with gguf-py) with a
Qwen3-shaped template (system, tools, <think> and Hermes <tool_call>s, enable_thinking), and
`--fake-forward --fake-reply TEXT` answers every request with TEXT. Checked:
- the reply's blocks (thinking, text, tool_use), stop_reason (end_turn, tool_use, max_tokens,
  stop_sequence with the string), usage, whole and streamed: the exact event sequence
  (message_start, ping, content_block_start / _delta / _stop per block, message_delta,
  message_stop), whose deltas sum to the whole response, and the SDK's stream accumulator
  (messages.stream) rebuilding the same message;
- the request's conversion: an Anthropic conversation gives the same prompt as the
  equivalent OpenAI chat request, token for token (--block-size 1: the second request
  reuses every prompt token but the last from the prefix cache only when the prompts are
  equal), for system blocks, tool_use / tool_result turns, thinking, prefill;
- Claude Code's volatile billing line is dropped: two turns of a recorded Claude Code-style
  agent loop (tests/data/claude_code_turns.json) where the second turn's prefill takes the
  first turn's whole prompt from the prefix cache, as /metrics counts too;
- refusals in Anthropic's error shape naming the field; x-api-key; count_tokens."""
import copy
import json
import os

import pytest

from smelt_server import ROOT, SMELT, Server, parse_responses, raw_http

gguf = pytest.importorskip("gguf")
anthropic = pytest.importorskip("anthropic")

from test_server_tools import write_vocab  # noqa: E402  (the byte-level vocabulary)

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

# Qwen3's shape, reduced: tools in the system turn, <think> in assistant turns, Hermes calls,
# tool results as user turns, enable_thinking false closing an empty <think> block
QWEN3 = """{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}{% for m in messages %}{% if m.role == 'system' and loop.first %}{% elif m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}{% if not (loop.last and m.role == 'assistant' and not add_generation_prompt) %}<|im_end|>
{% endif %}{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% endif %}"""

TOOLS = [{"name": "get_weather", "description": "Weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
OAI_TOOLS = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["input_schema"]}} for t in TOOLS]
USER = [{"role": "user", "content": "Weather in Paris?"}]
REPLY = ('<think>\nThe user wants the weather.\n</think>\n\nLet me check.\n<tool_call>\n'
         '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
MODEL = "claude-test"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("anthropic")
    t = d / "qwen3.jinja"
    t.write_text(QWEN3)
    return {"vocab": write_vocab(str(d / "vocab.gguf")), "tmpl": str(t)}


@pytest.fixture
def serve(files):
    """serve(reply, *args) -> a started server (stopped after the test)."""
    started = []

    def start(reply, *args):
        s = Server(files["vocab"], "--fake-forward", "--fake-reply", reply, "--served-model-name",
                   MODEL, "--chat-template", files["tmpl"], "--quiet", *args, start_timeout=30)
        started.append(s)
        return s
    yield start
    for s in started:
        assert s.stop() == 0, s.log()


def msg(s, body, status=200, headers=None):
    st, j = s.post("/v1/messages", dict({"model": MODEL, "max_tokens": 400}, **body), headers)
    assert st == status, j
    return j


def sse(text):
    """Anthropic's SSE: a list of (event name, data object)."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        out.append((lines[0][7:], json.loads(lines[1][6:])))
    return out


def stream(s, body):
    st, h, data = s.request("POST", "/v1/messages",
                            dict({"model": MODEL, "max_tokens": 400, "stream": True}, **body))
    assert st == 200 and h["content-type"] == "text/event-stream", data
    return sse(data.decode())


def rebuild(events):
    """Checks the event sequence's shape and sums it into a message, as a client would."""
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    for n, d in events:
        assert d["type"] == n
    m = copy.deepcopy(events[0][1]["message"])
    assert m["content"] == [] and m["stop_reason"] is None and m["role"] == "assistant"
    open_i, partial = None, {}
    for n, d in events[2:-2]:
        if n == "content_block_start":
            assert open_i is None and d["index"] == len(m["content"]), "blocks in order, one open"
            open_i = d["index"]
            m["content"].append(d["content_block"])
            partial[open_i] = ""
        elif n == "content_block_delta":
            assert d["index"] == open_i
            b, dl = m["content"][open_i], d["delta"]
            kind = {"text": "text_delta", "thinking": "thinking_delta",
                    "tool_use": "input_json_delta"}[b["type"]]
            assert dl["type"] == kind, (b, dl)
            if kind == "text_delta":
                b["text"] += dl["text"]
            elif kind == "thinking_delta":
                b["thinking"] += dl["thinking"]
            else:
                partial[open_i] += dl["partial_json"]
        else:
            assert n == "content_block_stop" and d["index"] == open_i, (n, d)
            if m["content"][open_i]["type"] == "tool_use":
                m["content"][open_i]["input"] = json.loads(partial[open_i])
            open_i = None
    assert open_i is None
    delta = events[-2][1]
    m.update(delta["delta"])
    m["usage"].update(delta["usage"])
    return m


def strip_ids(m):
    m = copy.deepcopy(m)
    m.pop("id", None)
    for b in m["content"]:
        b.pop("id", None)
    return m


# ---- replies ----

def test_blocks_whole_and_streamed(serve):
    s = serve(REPLY)
    body = {"messages": USER, "tools": TOOLS}
    j = msg(s, body)
    assert j["type"] == "message" and j["role"] == "assistant" and j["model"] == MODEL
    assert j["id"].startswith("msg_")
    assert [b["type"] for b in j["content"]] == ["thinking", "text", "tool_use"]
    assert j["content"][0] == {"type": "thinking", "thinking": "The user wants the weather.",
                               "signature": ""}
    assert j["content"][1] == {"type": "text", "text": "Let me check."}
    call = j["content"][2]
    assert call["name"] == "get_weather" and call["input"] == {"city": "Paris"}
    assert call["id"].startswith("toolu_")
    assert j["stop_reason"] == "tool_use" and j["stop_sequence"] is None
    u = j["usage"]
    assert u["output_tokens"] > 10 and u["input_tokens"] > 50
    assert u["cache_creation_input_tokens"] == 0 and u["cache_read_input_tokens"] >= 0

    events = stream(s, body)
    m = rebuild(events)
    assert strip_ids(m) == strip_ids(j) | {"usage": m["usage"]}
    assert m["usage"]["output_tokens"] == u["output_tokens"]
    # message_start gives the whole prompt; message_delta splits it with the prefix cache
    start_in = events[0][1]["message"]["usage"]["input_tokens"]
    assert start_in == m["usage"]["input_tokens"] + m["usage"]["cache_read_input_tokens"]
    assert start_in == u["input_tokens"] + u["cache_read_input_tokens"]
    # the repeated prompt came from the prefix cache
    assert m["usage"]["cache_read_input_tokens"] >= 16


def test_sdk_create_and_stream(serve):
    s = serve(REPLY)
    c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=30)
    whole = c.messages.create(model=MODEL, max_tokens=400, messages=USER, tools=TOOLS)
    assert whole.stop_reason == "tool_use"
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.content[2].input == {"city": "Paris"}
    seen = []
    with c.messages.stream(model=MODEL, max_tokens=400, messages=USER, tools=TOOLS) as st:
        for ev in st:
            seen.append(ev.type)
        final = st.get_final_message()
    assert seen[0] == "message_start" and seen[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta",
            "thinking", "text", "input_json"} <= set(seen)
    assert strip_ids(final.model_dump(exclude_none=True)) == \
        strip_ids(whole.model_dump(exclude_none=True)) | {"usage": final.usage.model_dump(exclude_none=True)}
    # a tool round trip: the reply goes back as the next turn's assistant message
    follow = c.messages.create(model=MODEL, max_tokens=400, tools=TOOLS, messages=USER + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": whole.content[2].id,
                                      "content": "21 C, sunny"}]}])
    assert follow.stop_reason == "tool_use"


def test_stop_reasons(serve):
    s = serve("Hello STOP world. The end.")
    j = msg(s, {"messages": USER})
    assert j["stop_reason"] == "end_turn" and j["content"] == [
        {"type": "text", "text": "Hello STOP world. The end."}]
    for body in ({"messages": USER, "stop_sequences": ["nope", "STOP"]},):
        j = msg(s, body)
        assert j["stop_reason"] == "stop_sequence" and j["stop_sequence"] == "STOP"
        assert j["content"][0]["text"] == "Hello "
        m = rebuild(stream(s, body))
        assert m["stop_reason"] == "stop_sequence" and m["stop_sequence"] == "STOP"
        assert m["content"] == j["content"]
    j = msg(s, {"messages": USER, "max_tokens": 4})
    assert j["stop_reason"] == "max_tokens" and j["usage"]["output_tokens"] == 4
    assert rebuild(stream(s, {"messages": USER, "max_tokens": 4}))["stop_reason"] == "max_tokens"


def test_tool_choice_forces_a_call(serve):
    # the prompt ends with the opening of a call (Hermes syntax); the reply continues it
    s = serve('get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    j = msg(s, {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "any"}})
    assert j["stop_reason"] == "tool_use", j
    assert [b["type"] for b in j["content"]] == ["tool_use"], j
    assert j["content"][0]["input"] == {"city": "Oslo"}
    s = serve('{"city": "Oslo"}}\n</tool_call>')
    j = msg(s, {"messages": USER, "tools": TOOLS,
                "tool_choice": {"type": "tool", "name": "get_weather"}})
    assert j["stop_reason"] == "tool_use" and j["content"][0]["input"] == {"city": "Oslo"}, j
    # disable_parallel_tool_use: the first call only
    two = REPLY + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    s = serve(two)
    j = msg(s, {"messages": USER, "tools": TOOLS})
    assert [b["type"] for b in j["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    j = msg(s, {"messages": USER, "tools": TOOLS,
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}})
    assert [b["type"] for b in j["content"]] == ["thinking", "text", "tool_use"]
    # none: the tools stay out of the prompt and nothing is parsed as a call
    j = msg(s, {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "none"}})
    assert j["stop_reason"] == "end_turn" and "tool_use" not in [b["type"] for b in j["content"]]


# ---- the prompt: Anthropic's conversation vs the equivalent OpenAI chat ----

def same_prompt(s, body, messages, **chat):
    """The Anthropic request renders the prompt of the OpenAI chat request: with --block-size
    1, the second of the two reuses all but its last prompt token from the prefix cache."""
    st, c = s.post("/v1/chat/completions", dict({"model": MODEL, "messages": messages,
                                                 "max_tokens": 1}, **chat))
    assert st == 200, c
    n = c["usage"]["prompt_tokens"]
    st, ct = s.post("/v1/messages/count_tokens", dict({"model": MODEL}, **body))
    assert st == 200 and ct == {"input_tokens": n}, (ct, n)
    j = msg(s, dict({"max_tokens": 1}, **body))
    u = j["usage"]
    assert u["input_tokens"] + u["cache_read_input_tokens"] == n
    assert u["cache_read_input_tokens"] == n - 1, (u, n)
    s.wait_idle()


def test_conversion_matches_chat(serve):
    s = serve("ok", "--block-size", "1")
    # system as a string and as blocks (joined by "\n")
    same_prompt(s, {"system": "Be brief.", "messages": USER},
                [{"role": "system", "content": "Be brief."}] + USER)
    same_prompt(s, {"system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                               {"type": "text", "text": "Be kind."}],
                    "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]},
                [{"role": "system", "content": "Be brief.\nBe kind."}, {"role": "user", "content": "a\nb"}])
    # a tool turn: thinking + text + tool_use, then tool_result blocks and text
    body = {"tools": TOOLS, "messages": USER + [
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Need the tool.", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21 C"},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": [{"type": "text", "text": "25 C"}], "is_error": False},
            {"type": "text", "text": "And tomorrow?"}]}]}
    chat = USER + [
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Need the tool.",
         "tool_calls": [
             {"id": "toolu_1", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}},
             {"id": "toolu_2", "type": "function",
              "function": {"name": "get_weather", "arguments": json.dumps({"city": "Rome"})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "21 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "25 C"},
        {"role": "user", "content": "And tomorrow?"}]
    same_prompt(s, body, chat, tools=OAI_TOOLS)
    # thinking disabled / enabled: the template's enable_thinking
    same_prompt(s, {"messages": USER, "thinking": {"type": "disabled"}}, USER,
                chat_template_kwargs={"enable_thinking": False})
    same_prompt(s, {"messages": USER, "thinking": {"type": "enabled", "budget_tokens": 2048},
                    "max_tokens": 4096}, USER, chat_template_kwargs={"enable_thinking": True})
    # a final assistant message is continued
    pre = USER + [{"role": "assistant", "content": "The weather is"}]
    same_prompt(s, {"messages": pre}, pre, add_generation_prompt=False, continue_final_message=True)


def test_prefill_continues(serve):
    s = serve(" sunny.")
    j = msg(s, {"messages": USER + [{"role": "assistant", "content": "It is"}]})
    assert j["content"] == [{"type": "text", "text": "sunny."}]


# ---- Claude Code's volatile system text ----

def test_claude_code_billing_line_keeps_the_prefix_cache(serve, files):
    with open(os.path.join(ROOT, "tests", "data", "claude_code_turns.json")) as f:
        turns = json.load(f)
    t1, t2 = turns["turn1"], turns["turn2"]
    assert t1["messages"] == t2["messages"][:1]
    head1, head2 = t1["system"][0]["text"], t2["system"][0]["text"]
    assert head1.startswith("x-anthropic-billing-header:") and head1 != head2
    # the reply the model gave in turn 1 is what turn 2 sends back
    call = t2["messages"][1]["content"]
    reply = call[0]["text"] + "\n<tool_call>\n" + json.dumps(
        {"name": call[1]["name"], "arguments": call[1]["input"]}) + "\n</tool_call>"
    s = serve(reply)
    # the line is not part of the prompt: a request without it counts the same tokens
    st, with_line = s.post("/v1/messages/count_tokens", {k: v for k, v in t1.items()
                                                          if k not in ("max_tokens", "stream")})
    st, without = s.post("/v1/messages/count_tokens", {
        "model": t1["model"], "system": t1["system"][1:], "tools": t1["tools"],
        "messages": t1["messages"]})
    assert st == 200 and with_line == without, (with_line, without)
    m0 = s.metrics()
    r1 = msg(s, dict(t1, stream=False))
    assert r1["stop_reason"] == "tool_use" and r1["content"][1]["input"] == call[1]["input"]
    p1 = r1["usage"]["input_tokens"] + r1["usage"]["cache_read_input_tokens"]
    s.wait_idle()
    r2 = msg(s, dict(t2, stream=False))
    p2 = r2["usage"]["input_tokens"] + r2["usage"]["cache_read_input_tokens"]
    # the second turn's prefill reuses at least the first turn's whole prompt (full blocks)
    assert p2 > p1
    assert r2["usage"]["cache_read_input_tokens"] >= p1 // 16 * 16, (r1["usage"], r2["usage"])
    m1 = s.metrics()
    assert m1["smelt_prompt_cached_tokens_total"] - m0["smelt_prompt_cached_tokens_total"] == \
        r2["usage"]["cache_read_input_tokens"] + r1["usage"]["cache_read_input_tokens"]
    # with the line kept in the prompt (here: a system text that differs the same way in
    # its first line but is not the billing header) almost nothing would be reused
    t3 = copy.deepcopy(t2)
    t3["system"][0]["text"] = head2.replace("x-anthropic-billing-header", "x-other-header")
    r3 = msg(s, dict(t3, stream=False))
    assert r3["usage"]["cache_read_input_tokens"] < 32, r3["usage"]


# ---- refusals, auth, count_tokens ----

def err(s, body, param_text, status=400, path="/v1/messages"):
    st, j = s.post(path, body)
    assert st == status, j
    assert j["type"] == "error" and set(j) == {"type", "error"}, j
    assert j["error"]["type"] == ("invalid_request_error" if status == 400 else j["error"]["type"])
    assert param_text in j["error"]["message"], j
    return j


def test_refusals_name_the_field(serve):
    s = serve("ok")
    base = {"model": MODEL, "max_tokens": 10, "messages": USER}
    err(s, {"model": MODEL, "messages": USER}, "max_tokens")
    err(s, dict(base, max_tokens=0), "max_tokens")
    err(s, dict(base, messages=[]), "messages")
    err(s, dict(base, messages=[{"role": "system", "content": "x"}]), "messages[0].role")
    err(s, dict(base, messages=[{"role": "user", "content": 5}]), "messages[0].content")
    err(s, dict(base, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
        "messages[0].content[0]")
    err(s, dict(base, messages=[{"role": "user", "content": [{"type": "text"}]}]),
        "messages[0].content[0].text")
    err(s, dict(base, messages=[{"role": "user", "content": [{"type": "tool_result"}]}]),
        "tool_use_id")
    err(s, dict(base, messages=USER + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "x"}]}]), "messages[1].content[0].input")
    err(s, dict(base, messages=[{"role": "user", "content": "x", "name": "bob"}]), "'name'")
    err(s, dict(base, temperature=1.5), "temperature")
    err(s, dict(base, top_k=-1), "top_k")
    err(s, dict(base, stop_sequences="STOP"), "stop_sequences")
    err(s, dict(base, stop_sequences=["x"] * 17), "stop_sequences")
    err(s, dict(base, tools=[{"name": "f"}]), "tools[0].input_schema")
    err(s, dict(base, tools=[{"type": "web_search_20250305", "name": "web_search"}]), "tools[0]")
    err(s, dict(base, tools=[dict(TOOLS[0], strict="yes")]), "strict")
    err(s, dict(base, tool_choice={"type": "any"}), "tool_choice")
    err(s, dict(base, tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), "nope")
    err(s, dict(base, tools=TOOLS, tool_choice={"type": "sometimes"}), "tool_choice")
    err(s, dict(base, thinking={"type": "enabled"}), "budget_tokens")
    err(s, dict(base, thinking={"type": "enabled", "budget_tokens": 1024}), "less than max_tokens")
    err(s, dict(base, max_tokens=5000, thinking={"type": "enabled", "budget_tokens": 100}),
        "thinking.budget_tokens")
    err(s, dict(base, output_config={"format": {"type": "xml", "schema": {}}}),
        "output_config.format")
    err(s, dict(base, metadata={"user_id": 5}), "metadata.user_id")
    err(s, dict(base, container="c"), "container")
    err(s, dict(base, context_management=5), "context_management")
    err(s, dict(base, frequency_penalty=1), "frequency_penalty")
    err(s, dict(base, messages=USER + [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}]}]), "final assistant")
    st, j = s.post("/v1/messages", "{not json")
    assert st == 400 and j["type"] == "error"
    st, j = s.post("/v1/messages", dict(base, model="other"))
    assert st == 404 and j["error"]["type"] == "not_found_error", j
    # harmless fields are accepted
    msg(s, dict(base, metadata={"user_id": "u1"}, service_tier="auto",
                cache_control={"type": "ephemeral"}, top_k=5, temperature=0.5, top_p=0.9,
                output_config={"effort": "high"}))
    # the SDK raises them as its exceptions, with the body intact
    c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, max_tokens=10, messages=USER, extra_body={"temperature": 3})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        c.messages.create(model="nope", max_tokens=10, messages=USER)


def test_api_key_and_error_shape_on_headers(serve):
    s = serve("ok", "--api-key", "sekret")
    st, j = s.post("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": USER})
    assert st == 401 and j == {"type": "error", "error": {"type": "authentication_error",
                                                          "message": j["error"]["message"]}}
    assert "x-api-key" in j["error"]["message"]
    # Anthropic's clients send x-api-key; OpenAI's Bearer works too, on every route
    msg(s, {"messages": USER}, headers={"x-api-key": "sekret"})
    msg(s, {"messages": USER}, headers={"Authorization": "Bearer sekret"})
    st, j = s.post("/v1/chat/completions", {"messages": USER, "max_tokens": 2},
                   {"x-api-key": "sekret"})
    assert st == 200, j
    st, j = s.post("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": USER},
                   {"x-api-key": "wrong"})
    assert st == 401
    # a key given twice is ambiguous: refused, as two Authorization headers are
    got, closed = raw_http(s.host, s.port, b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n"
                           b"x-api-key: sekret\r\nx-api-key: other\r\nContent-Length: 2\r\n\r\n{}")
    assert parse_responses(got)[0][0] == 400 and closed
    # refusals made on the headers use the route's shape
    st, h, data = s.request("GET", "/v1/messages", headers={"x-api-key": "sekret"})
    assert st == 405 and json.loads(data)["type"] == "error"
    st, h, data = s.request("POST", "/v1/messages", b"x" * 100, headers={
        "x-api-key": "sekret", "Transfer-Encoding": "gzip, chunked"})
    assert st in (400, 501)
    # the SDK with the right key, and a wrong one
    c = anthropic.Anthropic(base_url=s.url, api_key="sekret", max_retries=0, timeout=30)
    assert c.messages.create(model=MODEL, max_tokens=5, messages=USER).content[0].text == "ok"
    assert c.messages.count_tokens(model=MODEL, messages=USER).input_tokens > 5
    bad = anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0, timeout=30)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model=MODEL, max_tokens=5, messages=USER)


def test_count_tokens(serve):
    s = serve("ok")
    st, j = s.post("/v1/messages/count_tokens", {"model": MODEL, "messages": USER, "tools": TOOLS})
    assert st == 200 and set(j) == {"input_tokens"}
    st, t = s.post("/tokenize", {"messages": USER, "tools": OAI_TOOLS})
    assert j["input_tokens"] == t["count"]
    st, j2 = s.post("/v1/messages/count_tokens", {"model": MODEL, "messages": USER})
    assert j2["input_tokens"] < j["input_tokens"]
    err(s, {"model": MODEL}, "messages", path="/v1/messages/count_tokens")
    st, j = s.post("/v1/messages/count_tokens", {"model": "nope", "messages": USER})
    assert st == 404 and j["error"]["type"] == "not_found_error"


def test_engine_failure_mid_reply(serve):
    # a step with a row at position 60 or later fails: the prompt (~36 tokens) prefills, and
    # the reply is cut about 24 tokens in
    s = serve(REPLY, "--fake-fail-at", "60")
    events = stream(s, {"messages": USER})
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-1] == "error", names
    assert "message_delta" not in names and "message_stop" not in names
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error",
                                                        "message": events[-1][1]["error"]["message"]}}
    st, j = s.post("/v1/messages", {"model": MODEL, "max_tokens": 400, "messages": USER})
    assert st == 500 and j["type"] == "error" and j["error"]["type"] == "api_error", j
    c = anthropic.Anthropic(base_url=s.url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(anthropic.APIStatusError):
        with c.messages.stream(model=MODEL, max_tokens=400, messages=USER) as st:
            for _ in st:
                pass
    assert s.metrics()['smelt_http_requests_total{status="500"}'] == 3


def test_max_tokens_is_a_cap(serve):
    # Claude Code asks max_tokens 32000 whatever the model: not refused, the reply stops at
    # the context's end (the OpenAI routes refuse prompt + max_tokens over the context)
    s = serve(REPLY, "-c", "80")
    j = msg(s, {"messages": USER, "max_tokens": 32000})
    u = j["usage"]
    assert j["stop_reason"] == "model_context_window_exceeded", j
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["output_tokens"] == 80
    assert rebuild(stream(s, {"messages": USER, "max_tokens": 32000}))["stop_reason"] == \
        "model_context_window_exceeded"
    st, j = s.post("/v1/chat/completions", {"messages": USER, "max_tokens": 32000})
    assert st == 400 and j["error"]["param"] == "max_tokens"
