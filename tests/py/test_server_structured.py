"""Structured output through `smelt serve` (docs/structured-output.md), in two parts.

Scripted replies: the model is test_server_tools.py's byte-level vocabulary with `--fake-forward --fake-reply`:
the scripted reply's next token gets a logit of 30 and every other token 0, so where the
grammar allows the script it is followed exactly, and where it does not, the grammar's mask
picks among the allowed tokens. So a reply that already follows the grammar comes back as it
is, and one that does not is bent into one that does: checked with Python's `jsonschema`
(the independent reference), over OpenAI's chat and completions (response_format,
llama.cpp's grammar and json_schema fields, strict tools in each tool-call syntax), the
Responses and Anthropic Messages routes, streamed and whole, greedy and sampled.

The real test model (Qwen2.5-Coder-0.5B-Instruct, docs/models.md), one server for the module:
every input form at once in one batch (response_format json_object and json_schema, llama.cpp's
json_schema and grammar fields, strict tools under tool_choice required and a named function,
n = 2 sampled and streamed, completions' json_schema, Messages' strict tool_choice tool) beside a
free request, whose greedy text must equal what it gets alone (one sequence's grammar never
changes another's tokens); each output checked with `jsonschema` (format checker on); refusals
as 400s naming the field and the schema path."""
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from smelt_server import QWEN, SMELT, Server
from test_server_tools import HERMES, LLAMA3, MISTRAL, MISTRAL_ARGS, QWEN_XML, serve, write_vocab

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

USER = [{"role": "user", "content": "Weather in Paris?"}]

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age"], "additionalProperties": False}

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit"], "additionalProperties": False}
STRICT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True,
                                                  "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    tmpl = {}
    for name, src in (("hermes", HERMES), ("mistral", MISTRAL), ("mistral_args", MISTRAL_ARGS),
                      ("llama3", LLAMA3), ("qwen_xml", QWEN_XML)):
        p = d / f"{name}.jinja"
        p.write_text(src)
        tmpl[name] = str(p)
    return write_vocab(str(d / "bare.gguf")), tmpl


@pytest.fixture(scope="module")
def server(vocab):
    """server(reply, template="hermes") -> a started server (one per reply and template for
    the module: the script is the server's)."""
    model, tmpl = vocab
    started = {}

    def start(reply, template="hermes"):
        if (reply, template) not in started:
            started[reply, template] = serve(
                model, reply, *(("--chat-template", tmpl[template]) if template else ()))
        return started[reply, template]
    yield start
    for s in started.values():
        assert s.stop() == 0, s.log()


def chat(s, **kw):
    """The choices of a chat request, sampled with a fixed seed: the script's token (logit 30)
    is taken wherever the grammar allows it, and where it does not, a token drawn uniformly
    among the allowed ones (greedy would take the lowest id, whitespace, over and over)."""
    st, j = s.post("/v1/chat/completions", dict({"model": "m", "messages": USER,
                                                 "max_tokens": 120, "temperature": 1, "seed": 1}, **kw))
    assert st == 200, j
    return j["choices"]


def streamed_content(s, **kw):
    st, events, raw = s.stream("/v1/chat/completions", dict({"model": "m", "messages": USER,
                                                             "max_tokens": 120, "stream": True,
                                                             "temperature": 1, "seed": 1}, **kw))
    assert st == 200 and events[-1] == "[DONE]", raw[-400:]
    return "".join(c["delta"].get("content") or "" for e in events[:-1] for c in e["choices"])


def json_schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


def test_response_format_bends_any_reply(server):
    # the script is the valid document: it comes back as it is; a reply that is not JSON
    # (a preamble, wrong types, an array) is bent into a document that validates
    good = '{"name": "Ann", "age": 31, "tags": ["a"]}'
    s = server(good)
    for fmt in (json_schema_format(PERSON), {"type": "json_object"}):
        c = chat(s, response_format=fmt)[0]
        assert c["message"]["content"] == good and c["finish_reason"] == "stop", c
        assert streamed_content(s, response_format=fmt) == good
    for reply in ('Sure! Here it is: {"name": "Ann"}', '{"name": "A very long name indeed", '
                  '"age": "31", "extra": true}', "[1, 2, 3]"):
        s = server(reply)
        c = chat(s, response_format=json_schema_format(PERSON), max_tokens=400)[0]
        assert c["finish_reason"] == "stop", (reply, c)
        jsonschema.validate(json.loads(c["message"]["content"]), PERSON)
    # json_object over a reply that never closes its object: cut by max_tokens, the text is
    # still the beginning of an object (a key that goes on)
    c = chat(server("[1, 2, 3]"), response_format={"type": "json_object"}, max_tokens=30)[0]
    assert c["finish_reason"] == "length" and c["message"]["content"].startswith("{"), c


def test_sampled_choices_all_validate(server):
    s = server('{"nope": 1}')
    for c in chat(s, response_format=json_schema_format(PERSON), n=4, temperature=1.0, seed=3,
                  max_tokens=400):
        assert c["finish_reason"] == "stop", c
        jsonschema.validate(json.loads(c["message"]["content"]), PERSON)


def test_length_leaves_a_prefix(server):
    s = server('{"name": "Ann", "age": 31}')
    c = chat(s, response_format=json_schema_format(PERSON), max_tokens=5)[0]
    assert c["finish_reason"] == "length"
    assert '{"name": "Ann", "age": 31}'.startswith(c["message"]["content"])


def test_completions_llama_cpp_fields(server):
    s = server("red, green, and purple", template=None)
    st, j = s.post("/v1/completions", {"model": "m", "prompt": "Colors:", "max_tokens": 60,
                                       "grammar": 'root ::= c (", " c)*\nc ::= "red" | "green" | "blue"'})
    assert st == 200, j
    text, finish = j["choices"][0]["text"], j["choices"][0]["finish_reason"]
    # the script's "and purple" is refused: the grammar goes on with its colors (to max_tokens,
    # a prefix of a sentence)
    assert text.startswith("red, green, ") and finish == "length"
    assert re.fullmatch(r"((red|green|blue), )*(red|green|blue|r|re|g|gr|gre|gree|b|bl|blu|, ?)?",
                        text), text
    schema = {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 2,
              "maxItems": 2}
    st, j = s.post("/v1/completions", {"model": "m", "prompt": "Colors:", "max_tokens": 200,
                                       "json_schema": schema})
    assert st == 200 and j["choices"][0]["finish_reason"] == "stop", j
    jsonschema.validate(json.loads(j["choices"][0]["text"]), schema)
    # chat takes them too
    st, j = s.post("/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 20,
                                            "grammar": 'root ::= "yes" | "no"'})
    assert st == 200 and j["choices"][0]["message"]["content"] in ("yes", "no"), j


def test_refusals_name_the_field(server):
    s = server("x")
    cases = [
        ({"response_format": json_schema_format({"type": "object", "properties": {
            "a": {"type": "string", "format": "hostname"}}})},
         "response_format.json_schema.schema", "/properties/a"),
        ({"json_schema": {"type": "object", "if": {}}}, "json_schema", "'if'"),
        ({"grammar": "root ::= \"a\" | b"}, "grammar", "line 1"),
        ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
            "type": "object", "properties": {"x": {"type": "array", "contains": {}}}}}}]},
         "tools[0].function.parameters", "/properties/x"),
        ({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}, "grammar",
         "both"),
    ]
    for body, param, text in cases:
        st, j = s.post("/v1/chat/completions", dict({"model": "m", "messages": USER}, **body))
        assert st == 400 and j["error"]["param"] == param and text in j["error"]["message"], (body, j)


# ---- strict tools, in each tool-call syntax ----

def call_reply(syntax, city, unit, extra=""):
    """A reply calling get_weather in syntax, its arguments as given (maybe invalid)."""
    args = json.dumps(dict({"city": city, "unit": unit}, **({"x": 1} if extra else {})))
    if syntax == "hermes":
        return f'Checking.\n<tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    if syntax == "qwen_xml":
        return (f"Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n{city}\n"
                f"</parameter>\n<parameter=unit>\n{unit}\n</parameter>\n</function>\n</tool_call>")
    if syntax == "llama3":
        return f'{{"name": "get_weather", "parameters": {args}}}'
    if syntax == "mistral":
        return f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {args}}}]'
    return f"[TOOL_CALLS]get_weather[ARGS]{args}"


PREFILL = {"hermes": '<tool_call>\n{"name": "', "qwen_xml": "<tool_call>\n<function=",
           "llama3": '{"name": "', "mistral": '[TOOL_CALLS][{"name": "', "mistral_args": "[TOOL_CALLS]"}


@pytest.mark.parametrize("syntax", ["hermes", "qwen_xml", "llama3", "mistral", "mistral_args"])
@pytest.mark.parametrize("tc", ["auto", "required"])
def test_strict_tool_calls(server, syntax, tc):
    def script(reply):  # a forced call's prompt ends with the call's opening (the prefill)
        return reply if tc == "auto" else reply[reply.index(PREFILL[syntax]) + len(PREFILL[syntax]):]
    one = dict(tools=STRICT_TOOLS, tool_choice=tc, parallel_tool_calls=False, max_tokens=300)
    # a valid call comes back as it is
    s = server(script(call_reply(syntax, "Paris", "c")), template=syntax)
    c = chat(s, **one)[0]
    calls = c["message"].get("tool_calls") or []
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather", c
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "unit": "c"}
    assert c["finish_reason"] == "tool_calls"
    # arguments that break the schema (a unit not in its enum, a key it does not have) are bent
    # into arguments that follow it
    s = server(script(call_reply(syntax, "Paris", "kelvin", extra="x")), template=syntax)
    c = chat(s, **one)[0]
    calls = c["message"].get("tool_calls") or []
    assert len(calls) == 1 and c["finish_reason"] == "tool_calls", c
    args = json.loads(calls[0]["function"]["arguments"])
    jsonschema.validate(args, WEATHER)
    assert args["city"] == "Paris" and args["unit"] in ("c", "f")


def test_strict_tool_text_reply_and_format_or_call(server):
    # auto + strict: a text reply stays text; with a response format beside the tools, the
    # reply is the format's document or a call
    s = server("It is sunny.")
    m = chat(s, tools=STRICT_TOOLS)[0]["message"]
    assert m["content"] == "It is sunny." and not m.get("tool_calls")
    # (the call's city bounded: a free string that the script never closes would go on)
    short = dict(WEATHER, properties=dict(WEATHER["properties"], city={"type": "string", "maxLength": 8}))
    tools = [{"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": short}}]
    for seed in (1, 2, 3, 4):
        m = chat(s, tools=tools, response_format=json_schema_format(PERSON), max_tokens=400,
                 seed=seed)[0]["message"]
        if m.get("tool_calls"):
            jsonschema.validate(json.loads(m["tool_calls"][0]["function"]["arguments"]), short)
        else:
            jsonschema.validate(json.loads(m["content"]), PERSON)
    s = server(call_reply("hermes", "Oslo", "f")[len("Checking.\n"):])
    m = chat(s, tools=STRICT_TOOLS, response_format=json_schema_format(PERSON))[0]["message"]
    assert json.loads(m["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo", "unit": "f"}


def test_qwen_xml_string_pattern_refused(server):
    s = server("x", template="qwen_xml")
    tools = [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}}}]
    st, j = s.post("/v1/chat/completions", {"model": "m", "messages": USER, "tools": tools})
    assert st == 400 and j["error"]["param"] == "tools[0].function.parameters.properties.code", j
    assert "pattern" in j["error"]["message"]


# ---- the other routes ----

def test_responses_and_messages_formats(server):
    s = server("Here you go: Ann, 31")
    st, j = s.post("/v1/responses", {"model": "m", "input": "Ann?", "max_output_tokens": 200,
                                     "text": {"format": {"type": "json_schema", "name": "p",
                                                         "schema": PERSON, "strict": True}}})
    assert st == 200, j
    text = "".join(c["text"] for o in j["output"] if o["type"] == "message" for c in o["content"])
    jsonschema.validate(json.loads(text), PERSON)
    st, j = s.post("/v1/messages", {"model": "m", "max_tokens": 200, "messages": USER,
                                    "output_config": {"format": {"type": "json_schema", "schema": PERSON}}})
    assert st == 200, j
    jsonschema.validate(json.loads(j["content"][0]["text"]), PERSON)
    # strict tools there too (a script whose arguments break the schema), and refusals in
    # each API's own names
    c = server(call_reply("hermes", "Rome", "kelvin", extra="x")[len("Checking.\n"):][len(PREFILL["hermes"]):])
    st, j = c.post("/v1/messages", {"model": "m", "max_tokens": 200, "messages": USER, "temperature": 0,
                                    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                                    "tools": [{"name": "get_weather", "input_schema": WEATHER, "strict": True}]})
    assert st == 200 and j["stop_reason"] == "tool_use", j
    assert j["content"][-1]["input"]["city"] == "Rome"
    jsonschema.validate(j["content"][-1]["input"], WEATHER)
    st, j = c.post("/v1/responses", {"model": "m", "max_output_tokens": 200, "input": "x", "temperature": 0,
                                     "tool_choice": "required", "parallel_tool_calls": False, "tools": [
                                         {"type": "function", "name": "get_weather", "parameters": WEATHER,
                                          "strict": True}]})
    assert st == 200, j
    calls = [o for o in j["output"] if o["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather", j
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
    st, j = s.post("/v1/messages", {"model": "m", "max_tokens": 20, "messages": USER, "tools": [
        {"name": "f", "strict": True, "input_schema": {"type": "object", "properties": {"a": {"not": {}}}}}]})
    assert st == 400 and "tools[0].input_schema" in j["error"]["message"], j
    st, j = s.post("/v1/responses", {"model": "m", "input": "x", "text": {"format": {
        "type": "json_schema", "name": "p", "schema": {"type": "object", "if": {}}}}})
    assert st == 400 and j["error"]["param"] == "text.format.schema", j


# ---- the real test model ----

TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}},
        "required": ["timezone"], "additionalProperties": False}
EVENT = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 30}, "date": {"type": "string", "format": "date"},
    "priority": {"enum": ["low", "high"]}}, "required": ["title", "date", "priority"],
    "additionalProperties": False}
REAL_TOOLS = [{"type": "function", "function": {"name": "get_weather", "strict": True,
                                                "description": "Current weather in a city",
                                                "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time", "strict": True,
                                                "description": "Current time in a timezone",
                                                "parameters": TIME}}]


def valid(doc, schema):
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def qwen():
    if not os.path.exists(QWEN):
        pytest.skip(f"model absent: {QWEN} (make models)")
    s = Server(QWEN, "--served-model-name", "m", "--quiet", "-c", "1024")
    yield s
    assert s.stop() == 0, s.log()


def test_real_model_one_batch(qwen):
    s = qwen
    ask = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    chat_ = lambda **kw: ("/v1/chat/completions", dict({"model": "m", "temperature": 0,  # noqa: E731
                                                         "max_tokens": 48}, **kw))
    free = chat_(messages=ask("Name three colors."), max_tokens=12)
    reqs = {
        "free": free,
        "schema": chat_(messages=ask("Make up an event for next week."),
                        response_format=json_schema_format(EVENT)),
        "object": chat_(messages=ask('Reply with the JSON object {"ok": true}.'),
                        response_format={"type": "json_object"}),
        "gbnf": chat_(messages=ask("Is the sky blue? Answer yes or no."),
                      grammar='root ::= ("yes" | "no") "."'),
        "required": chat_(messages=ask("What is the weather in Paris?"), tools=REAL_TOOLS,
                          tool_choice="required", parallel_tool_calls=False),
        "named": chat_(messages=ask("What is the weather in Paris?"), tools=REAL_TOOLS,
                       tool_choice={"type": "function", "function": {"name": "get_time"}}),
        "n2": chat_(messages=ask("Make up an event."), response_format=json_schema_format(EVENT),
                    n=2, temperature=1.0, seed=7, stream=True),
        "completions": ("/v1/completions", {"model": "m", "prompt": "A person in JSON:", "max_tokens": 40,
                                            "temperature": 0, "json_schema": PERSON}),
        "messages": ("/v1/messages", {"model": "m", "max_tokens": 48, "temperature": 0,
                                      "messages": ask("What time is it in Tokyo?"),
                                      "tool_choice": {"type": "tool", "name": "get_time"},
                                      "tools": [{"name": "get_time", "input_schema": TIME, "strict": True}]}),
    }

    # The whole batch on the real model takes ~45 s under the ASan build (-O1) on a quiet
    # 2-core machine, so the default 60 s timed out whenever anything else ran beside it.
    def send(item):
        path, body = item
        if body.get("stream"):
            st, events, raw = s.stream(path, body, timeout=180)
            return st, events
        return s.post(path, body, timeout=180)
    with ThreadPoolExecutor(len(reqs)) as pool:  # one batch: the engine takes them together
        got = dict(zip(reqs, pool.map(send, reqs.values())))
    for k, (st, j) in got.items():
        assert st == 200, (k, j)

    def one(k):
        c = got[k][1]["choices"][0]
        assert c["finish_reason"] in ("stop", "tool_calls"), (k, c)
        return c
    valid(json.loads(one("schema")["message"]["content"]), EVENT)
    assert isinstance(json.loads(one("object")["message"]["content"]), dict)
    assert one("gbnf")["message"]["content"] in ("yes.", "no.")
    for k, name, schema in (("required", None, WEATHER), ("named", "get_time", TIME)):
        calls = one(k)["message"]["tool_calls"]
        assert len(calls) == 1 and name in (None, calls[0]["function"]["name"]), (k, calls)
        valid(json.loads(calls[0]["function"]["arguments"]),
              {"get_weather": WEATHER, "get_time": TIME}[calls[0]["function"]["name"]])
    valid(json.loads(got["completions"][1]["choices"][0]["text"]), PERSON)
    m = got["messages"][1]
    assert m["stop_reason"] == "tool_use" and m["content"][-1]["name"] == "get_time", m
    valid(m["content"][-1]["input"], TIME)
    # n = 2, sampled and streamed: each choice's text validates
    events = got["n2"][1]
    texts, finish = {}, {}
    for e in events[:-1]:
        for c in e["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + (c["delta"].get("content") or "")
            finish[c["index"]] = c.get("finish_reason") or finish.get(c["index"])
    assert sorted(texts) == [0, 1] and set(finish.values()) == {"stop"}, (texts, finish)
    for t in texts.values():
        valid(json.loads(t), EVENT)
    # the free request in that batch got the greedy text it gets alone
    st, alone = s.post(*free)
    assert st == 200 and alone["choices"][0]["message"]["content"] == one("free")["message"]["content"], \
        (alone, got["free"][1])
    # the engine counted the grammar rows (/metrics)
    assert s.metrics()["smelt_grammar_rows_total"] > 0


def test_sdk_parse_pydantic_and_strict_tool(qwen):
    """The official openai SDK's structured outputs as applications use them: parse() with a
    Pydantic model (the SDK turns it into a strict json_schema response_format and parses
    the reply back into the model), and a strict tool made by openai.pydantic_function_tool
    under a named tool_choice, whose parsed arguments come back as the tool's model."""
    import datetime
    from typing import List, Literal

    import pydantic
    openai = pytest.importorskip("openai")

    class Attendee(pydantic.BaseModel):
        name: str
        role: Literal["host", "guest"]

    class Event(pydantic.BaseModel):
        title: str
        day: datetime.date
        attendees: List[Attendee]

    class GetWeather(pydantic.BaseModel):
        city: str
        unit: Literal["celsius", "fahrenheit"]

    client = openai.OpenAI(base_url=qwen.url + "/v1", api_key="none", timeout=120, max_retries=0)
    parse = client.chat.completions.parse if hasattr(client.chat.completions, "parse") \
        else client.beta.chat.completions.parse
    r = parse(model="m", temperature=0, max_tokens=120, response_format=Event,
              messages=[{"role": "user", "content": "Make up a team lunch next week with two people."}])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "stop", r
    assert isinstance(msg.parsed, Event), msg
    assert msg.parsed.attendees and all(a.role in ("host", "guest") for a in msg.parsed.attendees)
    r = parse(model="m", temperature=0, max_tokens=60,
              messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
              tools=[openai.pydantic_function_tool(GetWeather)],
              tool_choice={"type": "function", "function": {"name": "GetWeather"}})
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather), call
    assert call.function.parsed_arguments.unit in ("celsius", "fahrenheit")


def test_real_model_refusals(qwen):
    """Refusals name the field and the schema path, and the server goes on."""
    cases = [
        ("/v1/chat/completions", {"response_format": json_schema_format(
            {"type": "object", "properties": {"a": {"type": "string", "format": "hostname"}}})},
         "response_format.json_schema.schema", "/properties/a"),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {
            "name": "f", "strict": True, "parameters": {"type": "object", "patternProperties": {}}}}]},
         "tools[0].function.parameters", "patternProperties"),
        ("/v1/chat/completions", {"grammar": "root ::= x"}, "grammar", "x"),
        ("/v1/responses", {"text": {"format": {"type": "json_schema", "name": "e", "schema": {
            "type": "array", "contains": {}}}}}, "text.format.schema", "contains"),
    ]
    for path, body, param, text in cases:
        base = {"model": "m", "max_tokens": 8} if path != "/v1/responses" else {"model": "m", "input": "x"}
        if path == "/v1/chat/completions":
            base["messages"] = USER
        st, j = qwen.post(path, dict(base, **body))
        assert st == 400 and j["error"]["param"] == param and text in j["error"]["message"], (body, j)
