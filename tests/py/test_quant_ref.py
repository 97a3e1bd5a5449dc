"""smelt's reference (de)quantizers against gguf-py's numpy implementation.

The C side is called through ctypes on libsmelt.so (qtype_get -> struct qtype_info).
Dequantize must be bit-exact on random blocks, including blocks whose f16 scales are
NaN, +-Inf, denormal or zero. Quantize must be bit-exact where gguf-py implements it;
for the other types the round trip error is checked against a bound (and printed with
-s, for docs/quant.md).
"""
import ctypes
import os

import numpy as np
import pytest
from conftest import libsmelt_path

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf import quants as gq  # noqa: E402


DEQ = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
QUA = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class QtypeInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("blck_size", ctypes.c_uint32),
                ("type_size", ctypes.c_uint32), ("dequantize", ctypes.c_void_p),
                ("quantize", ctypes.c_void_p)]


@pytest.fixture(scope="module")
def lib():
    so = ctypes.CDLL(libsmelt_path())
    so.qtype_get.restype = ctypes.POINTER(QtypeInfo)
    so.qtype_get.argtypes = [ctypes.c_uint32]
    so.qtype_row_size.restype = ctypes.c_uint64
    so.qtype_row_size.argtypes = [ctypes.c_uint32, ctypes.c_int64]
    return so


def info(lib, t):
    p = lib.qtype_get(int(t))
    assert p, f"qtype_get({t}) returned NULL"
    return p.contents


def c_dequant(lib, t, raw):
    inf = info(lib, t)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    n = raw.size // inf.type_size * inf.blck_size
    out = np.empty(n, dtype=np.float32)
    DEQ(inf.dequantize)(raw.ctypes.data, out.ctypes.data, n)
    return out


def c_quant(lib, t, x):
    inf = info(lib, t)
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // inf.blck_size * inf.type_size, dtype=np.uint8)
    QUA(inf.quantize)(x.ctypes.data, out.ctypes.data, x.size)
    return out


# (type, byte offsets of f16 scale fields within a block)
DEQUANT_TYPES = [
    (T.F16, []), (T.BF16, []),
    (T.Q4_0, [0]), (T.Q4_1, [0, 2]), (T.Q5_0, [0]), (T.Q5_1, [0, 2]), (T.Q8_0, [0]),
    (T.Q2_K, [80, 82]), (T.Q3_K, [108]), (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]), (T.Q6_K, [208]),
    (T.IQ2_XXS, [0]), (T.IQ2_XS, [0]), (T.IQ2_S, [0]), (T.IQ3_XXS, [0]), (T.IQ3_S, [0]),
    (T.IQ1_S, [0]), (T.IQ1_M, []), (T.IQ4_NL, [0]), (T.IQ4_XS, [0]),
    (T.TQ1_0, [52]), (T.TQ2_0, [64]), (T.MXFP4, []), (T.NVFP4, []),
]

SPECIAL_F16 = [0x7E00, 0x7C01, 0xFE00, 0x7C00, 0xFC00, 0x0001, 0x8001, 0x03FF, 0x0000, 0x8000,
               0x7BFF, 0xFBFF, 0x3C00]


def same_bits(a, b):
    a = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    b = np.ascontiguousarray(b, dtype=np.float32).view(np.uint32)
    return a.shape == b.shape and np.array_equal(a, b)


def first_diff(a, b):
    a = a.view(np.uint32)
    b = b.view(np.uint32)
    i = int(np.nonzero(a != b)[0][0])
    return f"element {i}: smelt {a[i]:#010x} ({a.view(np.float32)[i]!r}) gguf {b[i]:#010x} ({b.view(np.float32)[i]!r})"


@pytest.mark.parametrize("t,scale_offs", DEQUANT_TYPES, ids=[t.name for t, _ in DEQUANT_TYPES])
def test_dequantize_bit_exact(lib, t, scale_offs):
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    assert info(lib, t).blck_size == bs and info(lib, t).type_size == ts
    rng = np.random.default_rng(1234 + int(t))
    nblocks = 512 if bs > 1 else 4096
    raw = rng.integers(0, 256, size=(nblocks, ts), dtype=np.uint8)
    # Sane scales on most blocks (random bytes give mostly huge or tiny halves), then
    # the special values on others.
    for off in scale_offs:
        sane = (rng.standard_normal(nblocks).astype(np.float32) * 0.01).astype(np.float16)
        raw[:, off:off + 2] = sane.view(np.uint8).reshape(nblocks, 2)
        for k, h in enumerate(SPECIAL_F16):
            blk = 1 + k * 7 + scale_offs.index(off)
            raw[blk, off] = h & 0xFF
            raw[blk, off + 1] = h >> 8
    if t in (T.F16, T.BF16):
        sp = np.array(SPECIAL_F16, dtype=np.uint16).view(np.uint8)
        raw.reshape(-1)[:sp.size] = sp
    ref = gq.dequantize(raw.reshape(-1), t).reshape(-1).astype(np.float32, copy=False)
    got = c_dequant(lib, t, raw)
    assert same_bits(got, ref), f"{t.name}: {first_diff(got, ref)}"


def test_dequantize_mxfp4_every_exponent(lib):
    # gpt-oss's experts: every E8M0 scale byte (0 and 1 take ggml's subnormal branch, 255 the
    # largest) with every code in both nibbles, bit for bit against gguf-py.
    raw = np.zeros((256 * 16, 17), dtype=np.uint8)
    for e in range(256):
        blk = raw[e * 16:(e + 1) * 16]
        blk[:, 0] = e
        blk[:, 1:] = (np.arange(16, dtype=np.uint8)[:, None] * 17 + np.arange(16)) & 0xFF
    ref = gq.dequantize(raw.reshape(-1), T.MXFP4).reshape(-1).astype(np.float32, copy=False)
    got = c_dequant(lib, T.MXFP4, raw)
    assert same_bits(got, ref), f"MXFP4: {first_diff(got, ref)}"


def test_dequantize_iq1_m_special_scales(lib):
    # IQ1_M's f16 super-scale is spread over the top nibbles of its 4 scale words.
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(len(SPECIAL_F16), 56), dtype=np.uint8)
    for k, h in enumerate(SPECIAL_F16):
        words = raw[k, 48:56].copy().view(np.uint16) & 0x0FFF
        for j in range(4):
            words[j] |= ((h >> (4 * j)) & 0xF) << 12
        raw[k, 48:56] = words.view(np.uint8)
    ref = gq.dequantize(raw.reshape(-1), T.IQ1_M).reshape(-1)
    got = c_dequant(lib, T.IQ1_M, raw)
    assert same_bits(got, ref), first_diff(got, ref)


def _np_q8(raw, ts, bs, dtype_d):
    """Independent numpy decoders for the activation formats gguf-py lacks."""
    d = raw[:, :4].copy().view(np.float32) if dtype_d == "f32" else raw[:, :2].copy().view(np.float16).astype(np.float32)
    qoff = 4
    qs = raw[:, qoff:qoff + bs].copy().view(np.int8).astype(np.float32)
    return (d * qs).reshape(-1) if dtype_d == "f32" else (qs * d).reshape(-1)


def test_dequantize_q8_1_q8_k(lib):
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, size=(256, 36), dtype=np.uint8)
    raw[:, 0:2] = (rng.standard_normal(256).astype(np.float32)).astype(np.float16).view(np.uint8).reshape(256, 2)
    assert same_bits(c_dequant(lib, T.Q8_1, raw), _np_q8(raw, 36, 32, "f16"))
    raw = rng.integers(0, 256, size=(64, 292), dtype=np.uint8)
    raw[:, 0:4] = rng.standard_normal(64).astype(np.float32).view(np.uint8).reshape(64, 4)
    assert same_bits(c_dequant(lib, T.Q8_K, raw), _np_q8(raw, 292, 256, "f32"))


def test_dequantize_q1_0(lib):
    rng = np.random.default_rng(6)
    raw = rng.integers(0, 256, size=(64, 18), dtype=np.uint8)
    d = raw[:, :2].copy().view(np.float16).astype(np.float32)
    bits = np.unpackbits(raw[:, 2:], axis=1, bitorder="little")
    ref = np.where(bits == 1, d, -d).reshape(-1)
    assert same_bits(c_dequant(lib, T.Q1_0, raw), ref)


def gaussian_rows(rng, nrows, ncols):
    x = rng.standard_normal((nrows, ncols)).astype(np.float32)
    # per-row scales over several orders of magnitude, and some heavy-tailed rows
    x *= (10.0 ** rng.uniform(-4, 1, size=(nrows, 1))).astype(np.float32)
    x[::7] *= rng.standard_t(3, size=x[::7].shape).astype(np.float32)
    return x


def edge_rows(ncols):
    rows = [np.zeros(ncols, np.float32), np.full(ncols, 0.25, np.float32),
            np.full(ncols, -3.0, np.float32), np.linspace(-1, 1, ncols, dtype=np.float32),
            (np.arange(ncols, dtype=np.float32) % 17 - 8) * 0.5,   # exact ties
            np.full(ncols, 1e-30, np.float32), np.full(ncols, 3e4, np.float32)]
    r = np.zeros(ncols, np.float32)
    r[::5] = 1.0
    rows.append(r)
    return np.stack(rows)


QUANT_EXACT = [T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.TQ1_0, T.TQ2_0, T.MXFP4]


@pytest.mark.parametrize("t", QUANT_EXACT, ids=[t.name for t in QUANT_EXACT])
def test_quantize_bit_exact(lib, t):
    rng = np.random.default_rng(99 + int(t))
    x = np.concatenate([gaussian_rows(rng, 64, 512), edge_rows(512)])
    ref = gq.quantize(x, t).reshape(-1)
    got = c_quant(lib, t, x)
    if not np.array_equal(got, ref):
        bs, ts = gguf.GGML_QUANT_SIZES[t]
        bad = np.nonzero((got.reshape(-1, ts) != ref.reshape(-1, ts)).any(axis=1))[0]
        pytest.fail(f"{t.name}: {bad.size} of {got.size // ts} blocks differ, first {bad[0]}: "
                    f"smelt {got.reshape(-1, ts)[bad[0]].tobytes().hex()} gguf {ref.reshape(-1, ts)[bad[0]].tobytes().hex()}")


def test_quantize_f16_matches_numpy(lib):
    rng = np.random.default_rng(3)
    x = np.concatenate([gaussian_rows(rng, 16, 256).reshape(-1),
                        np.array([65504, 65520, 1e-8, 6e-8, -0.0, np.inf, -np.inf, 1e9], np.float32)])
    assert np.array_equal(c_quant(lib, T.F16, x), x.astype(np.float16).view(np.uint8))


# Round-trip RMSE bounds (relative to the RMS of the data) for the quantizers gguf-py
# lacks; the measured values are in docs/quant.md. They fail when a quantizer breaks
# (a wrong layout gives errors of order 1).
RMSE_BOUND = {T.Q2_K: 0.40, T.Q3_K: 0.20, T.Q4_K: 0.10, T.Q5_K: 0.05, T.Q6_K: 0.025,
              T.Q8_K: 0.01, T.Q8_1: 0.01, T.IQ4_NL: 0.10, T.IQ4_XS: 0.10, T.NVFP4: 0.12,
              T.Q1_0: 0.70}


@pytest.mark.parametrize("t", list(RMSE_BOUND), ids=[t.name for t in RMSE_BOUND])
def test_quantize_round_trip(lib, t):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    q = c_quant(lib, t, x)
    # decode with gguf-py where it can (an independent decoder), else with smelt's
    if t in (T.Q8_1, T.Q8_K, T.Q1_0):
        y = c_dequant(lib, t, q)
    else:
        y = gq.dequantize(q, t).reshape(-1)
    rel = float(np.sqrt(np.mean((y - x.reshape(-1)) ** 2)) / np.sqrt(np.mean(x ** 2)))
    print(f"RMSE {t.name}: {rel:.5f} of RMS (Gaussian)")
    assert rel < RMSE_BOUND[t], f"{t.name}: relative RMSE {rel}"
    # zero rows stay exactly zero
    z = c_quant(lib, t, np.zeros(1024, np.float32))
    assert np.all(c_dequant(lib, t, z) == 0)


def test_row_size_and_table(lib):
    for t, (bs, ts) in gguf.GGML_QUANT_SIZES.items():
        if t == T.Q8_1:
            ts = 36  # ggml's layout; gguf-py's table lists an older 40-byte one
        p = lib.qtype_get(int(t))
        assert p, t.name
        assert p.contents.name.decode() == t.name
        assert (p.contents.blck_size, p.contents.type_size) == (bs, ts), t.name
        assert lib.qtype_row_size(int(t), bs * 8) == ts * 8
        if bs > 1:
            assert lib.qtype_row_size(int(t), bs * 8 + 1) == 0
    for bad in (4, 5, 31, 32, 33, 36, 37, 38, 42, 1000):
        assert not lib.qtype_get(bad)


# ---------------------------------------------------------------------------------------
# smelt quantize (the command): end to end through the GGUF writer and the thread pool.

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMELT = os.environ.get("SMELT_BIN", os.path.join(ROOT, "build", "smelt"))


def smelt(*args, check=True):
    r = subprocess.run([SMELT, "quantize", *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory):
    if not os.path.exists(SMELT):
        pytest.skip(f"SKIP smelt binary not built ({SMELT})")
    p = tmp_path_factory.mktemp("q") / "tiny-f16.gguf"
    smelt("--random", "tiny", p, "F16", "--seed", 7)
    return p


def tensors(path):
    r = gguf.GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


def as_f32(t):
    return gq.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)


def test_random_tiny_matches_mkmodel_shapes(tiny_f16):
    r, ts = tensors(tiny_f16)
    # mkmodel.py "tiny": llama, 256, 2 layers, 4 heads, 2 kv, ff 512, vocab 1000, untied
    d, L, H, KV, F, V = 256, 2, 4, 2, 512, 1000
    hd = d // H
    spec = [("token_embd.weight", (d, V))]
    for i in range(L):
        p = f"blk.{i}."
        spec += [(p + "attn_norm.weight", (d,)), (p + "attn_q.weight", (d, H * hd)),
                 (p + "attn_k.weight", (d, KV * hd)), (p + "attn_v.weight", (d, KV * hd)),
                 (p + "attn_output.weight", (H * hd, d)), (p + "ffn_norm.weight", (d,)),
                 (p + "ffn_gate.weight", (d, F)), (p + "ffn_up.weight", (d, F)),
                 (p + "ffn_down.weight", (F, d))]
    spec += [("output_norm.weight", (d,)), ("output.weight", (d, V))]
    assert [t.name for t in r.tensors] == [n for n, _ in spec]
    for n, shape in spec:
        assert tuple(int(x) for x in ts[n].shape) == shape, n
        want = T.F32 if len(shape) == 1 else T.F16
        assert ts[n].tensor_type == want, n
    f = r.fields
    assert f["general.architecture"].contents() == "llama"
    assert f["llama.block_count"].contents() == 2
    assert f["llama.rope.dimension_count"].contents() == hd
    assert f["general.file_type"].contents() == 1
    assert len(f["tokenizer.ggml.tokens"].contents()) == V
    assert f["tokenizer.ggml.tokens"].contents()[:4] == ["<unk>", "<s>", "</s>", "<0x00>"]
    # weights: ~N(0, 0.02), norms ~1 + N(0, 0.05)
    w = as_f32(ts["blk.0.ffn_up.weight"])
    assert abs(float(w.std()) - 0.02) < 0.001 and abs(float(w.mean())) < 0.001
    nrm = as_f32(ts["blk.0.attn_norm.weight"])
    assert abs(float(nrm.mean()) - 1) < 0.02 and 0.03 < float(nrm.std()) < 0.07


def test_random_is_deterministic(tiny_f16, tmp_path):
    again = tmp_path / "again.gguf"
    smelt("--random", "tiny", again, "F16", "--seed", 7, "--threads", 1)
    assert open(again, "rb").read() == open(tiny_f16, "rb").read()
    other = tmp_path / "other.gguf"
    smelt("--random", "tiny", other, "F16", "--seed", 8)
    assert open(other, "rb").read() != open(tiny_f16, "rb").read()


@pytest.mark.parametrize("qt", ["Q8_0", "Q4_0", "Q5_1", "BF16", "TQ2_0"])
def test_quantize_file_bit_exact(tiny_f16, tmp_path, qt):
    out = tmp_path / f"tiny-{qt}.gguf"
    smelt(tiny_f16, out, qt, "--pure", "--threads", 2)
    _, src = tensors(tiny_f16)
    r, dst = tensors(out)
    t = T[qt]
    for name, s in src.items():
        d = dst[name]
        if len(s.shape) == 1:
            assert d.tensor_type == s.tensor_type and np.array_equal(d.data, s.data), name
            continue
        assert d.tensor_type == t, name
        ref = gq.quantize(as_f32(s).reshape(int(s.shape[1]), int(s.shape[0])), t)
        assert np.array_equal(np.asarray(d.data).reshape(-1).view(np.uint8), ref.reshape(-1).view(np.uint8)), name


def test_quantize_q4_k_m_mix_and_metadata(tiny_f16, tmp_path):
    out = tmp_path / "tiny-q4km.gguf"
    res = smelt(tiny_f16, out, "Q4_K_M")
    assert "[  21/21]" in res.stderr and "MB/s" in res.stderr
    rin, src = tensors(tiny_f16)
    r, dst = tensors(out)
    # tiny has 2 layers: use_more_bits(i, 2) = i < 0 || i >= 1 || i % 3 == 2 holds for
    # layer 1 only, so attn_v and ffn_down are Q6_K there and Q4_K on layer 0
    want = {"output.weight": T.Q6_K, "blk.0.attn_v.weight": T.Q4_K, "blk.1.attn_v.weight": T.Q6_K,
            "blk.0.ffn_down.weight": T.Q4_K, "blk.1.ffn_down.weight": T.Q6_K,
            "token_embd.weight": T.Q4_K, "blk.0.attn_q.weight": T.Q4_K,
            "blk.0.attn_norm.weight": T.F32}
    for n, t in want.items():
        assert dst[n].tensor_type == t, (n, dst[n].tensor_type.name)
    assert r.fields["general.file_type"].contents() == 15
    assert r.fields["general.quantization_version"].contents() == 2
    for k, v in rin.fields.items():
        if k.startswith("GGUF.") or k == "general.file_type":
            continue
        assert k in r.fields, k
        assert r.fields[k].contents() == v.contents(), k
    for n, s in src.items():
        x, y = as_f32(s), as_f32(dst[n])
        rel = np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x ** 2))
        assert rel < (1e-7 if len(s.shape) == 1 else 0.08), (n, rel)


def test_quantize_rejects_bad_input(tiny_f16, tmp_path):
    q = tmp_path / "q.gguf"
    smelt(tiny_f16, q, "Q4_0")
    r = smelt(q, tmp_path / "qq.gguf", "Q8_0", check=False)
    assert r.returncode == 1 and "reads F32, F16 or BF16" in r.stderr
    r = smelt(tiny_f16, tmp_path / "x.gguf", "IQ2_XXS", check=False)
    assert r.returncode == 1 and "importance matrix" in r.stderr
    r = smelt(tiny_f16, tmp_path / "x.gguf", "Q8_K", check=False)
    assert r.returncode == 1 and "activation format" in r.stderr
    r = smelt(tiny_f16, tmp_path / "x.gguf", "Q9_X", check=False)
    assert r.returncode == 1 and "unknown type" in r.stderr
    r = smelt("--random", "nope", tmp_path / "x.gguf", "F16", check=False)
    assert r.returncode == 2 and "presets" in r.stderr
    r = smelt(tmp_path / "missing.gguf", tmp_path / "x.gguf", "Q8_0", check=False)
    assert r.returncode == 1
    assert not (tmp_path / "x.gguf").exists()


def plan(*args):
    out = smelt(*args, "--dry-run").stdout.splitlines()
    rows = {}
    for line in out[:-1]:
        p = line.split()
        rows[p[0]] = (p[1], p[2], p[4])
    return rows, out[-1]


def test_llama3_8b_q4_k_m_plan():
    if not os.path.exists(SMELT):
        pytest.skip("SKIP smelt binary not built")
    rows, total = plan("--random", "llama3-8b", "/nonexistent.gguf", "Q4_K_M")
    from collections import Counter
    c = Counter(t for _, _, t in rows.values())
    # llama.cpp's Llama-3-8B Q4_K_M: 65 f32, 193 q4_K, 33 q6_K (16 attn_v, 16 ffn_down, output)
    assert c == {"F32": 65, "Q4_K": 193, "Q6_K": 33}, c
    assert rows["token_embd.weight"] == ("4096x128256", "F16", "Q4_K")
    assert rows["output.weight"][2] == "Q6_K"
    # 4.9 GB file: check the planned size is that of llama.cpp's 4.92 GB Q4_K_M
    mb = float(total.split("->")[1].split()[0])
    assert 4900 < mb < 4930, total


GEMMA = os.path.join(ROOT, "models", "gemma3-270m-q4_k_m.gguf")
QWEN = os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf")


def gguf_index(path):
    """({name: (shape "AxB", type name, offset)}, data start) from a GGUF header. A
    minimal parser: gguf-py's GGUFReader takes ~20 s on a 262k-token vocab, this well
    under a second. Assumes the default alignment (32) unless general.alignment is set."""
    import struct
    with open(path, "rb") as f:
        buf = f.read(64 << 20)
    pos = 0

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(vt):
        nonlocal pos
        if vt == 8:
            n = rd("Q")
            pos += n
        elif vt == 9:
            et, n = rd("I"), rd("Q")
            if et in sizes:
                pos += sizes[et] * n
            else:
                for _ in range(n):
                    skip(et)
        else:
            pos += sizes[vt]

    assert rd("I") == 0x46554747
    rd("I")
    n_t, n_kv = rd("Q"), rd("Q")
    align = 32
    for _ in range(n_kv):
        n = rd("Q")
        key = buf[pos:pos + n]
        pos += n
        vt = rd("I")
        if key == b"general.alignment" and vt == 4:
            align = rd("I")
        else:
            skip(vt)
    out = {}
    for _ in range(n_t):
        ln = rd("Q")
        name = buf[pos:pos + ln].decode()
        pos += ln
        nd = rd("I")
        ne = [rd("Q") for _ in range(nd)]
        t = rd("I")
        off = rd("Q")
        out[name] = ("x".join(map(str, ne)), T(t).name, off)
    return out, (pos + align - 1) // align * align


def tensor_types(path):
    return {n: (shape, t) for n, (shape, t, _) in gguf_index(path)[0].items()}


def test_mix_matches_llama_quantize_gemma3():
    """A real llama.cpp Q4_K_M file: the plan for its shapes must give every tensor's type."""
    if not os.path.exists(GEMMA):
        pytest.skip(f"SKIP {GEMMA} absent (make models)")
    ts = tensor_types(GEMMA)
    rows, _ = plan(GEMMA, "/nonexistent.gguf", "Q4_K_M")
    bad = {n: (t, rows[n][2]) for n, (_, t) in ts.items() if t != rows[n][2]}
    assert not bad


def test_mix_matches_llama_quantize_qwen2():
    """This file was made by an older llama.cpp that counted layers in string order
    (blk.0, blk.1, blk.10, ...); the current one counts by layer number. Everything but
    the count-dependent attn_v / ffn_down choice must match, and those must match the
    same rule applied in string order."""
    if not os.path.exists(QWEN):
        pytest.skip(f"SKIP {QWEN} absent (make models)")
    ts = {n: t for n, (_, t) in tensor_types(QWEN).items()}
    rows, _ = plan(QWEN, "/nonexistent.gguf", "Q4_K_M")
    n = 24
    more = lambda i: i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # noqa: E731
    for kind, hi, lo in (("attn_v.weight", "Q8_0", "Q5_0"), ("ffn_down.weight", "Q6_K", "Q4_K")):
        names = sorted(k for k in ts if k.endswith(kind))
        for i, nm in enumerate(names):
            assert ts[nm] == (hi if more(i) else lo), nm
        by_layer = sorted(names, key=lambda s: int(s.split(".")[1]))
        for i, nm in enumerate(by_layer):
            assert rows[nm][2] == (hi if more(i) else lo), nm
    for nm, t in ts.items():
        if nm.endswith("attn_v.weight") or nm.endswith("ffn_down.weight"):
            continue
        assert t == rows[nm][2], nm


def test_qwen3_30b_a3b_q4_k_m_plan():
    """The MoE benchmark preset: Qwen3-30B-A3B's shapes (3-D expert tensors, an F32 router)
    and llama.cpp's Q4_K_M types for them (ffn_down_exps more bits by layer number)."""
    if not os.path.exists(SMELT):
        pytest.skip("SKIP smelt binary not built")
    rows, total = plan("--random", "qwen3-30b-a3b", "/nonexistent.gguf", "Q4_K_M")
    from collections import Counter
    c = Counter(t for _, _, t in rows.values())
    # 48 layers x (attn_norm, q/k norms, ffn_norm, router) + output_norm F32; attn_v and
    # ffn_down_exps Q6_K on the 24 more-bits layers, and output; the rest Q4_K
    assert c == {"F32": 241, "Q4_K": 289, "Q6_K": 49}, c
    assert rows["blk.0.ffn_gate_inp.weight"] == ("2048x128", "F32", "F32")
    assert rows["blk.7.ffn_gate_exps.weight"] == ("2048x768x128", "F16", "Q4_K")
    assert rows["blk.7.ffn_up_exps.weight"] == ("2048x768x128", "F16", "Q4_K")
    assert rows["blk.7.ffn_down_exps.weight"] == ("768x2048x128", "F16", "Q4_K")
    assert rows["blk.8.ffn_down_exps.weight"][2] == "Q6_K"  # (8 - 6) % 3 == 2
    assert rows["blk.0.attn_q.weight"][0] == "2048x4096"  # 32 heads of 128
    assert rows["blk.0.attn_k.weight"][0] == "2048x512"   # 4 KV heads
    assert rows["token_embd.weight"] == ("2048x151936", "F16", "Q4_K")
    assert rows["output.weight"][2] == "Q6_K"
    # llama.cpp's Qwen3-30B-A3B Q4_K_M is about 18.6 GB
    mb = float(total.split("->")[1].split()[0])
    assert 18400 < mb < 18700, total


def assert_bench_runs(path, batch=1):
    """smelt bench runs a prefill and a decode test on the file (CPU), and a batched decode
    of `batch` sequences when batch > 1."""
    more = ["-B", str(batch)] if batch > 1 else []
    b = subprocess.run([SMELT, "bench", "-m", str(path), "--backend", "cpu", "-p", "8", "-n", "4",
                        "-r", "1", "-o", "json", *more], capture_output=True, text=True,
                       timeout=120)
    assert b.returncode == 0, b.stderr
    want = [(8, 0, 1), (0, 4, 1)] + ([(0, 4, batch)] if batch > 1 else [])
    assert [(x["n_prompt"], x["n_gen"], x["n_seqs"]) for x in json.loads(b.stdout)] == want


def test_random_tiny_moe_runs(tmp_path):
    """A random MoE file as the preset writes it loads and runs (smelt bench on the CPU)."""
    out = tmp_path / "tiny-moe.gguf"
    smelt("--random", "tiny-moe", out, "Q4_K_M")
    r, ts = tensors(out)
    assert tuple(int(x) for x in ts["blk.1.ffn_down_exps.weight"].shape) == (256, 256, 16)
    assert ts["blk.1.ffn_gate_inp.weight"].tensor_type == T.F32
    assert r.fields["qwen3moe.expert_used_count"].contents() == 4
    assert_bench_runs(out)


def test_gpt_oss_20b_mxfp4_plan():
    """gpt-oss-20b's preset, quantized as MXFP4_MOE, has the layout of the MXFP4 file
    llama.cpp's converter writes (ggml-org/gpt-oss-20b-GGUF: 459 tensors, 289 F32, the 72
    expert tensors MXFP4, 12.1 GB): every other matrix Q8_0, biases, sinks and the router
    F32."""
    if not os.path.exists(SMELT):
        pytest.skip("SKIP smelt binary not built")
    rows, total = plan("--random", "gpt-oss-20b", "/nonexistent.gguf", "MXFP4_MOE")
    from collections import Counter
    c = Counter(t for _, _, t in rows.values())
    # 24 layers x (attn_norm, q/k/v/o biases, sinks, post_attention_norm, router weight and
    # bias, 3 expert biases) + output_norm F32; 24 x (q, k, v, o) + token_embd + output Q8_0
    assert c == {"F32": 289, "MXFP4": 72, "Q8_0": 98}, c
    assert rows["blk.3.ffn_gate_exps.weight"] == ("2880x2880x32", "F16", "MXFP4")
    assert rows["blk.3.ffn_down_exps.weight"] == ("2880x2880x32", "F16", "MXFP4")
    assert rows["blk.3.ffn_up_exps.bias"] == ("2880x32", "F32", "F32")
    assert rows["blk.3.ffn_gate_inp.weight"] == ("2880x32", "F32", "F32")
    assert rows["blk.3.attn_sinks.weight"] == ("64", "F32", "F32")
    assert rows["blk.3.attn_q.weight"] == ("2880x4096", "F16", "Q8_0")  # 64 heads of 64
    assert rows["blk.3.attn_k.weight"][0] == "2880x512"                 # 8 KV heads
    assert rows["blk.3.post_attention_norm.weight"][2] == "F32"
    assert "blk.3.ffn_norm.weight" not in rows
    assert rows["token_embd.weight"] == ("2880x201088", "F16", "Q8_0")
    assert rows["output.weight"][2] == "Q8_0"
    mb = float(total.split("->")[1].split()[0])
    assert 12000 < mb < 12200, total


def test_random_tiny_gpt_oss_runs(tmp_path):
    """A random gpt-oss file as the preset writes it loads and runs (smelt bench on the CPU),
    with gpt-oss's keys and tensors."""
    out = tmp_path / "tiny-gpt-oss.gguf"
    smelt("--random", "tiny-gpt-oss", out, "MXFP4_MOE")
    r, ts = tensors(out)
    assert ts["blk.1.ffn_down_exps.weight"].tensor_type == T.MXFP4
    assert tuple(int(x) for x in ts["blk.1.ffn_down_exps.bias"].shape) == (256, 16)
    assert ts["blk.0.attn_sinks.weight"].tensor_type == T.F32
    assert r.fields["gpt-oss.attention.sliding_window"].contents() == 128
    assert r.fields["gpt-oss.rope.scaling.type"].contents() == "yarn"
    assert_bench_runs(out)


def test_qwen35_35b_a3b_q4_k_m_plan():
    """The hybrid MoE benchmark preset: Qwen3.5-35B-A3B's (and Qwen3.6-35B-A3B's) shapes
    (30 DeltaNet and 10 attention layers, 256 experts of 512 with a shared expert of 512,
    one MTP layer) and llama.cpp's Q4_K_M types for them."""
    if not os.path.exists(SMELT):
        pytest.skip("SKIP smelt binary not built")
    rows, total = plan("--random", "qwen3.5-35b-a3b", "/nonexistent.gguf", "Q4_K_M")
    from collections import Counter
    c = Counter(t for _, _, t in rows.values())
    # F32: norms, routers, ssm_a / dt_bias and the 30 conv kernels (F32 as the converter
    # writes them: llama.cpp's ssm_conv takes F32 only; never quantized); Q6_K: attn_qkv /
    # attn_v and both ffn_down of the more-bits layers, and output
    assert c == {"F32": 310, "Q4_K": 379, "Q6_K": 64}, c
    assert rows["blk.0.attn_qkv.weight"] == ("2048x8192", "F16", "Q6_K")  # 16 x 2 x 128 + 32 x 128
    assert rows["blk.0.ssm_out.weight"] == ("4096x2048", "F16", "Q4_K")
    assert rows["blk.0.ssm_conv1d.weight"] == ("4x8192", "F32", "F32")
    assert rows["blk.40.nextn.shared_head_norm.weight"] == ("2048", "F32", "F32")
    assert rows["blk.3.attn_q.weight"] == ("2048x8192", "F16", "Q4_K")  # 16 heads x [q | gate] x 256
    assert rows["blk.3.attn_k.weight"] == ("2048x512", "F16", "Q4_K")   # 2 KV heads
    assert rows["blk.1.ffn_gate_inp.weight"] == ("2048x256", "F32", "F32")
    assert rows["blk.1.ffn_gate_exps.weight"] == ("2048x512x256", "F16", "Q4_K")
    assert rows["blk.6.ffn_down_exps.weight"] == ("512x2048x256", "F16", "Q4_K")
    assert rows["blk.7.ffn_down_exps.weight"][2] == "Q6_K"  # (7 - 5) % 3 == 2
    assert rows["blk.1.ffn_gate_inp_shexp.weight"] == ("2048x1", "F32", "F32")  # a vector
    assert rows["blk.1.ffn_up_shexp.weight"] == ("2048x512", "F16", "Q4_K")
    assert rows["blk.40.nextn.eh_proj.weight"] == ("4096x2048", "F16", "Q4_K")
    assert rows["output.weight"] == ("2048x248320", "F16", "Q6_K")
    # 21,700 MB; without the MTP layer (547 MB) 21,154 MB: llama.cpp's Q4_K_M of
    # Qwen3.5-35B-A3B, converted without it, is 21.2 GB
    mb = float(total.split("->")[1].split()[0])
    assert 21600 < mb < 21800, total


def test_random_tiny_qwen35moe_runs(tmp_path):
    """The hybrid MoE preset's layout at a tiny size loads and runs (smelt bench on the
    CPU, one and two sequences)."""
    out = tmp_path / "tiny-qwen35moe.gguf"
    smelt("--random", "tiny-qwen35moe", out, "Q4_K_M")
    r, ts = tensors(out)
    assert r.fields["general.architecture"].contents() == "qwen35moe"
    assert "qwen35moe.feed_forward_length" not in r.fields
    assert r.fields["qwen35moe.expert_shared_feed_forward_length"].contents() == 256
    assert tuple(int(x) for x in ts["blk.2.ffn_down_exps.weight"].shape) == (256, 256, 16)
    assert ts["blk.2.ffn_gate_inp_shexp.weight"].tensor_type == T.F32
    assert "blk.3.attn_q.weight" in ts and "blk.3.ssm_a" not in ts  # layer 3: attention
    assert_bench_runs(out, batch=2)


def test_random_gemma3_270m_matches_real_file():
    if not os.path.exists(GEMMA):
        pytest.skip(f"SKIP {GEMMA} absent (make models)")
    ts = tensor_types(GEMMA)
    rows, _ = plan("--random", "gemma3-270m", "/nonexistent.gguf", "Q4_K_M")
    assert set(rows) == set(ts)
    for n, (shape, t) in ts.items():
        assert rows[n][0] == shape, n
        assert rows[n][2] == t, n


REAL_BOUND = {T.Q4_0: 0.13, T.Q4_1: 0.12, T.Q5_0: 0.07, T.Q5_1: 0.06, T.Q8_0: 0.01,
              T.Q2_K: 0.40, T.Q3_K: 0.20, T.Q4_K: 0.10, T.Q5_K: 0.05, T.Q6_K: 0.03,
              T.IQ4_NL: 0.10, T.IQ4_XS: 0.10, T.MXFP4: 0.16, T.NVFP4: 0.13, T.BF16: 0.004}


def test_rmse_real_weights(lib):
    """Round-trip error on real weight distributions. The real models here are Q4_K_M
    files; their Q8_0 tensors (Gemma's tied embedding, Qwen's output matrix) are the
    closest to the original weights, so 512k values of each are decoded and re-quantized.
    Run with -s to print the table in docs/quant.md."""
    samples = []
    for path, name in ((GEMMA, "token_embd.weight"), (QWEN, "output.weight")):
        if os.path.exists(path):
            samples.append((os.path.basename(path).split("-")[0], path, name))
    if not samples:
        pytest.skip("SKIP no real model under models/ (make models)")
    for short, path, name in samples:
        idx, start = gguf_index(path)
        _, tname, off = idx[name]
        assert tname == "Q8_0"
        with open(path, "rb") as f:
            f.seek(start + off)
            raw = np.frombuffer(f.read(34 * (1 << 19) // 32), dtype=np.uint8)
        x = gq.dequantize(raw, T.Q8_0).reshape(-1).astype(np.float32)
        rms = float(np.sqrt(np.mean(x ** 2)))
        line = []
        for qt, bound in REAL_BOUND.items():
            y = c_dequant(lib, qt, c_quant(lib, qt, x))
            rel = float(np.sqrt(np.mean((y - x) ** 2)) / rms)
            line.append(f"{qt.name} {rel:.4f}")
            assert rel < bound, (short, qt.name, rel)
        print(f"real {short} {name}: " + ", ".join(line))
