"""smelt serve driven by the official `openai` Python SDK, unmodified, on the real
Qwen2.5-Coder 0.5B Instruct model (its own chat template, with tools): chat and
completions, streaming and not, n, stops, seeds, logprobs, include_usage, cached_tokens on
a repeated prefix, a tool-call round trip, and errors surfacing as the SDK's exceptions.
Skips when the model is absent (`make models` fetches it)."""
import os

import pytest

from smelt_server import QWEN, SMELT, Server

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

MODEL = "qwen"


@pytest.fixture(scope="module")
def client():
    if not os.path.exists(QWEN):
        pytest.skip(f"model absent: {QWEN} (make models)")
    s = Server(QWEN, "--served-model-name", MODEL, "-c", "2048", "--kv-size", "8192",
               "--api-key", "test-key", "--quiet")
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="test-key", timeout=120, max_retries=0)
    yield c
    assert s.stop() == 0, s.log()


USER = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def test_models(client):
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids


def test_chat_whole_and_stream_agree(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0)
    text = r.choices[0].message.content
    assert "Paris" in text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and r.usage.completion_tokens <= 8
    assert r.id.startswith("chatcmpl-") and r.object == "chat.completion" and r.model == MODEL
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    # the repeated prompt's full blocks came from the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 16
    # no reasoning template: the details are there, with no reasoning tokens
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 0


def test_stop_n_seed_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=8, temperature=0,
                                       stop=["aris"])
    assert r.choices[0].message.content.endswith("P") or "aris" not in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    q = [{"role": "user", "content": "Name a random fruit."}]
    a = client.chat.completions.create(model=MODEL, messages=q, max_tokens=6, temperature=1.0,
                                       seed=7, n=2)
    b = client.chat.completions.create(model=MODEL, messages=q, max_tokens=6, temperature=1.0,
                                       seed=7, n=2)
    assert len(a.choices) == 2
    assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
    assert 2 <= a.usage.completion_tokens <= 12
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, temperature=0,
                                       logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens or len(lp) == r.usage.completion_tokens - 1
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4  # greedy takes the top one
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token


def test_completions(client):
    r = client.completions.create(model=MODEL, prompt="def add(a, b):\n    return", max_tokens=5,
                                  temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    s = list(client.completions.create(model=MODEL, prompt="def add(a, b):\n    return",
                                       max_tokens=5, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


def test_echo_logprobs_match_generation(client):
    prompt = "def fibonacci(n):\n"
    g = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0,
                                  logprobs=2)
    gen = g.choices[0].logprobs
    e = client.completions.create(model=MODEL, prompt=prompt + g.choices[0].text, max_tokens=0,
                                  echo=True, logprobs=2)
    lp = e.choices[0].logprobs
    assert e.choices[0].text == prompt + g.choices[0].text
    assert lp.token_logprobs[0] is None
    if lp.tokens[-6:] == gen.tokens:  # the text re-tokenizes to the same tokens
        # scoring the prompt gives the logprobs the generation had (prefill vs decode numerics)
        for a, b in zip(lp.token_logprobs[-6:], gen.token_logprobs):
            assert abs(a - b) < 0.05, (lp.token_logprobs[-6:], gen.token_logprobs)


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def test_tool_call_round_trip(client):
    msgs = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
    r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=40,
                                       temperature=0)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    import json
    assert json.loads(call.function.arguments)["city"].lower() == "paris"
    assert call.id.startswith("call_")
    # the same as a stream: the SDK's accumulator sees one complete call
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                                 max_tokens=40, temperature=0, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # send the result back: the model answers in text
    msgs.append(ch.message.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "{\"temp_c\": 21, \"sky\": \"sunny\"}"})
    r2 = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=30,
                                        temperature=0)
    assert r2.choices[0].message.content
    assert "21" in r2.choices[0].message.content or "sunny" in r2.choices[0].message.content.lower()


def test_errors_are_sdk_exceptions(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, temperature=5)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=USER)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER,
                                       response_format={"type": "json_schema", "json_schema": {
                                           "name": "x", "schema": {"type": "object", "properties": {
                                               "a": {"type": "object", "patternProperties": {}}}}}})
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert "/properties/a" in e.value.body["message"] and "patternProperties" in e.value.body["message"]
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_forced_tool_choice_stream_matches_whole(client):
    # the question needs no tool: the call happens only because tool_choice forces it
    msgs = [{"role": "user", "content": "Say hello to Paris."}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for tc in (named, "required"):
        r = client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, tool_choice=tc,
                                           max_tokens=30, temperature=0)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls", ch
        assert not ch.message.content  # the prefilled opening is not echoed
        call = ch.message.tool_calls[0]
        assert call.function.name == "get_weather"
        import json
        assert isinstance(json.loads(call.function.arguments), dict)
        # the SDK's stream accumulator rebuilds the same call from the deltas
        with client.chat.completions.stream(model=MODEL, messages=msgs, tools=TOOLS,
                                            tool_choice=tc, max_tokens=30, temperature=0) as s:
            final = s.get_final_completion()
        got = final.choices[0].message.tool_calls
        assert [(c.function.name, c.function.arguments) for c in got] == \
            [(c.function.name, c.function.arguments) for c in ch.message.tool_calls]
        assert final.choices[0].finish_reason == "tool_calls"
