"""gpt-oss's harmony format through `smelt serve`: the analysis channel as reasoning_content,
the final channel as content, commentary messages to functions.NAME as tool calls, whole
and streamed, over raw HTTP and the official `openai` SDK.

As in test_server_tools.py the model is a vocabulary only (every byte a token, plus
harmony's special tokens, written with gguf-py) and `smelt serve --fake-forward
--fake-reply TEXT` answers with TEXT token by token, so the replies below are what gpt-oss
writes after the prompt's "<|start|>assistant", following the harmony spec (OpenAI's
harmony guide and the openai-harmony package): analysis, then final or a call, with
<|return|> / <|call|> ending the generation.

The chat template is a reduced harmony template written here, and the real gpt-oss template
where it is available: $SMELT_GPT_OSS_TEMPLATE or ../shared/data/chat-templates/
openai-gpt-oss-120b.jinja (it is not committed: the tests that need it skip, saying so)."""
import json
import os

import pytest

from smelt_server import SMELT
from test_server_tools import (TOOLS, USER, byte_alphabet, calls_of, chat, serve as serve_vocab,
                               stream_deltas)

gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.environ.get("SMELT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
REAL = os.environ.get("SMELT_GPT_OSS_TEMPLATE",
                      os.path.join(SHARED, "data", "chat-templates", "openai-gpt-oss-120b.jinja"))

# o200k_harmony's special tokens (ids differ here; the names are what matters)
SPECIAL = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
           "<|start|>", "<|end|>", "<|message|>", "<|call|>"]

# shaped like gpt-oss's template, reduced: system (reasoning effort), developer (tools),
# messages, the analysis of a pending call from `thinking`, "<|start|>assistant" to generate
HARMONY = """<|start|>system<|message|>Reasoning: {{ reasoning_effort if reasoning_effort is defined else 'medium' }}
# Valid channels: analysis, commentary, final.<|end|>
{%- if tools %}<|start|>developer<|message|># Tools
{% for t in tools %}type {{ t.function.name }} = (_: any) => any;
{% endfor %}<|end|>{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}
{%- if m.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{% endif -%}
<|start|>assistant to=functions.{{ m.tool_calls[0].function.name }}<|channel|>commentary json<|message|>{{ m.tool_calls[0].function.arguments | tojson }}<|call|>
{%- elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'tool' %}<|start|>functions.tool to=assistant<|channel|>commentary<|message|>{{ m.content | tojson }}<|end|>
{%- else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"""

ANALYSIS = "The user wants weather and time in Paris. I should call get_weather."
REASON_FINAL = (f"<|channel|>analysis<|message|>{ANALYSIS}<|end|>"
                "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>")
CALL = (f"<|channel|>analysis<|message|>{ANALYSIS}<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris", "unit": "c"}<|call|>')
PREAMBLE_CALL = ("<|channel|>analysis<|message|>Time first.<|end|>"
                 "<|start|>assistant<|channel|>commentary<|message|>Let me check the time.<|end|>"
                 "<|start|>assistant to=functions.get_time<|channel|>commentary json"
                 '<|message|>{"tz": "Europe/Paris"}<|call|>')


def write_vocab(path, template):
    alpha = byte_alphabet()
    # (one merge, of two control bytes no reply holds: gguf-py writes no empty list)
    tokens = [alpha[b] for b in range(256)] + [alpha[1] + alpha[2]] + SPECIAL
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3] * len(SPECIAL))
    w.add_token_merges([alpha[1] + " " + alpha[2]])
    w.add_bos_token_id(tokens.index("<|startoftext|>"))
    w.add_eos_token_id(tokens.index("<|return|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def n_tokens(text):
    """Tokens of text in this vocab: one per special token, one per other byte."""
    n = 0
    while text:
        sp = next((s for s in SPECIAL if text.startswith(s)), None)
        k = len(sp) if sp else len(text[0].encode())
        n += 1 if sp else k
        text = text[len(sp) if sp else 1:]
    return n


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    d = tmp_path_factory.mktemp("harmony")
    out = {"reduced": write_vocab(str(d / "reduced.gguf"), HARMONY)}
    if os.path.exists(REAL):
        out["real"] = write_vocab(str(d / "real.gguf"), open(REAL, encoding="utf-8").read())
    return out


@pytest.fixture
def serve(vocab):
    started = []

    def start(reply, template="reduced"):
        if template not in vocab:
            pytest.skip(f"SKIP the gpt-oss chat template is not at {REAL} "
                        "(set SMELT_GPT_OSS_TEMPLATE)")
        s = serve_vocab(vocab[template], reply)
        started.append(s)
        return s
    yield start
    for s in started:
        assert s.stop() == 0, s.log()


def prompt_of(s, **kw):
    st, t = s.post("/tokenize", dict({"messages": USER}, **kw))
    assert st == 200, t
    st, d = s.post("/detokenize", {"tokens": t["tokens"]})
    assert st == 200, d
    return d["content"]


@pytest.mark.parametrize("template", ["reduced", "real"])
def test_reasoning_and_final(serve, template):
    s = serve(REASON_FINAL, template)
    j = chat(s)
    msg = j["choices"][0]["message"]
    assert msg["reasoning_content"] == ANALYSIS and msg["content"] == "It is sunny in Paris."
    assert j["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in msg
    # <|end|> closes a message, not the reply: the final channel came after it
    # reasoning tokens: the analysis message, its header and <|end|> included
    want = n_tokens(REASON_FINAL[:REASON_FINAL.index("<|end|>") + len("<|end|>")])
    assert j["usage"]["completion_tokens_details"]["reasoning_tokens"] == want
    assert j["usage"]["completion_tokens"] == n_tokens(REASON_FINAL)
    # streamed: reasoning deltas token by token, then content; they add up to the whole
    st, events, raw = s.stream("/v1/chat/completions", {"model": "m", "messages": USER,
                                                        "max_tokens": 400, "stream": True})
    assert st == 200 and events[-1] == "[DONE]", raw[-500:]
    deltas = [e["choices"][0]["delta"] for e in events[:-1]]
    kinds = [k for d in deltas[1:] for k in d if d[k]]
    assert kinds == sorted(kinds, key=lambda k: k == "content") and set(kinds) == {
        "reasoning_content", "content"}, deltas
    assert len([d for d in deltas if d.get("reasoning_content")]) > 10
    assert "".join(d.get("reasoning_content", "") for d in deltas) == ANALYSIS
    assert "".join(d.get("content", "") for d in deltas) == "It is sunny in Paris."
    # the SDK sees the same
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    r = client.chat.completions.create(model="m", messages=USER, max_tokens=400)
    assert r.choices[0].message.content == "It is sunny in Paris."
    assert r.choices[0].message.model_extra["reasoning_content"] == ANALYSIS


@pytest.mark.parametrize("template", ["reduced", "real"])
@pytest.mark.parametrize("reply,want_content,want_calls", [
    (CALL, None, [("get_weather", '{"city": "Paris", "unit": "c"}')]),
    (PREAMBLE_CALL, "Let me check the time.", [("get_time", '{"tz": "Europe/Paris"}')]),
])
def test_tool_calls_whole_and_streamed(serve, template, reply, want_content, want_calls):
    s = serve(reply, template)
    j = chat(s, tools=TOOLS)
    c = j["choices"][0]
    assert c["finish_reason"] == "tool_calls"
    assert c["message"]["content"] == want_content
    assert calls_of(c["message"]) == want_calls
    assert c["message"]["reasoning_content"] in (ANALYSIS, "Time first.")
    for tc in c["message"]["tool_calls"]:
        json.loads(tc["function"]["arguments"])
    content, calls, finish, events = stream_deltas(s, tools=TOOLS, max_tokens=400)
    assert (content or None) == want_content and calls == want_calls and finish == "tool_calls"
    # the arguments stream in pieces
    assert sum(1 for e in events[:-1] for ch in e["choices"]
               for tc in ch["delta"].get("tool_calls") or [] if "id" not in tc) > 5
    # the SDK's stream accumulator rebuilds the same calls
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=30)
    with client.beta.chat.completions.stream(model="m", messages=USER, tools=TOOLS,
                                             max_tokens=400) as st:
        for _ in st:
            pass
        final = st.get_final_completion()
    got = [(t.function.name, t.function.arguments) for t in final.choices[0].message.tool_calls]
    assert got == want_calls


def test_no_tools_no_calls(serve):
    # a request without tools (or with tool_choice none) gets no tool_calls: the message to
    # a recipient is content
    s = serve(CALL)
    for kw in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        msg = chat(s, **kw)["choices"][0]["message"]
        assert "tool_calls" not in msg and msg["content"] == '{"city": "Paris", "unit": "c"}'
        assert msg["reasoning_content"] == ANALYSIS


@pytest.mark.parametrize("template", ["reduced", "real"])
def test_tool_choice_forces_a_call(serve, template):
    # named: the prompt ends with the call's header, the model writes only the arguments
    s = serve('{"tz": "UTC"}<|call|>', template)
    named = {"type": "function", "function": {"name": "get_time"}}
    p = prompt_of(s, tools=TOOLS, tool_choice=named)
    assert p.endswith("<|start|>assistant<|channel|>commentary to=functions.get_time "
                      "<|constrain|>json<|message|>"), p[-200:]
    msg = chat(s, tools=TOOLS, tool_choice=named)["choices"][0]["message"]
    assert calls_of(msg) == [("get_time", '{"tz": "UTC"}')] and msg["content"] is None
    content, calls, finish, _ = stream_deltas(s, tools=TOOLS, tool_choice=named)
    assert calls == [("get_time", '{"tz": "UTC"}')] and finish == "tool_calls"
    # required: the model names the function
    s2 = serve('get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>', template)
    msg = chat(s2, tools=TOOLS, tool_choice="required")["choices"][0]["message"]
    assert calls_of(msg) == [("get_weather", '{"city": "Oslo"}')]
    # a name the header cannot hold is refused
    st, j = s.post("/v1/chat/completions", {"model": "m", "messages": USER, "tools": [
        {"type": "function", "function": {"name": "get time"}}],
        "tool_choice": {"type": "function", "function": {"name": "get time"}}})
    assert st == 400 and j["error"]["param"] == "tool_choice", j


@pytest.mark.parametrize("template", ["reduced", "real"])
def test_prompt(serve, template):
    s = serve("<|channel|>final<|message|>ok", template)
    # reasoning_effort reaches the system message
    assert "Reasoning: medium" in prompt_of(s)
    assert "Reasoning: high" in prompt_of(s, reasoning_effort="high")
    # gpt-oss knows low, medium, high: none and minimal are low
    assert "Reasoning: low" in prompt_of(s, reasoning_effort="minimal")
    assert "Reasoning: low" in prompt_of(s, reasoning_effort="none")
    assert prompt_of(s).endswith("<|start|>assistant")
    # a pending call's reasoning, sent back as reasoning_content, is rendered as its analysis
    turn = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    p = prompt_of(s, messages=turn, tools=TOOLS)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "Paris"}<|call|>') in p, p
    assert chat(s, messages=turn, tools=TOOLS)["choices"][0]["message"]["content"] == "ok"
