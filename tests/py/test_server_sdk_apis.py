"""smelt serve driven by the official `anthropic` SDK (/v1/messages) and the `openai` SDK's
client.responses (/v1/responses), unmodified, on the real Qwen2.5-Coder 0.5B Instruct model
(its own chat template, with tools): answers, streams whose text equals the whole answer,
count_tokens, a tool round trip in each API, previous_response_id chaining, errors as the
SDKs' exceptions. test_server_anthropic and test_server_responses check the shapes exactly
on scripted replies; this checks that a real template and model work through them. Skips
when the model is absent (`make models` fetches it)."""
import json
import os

import pytest

from smelt_server import QWEN, SMELT, Server

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

MODEL = "qwen"
ASK = "What is the capital of France? Answer in one word."
WEATHER = "What is the weather in Paris? Use the tool."


@pytest.fixture(scope="module")
def server():
    if not os.path.exists(QWEN):
        pytest.skip(f"model absent: {QWEN} (make models)")
    s = Server(QWEN, "--served-model-name", MODEL, "-c", "2048", "--kv-size", "8192",
               "--api-key", "test-key", "--quiet")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="test-key", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="test-key", timeout=120, max_retries=0)


def test_messages(claude):
    greedy = {"temperature": 0}
    m = claude.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": ASK}],
                               system="You are terse.", extra_body=greedy)
    assert m.content[0].type == "text" and "Paris" in m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens <= 8
    n = claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": ASK}],
                                     system="You are terse.").input_tokens
    assert n == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    with claude.messages.stream(model=MODEL, max_tokens=8, system="You are terse.",
                                messages=[{"role": "user", "content": ASK}], extra_body=greedy) as st:
        text = "".join(st.text_stream)
        final = st.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.usage.cache_read_input_tokens >= 16  # the same prompt, from the prefix cache


TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]


def test_messages_tool_round_trip(claude):
    msgs = [{"role": "user", "content": WEATHER}]
    m = claude.messages.create(model=MODEL, max_tokens=40, messages=msgs, tools=TOOLS,
                               extra_body={"temperature": 0})
    assert m.stop_reason == "tool_use", m
    call = [b for b in m.content if b.type == "tool_use"][0]
    assert call.name == "get_weather" and call.input["city"].lower() == "paris"
    msgs += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                           "content": "{\"temp_c\": 21, \"sky\": \"sunny\"}"}]}]
    r = claude.messages.create(model=MODEL, max_tokens=30, messages=msgs, tools=TOOLS,
                               extra_body={"temperature": 0})
    text = "".join(b.text for b in r.content if b.type == "text")
    assert "21" in text or "sunny" in text.lower(), r
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=5, messages=msgs,
                               tools=[dict(TOOLS[0], input_schema=5)])
    assert "input_schema" in e.value.body["error"]["message"]


def test_responses(oai):
    r = oai.responses.create(model=MODEL, input=ASK, instructions="You are terse.",
                             max_output_tokens=8, temperature=0)
    assert "Paris" in r.output_text and r.status in ("completed", "incomplete")
    with oai.responses.stream(model=MODEL, input=ASK, instructions="You are terse.",
                              max_output_tokens=8, temperature=0) as st:
        deltas = "".join(e.delta for e in st if e.type == "response.output_text.delta")
        final = st.get_final_response()
    assert deltas == final.output_text == r.output_text
    # chaining: the second turn sees the first (and its answer) through the store
    r2 = oai.responses.create(model=MODEL, previous_response_id=r.id, temperature=0,
                              max_output_tokens=12,
                              input="Repeat your previous answer, in lowercase.")
    assert "paris" in r2.output_text.lower()
    assert r2.usage.input_tokens > r.usage.input_tokens
    assert r2.usage.input_tokens_details.cached_tokens >= 16


def test_responses_function_call(oai):
    tools = [{"type": "function", "name": "get_weather",
              "description": "Get the current weather in a city",
              "parameters": TOOLS[0]["input_schema"]}]
    r = oai.responses.create(model=MODEL, input=WEATHER, tools=tools, max_output_tokens=40,
                             temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather", r.output
    assert json.loads(calls[0].arguments)["city"].lower() == "paris"
    r2 = oai.responses.create(model=MODEL, previous_response_id=r.id, tools=tools,
                              max_output_tokens=30, temperature=0, input=[
                                  {"type": "function_call_output", "call_id": calls[0].call_id,
                                   "output": "{\"temp_c\": 21, \"sky\": \"sunny\"}"}])
    assert "21" in r2.output_text or "sunny" in r2.output_text.lower(), r2.output
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=MODEL, input=WEATHER, tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0]"
