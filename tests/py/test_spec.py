"""Speculative decoding end to end (docs/speculative.md): `smelt run`, `smelt serve` and
`smelt bench` with --spec ngram, --draft and --spec mtp.

The reference is smelt itself without speculation: greedy output must be the same token for
token (the CPU backend computes a row's logits with the same bits at any row count below
eight, and the verify steps here stay below), on the tiny fixtures and a random tiny model
(every draft rejected: rollbacks all the way), and on the real Qwen2.5-Coder 0.5B through
one server: n-gram drafts on a repeat-and-edit prompt, and a json_schema request whose
drafts are cut and masked by its grammar. A draft with another vocabulary is refused with
both sizes and the first differing token. The long real-model identity runs (hundreds of
tokens, the model as its own draft, truncated-layer drafts, the acceptance table) are
scripts/spec-check.sh's, which runs on the CPU and on the GPU."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from smelt_server import Server, make_tiny  # noqa: E402

SMELT = os.environ.get("SMELT_BIN", "build/smelt")
ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "data" / "ref" / "qwen2-f32.gguf"
HYBRID = ROOT / "tests" / "data" / "ref-hybrid" / "qwen35-f32.gguf"
HYBRID_MOE = ROOT / "tests" / "data" / "ref-hybrid" / "qwen35moe-f16.gguf"
QWEN = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
GEMMA = ROOT / "models" / "gemma3-270m-q4_k_m.gguf"

EDIT = """Rewrite this function with the loop counting down instead of up; keep everything else.

int sum(const int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        s += a[i];
    }
    return s;
}"""


def run(*args, stdin=None, timeout=600):
    return subprocess.run([SMELT, "run", *map(str, args)], capture_output=True, text=True,
                          input=stdin, timeout=timeout)


SPEC_LINE = re.compile(r"speculation \((\w+)\): (\d+) proposed, (\d+) accepted")


def spec_counts(r):
    m = SPEC_LINE.search(r.stderr)
    assert m, r.stderr
    return int(m[2]), int(m[3])


def need(path):
    if not path.exists():
        pytest.skip(f"{path} absent (run scripts/fetch-test-models.sh)")


def truncated(src, dst, layers):
    if not dst.exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "make-truncated-draft.py"), str(src),
                        str(dst), "--layers", str(layers)], check=True, capture_output=True,
                       timeout=600)
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    t = pathlib.Path(make_tiny(str(d / "tiny.gguf")))
    return t, truncated(t, d / "tiny-1.gguf", 1)


def test_fixtures_greedy_identical():
    """n-gram and a self-draft on the qwen2 fixture, n-gram on the recurrent qwen35 fixture
    (a rejected draft restores a state snapshot and feeds the accepted tokens again; a draft
    model must be attention-only): the same text as without speculation. The qwen35
    fixture's prompt is one after which its random weights repeat bigrams (20 tokens
    proposed, all rejected)."""
    rep = "hello world hello world hello"
    cases = [(FIX, rep, ["--spec", "ngram"]), (FIX, rep, ["--draft", FIX]),
             (HYBRID, "z", ["--spec", "ngram"])]
    for model, prompt, extra in cases:
        args = [model, prompt, "--raw", "-n", "100", "--temp", "0"]
        base = run(*args)
        r = run(*args, *extra, "--spec-fixed")
        assert base.returncode == 0 and r.returncode == 0, r.stderr
        assert r.stdout == base.stdout, (model, extra)
        proposed, accepted = spec_counts(r)
        assert proposed > 0, r.stderr
        if "--draft" in extra:  # the model as its own draft: every draft is the target's argmax
            assert accepted == proposed, r.stderr


def test_random_draft_rolls_back(tiny):
    """A random 1-layer draft of a random 2-layer model: nearly every draft is rejected and
    rolled back, and the greedy text is still the plain one."""
    model, draft = tiny
    base = run(model, "one two three four", "--raw", "-n", "80", "--temp", "0")
    r = run(model, "one two three four", "--raw", "-n", "80", "--temp", "0", "--draft", draft,
            "--spec-fixed", "--spec-k", "6")
    assert r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    proposed, accepted = spec_counts(r)
    assert proposed > 100 and accepted < proposed


def test_sampled_ngram_same_seed(tiny):
    """Sampled decoding with n-gram drafts (point masses): the verified draws are the
    sampler's own, so a seed gives the non-speculative text."""
    model, _ = tiny
    for seed in (1, 2, 3):
        args = [model, "la la la la la la", "--raw", "-n", "60", "--temp", "0.9", "--top-p",
                "0.95", "--seed", str(seed)]
        base = run(*args)
        r = run(*args, "--spec", "ngram", "--spec-fixed")
        assert r.returncode == 0, r.stderr
        assert r.stdout == base.stdout, seed


def test_mtp_greedy_identical():
    """--spec mtp on the qwen35moe fixture (its random MTP layer: every draft rejected, so
    every verify step rolls the recurrent state back to a snapshot, some exactly to one):
    greedy text identical to the plain run at k = 1, 4 and 8."""
    base = run(HYBRID_MOE, "Hello there, the quick brown fox", "-n", "100", "--temp", "0")
    assert base.returncode == 0, base.stderr
    for k in ("1", "4", "8"):
        r = run(HYBRID_MOE, "Hello there, the quick brown fox", "-n", "100", "--temp", "0",
                "--spec", "mtp", "--spec-fixed", "--spec-k", k)
        assert r.returncode == 0, r.stderr
        assert r.stdout == base.stdout, k
        p, a = spec_counts(r)
        assert p >= 10 * int(k) and a <= p, r.stderr


def test_draft_vocabulary_refused():
    """A draft with another vocabulary is refused, naming both sizes and the first
    differing token."""
    r = run(FIX, "hi", "--draft", ROOT / "tests" / "data" / "ref" / "llama-f32.gguf")
    assert r.returncode == 1
    assert re.search(r"vocabulary \(\d+ tokens\) is not the target's \(\d+ tokens\): they "
                     r"differ first at token \d+", r.stderr), r.stderr
    r = run(FIX, "hi", "--spec", "draft")
    assert r.returncode == 1 and "--draft" in r.stderr
    r = run(FIX, "hi", "--spec", "mtp")
    assert r.returncode == 1 and "qwen2 has no multi-token-prediction head" in r.stderr, r.stderr
    r = run(FIX, "hi", "--spec", "eagle")
    assert r.returncode == 1 and "ngram" in r.stderr
    r = run(FIX, "hi", "--spec-k", "99")
    assert r.returncode == 2


def test_run_grammar_with_drafts(tmp_path):
    """smelt run --grammar with each proposer on the fixtures (greedy): the answer under the
    grammar is the one without drafts; the fixture as its own draft and n-gram drafts are
    accepted through the per-row masks, the MTP head's (random) ones verified and rejected."""
    g = tmp_path / "g.gbnf"
    g.write_text("root ::= [^<]{1,400}\n")
    for model, prompt, specs in (
            (FIX, "a b c a b c a b c", (("--spec", "ngram"), ("--draft", FIX))),
            (HYBRID_MOE, "hello yes no", (("--spec", "mtp"),))):
        base = run(model, prompt, "--grammar", g, "--temp", "0", "-n", "40")
        assert base.returncode == 0, base.stderr
        for spec in specs:
            r = run(model, prompt, "--grammar", g, "--temp", "0", "-n", "40", *spec, "--spec-fixed")
            assert r.returncode == 0, r.stderr
            assert r.stdout == base.stdout, spec
            proposed, accepted = spec_counts(r)
            assert proposed > 0 and (accepted > 0 or spec[1] == "mtp"), (spec, r.stderr)


TURN = re.compile(r"turn (\d+): prompt (\d+) tokens \((\d+) reused from the cache\), "
                  r"generation (\d+) tokens")


def test_chat_turns_continue_the_cache():
    """-i with n-gram drafts on the qwen2 fixture (random weights: most drafts rolled back):
    the second turn reuses exactly what it reuses without them, and says the same: the
    rolled-back cache holds what the plain run's holds."""
    args = ["-i", "Repeat after me: a b c a b c a b c", "--temp", "0", "-n", "40"]
    stdin = "Again, twice.\n"
    base = run(FIX, *args, stdin=stdin)
    r = run(FIX, *args, "--spec", "ngram", "--spec-fixed", stdin=stdin)
    assert base.returncode == 0 and r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    turns = TURN.findall(r.stderr)
    assert len(turns) == 2 and int(turns[1][2]) > 0 and turns == TURN.findall(base.stderr)
    assert spec_counts(r)[0] > 0


def metric(text, name, model=None):
    """The value of a series (of model's, when given), or None."""
    lab = rf'\{{model="{re.escape(model)}"\}}' if model else r"(?:\{[^}]*\})?"
    m = re.search(rf"^{name}{lab} (\S+)$", text, re.M)
    return float(m[1]) if m else None


def complete(s, prompt, path="/v1/completions", **kw):
    body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, **kw}
    if path != "/v1/completions":
        body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    st, j = s.post(path, body, timeout=300)
    assert st == 200, j
    return j


def text_of(j):
    c = j["choices"][0]
    return c["message"]["content"] if "message" in c else c["text"]


def pairs(s, reqs):
    """Each request twice at once, with and without speculation (6 rows a step at most with
    --spec-k 4): their texts."""
    import concurrent.futures as cf
    jobs = [(r, spec) for r in reqs for spec in (True, False)]
    with cf.ThreadPoolExecutor(len(jobs)) as ex:
        out = list(ex.map(lambda a: complete(s, **a[0], speculative=a[1]), jobs))
    return [(text_of(out[2 * i]), text_of(out[2 * i + 1])) for i in range(len(reqs))]


@pytest.fixture(scope="module")
def qwen_server():
    need(QWEN)
    s = Server(str(QWEN), "--spec", "ngram", "--spec-k", "4", "--max-seqs", "4", "-c", "1024")
    yield s
    s.stop()


def test_qwen_ngram_and_grammar(qwen_server):
    """The real model with n-gram drafts, greedy: a repeat-and-edit request, and a
    json_schema chat request (its drafts are cut where the grammar refuses them, its verify
    rows masked as the drafts advance the matcher), each next to the same request with
    "speculative": false: the same text; drafts were accepted under the grammar."""
    s = qwen_server
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"name": {"type": "string"}, "qty": {"type": "integer"}},
        "required": ["name", "qty"]}}}, "required": ["items"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "list", "schema": schema}}
    m0 = s.request("GET", "/metrics")[2].decode()
    (a, b), = pairs(s, [dict(prompt=EDIT, max_tokens=24)])
    assert a == b
    m1 = s.request("GET", "/metrics")[2].decode()
    # to the end of the document: a draft that would complete it is cut (the row after it
    # would have nothing left to draw: a 500 "every token is banned" before the fix)
    (a, b), = pairs(s, [dict(prompt='Print exactly this JSON, on one line: {"items": [{"name": '
                                    '"apple", "qty": 1}, {"name": "pear", "qty": 2}]}',
                             path="/v1/chat/completions", max_tokens=60, response_format=fmt)])
    assert a == b and json.loads(a)["items"][1] == {"name": "pear", "qty": 2}, a
    m2 = s.request("GET", "/metrics")[2].decode()
    acc = [metric(m, "smelt_spec_accepted_tokens_total") or 0 for m in (m0, m1, m2)]
    assert acc[1] > acc[0] and acc[2] > acc[1], (acc, m2)
    assert metric(m2, "smelt_grammar_rows_total") > 0


@pytest.fixture(scope="module")
def tiny_server(tiny, tmp_path_factory):
    """The tiny model twice: "tiny" (the first, without speculation) and "spec", whose
    models: entry gives it the 1-layer draft: speculation is a model's setting."""
    model, draft = tiny
    cfg = tmp_path_factory.mktemp("spec-cfg") / "smelt.yaml"
    cfg.write_text(f"models:\n  - name: spec\n    model: {model}\n    draft: {draft}\n"
                   f"    spec_k: 5\n    pinned: true\n")
    s = Server(str(model), "--config", str(cfg), "--max-seqs", "8")
    yield s
    s.stop()


def test_serve_spec_metrics_and_log(tiny_server):
    """A model served with a draft: concurrent greedy requests get the text of the same
    weights served without one, /metrics counts its proposed and accepted tokens (the other
    model's stay 0), the request log line carries them, and a request that opts out
    ("speculative": false) proposes nothing."""
    import concurrent.futures as cf
    s = tiny_server
    prompts = [f"count {i} {i} {i} and then" for i in range(6)]
    want = [text_of(complete(s, p, model="tiny")) for p in prompts]
    with cf.ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda p: text_of(complete(s, p, model="spec")), prompts))
    assert got == want
    assert text_of(complete(s, prompts[0], model="spec", speculative=False)) == want[0]
    m = s.request("GET", "/metrics")[2].decode()
    proposed = metric(m, "smelt_spec_proposed_tokens_total", "spec")
    accepted = metric(m, "smelt_spec_accepted_tokens_total", "spec")
    assert proposed and proposed > 0 and accepted is not None and accepted <= proposed, m
    assert metric(m, "smelt_spec_draft_steps_total", "spec") > 0
    assert metric(m, "smelt_spec_proposed_tokens_total", "tiny") == 0
    import time
    t0 = time.time()
    while True:  # a request's log line is written after its response is sent
        log = s.log()
        lines = [l for l in log.splitlines() if "smelt: request" in l and "/v1/completions" in l]
        if len(lines) >= 13 or time.time() - t0 > 10:
            break
        time.sleep(0.05)
    assert len(lines) == 13, log
    counts = [re.search(r"proposed=(\d+) accepted=(\d+)", l) for l in lines]
    assert sum(bool(c) for c in counts) == 7, lines  # the fields only on the speculating model
    assert sum(int(c[1]) > 0 for c in counts if c) == 6, lines  # the opted-out one: none
    assert sum(int(c[1]) for c in counts if c) == proposed
    assert re.search(r"spec .*speculation draft", log) and re.search(r"tiny .*speculation off", log)


def test_serve_ngram_fake_forward():
    """--spec ngram with the fake forward (no model compute): the server's path with
    speculation works without a draft, and the startup line says so."""
    need(QWEN)
    s = Server(str(QWEN), "--fake-forward", "--spec", "ngram")
    try:
        j = complete(s, "a b a b a b", max_tokens=30)
        assert j["usage"]["completion_tokens"] == 30
    finally:
        s.stop()
    assert "speculation ngram" in s.log()


def test_bench_spec(tiny):
    """smelt bench --spec: a row per test with the acceptance rate."""
    model, draft = tiny
    r = subprocess.run([SMELT, "bench", "-m", str(model), "-p", "0", "-n", "32", "-r", "1",
                        "--draft", str(draft), "--spec-fixed", "-o", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    spec = [x for x in rows if x.get("spec") == "draft"]
    assert spec and spec[0]["spec_proposed"] > 0, rows
    assert 0 <= spec[0]["spec_accept_pct"] <= 100


def test_serve_and_bench_mtp():
    """--spec mtp through the engine (serve, bench) on the qwen35moe fixture: the trunk's
    hidden states go to the MTP head after each step (its random layer proposes, nearly
    everything is rejected, the recurrent state rolls back): concurrent greedy requests get
    the text the same model serves without speculation, and the head's drafts are counted;
    smelt bench --spec mtp prints its acceptance row."""
    import concurrent.futures as cf
    prompts = [f"Hello there {i}, the quick brown fox" for i in range(3)]
    plain = Server(str(HYBRID_MOE), "--max-seqs", "3")
    try:
        want = [text_of(complete(plain, p, max_tokens=30)) for p in prompts]
    finally:
        plain.stop()
    # k = 1: a verify step of three sequences stays at 6 rows, where the CPU's rows keep
    # their bits whatever the batch (the module's note)
    s = Server(str(HYBRID_MOE), "--max-seqs", "3", "--spec", "mtp", "--spec-fixed", "--spec-k", "1")
    try:
        with cf.ThreadPoolExecutor(3) as ex:
            got = list(ex.map(lambda p: text_of(complete(s, p, max_tokens=30)), prompts))
        m = s.request("GET", "/metrics")[2].decode()
    finally:
        s.stop()
    assert got == want
    assert metric(m, "smelt_spec_proposed_tokens_total") > 0, m
    assert "speculation mtp" in s.log()
    r = subprocess.run([SMELT, "bench", "-m", str(HYBRID_MOE), "-p", "0", "-n", "24", "-r", "1",
                        "--spec", "mtp", "--spec-fixed", "-o", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    spec = [x for x in json.loads(r.stdout) if x.get("spec") == "mtp"]
    assert spec and spec[0]["spec_proposed"] > 0, r.stdout
