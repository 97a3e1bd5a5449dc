"""The OpenAI Responses API (/v1/responses) through `smelt serve`, over raw HTTP and the
official `openai` SDK's client.responses, with exactly the model text each case needs
(test_server_anthropic's vocabulary, Qwen3-shaped template and server fixtures,
`--fake-forward --fake-reply`).

Checked: output items (reasoning, message / output_text, function_call) whole and streamed
(the semantic event sequence, sequence numbers, the same item ids in every event and in the
final response; the SDK's stream accumulator rebuilds the response create() gives);
status incomplete at max_output_tokens; the request's conversion (instructions, input
items, function_call / function_call_output turns, reasoning) gives the prompt of the
equivalent chat request token for token; previous_response_id chaining from the store (the
stored conversation is the earlier turns without their instructions), store false, GET, the
store's byte bound; refusals naming the field in OpenAI's error shape."""
import json
import os

import pytest

from smelt_server import SMELT, Server

gguf = pytest.importorskip("gguf")
openai = pytest.importorskip("openai")

# the vocabulary, template, scripted reply and server fixtures
from test_server_anthropic import MODEL, REPLY, USER, files, serve  # noqa: E402,F401

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]
OAI_TOOLS = [{"type": "function", "function": {"name": "get_weather",
                                               "description": "Weather in a city",
                                               "parameters": TOOLS[0]["parameters"]}}]


def create(s, body, status=200):
    st, j = s.post("/v1/responses", dict({"model": MODEL}, **body))
    assert st == status, j
    return j


def events_of(s, body):
    st, h, data = s.request("POST", "/v1/responses", dict({"model": MODEL, "stream": True}, **body))
    assert st == 200 and h["content-type"] == "text/event-stream", data
    out = []
    for block in data.decode().split("\n\n"):
        if block.strip():
            name, d = block.split("\n")
            assert name.startswith("event: ") and d.startswith("data: ")
            ev = json.loads(d[6:])
            assert ev["type"] == name[7:]
            out.append(ev)
    return out


def without_ids(r):
    r = json.loads(json.dumps(r))
    for k in ("id", "created_at", "usage"):
        r.pop(k, None)
    for it in r["output"]:
        it.pop("id", None)
        it.pop("call_id", None)
    return r


def test_items_whole_and_streamed(serve):
    s = serve(REPLY)
    body = {"input": USER, "tools": TOOLS, "instructions": "Be brief."}
    r = create(s, body)
    assert r["object"] == "response" and r["status"] == "completed" and r["id"].startswith("resp_")
    assert [i["type"] for i in r["output"]] == ["reasoning", "message", "function_call"]
    rs, m, fc = r["output"]
    assert rs["content"] == [{"type": "reasoning_text", "text": "The user wants the weather."}]
    assert rs["id"].startswith("rs_") and rs["summary"] == []
    assert m["role"] == "assistant" and m["status"] == "completed" and m["id"].startswith("msg_")
    assert m["content"] == [{"type": "output_text", "text": "Let me check.", "annotations": [],
                             "logprobs": []}]
    assert fc["name"] == "get_weather" and json.loads(fc["arguments"]) == {"city": "Paris"}
    assert fc["id"].startswith("fc_") and fc["call_id"].startswith("call_")
    assert r["instructions"] == "Be brief." and r["tools"] == TOOLS and r["incomplete_details"] is None
    u = r["usage"]
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    assert u["output_tokens_details"]["reasoning_tokens"] > 5

    ev = events_of(s, body)
    types = [e["type"] for e in ev]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e["sequence_number"] for e in ev] == list(range(len(ev)))
    assert ev[0]["response"]["status"] == "in_progress" and ev[0]["response"]["output"] == []
    final = ev[-1]["response"]
    assert without_ids(final) == without_ids(r)
    # per item: added, (content part added), deltas, done events, item done; ids agree
    items, texts = {}, {}
    for e in ev[2:-1]:
        t = e["type"]
        if t == "response.output_item.added":
            assert e["output_index"] == len(items) and e["item"]["status"] == "in_progress"
            items[e["output_index"]] = e["item"]
            texts[e["output_index"]] = ""
            continue
        i = e["output_index"]
        if t == "response.output_item.done":
            assert e["item"] == final["output"][i] and e["item"]["id"] == items[i]["id"]
            continue
        assert e["item_id"] == items[i]["id"], e
        if t.endswith(".delta"):
            texts[i] += e["delta"]
    assert texts == {0: "The user wants the weather.", 1: "Let me check.",
                     2: fc["arguments"]}
    assert "response.function_call_arguments.done" in types and "response.output_text.done" in types
    assert "response.reasoning_text.delta" in types and "response.content_part.done" in types

    # the SDK: create, and its stream accumulator
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    whole = c.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS)
    assert whole.output[2].type == "function_call" and whole.output_text == "Let me check."
    with c.responses.stream(model=MODEL, input="Weather in Paris?", tools=TOOLS) as st:
        seen = [e.type for e in st]
        got = st.get_final_response()
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert without_ids(got.model_dump(exclude_none=True)) == without_ids(whole.model_dump(exclude_none=True))


def test_incomplete_and_text_only(serve):
    s = serve("Hello there, a long answer.")
    r = create(s, {"input": "hi", "max_output_tokens": 5})
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert r["output"][0]["status"] == "incomplete" and r["usage"]["output_tokens"] == 5
    ev = events_of(s, {"input": "hi", "max_output_tokens": 5})
    assert ev[-1]["type"] == "response.incomplete" and ev[-1]["response"]["status"] == "incomplete"
    r = create(s, {"input": "hi"})
    assert r["status"] == "completed" and [i["type"] for i in r["output"]] == ["message"]
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    assert c.responses.create(model=MODEL, input="hi").output_text == "Hello there, a long answer."


def same_prompt(s, body, messages, **chat):
    """As in test_server_anthropic: the Responses request renders the chat request's prompt."""
    st, c = s.post("/v1/chat/completions", dict({"model": MODEL, "messages": messages,
                                                 "max_tokens": 1}, **chat))
    assert st == 200, c
    n = c["usage"]["prompt_tokens"]
    r = create(s, dict({"max_output_tokens": 1}, **body))
    u = r["usage"]
    assert u["input_tokens"] == n and u["input_tokens_details"]["cached_tokens"] == n - 1, (u, n)
    s.wait_idle()
    return r


def test_conversion_and_chaining(serve):
    s = serve("ok", "--block-size", "1")
    same_prompt(s, {"input": "hi", "instructions": "Be brief."},
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    items = [
        {"role": "developer", "content": "Rules."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Think."}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather",
         "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "25 C"}]},
        {"role": "user", "content": "And tomorrow?"}]
    chat = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "a\nb"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "Think.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                 {"id": "call_2", "type": "function", "function": {
                     "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "25 C"},
            {"role": "user", "content": "And tomorrow?"}]
    same_prompt(s, {"input": items, "tools": TOOLS}, chat, tools=OAI_TOOLS)
    same_prompt(s, {"input": "hi", "reasoning": {"effort": "none"}}, [{"role": "user", "content": "hi"}],
                reasoning_effort="none")
    # chaining: the stored conversation (without the instructions) comes before the input
    r1 = same_prompt(s, {"input": "first", "instructions": "Old rules."},
                     [{"role": "system", "content": "Old rules."}, {"role": "user", "content": "first"}])
    said = r1["output"][0]["content"][0]["text"]  # (max_output_tokens 1: "o")
    conv = [{"role": "user", "content": "first"}, {"role": "assistant", "content": said}]
    r2 = same_prompt(s, {"input": "second", "previous_response_id": r1["id"],
                         "instructions": "New rules."},
                     [{"role": "system", "content": "New rules."}] + conv +
                     [{"role": "user", "content": "second"}])
    assert r2["previous_response_id"] == r1["id"]
    same_prompt(s, {"input": "third", "previous_response_id": r2["id"]},
                conv + [{"role": "user", "content": "second"}, {"role": "assistant", "content": said},
                        {"role": "user", "content": "third"}])
    # GET gives the stored response; store false keeps none
    st, h, g = s.request("GET", f"/v1/responses/{r1['id']}")
    assert st == 200 and json.loads(g) == r1
    r4 = create(s, {"input": "x", "store": False, "max_output_tokens": 1})
    assert r4["store"] is False
    st, j = s.post("/v1/responses", {"input": "y", "previous_response_id": r4["id"]})
    assert st == 400 and j["error"]["param"] == "previous_response_id", j
    assert j["error"]["code"] == "previous_response_not_found"
    assert s.request("GET", f"/v1/responses/{r4['id']}")[0] == 404


def test_function_call_round_trip_sdk(serve):
    s = serve(REPLY)
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    r = c.responses.create(model=MODEL, input="Weather in Paris?", tools=TOOLS)
    call = [o for o in r.output if o.type == "function_call"][0]
    assert json.loads(call.arguments) == {"city": "Paris"}
    # stateless: the output items go back as input, with the call's output
    inp = [{"role": "user", "content": "Weather in Paris?"}] + \
        [o.model_dump(exclude_none=True) for o in r.output] + \
        [{"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}]
    r2 = c.responses.create(model=MODEL, input=inp, tools=TOOLS)
    # stateful: previous_response_id and only the new item
    r3 = c.responses.create(model=MODEL, previous_response_id=r.id, tools=TOOLS, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}])
    assert r2.usage.input_tokens == r3.usage.input_tokens
    assert r3.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens // 16 * 16


def test_store_bound(serve):
    s = serve("ok", "--response-store", "6000")
    ids = [create(s, {"input": "hello " * 20, "max_output_tokens": 1})["id"] for _ in range(6)]
    got = [s.request("GET", f"/v1/responses/{i}")[0] for i in ids]
    # each entry is about 2 KB (the response object and the conversation): the oldest go first
    assert got[-1] == 200 and got[0] == 404 and got == sorted(got, reverse=True), got
    s2 = serve("ok", "--response-store", "0")
    r = create(s2, {"input": "hi"})
    assert s2.request("GET", f"/v1/responses/{r['id']}")[0] == 404
    st, j = s2.post("/v1/responses", {"input": "hi", "previous_response_id": r["id"]})
    assert st == 400 and "--response-store 0" in j["error"]["message"]


def test_refusals_name_the_field(serve):
    s = serve("ok")

    def bad(body, param):
        st, j = s.post("/v1/responses", dict({"model": MODEL, "input": "hi"}, **body))
        assert st == 400 and j["error"]["param"] == param, (body, j)
        assert j["error"]["type"] == "invalid_request_error"

    bad({"input": None}, "input")
    bad({"input": []}, "input")
    bad({"input": 5}, "input")
    bad({"input": [{"role": "robot", "content": "x"}]}, "input[0]")
    bad({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input[0].content[0]")
    bad({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0]")
    bad({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output")
    bad({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]")
    bad({"input": [{"role": "user", "content": "x", "extra": 1}]}, "input[0]")
    bad({"instructions": 5}, "instructions")
    bad({"tools": [{"type": "web_search"}]}, "tools[0]")
    bad({"tools": [dict(TOOLS[0], strict="yes")]}, "tools[0]")
    bad({"tools": [{"type": "function"}]}, "tools[0]")
    bad({"tool_choice": "required"}, "tool_choice")
    bad({"tool_choice": {"type": "file_search"}}, "tool_choice")
    bad({"tools": TOOLS, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice")
    bad({"max_output_tokens": 0}, "max_output_tokens")
    bad({"temperature": 3}, "temperature")
    bad({"reasoning": {"effort": "max"}}, "reasoning.effort")
    bad({"text": {"format": {"type": "xml"}}}, "text.format")
    bad({"truncation": "auto"}, "truncation")
    bad({"include": ["message.output_text.logprobs"]}, "include")
    bad({"background": True}, "background")
    bad({"top_logprobs": 3}, "top_logprobs")
    bad({"previous_response_id": 5}, "previous_response_id")
    bad({"previous_response_id": "resp_nope"}, "previous_response_id")
    bad({"frequency_penalty": 1}, "frequency_penalty")
    bad({"stream_options": {"include_usage": True}}, "stream_options")
    st, j = s.post("/v1/responses", {"model": "other", "input": "hi"})
    assert st == 404 and j["error"]["code"] == "model_not_found"
    # accepted: what changes nothing here
    create(s, {"input": "hi", "user": "u", "metadata": {"k": "v"}, "store": True,
               "parallel_tool_calls": False, "truncation": "disabled", "service_tier": "auto",
               "include": ["reasoning.encrypted_content"], "text": {"format": {"type": "text"},
                                                                   "verbosity": "low"},
               "reasoning": {"effort": "low", "summary": "auto"}, "prompt_cache_key": "k",
               "stream_options": None})
    c = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="hi", temperature=3)
    assert e.value.body["param"] == "temperature"


def test_engine_failure_mid_reply(serve):
    s = serve(REPLY, "--fake-fail-at", "60")
    ev = events_of(s, {"input": USER})
    types = [e["type"] for e in ev]
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert "response.output_item.added" in types and "response.output_item.done" in types
    assert types[-2:] == ["error", "response.failed"], types
    assert ev[-2]["code"] == "server_error" and ev[-2]["message"]
    failed = ev[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in ev] == list(range(len(ev)))
    st, j = s.post("/v1/responses", {"model": MODEL, "input": USER})
    assert st == 500 and j["error"]["type"] == "server_error", j
