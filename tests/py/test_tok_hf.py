"""Tokenizer checks through the smelt binary.

- 1 MB of random Unicode per case (random_text in scripts/make-tok-corpus.py, seed in
  tests/data/tok/expected.json): the count and FNV-1a-64 of our ids against those of
  Hugging Face's tokenizer for the same vocab, recorded by that script.
- The invalid-UTF-8 policy: encoding arbitrary bytes gives the ids of Python's
  bytes.decode("utf-8", errors="replace") of them.
- `smelt tokenize` options and errors.
A case whose vocab is absent (../shared/data, models/) is skipped, saying which.
"""
import functools
import importlib.util
import json
import os
import random
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMELT = os.environ.get("SMELT_BIN", os.path.join(ROOT, "build", "smelt"))
EXPECTED = os.path.join(ROOT, "tests", "data", "tok", "expected.json")


def _load_script():
    spec = importlib.util.spec_from_file_location(
        "make_tok_corpus", os.path.join(ROOT, "scripts", "make-tok-corpus.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MK = _load_script()
EXP = json.load(open(EXPECTED))


@functools.lru_cache(maxsize=None)
def vocab(src):
    return MK.case_path(src)


@functools.lru_cache(maxsize=1)
def random_corpus():
    return MK.random_text(EXP["random"]["seed"], EXP["random"]["bytes"]).encode("utf-8")


def tokenize(path, data, *args):
    r = subprocess.run([SMELT, "tokenize", path, "--file", "-", "--ids", *args],
                       input=data, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    return [int(x) for x in r.stdout.split()]


def shared(name):
    p = vocab("shared:" + name)
    if not p:
        pytest.skip("../shared/data/vocab/ggml-vocab-%s.gguf absent" % name)
    return p


@pytest.mark.parametrize("case", sorted(EXP["cases"]))
def test_random_unicode_matches_hf(case):
    c = EXP["cases"][case]
    path = vocab(c["vocab"])
    if not path:
        where = "../shared/data" if c["vocab"].startswith("shared:") else "no model under models/ (make models)"
        pytest.skip("vocab %s absent: %s" % (c["vocab"], where))
    extra = ["--pre", c["pre"]] if c["pre"] else []
    ids = tokenize(path, random_corpus(), "--no-bos", *extra)
    n, h = c["random"]
    assert len(ids) == n, "%d ids, HF %d" % (len(ids), n)
    assert "%016x" % MK.fnv64(ids) == h


@pytest.mark.parametrize("name", ["gpt-2", "llama-spm"])
def test_invalid_utf8_is_replaced_like_python(name):
    path = shared(name)
    rng = random.Random(3)
    chunks = []
    for _ in range(300):
        n = rng.randrange(0, 40)
        chunks.append(bytes(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(256)])
                            for _ in range(n)))
    raw = b"\x1e".join(chunks) + b"\xe2\x82" + b"\xf0\x9f\x98" + b"\xed\xa0\x80" + b"\xc0"
    fixed = raw.decode("utf-8", errors="replace").encode("utf-8")
    assert raw != fixed
    assert tokenize(path, raw, "--no-bos") == tokenize(path, fixed, "--no-bos")


def run(*args, data=None):
    return subprocess.run([SMELT, "tokenize", *args], input=data, capture_output=True,
                          timeout=120)


def test_cli_outputs():
    path = shared("gpt-2")
    r = run(path, "Hello world", "--ids")
    assert r.returncode == 0 and r.stdout.decode() == "15496 995\n"
    r = run(path, "Hello world", "--pieces")
    assert r.stdout.decode() == "'Hello' ' world'\n"
    r = run(path, "Hello world")
    assert r.stdout.decode() == "15496\t'Hello'\n995\t' world'\n"
    r = run(path, "a\nb", "--pieces")
    assert r.stdout.decode() == "'a' '\\n' 'b'\n"


def test_cli_special_and_bos():
    path = shared("gpt-2")
    assert run(path, "<|endoftext|>", "--ids").stdout.decode() == "50256\n"
    lit = run(path, "<|endoftext|>", "--ids", "--no-special").stdout.decode().split()
    assert len(lit) > 1 and "50256" not in lit
    spm = shared("llama-spm")
    assert run(spm, "Hello", "--ids").stdout.decode() == "1 15043\n"
    assert run(spm, "Hello", "--ids", "--no-bos").stdout.decode() == "15043\n"


def test_cli_split():
    path = shared("gpt-2")
    r = run(path, "--file", "-", "--split", "|", "--ids", data=b"Hello|world||")
    assert r.returncode == 0
    assert r.stdout.decode() == "15496\n6894\n\n\n"


def test_cli_errors():
    r = run()
    assert r.returncode == 2
    r = run("/nonexistent.gguf", "x")
    assert r.returncode == 1 and "nonexistent" in r.stderr.decode()
    r = run("/nonexistent.gguf", "x", "--bogus")
    assert r.returncode == 2


def test_cli_unknown_pretokenizer():
    # refused, naming it; --allow-unknown-pretokenizer loads it with GPT-2's split
    path = shared("gpt-2")
    r = run(path, "Hello world", "--ids", "--pre", "kimi-k2")
    err = r.stderr.decode()
    assert r.returncode == 1 and '"kimi-k2"' in err and "--allow-unknown-pretokenizer" in err
    assert "qwen35" in err and r.stdout == b""
    r = run(path, "Hello world", "--ids", "--pre", "kimi-k2", "--allow-unknown-pretokenizer")
    assert r.returncode == 0 and r.stdout.decode() == "15496 995\n"
    assert "kimi-k2" in r.stderr.decode()  # the warning
    # the same in smelt run and smelt serve (a vocab-only file whose pre is kimi-k2)
    gguf = pytest.importorskip("gguf")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        bad = os.path.join(d, "kimi.gguf")
        w = gguf.GGUFWriter(bad, "llama")
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("kimi-k2")
        w.add_token_list(["a", "b", "ab", "<|im_end|>"])
        w.add_token_types([1, 1, 1, 3])
        w.add_token_merges(["a b"])
        w.add_eos_token_id(3)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        for cmd in (["run", bad, "hi"], ["serve", bad, "--port", "0", "--fake-forward"]):
            r = subprocess.run([SMELT, *cmd], capture_output=True, timeout=60)
            assert r.returncode != 0 and b'"kimi-k2"' in r.stderr, (cmd, r.stderr)
        # allowed: run gets past the tokenizer (and fails on the missing weights)
        r = subprocess.run([SMELT, "run", bad, "hi", "--allow-unknown-pretokenizer"],
                           capture_output=True, timeout=60)
        assert r.returncode != 0 and b'tokenizer.ggml.pre = "kimi-k2"' not in r.stderr, r.stderr
