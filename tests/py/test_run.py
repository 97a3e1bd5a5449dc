"""`smelt run`: generation from the command line.

On the tiny fixtures of tests/data/ref (always present) it checks the plumbing; on the real
test models (models/, skipped when absent) it checks a chat answer and a greedy
continuation against transformers' (the snapshot in tests/data/ref-real, recorded from the
same GGUF dequantized to float32)."""
import json
import os
import pathlib
import re
import subprocess

import pytest

SMELT = os.environ.get("SMELT_BIN", "build/smelt")
ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "ref" / "qwen2-f32.gguf"
QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
GEMMA = ROOT / "models" / "gemma3-270m-q4_k_m.gguf"


def run(*args, stdin=None, timeout=300):
    return subprocess.run([SMELT, "run", *map(str, args)], capture_output=True, text=True,
                          input=stdin, timeout=timeout)


def test_tiny_raw_greedy_is_deterministic():
    a = run(TINY, "hello world", "-n", "6", "--temp", "0")
    b = run(TINY, "hello world", "-n", "6", "--temp", "0", "-t", "1")
    assert a.returncode == 0, a.stderr
    assert "no chat template" in a.stderr  # the fixture ships none: raw prompt
    assert "generation: 6 tokens" in a.stderr
    assert a.stdout == b.stdout  # thread count does not change greedy output


def test_tiny_moe_runs():
    """A mixture-of-experts file (the qwen3moe fixture) through `smelt run` on the CPU: the
    F32 and F16 files hold the same numbers and give the same greedy text, whatever the
    thread count (the expert grouping splits work over threads)."""
    moe = TINY.parent / "qwen3moe-f32.gguf"
    a = run(moe, "hello world", "-n", "8", "--temp", "0")
    b = run(moe.with_name("qwen3moe-f16.gguf"), "hello world", "-n", "8", "--temp", "0", "-t", "1")
    assert a.returncode == 0, a.stderr
    assert "generation: 8 tokens" in a.stderr
    assert a.stdout == b.stdout


def test_tiny_interactive_keeps_going():
    r = run(TINY, "-i", "--temp", "0", "-n", "3", stdin="one\ntwo\n")
    assert r.returncode == 0, r.stderr
    assert "generation: 6 tokens" in r.stderr  # two turns of 3
    # raw text continues the cache: turn 2 reuses turn 1's prompt and all 3 answer tokens
    t = turns(r)
    assert t[1][1] == 0 and t[2][1] == t[1][0] + 3, r.stderr


def test_errors():
    r = run("/nonexistent.gguf", "hi")
    assert r.returncode == 1 and "smelt run" in r.stderr
    r = run(TINY, "hi", "--temp")
    assert r.returncode == 2
    r = run(TINY, "hi", "--frobnicate", "1")
    assert r.returncode == 2
    r = run(TINY, "hi", "--repeat-last-n", "-2")
    assert r.returncode == 2 and "--repeat-last-n" in r.stderr
    r = run(TINY, "hi", "-c", "64", "-n", "100", "--ignore-eos")  # runs out of context
    assert r.returncode == 1 and "context" in r.stderr


def copy_with_sampling(dst, **keys):
    """The tiny fixture rewritten with general.sampling.* keys (typed as gguf-py's
    add_sampling_* writes them: top_k and penalty_last_n INT32, the rest FLOAT32)."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(str(TINY))
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    VT = gguf.GGUFValueType
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.types[0] == VT.ARRAY:
            w.add_key_value(f.name, f.contents(), VT.ARRAY, sub_type=f.types[-1])
        else:
            w.add_key_value(f.name, f.contents(), f.types[0])
    for k, v in keys.items():
        getattr(w, f"add_sampling_{k}")(v)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def sampling_line(r):
    lines = [x for x in r.stderr.splitlines() if x.startswith("smelt run: sampling:")]
    assert r.returncode == 0, r.stderr
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_sampling_defaults_from_gguf(tmp_path):
    f = copy_with_sampling(tmp_path / "s.gguf", temp=0.25, top_k=7, top_p=0.8, min_p=0.05,
                           penalty_repeat=1.3, penalty_last_n=17)
    line = sampling_line(run(f, "hello", "-n", "3", "-v"))
    assert "temperature 0.25, top_k 7, top_p 0.8, min_p 0.05, " \
        "repeat_penalty 1.3 over the last 17 tokens" in line, line
    assert "from the file: temp, top_k, top_p, min_p, penalty_repeat, penalty_last_n" in line
    # flags win over the file, key by key
    line = sampling_line(run(f, "hello", "-n", "3", "-v", "--temp", "0", "--top-k", "3",
                             "--repeat-last-n", "4"))
    assert "temperature 0, top_k 3, top_p 0.8, min_p 0.05, " \
        "repeat_penalty 1.3 over the last 4 tokens" in line, line
    assert "from the file: top_p, min_p, penalty_repeat)" in line, line
    # printed with -v only, and once
    assert "sampling:" not in run(f, "hello", "-n", "3").stderr


def test_sampling_penalty_window_from_gguf(tmp_path):
    # llama.cpp's meaning: -1 the whole context, 0 no penalty
    f = copy_with_sampling(tmp_path / "all.gguf", penalty_repeat=1.3, penalty_last_n=-1)
    assert "repeat_penalty 1.3 over all tokens" in sampling_line(run(f, "hi", "-n", "2", "-v"))
    f = copy_with_sampling(tmp_path / "off.gguf", penalty_repeat=1.3, penalty_last_n=0)
    assert "repeat_penalty off" in sampling_line(run(f, "hi", "-n", "2", "-v"))
    # ... unless the penalty is asked for on the command line
    line = sampling_line(run(f, "hi", "-n", "2", "-v", "--repeat-penalty", "1.1"))
    assert "repeat_penalty 1.1 over all tokens" in line, line
    # a window past the context (-c) is the whole history
    f = copy_with_sampling(tmp_path / "big.gguf", penalty_repeat=1.3, penalty_last_n=1 << 30)
    line = sampling_line(run(f, "hi", "-n", "2", "-v", "-c", "64"))
    assert "repeat_penalty 1.3 over all tokens" in line, line
    # no keys: smelt's defaults
    line = sampling_line(run(TINY, "hi", "-n", "2", "-v"))
    assert "temperature 1, top_k 0, top_p 1, min_p 0, repeat_penalty off" in line, line
    assert "(from the file: nothing)" in line


def need(path):
    if not path.exists():
        pytest.skip(f"{path} absent (run scripts/fetch-test-models.sh)")


def test_qwen_answers_a_question():
    need(QWEN)
    r = run(QWEN, "What is the capital of France? Answer in one sentence.", "--temp", "0",
            "-n", "24")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout


TURN = re.compile(r"turn (\d+): prompt (\d+) tokens \((\d+) reused from the cache\), "
                  r"generation (\d+) tokens")


def turns(r):
    """{turn: (prefilled, reused, generated)} from -i's per-turn lines on stderr."""
    return {int(m[1]): (int(m[2]), int(m[3]), int(m[4])) for m in TURN.finditer(r.stderr)}


def test_qwen_chat_keeps_context():
    need(QWEN)
    r = run(QWEN, "-i", "What is the capital of Italy?", "--temp", "0", "-n", "24",
            stdin="And of Germany?\n")
    assert r.returncode == 0, r.stderr
    assert "Rome" in r.stdout and "Berlin" in r.stdout
    t = turns(r)
    assert sorted(t) == [1, 2], r.stderr
    (p1, c1, g1), (p2, c2, g2) = t[1], t[2]
    assert c1 == 0
    # the second turn reuses all of the first (its prompt, its answer and the end-of-turn
    # token the answer stopped at) and prefills only the new user message in ChatML
    assert c2 == p1 + g1 + 1, r.stderr
    delta = "\n<|im_start|>user\nAnd of Germany?<|im_end|>\n<|im_start|>assistant\n"
    ids = subprocess.run([SMELT, "tokenize", str(QWEN), delta, "--ids", "--no-bos"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert p2 == len(ids), (p2, ids, r.stderr)
    # re-prefilling the conversation would have fed p1 + g1 + 1 + len(ids) tokens
    assert p2 < p1
    assert f"prompt: {p1 + p2} tokens" in r.stderr


def test_gemma_greedy_matches_transformers():
    need(GEMMA)
    ref = json.loads((ROOT / "tests/data/ref-real/gemma3-270m-q4_k_m.json").read_text())
    prompt = next(p for p in ref["prompts"] if p["label"] == ref["greedy"]["prompt_label"])
    r = run(GEMMA, prompt["text"], "--temp", "0", "-n", "8", "--raw")
    assert r.returncode == 0, r.stderr
    # the first 8 greedy tokens agree with transformers' (margins >= 0.25 there)
    want = ref["greedy"]["text"]
    got = r.stdout.rstrip("\n")
    assert want.startswith(got) and len(got) >= 20, (got, want)


HYBRID = ROOT / "tests" / "data" / "ref-hybrid" / "qwen35-f32.gguf"


@pytest.mark.parametrize("model", ["qwen35-f32", "qwen35moe-f16", "qwen3next-f16"])
def test_hybrid_raw_turns_keep_the_state(model):
    """qwen35, qwen35moe, qwen3next (recurrent layers): raw text continues the
    conversation, so turn 2 reuses all of turn 1, prompt and answer (23 tokens, not a block
    boundary): the live recurrent state carries over, and the output does not depend on
    the thread count. --ignore-eos: where a random model's end token falls is not the
    point."""
    args = (HYBRID.parent / f"{model}.gguf", "--raw", "-i", "some prompt text", "--temp", "0",
            "-n", "9", "--ignore-eos")
    a = run(*args, stdin="more text\n")
    b = run(*args, "-t", "1", stdin="more text\n")
    assert a.returncode == 0, a.stderr
    assert "recurrent state 4 slots" in a.stderr
    t = turns(a)
    (p1, c1, g1), (p2, c2, g2) = t[1], t[2]
    assert c1 == 0 and g1 == 9 and c2 == p1 + g1, a.stderr
    assert a.stdout == b.stdout


def test_hybrid_chat_rolls_back_to_a_snapshot():
    """qwen35 with its ChatML template: the random model's answer does not re-tokenize to
    the tokens it generated, so turn 2 shares only part of turn 1; the recurrent state
    restarts from the newest snapshot (a block boundary, blocks of 16) at or before the
    divergence and feeds the rest again."""
    args = (HYBRID, "-i", "What is the capital of Italy?", "--temp", "0", "-n", "8")
    a = run(*args, stdin="And of Germany?\n")
    b = run(*args, "-t", "1", stdin="And of Germany?\n")
    assert a.returncode == 0, a.stderr
    (p1, c1, g1), (p2, c2, g2) = turns(a)[1], turns(a)[2]
    assert 0 < c2 < p1 + g1 and c2 % 16 == 0, a.stderr
    assert a.stdout == b.stdout


PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                  "maxItems": 3}}}


@pytest.mark.parametrize("temp", ["0", "0.9"])
def test_qwen_json_schema(tmp_path, temp):
    """--json-schema: the answer parses and validates (greedy and sampled), and it ends where
    the object closes, well before -n."""
    need(QWEN)
    jsonschema = pytest.importorskip("jsonschema")
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    r = run(QWEN, "Describe a person as JSON.", "--json-schema", schema, "--temp", temp,
            "--seed", "7", "-n", "120")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    jsonschema.validate(doc, PERSON)
    n = int(re.search(r"generation: (\d+) tokens", r.stderr)[1])
    assert n < 120


ITEMS = {"type": "object", "additionalProperties": False, "required": ["items"],
         "properties": {"items": {"type": "array", "maxItems": 4, "items": {
             "type": "object", "additionalProperties": False, "required": ["name", "qty"],
             "properties": {"name": {"type": "string", "maxLength": 20},
                            "qty": {"type": "integer", "minimum": 0, "maximum": 99}}}}}}


def test_qwen_json_schema_spec(tmp_path):
    """--json-schema with n-gram drafts (greedy): the drafts are cut where the grammar
    refuses them and before one that would complete the document, each verify row has its
    own mask, and the answer is the one without drafts (which copies the prompt: drafts are
    accepted under the grammar, up to the closing brace)."""
    need(QWEN)
    jsonschema = pytest.importorskip("jsonschema")
    schema = tmp_path / "items.json"
    schema.write_text(json.dumps(ITEMS))
    prompt = ('Print exactly this JSON, on one line: {"items": [{"name": "apple", "qty": 1}, '
              '{"name": "pear", "qty": 2}, {"name": "plum", "qty": 3}]}')
    base = run(QWEN, prompt, "--json-schema", schema, "--temp", "0", "-n", "80")
    r = run(QWEN, prompt, "--json-schema", schema, "--temp", "0", "-n", "80", "--spec", "ngram",
            "--spec-fixed")
    assert base.returncode == 0 and r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    jsonschema.validate(json.loads(r.stdout), ITEMS)
    m = re.search(r"(\d+) proposed, (\d+) accepted", r.stderr)
    assert m and int(m[2]) > 0, r.stderr


def test_grammar_gbnf(tmp_path):
    """--grammar: a GBNF grammar holds the answer to its sentences (the tiny fixture's random
    weights would write anything else), at -n's length or where the grammar ends."""
    g = tmp_path / "g.gbnf"
    g.write_text('root ::= "yes" | "no" | ("maybe " [0-9])\n')
    r = run(TINY, "hello", "--grammar", g, "--temp", "0.8", "--seed", "3", "-n", "8")
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"(yes|no|maybe [0-9])\n", r.stdout), repr(r.stdout)


def test_grammar_errors(tmp_path):
    bad = tmp_path / "bad.gbnf"
    bad.write_text("root ::= \"a\" | ( \n")
    r = run(TINY, "hi", "--grammar", bad, "-n", "2")
    assert r.returncode != 0 and str(bad) in r.stderr and "line" in r.stderr, r.stderr
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "object", "patternProperties": {"^a": {}}}))
    r = run(TINY, "hi", "--json-schema", schema, "-n", "2")
    assert r.returncode != 0 and "patternProperties" in r.stderr, r.stderr
    r = run(TINY, "hi", "--json-schema", tmp_path / "absent.json", "-n", "2")
    assert r.returncode != 0 and "absent.json" in r.stderr, r.stderr
    r = run(TINY, "hi", "--json-schema", schema, "--grammar", bad, "-n", "2")
    assert r.returncode != 0 and "give one of them" in r.stderr, r.stderr
