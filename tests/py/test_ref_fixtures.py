"""Checks the committed forward-pass fixtures (tests/data/ref/) against themselves.

The logits in tests/data/ref/ were recorded from Hugging Face transformers; the GGUF files
beside them were written by scripts/make-ref-fixtures.py. Here tests/py/ref_forward.py, an
independent numpy forward that reads the GGUF files, must reproduce those logits from every
file of a model (F32, F16, and the MoE model's Q8_0-experts file: the same numbers). This guards the fixtures (a wrong permutation, norm convention
or metadata key would fail) and the numpy reference the C forward pass is debugged with.
"""
import hashlib
import json
import pathlib

import numpy as np
import pytest

import ref_forward

REF = pathlib.Path(__file__).resolve().parents[1] / "data" / "ref"
MANIFEST = json.loads((REF / "manifest.json").read_text())
CASES = [(m["name"], kind) for m in MANIFEST["models"] for kind in m["files"]]


def model_info(name):
    return next(m for m in MANIFEST["models"] if m["name"] == name)


@pytest.mark.parametrize("name,kind", CASES)
def test_fixture_file_sha256(name, kind):
    f = model_info(name)["files"][kind]
    data = (REF / f["file"]).read_bytes()
    assert len(data) == f["bytes"]
    assert hashlib.sha256(data).hexdigest() == f["sha256"]


@pytest.mark.parametrize("name,kind", CASES)
def test_numpy_forward_matches_transformers(name, kind):
    pytest.importorskip("gguf")
    m = model_info(name)
    ref = ref_forward.RefModel(str(REF / m["files"][kind]["file"]))
    assert ref.arch == m["arch"] and ref.n_vocab == m["n_vocab"]
    for p in m["prompts"]:
        want = np.fromfile(REF / p["logits"], dtype="<f4").reshape(p["shape"])
        got = ref.forward(p["ids"])
        assert got.shape == want.shape
        err = np.max(np.abs(got - want))
        assert err < 1e-4 * max(1.0, p["max_abs_logit"]), f"{name} {kind} n={len(p['ids'])}: {err}"
