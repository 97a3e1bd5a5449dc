"""smelt compare: two quantizations of one random model side by side.

The tiny random model (vocab 1000, 2 layers) is written as F16 and as Q4_0 from the same
seed, so the two files hold the same weights at two precisions and share a vocabulary.
Checks: a model against itself agrees everywhere with zero divergence; F16 against Q4_0
diverges a little, symmetrically in agreement; the perplexity of a side does not depend on
the other side; a different vocabulary is refused, naming the first differing token."""
import json
import math
import os
import subprocess

import pytest

from smelt_server import QWEN, SMELT

TEXT = ("The quick brown fox jumps over the lazy dog. " * 8 +
        "int main(void) { return 0; }\n" * 4)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("compare")
    out = {}
    for t in ("F16", "Q4_0"):
        p = str(d / f"tiny-{t}.gguf")
        subprocess.run([SMELT, "quantize", "--random", "tiny", p, t, "--seed", "7"], check=True,
                       capture_output=True, timeout=120)
        out[t] = p
    text = d / "text.txt"
    text.write_text(TEXT)
    out["text"] = str(text)
    return out


def compare(*args):
    r = subprocess.run([SMELT, "compare", *args, "--backend", "cpu", "-t", "1", "--pp", "16",
                        "--tg", "4", "-n", "12", "-o", "json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_self_is_identical(files):
    j = compare(files["F16"], "-f", files["text"], "--ctx", "40")
    assert j["positions"] > 60
    assert j["top1_agreement"] == 1.0
    assert j["kl_max"] == 0.0
    assert j["ppl"][0] == j["ppl"][1]
    assert j["greedy_first_difference"] == -1 and j["greedy_a"] == j["greedy_b"]
    assert math.isfinite(j["ppl"][0]) and j["ppl"][0] > 1.0


def test_two_precisions(files):
    ab = compare(files["F16"], files["Q4_0"], "-f", files["text"])
    ba = compare(files["Q4_0"], files["F16"], "-f", files["text"])
    aa = compare(files["F16"], files["F16"], "-f", files["text"])
    assert ab["kl_mean"] > 0 and ab["kl_max"] >= ab["kl_p99"] >= ab["kl_median"] >= 0
    assert ab["top1_agreement"] == ba["top1_agreement"]
    # each side's perplexity is its own, whatever it is compared with
    assert ab["ppl"][0] == aa["ppl"][0] == ba["ppl"][1]
    assert ab["ppl"][1] == ba["ppl"][0]
    # the speed tests ran on both sides
    assert min(ab["pp_ts"] + ab["tg_ts"]) > 0


def test_exact_side(files):
    """The same file with the CPU reference matmuls on one side: close, not identical."""
    j = compare(files["Q4_0"], "--exact-b", "-f", files["text"])
    assert 0 < j["kl_mean"] < 1e-2
    assert "exact" in j["b"] and "exact" not in j["a"]


def test_vocab_mismatch_refused(files):
    if not os.path.exists(QWEN):
        pytest.skip(f"needs {QWEN} (make models)")
    r = subprocess.run([SMELT, "compare", files["F16"], QWEN, "--backend", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "vocabularies differ (1000 and 151936 tokens)" in r.stderr
    assert "first difference at id" in r.stderr


def test_usage_errors():
    for args, msg in ([[], "a model is required"], [["a", "b", "c"], "more than two models"],
                      [["a", "--ctx", "1"], "bad value for --ctx"],
                      [["a", "--bogus", "1"], "unknown option --bogus"]):
        r = subprocess.run([SMELT, "compare", *args], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and msg in r.stderr, (args, r.stderr)
