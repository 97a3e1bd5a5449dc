"""The real test models that scripts/fetch-test-models.sh assembles into models/.

Each file listed in scripts/test-models.sha256 must, when present, hash to its committed
sha256 and be the GGUF that docs/models.md describes (checked with gguf-py, an
independent reader). A file that is absent is skipped with the reason.
"""
import hashlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUMS = ROOT / "scripts" / "test-models.sha256"

# name -> (architecture, tensor count, block count) as documented in docs/models.md
EXPECTED = {
    "gemma3-270m-q4_k_m.gguf": ("gemma3", 236, 18),
    "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf": ("qwen2", 291, 24),
}


def committed_sums():
    out = {}
    for line in SUMS.read_text().splitlines():
        if line.strip():
            sha, name = line.split()
            out[name] = sha
    return out


def test_sums_cover_documented_models():
    assert set(committed_sums()) == set(EXPECTED)


def test_real_refs_match_committed_models():
    """tests/data/ref-real/*.json were recorded from exactly these files."""
    sums = committed_sums()
    refs = sorted((ROOT / "tests" / "data" / "ref-real").glob("*.json"))
    assert len(refs) == len(sums)
    for r in refs:
        rec = json.loads(r.read_text())
        assert rec["model_file"] == r.stem + ".gguf"
        assert sums[rec["model_file"]] == rec["sha256"]
        for p in rec["prompts"]:
            assert len(p["topk_ids"]) == len(p["ids"]) == len(p["topk_logits"])


def model_path(name):
    p = ROOT / "models" / name
    if not p.exists():
        pytest.skip(f"models/{name} absent (run scripts/fetch-test-models.sh)")
    return p


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_sha256(name):
    p = model_path(name)
    h = hashlib.sha256()
    with p.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    assert h.hexdigest() == committed_sums()[name]


def read_header_kvs(path, wanted):
    """Reads the GGUF v3 header and walks the key/value section until every key in
    `wanted` is found (scalar and string values only; arrays are skipped). gguf-py's
    GGUFReader parses the 262k-entry vocab arrays too and takes ~10 s per file, so this
    test walks the header itself; identity is already proven by the sha256 test."""
    import struct
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
              10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<4sIQQ", f.read(24))
        assert magic == b"GGUF" and version == 3
        found = {}

        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

        def rstr():
            return f.read(rd("Q")).decode("utf-8")

        def value(t):
            if t in scalar:
                return rd(scalar[t])
            if t == 8:
                return rstr()
            assert t == 9, f"bad value type {t}"
            et, n = rd("I"), rd("Q")
            for _ in range(n):
                value(et)
            return None

        for _ in range(n_kv):
            key = rstr()
            found[key] = value(rd("I"))
            if all(k in found for k in wanted):
                break
    return n_tensors, found


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_model_is_expected_gguf(name):
    p = model_path(name)
    arch, n_tensors, n_blocks = EXPECTED[name]
    got_tensors, kv = read_header_kvs(p, ["general.architecture", f"{arch}.block_count"])
    assert kv.get("general.architecture") == arch
    assert kv.get(f"{arch}.block_count") == n_blocks
    assert got_tensors == n_tensors
