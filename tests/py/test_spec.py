"""Speculative decoding end to end (docs/speculative.md): `smelt run`, `smelt serve` and
`smelt bench` with --spec ngram and --draft.

The reference is smelt itself without speculation: greedy output must be the same token for
token (the CPU backend computes a row's logits with the same bits at any row count below
eight, and the verify steps stay below), on the tiny fixtures and a random tiny model (every
draft rejected: rollbacks all the way), and on the real Qwen2.5-Coder 0.5B (n-gram on a
repeat-and-edit prompt, the model as its own draft, a truncated-layer self-draft, and a chat
whose second turn continues from the first's cache). A draft with another vocabulary is
refused with both sizes and the first differing token."""
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
    model must be attention-only): the same text as without speculation."""
    cases = [(FIX, ["--spec", "ngram"]), (FIX, ["--draft", FIX]), (HYBRID, ["--spec", "ngram"])]
    for model, extra in cases:
        args = [model, "hello world hello world hello", "--raw", "-n", "100", "--temp", "0"]
        base = run(*args)
        r = run(*args, *extra, "--spec-fixed")
        assert base.returncode == 0 and r.returncode == 0, r.stderr
        assert r.stdout == base.stdout, (model, extra)
        proposed, _ = spec_counts(r)
        assert proposed > 0, r.stderr


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


def test_qwen_ngram_repeat_and_edit():
    need(QWEN)
    base = run(QWEN, EDIT, "-n", "100", "--temp", "0")
    r = run(QWEN, EDIT, "-n", "100", "--temp", "0", "--spec", "ngram")
    assert base.returncode == 0 and r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    proposed, accepted = spec_counts(r)
    assert accepted > 20, r.stderr


def test_qwen_self_and_truncated_draft(tmp_path):
    """The real model as its own draft accepts everything; a 20-layer copy of it (its first
    20 of 24 blocks) some; both give the plain text."""
    need(QWEN)
    prompt = "Write a C function that reverses a string in place."
    base = run(QWEN, prompt, "-n", "24", "--temp", "0")
    assert base.returncode == 0, base.stderr
    r = run(QWEN, prompt, "-n", "24", "--temp", "0", "--draft", QWEN, "--spec-fixed")
    assert r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    proposed, accepted = spec_counts(r)
    assert proposed > 0 and accepted == proposed
    draft = truncated(QWEN, tmp_path / "qwen-20.gguf", 20)
    r = run(QWEN, prompt, "-n", "24", "--temp", "0", "--draft", draft, "--spec-fixed")
    assert r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    proposed, accepted = spec_counts(r)
    assert 0 < accepted < proposed


TURN = re.compile(r"turn (\d+): prompt (\d+) tokens \((\d+) reused from the cache\), "
                  r"generation (\d+) tokens")


def test_qwen_chat_turns_continue_the_cache():
    """-i with n-gram drafts: the second turn reuses exactly what it reuses without them, and
    says the same: the rolled-back cache holds what the plain run's holds."""
    need(QWEN)
    args = ["-i", "Repeat after me: the quick brown fox jumps over the lazy dog.", "--temp", "0",
            "-n", "40"]
    stdin = "Now say it again, twice.\n"
    base = run(QWEN, *args, stdin=stdin)
    r = run(QWEN, *args, "--spec", "ngram", stdin=stdin)
    assert base.returncode == 0 and r.returncode == 0, r.stderr
    assert r.stdout == base.stdout
    assert TURN.findall(r.stderr) == TURN.findall(base.stderr)
    assert spec_counts(r)[1] > 0


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m[1]) if m else None


def complete(s, prompt, **kw):
    st, j = s.post("/v1/completions", {"prompt": prompt, "max_tokens": 40, "temperature": 0, **kw},
                   timeout=300)
    assert st == 200, j
    return j


def test_serve_spec_metrics_and_log(tiny):
    """smelt serve with a draft: concurrent greedy requests get the text of a server without
    one, /metrics counts proposed and accepted tokens, the request log line carries them,
    and a request that opts out ("speculative": false) proposes nothing."""
    import concurrent.futures as cf
    model, draft = tiny
    prompts = [f"count {i} {i} {i} and then" for i in range(6)]
    plain = Server(str(model), "--max-seqs", "8")
    try:
        want = [complete(plain, p)["choices"][0]["text"] for p in prompts]
    finally:
        plain.stop()
    s = Server(str(model), "--draft", str(draft), "--spec-k", "5", "--max-seqs", "8")
    try:
        with cf.ThreadPoolExecutor(6) as ex:
            got = list(ex.map(lambda p: complete(s, p)["choices"][0]["text"], prompts))
        assert got == want
        complete(s, prompts[0], speculative=False)
        st, _, data = s.request("GET", "/metrics")
        m = data.decode()
        proposed = metric(m, "smelt_spec_proposed_tokens_total")
        accepted = metric(m, "smelt_spec_accepted_tokens_total")
        assert proposed and proposed > 0 and accepted is not None and accepted <= proposed, m
        assert metric(m, "smelt_spec_draft_steps_total") > 0
    finally:
        s.stop()
    log = s.log()
    lines = [l for l in log.splitlines() if "smelt: request" in l and "/v1/completions" in l]
    assert len(lines) == 7, log
    counts = [re.search(r"proposed=(\d+) accepted=(\d+)", l) for l in lines]
    assert all(counts), lines
    assert sum(int(m[1]) > 0 for m in counts) == 6, lines  # the opted-out one proposed none
    assert sum(int(m[1]) for m in counts) == proposed
    assert "speculation draft" in log


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
