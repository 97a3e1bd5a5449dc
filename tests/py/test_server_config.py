"""Layered configuration through `smelt serve` and `smelt config` (docs/config.md): the
config file, SMELT_* variables, flags and --set, each winning over the one below; per-model
entries; refusals of a bad file naming the file, line and key. And the server-wide sampling
defaults: the model file's general.sampling.* < the server's settings (flags, the file, a
model's entry) < the request's own fields, each layer shown winning over the one below.

Sampling is observed on a tiny random llama (tiny_llama.py), whose next-token distribution
is nearly flat: at temperature 1 two requests with different seeds give different texts,
while greedy decoding (temperature 0, top-k 1, top-p 0) gives one text every time."""
import json
import os
import subprocess

import pytest

from smelt_server import SMELT, Server

pytest.importorskip("gguf")
from tiny_llama import write_tiny_llama  # noqa: E402

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

ENV = {"XDG_CONFIG_HOME": "/nonexistent"}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("sampling")
    # the same weights (seed 4) with and without sampling defaults in the file
    return {
        "plain": write_tiny_llama(str(d / "plain.gguf"), 400, seed=4),
        "greedy": write_tiny_llama(str(d / "greedy.gguf"), 400, seed=4, sampling={"temp": 0.0}),
        "topk1": write_tiny_llama(str(d / "topk1.gguf"), 400, seed=4, sampling={"top_k": 1}),
        "penalty": write_tiny_llama(str(d / "penalty.gguf"), 400, seed=4,
                                    sampling={"temp": 0.0, "penalty_repeat": 3.0}),
        "dir": str(d),
    }


def serve(*args, env=None):
    return Server(*args, "-t", "1", "--quiet", env={**ENV, **(env or {})}, start_timeout=60)


PROMPT = [5, 300, 301, 300, 301, 300, 301, 7]


def text(s, model=None, **kw):
    body = {"prompt": PROMPT, "max_tokens": 16, **kw}
    if model:
        body["model"] = model
    st, j = s.post("/v1/completions", body)
    assert st == 200, j
    return j["choices"][0]["text"]


def deterministic(s, **kw):
    """True when two requests without a seed give the same text."""
    return text(s, **kw) == text(s, **kw)


@pytest.fixture(scope="module")
def greedy_text(files):
    s = serve(files["plain"])
    try:
        return text(s, temperature=0)
    finally:
        s.stop()


def test_temperature_layers(files, greedy_text):
    s = serve(files["plain"])  # no default anywhere: OpenAI's temperature 1
    try:
        assert not deterministic(s)  # (the control: the test could fail)
    finally:
        assert s.stop() == 0
    s = serve(files["greedy"])  # the file's general.sampling.temp 0 wins over the built-in 1
    try:
        assert text(s) == text(s) == greedy_text
        assert "temperature 0 (the file)" in s.log()
    finally:
        assert s.stop() == 0
    s = serve(files["greedy"], "--temp", "1")  # the server's setting wins over the file
    try:
        assert not deterministic(s)
        assert "temperature 1 (--temp)" in s.log()
        assert text(s, temperature=0) == greedy_text  # and the request over the server
    finally:
        assert s.stop() == 0


def test_seed_top_k_top_p_layers(files, greedy_text):
    s = serve(files["plain"], "--seed", "7")
    try:
        a = text(s)
        assert text(s) == a == text(s, seed=7)  # the server's seed for requests without one
        assert text(s, seed=8) != a             # a request's own seed wins
    finally:
        assert s.stop() == 0
    s = serve(files["topk1"])  # top_k 1 from the file: greedy at temperature 1
    try:
        assert text(s) == greedy_text
    finally:
        assert s.stop() == 0
    s = serve(files["topk1"], "--top-k", "0")  # the server turns it off
    try:
        assert not deterministic(s)
        assert text(s, top_k=1) == greedy_text  # the request turns it on again
    finally:
        assert s.stop() == 0
    s = serve(files["plain"], "--top-p", "0")  # top_p 0: the most likely token only
    try:
        assert text(s) == greedy_text
        assert not deterministic(s, top_p=1)
    finally:
        assert s.stop() == 0


def test_repetition_penalty_layers(files, greedy_text):
    s = serve(files["penalty"])  # greedy with the file's penalty 3
    try:
        penalized = text(s)
        assert penalized != greedy_text and text(s) == penalized
    finally:
        assert s.stop() == 0
    for flags in (["--repeat-penalty", "1"], ["--repeat-last-n", "0"]):
        s = serve(files["penalty"], *flags)  # the server's setting turns the file's off
        try:
            assert text(s) == greedy_text, flags
            assert text(s, repetition_penalty=3.0) == penalized  # the request's own wins
        finally:
            assert s.stop() == 0


def test_model_entries_and_layers(files, greedy_text, tmp_path):
    cfg = tmp_path / "smelt.yaml"
    cfg.write_text(f"""
temp: 0                  # every model's default...
ctx_size: 512
models:
  - model: {files["plain"]}
    name: cold
  - model: {files["plain"]}
    name: warm
    temp: 1.0            # ...but this one's entry wins
    ctx_size: 256
""")
    s = serve(f"--config={cfg}")
    try:
        assert text(s, "cold") == greedy_text
        assert not deterministic(s, model="warm")
        st, h, body = s.request("GET", "/v1/models")
        lens = {m["id"]: m.get("max_model_len") for m in json.loads(body)["data"]}
        assert lens == {"cold": 512, "warm": 256}, lens
        assert f"warm: sampling defaults: temperature 1 ({cfg}:9)" in s.log(), s.log()
    finally:
        assert s.stop() == 0
    # the server-wide value from every layer, each over the one below; a model's entry over all
    cases = [({}, [], 512), ({"SMELT_CTX_SIZE": "384"}, [], 384),
             ({"SMELT_CTX_SIZE": "384"}, ["-c", "320"], 320),
             ({"SMELT_CTX_SIZE": "384"}, ["-c", "320", "--set", "ctx_size=288"], 288)]
    for env, flags, want in cases:
        s = serve(f"--config={cfg}", *flags, env=env)
        try:
            st, h, body = s.request("GET", "/v1/models")
            lens = {m["id"]: m.get("max_model_len") for m in json.loads(body)["data"]}
            assert lens["cold"] == want and lens["warm"] == 256, (env, flags, lens)
        finally:
            assert s.stop() == 0
    s = serve(f"--config={cfg}", "--set", "models.warm.ctx_size=128")
    try:
        st, h, body = s.request("GET", "/v1/models/warm")
        assert json.loads(body)["max_model_len"] == 128
    finally:
        assert s.stop() == 0


def run(*args, env=None, cwd=None):
    return subprocess.run([SMELT, *args], capture_output=True, text=True, timeout=60, cwd=cwd,
                          env={**os.environ, **ENV, **(env or {})})


def test_smelt_config_shows_every_source(files, tmp_path):
    (tmp_path / "smelt.yaml").write_text(f"""port: 9001
max_seqs: 8
threads: 2
models:
  - model: {files["plain"]}
    name: a
    temp: 0.5
""")
    r = run("config", "--max-seqs", "9", "--set", "threads=3", cwd=str(tmp_path),
            env={"SMELT_HOST": "0.0.0.0", "SMELT_API_KEY": "sekrit"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    lines = {l.split(":")[0]: l for l in out.splitlines() if l and l[0] not in " #"}
    assert "9001" in lines["port"] and "# smelt.yaml:1" in lines["port"]       # the file
    assert '"0.0.0.0"' in lines["host"] and "# $SMELT_HOST" in lines["host"]   # the environment
    assert "9" in lines["max_seqs"] and "# --max-seqs" in lines["max_seqs"]    # a flag
    assert "3" in lines["threads"] and "# --set" in lines["threads"]           # --set
    assert "# default" in lines["timeout"] and "# unset" in lines["kv_size"]
    assert "sekrit" not in out and "# api_key: (set, not shown)  # $SMELT_API_KEY" in out
    assert "    temp: 0.5" in out and "# smelt.yaml:7" in out                 # an entry's own
    assert "#   a: " + files["plain"] in out and "loaded at start" in out     # the models


@pytest.mark.parametrize("text,want", [
    ("port: 8080\nprot: 1\n", "smelt.yaml:2: unknown key 'prot' (did you mean 'port'?)"),
    ("max_seqs: \"8\"\n", "smelt.yaml:1: max_seqs: expected an integer, got a quoted string"),
    ("gpu_memory_utilization: 1.5\n", "smelt.yaml:1: gpu_memory_utilization: 1.5 is out of range"),
    ("log_format: xml\n", "log_format: expected one of text|json, got 'xml'"),
    ("models:\n  - model: x.gguf\n    host: 0.0.0.0\n",
     "smelt.yaml:3: models[0]: host: a server-wide setting"),
    ("models:\n  - name: x\n", "smelt.yaml:2: models[0]: model: missing"),
])
def test_bad_config_refused_at_start(tmp_path, text, want):
    (tmp_path / "smelt.yaml").write_text(text)
    for cmd in ("serve", "config"):
        r = run(cmd, "--port", "0", cwd=str(tmp_path))
        assert r.returncode == 2 and want in r.stderr, (cmd, r.stderr)


def test_bad_environment_and_flags_refused(files):
    r = run("serve", files["plain"], "--port", "0", env={"SMELT_MAX_SEQS": "lots"})
    assert r.returncode == 2 and "$SMELT_MAX_SEQS: expected an integer, got 'lots'" in r.stderr
    r = run("serve", files["plain"], "--port", "0", "--set", "models.x.temp=1")
    assert r.returncode == 2 and "no model named 'x'" in r.stderr
    r = run("serve", files["plain"], "--port", "0", "--temp", "-1")
    assert r.returncode == 2 and "--temp: -1 is out of range [0, 100]" in r.stderr, r.stderr
    r = run("serve", files["plain"], "--port", "0", "--config", "/nonexistent.yaml")
    assert r.returncode == 1 and "/nonexistent.yaml" in r.stderr
