"""Chat templates and tool calls through `smelt serve`, over raw HTTP and the official
`openai` SDK, with exactly the model text each case needs.

The model is a vocabulary only: a byte-level BPE vocab (every byte is a token, so any text
round-trips) with the special tokens of the Hermes/Qwen, Mistral and Llama 3 families,
written here with gguf-py (the independent GGUF writer), with chat templates chosen per
test. `smelt serve --fake-forward --fake-reply TEXT` then answers every request with TEXT,
token by token, so what the server makes of a known reply can be checked exactly:

- the ChatML fallback for a model without a chat template (BOS added, logged once);
- tokenizer.chat_template.tool_use picked when a request passes tools;
- tool calls in each syntax, whole and streamed: the stream's deltas have OpenAI's shape
  (first delta of a call: index, id, type, name, "" arguments; then index and argument
  pieces) and summing them by index, or the SDK's own stream accumulator, rebuilds
  exactly the calls of the whole response;
- tool_choice required / named (a prefilled call opening), none, parallel_tool_calls;
- refusals: tools for a template that cannot show them, a forced call for a template
  whose syntax smelt does not know."""
import json
import os

import pytest

from smelt_server import ROOT, SMELT, Server

gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")


# ---- the vocabulary ----

def byte_alphabet():
    """GPT-2's byte-level alphabet: byte -> the character that spells it in the vocab."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1))
            + list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


CONTROL = ["<s>", "<|im_start|>", "<|im_end|>", "[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]",
           "<|python_tag|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
USER_DEFINED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]


def write_vocab(path, chat_template=None, tool_use=None, add_bos=False):
    alpha = byte_alphabet()
    tokens = [alpha[b] for b in range(256)] + ["\u0120a"] + CONTROL + USER_DEFINED
    types = [1] * 257 + [3] * len(CONTROL) + [4] * len(USER_DEFINED)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(["\u0120 a"])
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(add_bos)
    if tool_use is not None:
        w.add_chat_template([{"name": "default", "template": chat_template},
                             {"name": "tool_use", "template": tool_use}])
    elif chat_template is not None:
        w.add_chat_template(chat_template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- templates (shaped like the families' own, reduced) ----

HERMES = """{%- if tools %}<|im_start|>system
# Tools
{% for t in tools %}{{ t | tojson }}
{% endfor %}Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}<tool_call>
{{ c.function | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

MISTRAL = """{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}
{%- for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]{% else %}
{%- if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list | tojson }}
{%- else %}{{ m.content }}{% endif %}{% endif %}{% endfor %}"""

MISTRAL_ARGS = MISTRAL.replace("[TOOL_CALLS]{{", "[TOOL_CALLS]{{ m.tool_calls[0].function.name }}[ARGS]{{")

LLAMA3 = """{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{% if tools and loop.last %}Tools: {{ tools | tojson }}. Reply with {"name": ..., "parameters": ...}.
{% endif %}{{ m.content }}<|eot_id|>{% endfor %}<|start_header_id|>assistant<|end_header_id|>

"""

# Qwen3-Coder's shape: calls as <function=...> tags, non-string values written with tojson
# (mappings, lists) or Jinja's string (the rest)
QWEN_XML = """{%- if tools %}<|im_start|>system
# Tools
<tools>{% for t in tools %}
<function><name>{{ t.function.name }}</name></function>{% endfor %}
</tools>
Call one as <tool_call>
<function=NAME>
<parameter=KEY>
VALUE
</parameter>
</function>
</tool_call><|im_end|>
{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.content %}{{ m.content }}{% endif %}{% for c in m.tool_calls or [] %}
<tool_call>
<function={{ c.function.name }}>
{% for k, v in c.function.arguments | items %}<parameter={{ k }}>
{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}
</parameter>
{% endfor %}</function>
</tool_call>{% endfor %}<|im_end|>
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# a template that shows tools but not in a syntax smelt knows how to force
PLAIN_TOOLS = """{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}{% if tools %}(functions: {{ tools | map(attribute='function.name') | join(', ') }})
{% endif %}<|im_start|>assistant
"""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time",
     "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}},
]
USER = [{"role": "user", "content": "Weather and time in Paris?"}]

TWO_CALLS = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
             '"S\u00e3o Paulo", "unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
             '"arguments": {"tz": "America/Sao_Paulo"}}\n</tool_call>')
CALLS_OF_TWO = [("get_weather", '{"city": "S\u00e3o Paulo", "unit": "c"}'),
                ("get_time", '{"tz": "America/Sao_Paulo"}')]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    tmpl = {}
    for name, src in (("hermes", HERMES), ("mistral", MISTRAL), ("mistral_args", MISTRAL_ARGS),
                      ("llama3", LLAMA3), ("plain_tools", PLAIN_TOOLS), ("qwen_xml", QWEN_XML)):
        p = d / f"{name}.jinja"
        p.write_text(src)
        tmpl[name] = str(p)
    return {
        "bare": write_vocab(str(d / "bare.gguf"), add_bos=True),
        "named": write_vocab(str(d / "named.gguf"), "DEFAULT {{ messages[0]['content'] }}",
                             tool_use="TOOL_USE {% for t in tools %}{{ t.function.name }} "
                                      "{% endfor %}<tool_call>{{ messages[0]['content'] }}"),
        "tmpl": tmpl,
    }


def serve(model, reply, *args):
    return Server(model, "--fake-forward", "--fake-reply", reply, "--served-model-name", "m",
                  "--quiet", *args, start_timeout=30)


@pytest.fixture
def server_of(models):
    """server_of(template name or None, reply) -> a started server (stopped after the test)."""
    started = []

    def start(template, reply, model="bare"):
        args = ("--chat-template", models["tmpl"][template]) if template else ()
        s = serve(models[model], reply, *args)
        started.append(s)
        return s
    yield start
    for s in started:
        assert s.stop() == 0, s.log()


def chat(s, **kw):
    st, j = s.post("/v1/chat/completions", dict({"model": "m", "messages": USER,
                                                 "max_tokens": 400}, **kw))
    assert st == 200, j
    return j


def calls_of(message):
    return [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls") or []]


def stream_deltas(s, **kw):
    """Streams a chat request; checks each tool-call delta's shape; returns (content,
    calls summed by index (name, arguments), finish_reason, events)."""
    st, events, raw = s.stream("/v1/chat/completions", dict({"model": "m", "messages": USER,
                                                             "max_tokens": 400, "stream": True}, **kw))
    assert st == 200 and events[-1] == "[DONE]", raw[-500:]
    content, calls, finish, ids = "", {}, None, set()
    for e in events[:-1]:
        for ch in e["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                i = tc["index"]
                if i not in calls:
                    # a call's first delta: exactly OpenAI's fields, arguments ""
                    assert set(tc) == {"index", "id", "type", "function"}, tc
                    assert tc["type"] == "function" and tc["id"].startswith("call_")
                    assert set(tc["function"]) == {"name", "arguments"} and tc["function"]["arguments"] == ""
                    assert i == len(calls), "calls start in order"
                    assert tc["id"] not in ids
                    ids.add(tc["id"])
                    calls[i] = [tc["function"]["name"], ""]
                else:
                    assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}, tc
                    calls[i][1] += tc["function"]["arguments"]
            if ch["finish_reason"]:
                finish = ch["finish_reason"]
    return content, [tuple(calls[i]) for i in sorted(calls)], finish, events


# ---- templates ----

def test_fallback_template_bos_and_log(server_of):
    s = server_of(None, "Hello there.")
    j = chat(s)
    assert j["choices"][0]["message"]["content"] == "Hello there."
    chat(s, stream=True)
    # the ChatML default, as docs/templates.md gives it, with the vocab's BOS first
    chatml = "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n<|im_start|>assistant\n"
    st, t = s.post("/tokenize", {"messages": USER})
    st, ref = s.post("/tokenize", {"content": chatml, "add_special": False})
    st, bos = s.post("/tokenize", {"content": "<s>", "add_special": False})
    assert t["tokens"] == bos["tokens"] + ref["tokens"]
    assert j["usage"]["prompt_tokens"] == t["count"]
    # said once, at startup; tools cannot be shown by the default template
    assert sum("ChatML default" in l for l in s.lines) == 1, s.log()
    st, j = s.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS})
    assert st == 400 and j["error"]["param"] == "tools" and "ChatML default" in j["error"]["message"]
    st, j = s.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "none",
                                            "max_tokens": 5})
    assert st == 200, j


def test_tool_use_template(server_of):
    s = server_of(None, "Sure.", model="named")
    assert any("tokenizer.chat_template.tool_use" in l for l in s.lines), s.log()

    def rendered(**kw):
        st, t = s.post("/tokenize", dict({"messages": USER, "with_pieces": True}, **kw))
        assert st == 200, t
        st, d = s.post("/detokenize", {"tokens": [p["id"] for p in t["tokens"]]})
        return d["content"]
    assert rendered() == "DEFAULT Weather and time in Paris?"
    assert rendered(tools=TOOLS) == "TOOL_USE get_weather get_time <tool_call>Weather and time in Paris?"
    assert rendered(tools=TOOLS, tool_choice="none") == "DEFAULT Weather and time in Paris?"
    # a chat request renders the same prompt
    st, t = s.post("/tokenize", {"messages": USER, "tools": TOOLS})
    assert chat(s, tools=TOOLS)["usage"]["prompt_tokens"] == t["count"]


# ---- tool calls: whole, streamed, SDK ----

def test_hermes_calls_whole_and_streamed(server_of):
    s = server_of("hermes", TWO_CALLS)
    j = chat(s, tools=TOOLS)
    ch = j["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    assert ch["message"]["content"] == "Let me check."
    assert calls_of(ch["message"]) == CALLS_OF_TWO
    ids = [c["id"] for c in ch["message"]["tool_calls"]]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    assert all(c["type"] == "function" for c in ch["message"]["tool_calls"])
    content, calls, finish, events = stream_deltas(s, tools=TOOLS)
    assert (content, calls, finish) == ("Let me check.", CALLS_OF_TWO, "tool_calls")
    # incremental: the arguments came in several pieces, after the name
    pieces = [tc for e in events[:-1] for c in e["choices"] for tc in c["delta"].get("tool_calls") or []]
    assert len(pieces) > 6, pieces
    # parallel_tool_calls false: the first call only, and generation stops after it
    k = chat(s, tools=TOOLS, parallel_tool_calls=False)
    assert calls_of(k["choices"][0]["message"]) == CALLS_OF_TWO[:1]
    assert k["usage"]["completion_tokens"] < j["usage"]["completion_tokens"]
    assert stream_deltas(s, tools=TOOLS, parallel_tool_calls=False)[1] == CALLS_OF_TWO[:1]
    # tool_choice none: no tools in the prompt, the text is not parsed
    k = chat(s, tools=TOOLS, tool_choice="none")
    assert k["choices"][0]["message"]["content"] == TWO_CALLS and "tool_calls" not in k["choices"][0]["message"]
    assert k["choices"][0]["finish_reason"] == "stop"
    st, t = s.post("/tokenize", {"messages": USER, "tools": TOOLS, "tool_choice": "none"})
    st, u = s.post("/tokenize", {"messages": USER})
    assert t["tokens"] == u["tokens"]
    # n > 1: each choice has its own calls, indexed from 0
    st, events, raw = s.stream("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "n": 2,
                                                        "stream": True, "max_tokens": 400})
    names = {}
    for e in events[:-1]:
        for c in e["choices"]:
            for tc in c["delta"].get("tool_calls") or []:
                if "id" in tc:
                    names.setdefault(c["index"], []).append((tc["index"], tc["function"]["name"]))
    assert names == {0: [(0, "get_weather"), (1, "get_time")], 1: [(0, "get_weather"), (1, "get_time")]}


def test_sdk_stream_accumulation_matches(server_of):
    openai = pytest.importorskip("openai")
    s = server_of("hermes", TWO_CALLS)
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    whole = client.chat.completions.create(model="m", messages=USER, tools=TOOLS, max_tokens=400)
    want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert want == CALLS_OF_TWO
    with client.chat.completions.stream(model="m", messages=USER, tools=TOOLS, max_tokens=400) as st:
        done = [ev for ev in st if ev.type == "tool_calls.function.arguments.done"]
        final = st.get_final_completion()
    msg = final.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == want
    assert [c.id for c in msg.tool_calls] != [c.id for c in whole.choices[0].message.tool_calls]
    assert msg.content == whole.choices[0].message.content == "Let me check."
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(d.name, d.arguments) for d in done] == want
    # the low-level accumulator, chunk by chunk
    from openai.lib.streaming.chat import ChatCompletionStreamState
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(model="m", messages=USER, tools=TOOLS,
                                                max_tokens=400, stream=True):
        state.handle_chunk(chunk)
    got = state.get_final_completion().choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in got] == want
    # the round trip: the assistant's calls and the tool results render through the template
    msgs = USER + [whole.choices[0].message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": c.id, "content": "{\"ok\": true}"}
        for c in whole.choices[0].message.tool_calls]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, max_tokens=400)
    assert r.choices[0].message.tool_calls  # the fake model calls again, as scripted


@pytest.mark.parametrize("template,reply,want", [
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {}}]',
     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    ("mistral_args", '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
     [("get_weather", '{"city": "Paris"}'), ("get_time", "{}")]),
    ("llama3", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
               '{"name": "get_time", "parameters": {"tz": "CET"}}',
     [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
     [("get_weather", '{"city": "Paris"}')]),
    ("qwen_xml", '<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n'
                 '</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n'
                 '</parameter>\n</function>\n</tool_call>',
     [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')]),
])
def test_other_syntaxes(server_of, template, reply, want):
    s = server_of(template, reply)
    j = chat(s, tools=TOOLS)
    assert calls_of(j["choices"][0]["message"]) == want
    assert j["choices"][0]["message"]["content"] is None
    assert j["choices"][0]["finish_reason"] == "tool_calls"
    assert stream_deltas(s, tools=TOOLS)[:3] == ("", want, "tool_calls")
    k = chat(s, tools=TOOLS, parallel_tool_calls=False)
    assert calls_of(k["choices"][0]["message"]) == want[:1]


# ---- tool_choice ----

@pytest.mark.parametrize("template,choice,reply,prefix", [
    ("hermes", "required", 'get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
     '<tool_call>\n{"name": "'),
    ("hermes", "named", '{"tz": "CET"}}\n</tool_call>',
     '<tool_call>\n{"name": "get_time", "arguments": '),
    ("mistral", "named", '{"tz": "CET"}}]', '[TOOL_CALLS][{"name": "get_time", "arguments": '),
    ("mistral_args", "required", 'get_time[ARGS]{"tz": "CET"}', "[TOOL_CALLS]"),
    ("mistral_args", "named", '{"tz": "CET"}', "[TOOL_CALLS]get_time[ARGS]"),
    ("llama3", "named", '{"tz": "CET"}}', '{"name": "get_time", "parameters": '),
    ("qwen_xml", "required", 'get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>',
     "<tool_call>\n<function="),
    ("qwen_xml", "named", '<parameter=tz>\nCET\n</parameter>\n</function>\n</tool_call>',
     "<tool_call>\n<function=get_time>\n"),
])
def test_tool_choice_forces_a_call(server_of, template, choice, reply, prefix):
    s = server_of(template, reply)
    tc = "required" if choice == "required" else {"type": "function", "function": {"name": "get_time"}}
    # the prompt ends with the opening of the call
    st, t = s.post("/tokenize", {"messages": USER, "tools": TOOLS, "tool_choice": tc})
    st, d = s.post("/detokenize", {"tokens": t["tokens"]})
    assert d["content"].endswith(prefix), d["content"][-80:]
    st, u = s.post("/tokenize", {"messages": USER, "tools": TOOLS})
    st, du = s.post("/detokenize", {"tokens": u["tokens"]})
    assert d["content"] == du["content"] + prefix
    # the model's continuation completes it; the prefill is not echoed as content
    want = [("get_time", '{"tz": "CET"}')]
    j = chat(s, tools=TOOLS, tool_choice=tc)
    msg = j["choices"][0]["message"]
    assert calls_of(msg) == want and msg["content"] is None, msg
    assert j["choices"][0]["finish_reason"] == "tool_calls"
    assert j["usage"]["prompt_tokens"] == t["count"]
    assert stream_deltas(s, tools=TOOLS, tool_choice=tc)[:3] == ("", want, "tool_calls")


def test_qwen_xml_typed_arguments(server_of):
    # the request's schema types the values: a string stays text (one newline stripped on
    # each side), an integer / object / boolean is JSON; the stream sums to the same
    tools = TOOLS + [{"type": "function", "function": {"name": "plan", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "opts": {"type": "object"}, "hourly": {"type": "boolean"}}}}}]
    reply = ('Planning.\n<tool_call>\n<function=plan>\n<parameter=city>\n'
             'S\u00e3o "Paulo"\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n'
             '{"unit": "c"}\n</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n</function>\n'
             '</tool_call>')
    want = [("plan", '{"city": "S\u00e3o \\"Paulo\\"", "days": 3, "opts": {"unit": "c"}, "hourly": true}')]
    s = server_of("qwen_xml", reply)
    j = chat(s, tools=tools)
    msg = j["choices"][0]["message"]
    assert calls_of(msg) == want and msg["content"] == "Planning.", msg
    assert json.loads(want[0][1]) == {"city": 'S\u00e3o "Paulo"', "days": 3, "opts": {"unit": "c"}, "hourly": True}
    assert j["choices"][0]["finish_reason"] == "tool_calls"
    assert stream_deltas(s, tools=tools)[:3] == (msg["content"], want, "tool_calls")
    # without the schema (no tools entry for it) every value is a string
    k = chat(s, tools=TOOLS)
    assert json.loads(calls_of(k["choices"][0]["message"])[0][1])["days"] == "3"
    # the call renders back through the template: the prompt shows it as the model wrote it
    msgs = USER + [{"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "plan", "arguments": want[0][1]}}]}]
    st, t = s.post("/tokenize", {"messages": msgs, "tools": tools, "add_generation_prompt": False})
    assert st == 200, t
    st, d = s.post("/detokenize", {"tokens": t["tokens"]})
    assert reply[reply.index("<tool_call>"):] in d["content"], d["content"]


def test_forced_call_is_always_a_call(server_of):
    # a forced call is written under the call syntax's grammar (docs/structured-output.md):
    # a model that would rather not call still writes a call (here, whatever tokens the grammar
    # leaves it, cut at max_tokens), never content
    s = server_of("hermes", "I would rather not.")
    kw = dict(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_tokens=40)
    msg = chat(s, **kw)["choices"][0]["message"]
    assert msg["content"] is None and len(calls_of(msg)) == 1, msg
    assert calls_of(msg)[0][0] in ("get_weather", "get_time")
    content, calls, finish, _ = stream_deltas(s, **kw)
    assert content == "" and len(calls) == 1 and calls[0][0] in ("get_weather", "get_time")


def test_refusals(server_of):
    s = server_of("plain_tools", "Plain answer.")
    # tools shown by the template: auto works (nothing to parse here)
    j = chat(s, tools=TOOLS)
    assert j["choices"][0]["message"]["content"] == "Plain answer."
    for tc in ("required", {"type": "function", "function": {"name": "get_time"}}):
        st, j = s.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": tc})
        assert st == 400 and j["error"]["param"] == "tool_choice", j
        assert j["error"]["code"] == "tool_choice_unsupported"
    st, j = s.post("/v1/chat/completions", {"messages": USER, "tool_choice": "required"})
    assert st == 400 and j["error"]["param"] == "tool_choice"
    st, j = s.post("/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": {
        "type": "function", "function": {"name": "nope"}}})
    assert st == 400 and j["error"]["param"] == "tool_choice"


def test_base_model_without_template_chats(tmp_path):
    # Gemma 3 270M is a base model: no tokenizer.chat_template; chat uses the ChatML
    # default, with Gemma's BOS first (the model is lost without it)
    gemma = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "models", "gemma3-270m-q4_k_m.gguf")
    if not os.path.exists(gemma):
        pytest.skip(f"model absent: {gemma} (make models)")
    s = Server(gemma, "-c", "512", "--kv-size", "1024", "-t", "2", "--quiet")
    try:
        st, j = s.post("/v1/chat/completions", {"messages": USER, "max_tokens": 3, "temperature": 0})
        assert st == 200, j
        assert j["choices"][0]["message"]["role"] == "assistant"
        st, t = s.post("/tokenize", {"messages": USER})
        assert t["tokens"][0] == 2 and j["usage"]["prompt_tokens"] == t["count"]  # <bos>
        st, d = s.post("/detokenize", {"tokens": t["tokens"]})
        assert d["content"].endswith("<|im_start|>user\nWeather and time in Paris?<|im_end|>\n"
                                     "<|im_start|>assistant\n")
        assert sum("ChatML default" in l for l in s.lines) == 1, s.log()
    finally:
        assert s.stop() == 0, s.log()


def test_smelt_template_picks_the_same_templates(models, tmp_path):
    # `smelt template` finds templates through the same code as the server
    # (template/tmpl_source.c): the ChatML fallback, and tool_use when a chat has tools
    import subprocess

    def render(model, conv):
        p = tmp_path / "conv.json"
        p.write_text(json.dumps(conv))
        r = subprocess.run([SMELT, "template", model, str(p)], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout, r.stderr
    out, err = render(models["named"], {"messages": USER})
    assert out == "DEFAULT Weather and time in Paris?"
    out, err = render(models["named"], {"messages": USER, "tools": TOOLS})
    assert out == "TOOL_USE get_weather get_time <tool_call>Weather and time in Paris?"
    out, err = render(models["bare"], {"messages": USER})
    assert out == "<|im_start|>user\nWeather and time in Paris?<|im_end|>\n<|im_start|>assistant\n"
    assert "ChatML default" in err


# ---- usage: completion_tokens_details.reasoning_tokens ----

# a reasoning template (it names <think>); THINK_OPEN also opens the block in the prompt
THINK = HERMES.replace("{% if m.content %}", "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{% if m.content %}")
THINK_OPEN = THINK.replace("<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>\n{% endif %}")


def byte_tokens(text):
    """Tokens of text in this vocab: <think> and </think> are one token each, every other
    byte one token (the text has no " a", the only merge)."""
    assert " a" not in text
    n = 0
    for part in text.replace("</think>", "\0").replace("<think>", "\0").split("\0"):
        n += len(part.encode())
    return n + text.count("<think>") + text.count("</think>")


def assert_usage_shape(u, reasoning):
    assert set(u) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
                      "completion_tokens_details"}, u
    assert set(u["prompt_tokens_details"]) == {"cached_tokens", "audio_tokens"}
    assert u["prompt_tokens_details"]["audio_tokens"] == 0
    assert u["completion_tokens_details"] == {"reasoning_tokens": reasoning, "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0, "audio_tokens": 0}, u
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


@pytest.mark.parametrize("template,reasoning,reply", [
    ("think", "\n2 + 2 = 4, plus 1.\n", "<think>\n2 + 2 = 4, plus 1.\n</think>\n\nIt is 5."),
    ("think_open", "2 + 2 = 4, plus 1.", "2 + 2 = 4, plus 1.</think>\n\nIt is 5."),
    ("hermes", None, "<think>not one</think>It is 5."),
])
def test_usage_reasoning_tokens(models, tmp_path, template, reasoning, reply):
    src = {"think": THINK, "think_open": THINK_OPEN}.get(template)
    path = models["tmpl"]["hermes"]
    if src:
        path = str(tmp_path / f"{template}.jinja")
        open(path, "w").write(src)
    s = serve(models["bare"], reply, "--chat-template", path)
    try:
        j = chat(s)
        msg = j["choices"][0]["message"]
        if reasoning is None:
            want = 0
            assert msg["content"] == reply and "reasoning_content" not in msg
        else:
            assert msg["reasoning_content"] == reasoning and msg["content"] == "It is 5."
            # every token up to and including </think> (and <think> when the reply opens it)
            want = byte_tokens(reply[:reply.index("</think>") + len("</think>")])
            assert want == byte_tokens(reasoning) + (2 if template == "think" else 1)
        u = j["usage"]
        assert_usage_shape(u, want)
        assert u["completion_tokens"] >= byte_tokens(reply)
        # the stream's include_usage chunk says the same
        st, events, raw = s.stream("/v1/chat/completions", {"model": "m", "messages": USER, "max_tokens": 400,
                                                            "stream": True, "stream_options": {"include_usage": True}})
        assert st == 200 and events[-1] == "[DONE]", raw[-500:]
        assert events[-2]["choices"] == []
        assert_usage_shape(events[-2]["usage"], want)
        assert events[-2]["usage"]["completion_tokens"] == u["completion_tokens"]
        # n choices: the counts add up
        k = chat(s, n=2)
        assert k["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2 * want
        # a reply cut inside the reasoning: every token is a reasoning token
        if template == "think":
            c = chat(s, max_tokens=4)
            assert c["usage"]["completion_tokens"] == 4
            assert c["usage"]["completion_tokens_details"]["reasoning_tokens"] == 4
        # the legacy endpoint has the same usage object (no reasoning split there)
        st, p = s.post("/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 400})
        assert st == 200, p
        assert_usage_shape(p["usage"], 0)
        # the SDK parses the details
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
        r = client.chat.completions.create(model="m", messages=USER, max_tokens=400)
        assert r.usage.completion_tokens_details.reasoning_tokens == want
        assert r.usage.completion_tokens_details.accepted_prediction_tokens == 0
        assert r.usage.prompt_tokens_details.cached_tokens >= 0
        chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=400, stream=True,
                                                     stream_options={"include_usage": True}))
        assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == want
        q = client.completions.create(model="m", prompt="Hi", max_tokens=400)
        assert q.usage.completion_tokens_details.reasoning_tokens == 0
    finally:
        assert s.stop() == 0, s.log()


# ---- reasoning: streamed, reasoning_effort ----

@pytest.mark.parametrize("template,reply", [
    ("think", "<think>\n2 + 2 = 4, plus 1.\n</think>\n\nIt is 5."),
    ("think_open", "2 + 2 = 4, plus 1.</think>\n\nIt is 5."),
])
def test_reasoning_streamed(models, tmp_path, template, reply):
    # streamed reasoning_content deltas (then content deltas) add up to the whole response
    path = str(tmp_path / f"{template}.jinja")
    open(path, "w").write({"think": THINK, "think_open": THINK_OPEN}[template])
    s = serve(models["bare"], reply, "--chat-template", path)
    try:
        msg = chat(s)["choices"][0]["message"]
        assert msg["reasoning_content"].strip() == "2 + 2 = 4, plus 1." and msg["content"] == "It is 5."
        st, events, raw = s.stream("/v1/chat/completions", {"model": "m", "messages": USER,
                                                            "max_tokens": 400, "stream": True})
        assert st == 200 and events[-1] == "[DONE]", raw[-500:]
        deltas = [e["choices"][0]["delta"] for e in events[:-1]]
        assert deltas[0] == {"role": "assistant", "content": ""}
        kinds = [k for d in deltas[1:] for k in d if d[k]]
        assert set(kinds) == {"reasoning_content", "content"}, deltas
        # all the reasoning first, then the content; one field per chunk
        assert kinds == sorted(kinds, key=lambda k: k == "content"), kinds
        assert all(len([k for k in d if d[k]]) <= 1 for d in deltas)
        assert "".join(d.get("reasoning_content", "") for d in deltas) == msg["reasoning_content"]
        assert "".join(d.get("content", "") for d in deltas) == msg["content"]
        assert len([d for d in deltas if d.get("reasoning_content")]) > 3  # token by token
        assert events[-2]["choices"][0]["finish_reason"] == "stop"
        # the SDK's stream carries it too (an extra field on the delta)
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
        chunks = list(client.chat.completions.create(model="m", messages=USER, max_tokens=400,
                                                     stream=True))
        got = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or ""
                      for c in chunks if c.choices)
        assert got == msg["reasoning_content"]
    finally:
        assert s.stop() == 0, s.log()


# reads reasoning_effort, and writes Qwen3's empty think block when enable_thinking is false
EFFORT = ("effort={{ reasoning_effort if reasoning_effort is defined else 'unset' }}|" +
          THINK.replace("<|im_start|>assistant\n{% endif %}",
                        "<|im_start|>assistant\n{% if enable_thinking is defined and not "
                        "enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"))


def test_reasoning_effort(models, tmp_path):
    path = str(tmp_path / "effort.jinja")
    open(path, "w").write(EFFORT)
    s = serve(models["bare"], "<think>hm</think>It is 5.", "--chat-template", path)
    empty = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    try:
        def rendered(**kw):
            st, t = s.post("/tokenize", dict({"messages": USER}, **kw))
            assert st == 200, t
            st, d = s.post("/detokenize", {"tokens": t["tokens"]})
            return d["content"]
        p = rendered()
        assert p.startswith("effort=unset|") and not p.endswith(empty)
        for effort in ("low", "medium", "high"):
            p = rendered(reasoning_effort=effort)
            assert p.startswith(f"effort={effort}|") and not p.endswith(empty), p
        for effort in ("none", "minimal"):  # thinking off, for templates that have the switch
            p = rendered(reasoning_effort=effort)
            assert p.startswith(f"effort={effort}|") and p.endswith(empty), p
        # chat_template_kwargs win
        p = rendered(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
        assert p.startswith("effort=none|") and not p.endswith(empty), p
        p = rendered(reasoning_effort="high", chat_template_kwargs={"reasoning_effort": "low"})
        assert p.startswith("effort=low|"), p
        # a chat request renders the same prompt
        st, t = s.post("/tokenize", {"messages": USER, "reasoning_effort": "none"})
        j = chat(s, reasoning_effort="none")
        assert j["usage"]["prompt_tokens"] == t["count"]
        # anything else is refused, naming the field
        st, j = s.post("/v1/chat/completions", {"model": "m", "messages": USER,
                                                "reasoning_effort": "max"})
        assert st == 400 and j["error"]["param"] == "reasoning_effort", j
        st, j = s.post("/v1/completions", {"model": "m", "prompt": "Hi", "reasoning_effort": "low"})
        assert st == 400 and j["error"]["param"] == "reasoning_effort", j
    finally:
        assert s.stop() == 0, s.log()


def test_strict_tools_text_reply(server_of):
    # strict tools with tool_choice auto: the grammar waits for the call marker, so a text
    # reply is untouched (test_server_structured.py has the calls); strict must be a boolean
    s = server_of("hermes", "It is sunny.")
    strict = [dict(TOOLS[0], function=dict(TOOLS[0]["function"], strict=False)),
              dict(TOOLS[1], function=dict(TOOLS[1]["function"], strict=True))]
    assert chat(s, tools=strict)["choices"][0]["message"]["content"] == "It is sunny."
    strict[1]["function"]["strict"] = "yes"
    st, j = s.post("/v1/chat/completions", {"model": "m", "messages": USER, "tools": strict})
    assert st == 400 and j["error"]["param"] == "tools[1].function.strict", j


# ---- Qwen3.5: its own template (shared data), thinking and XML calls ----

QWEN35 = os.path.join(os.environ.get("SMELT_SHARED_DIR", os.path.join(ROOT, "..", "shared")),
                      "data", "chat-templates", "Qwen3.5-4B.jinja")


@pytest.mark.parametrize("reply,reasoning,content,calls", [
    # what Qwen3.5 writes after the prompt's "<think>\n" (the template's own instructions)
    ("The user wants the weather in Paris. I will call get_weather.\n</think>\n\n<tool_call>\n"
     "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
     "The user wants the weather in Paris. I will call get_weather.\n", None,
     [("get_weather", '{"city": "Paris"}')]),
    ("Both tools.\n</think>\n\nI'll check both.\n\n<tool_call>\n<function=get_weather>\n"
     "<parameter=city>\nS\u00e3o Paulo\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=get_time>\n<parameter=tz>\nAmerica/Sao_Paulo\n</parameter>\n</function>\n</tool_call>",
     "Both tools.\n", "I'll check both.",
     [("get_weather", '{"city": "S\u00e3o Paulo"}'), ("get_time", '{"tz": "America/Sao_Paulo"}')]),
    ("Simple question.\n</think>\n\nIt is sunny in Paris.", "Simple question.\n", "It is sunny in Paris.", []),
])
def test_qwen35_template(models, reply, reasoning, content, calls):
    if not os.path.exists(QWEN35):
        pytest.skip(f"SKIP shared template {QWEN35} absent")
    s = serve(models["bare"], reply, "--chat-template", QWEN35)
    try:
        # the template opens <think> in the prompt: the reply starts inside the reasoning
        st, t = s.post("/tokenize", {"messages": USER, "tools": TOOLS})
        st, d = s.post("/detokenize", {"tokens": t["tokens"]})
        assert d["content"].endswith("<|im_start|>assistant\n<think>\n")
        msg = chat(s, tools=TOOLS)["choices"][0]["message"]
        assert msg["reasoning_content"] == reasoning and msg["content"] == content
        assert calls_of(msg) == calls
        got_content, got_calls, finish, _ = stream_deltas(s, tools=TOOLS)
        assert (got_content or None) == content and got_calls == calls
        assert finish == ("tool_calls" if calls else "stop")
        if calls:
            # the calls go back through the template as the model wrote them
            turn = USER + [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"],
                                 "content": "sunny"}]
            st, t = s.post("/tokenize", {"messages": turn, "tools": TOOLS})
            assert st == 200, t
            st, d = s.post("/detokenize", {"tokens": t["tokens"]})
            name, args = calls[0]
            key, val = next(iter(json.loads(args).items()))
            assert (f"<tool_call>\n<function={name}>\n<parameter={key}>\n{val}\n</parameter>\n"
                    "</function>\n</tool_call>") in d["content"], d["content"]
        # thinking off: the template closes an empty block, the reply is content
        st, t = s.post("/tokenize", {"messages": USER, "reasoning_effort": "none"})
        st, d = s.post("/detokenize", {"tokens": t["tokens"]})
        assert d["content"].endswith("<think>\n\n</think>\n\n")
    finally:
        assert s.stop() == 0, s.log()
