"""The grammar engine's JSON Schema compiler against Python's jsonschema, over the corpus of
tests/data/schemas/ (tool definitions, structured-output models and API objects; see its
README). The C side is called through ctypes on libsmelt.so (src/grammar/gram.h).

For every schema:
- it compiles (the corpus holds no refused feature; refusals are test_grammar_schema.c's);
- random walks of the matcher over a byte vocabulary (each step a random allowed byte, biased
  toward the bytes that close strings and containers; end-of-generation when allowed) give
  documents that parse and validate with the schema's jsonschema validator and its format
  checker;
- mutants of those documents (truncated, a value replaced by another type, a property
  removed or added, an item added or removed, a string lengthened) that jsonschema rejects
  are refused by the grammar;
- every fourth schema also gets a walk over the Qwen2.5 vocabulary (multi-byte tokens that
  cross the grammar's structure) when the test model is present.
"""
import copy
import ctypes as C
import glob
import json
import os
import random

import numpy as np
import pytest
from conftest import libsmelt_path

jsonschema = pytest.importorskip("jsonschema")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = sorted(glob.glob(os.path.join(ROOT, "tests", "data", "schemas", "*.json")))
MODEL = os.path.join(ROOT, "models", "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf")
GRAM_JSON_SCHEMA = 2
WALKS = 5
STEPS = 6000


class Err(C.Structure):
    _fields_ = [("code", C.c_int), ("msg", C.c_char * 512)]


VP = C.c_void_p


@pytest.fixture(scope="module")
def lib():
    so = C.CDLL(libsmelt_path())
    sig = {
        "gram_vocab_new_raw": (C.c_int, [C.POINTER(VP), C.c_int32, C.POINTER(C.c_char_p),
                                         C.POINTER(C.c_size_t), C.POINTER(C.c_int32), C.c_int32,
                                         C.POINTER(Err)]),
        "gram_vocab_new": (C.c_int, [C.POINTER(VP), VP, C.POINTER(Err)]),
        "gram_vocab_free": (None, [VP]),
        "gram_compile": (C.c_int, [C.POINTER(VP), VP, C.c_int, C.c_char_p, C.c_size_t,
                                   C.POINTER(Err)]),
        "gram_unref": (None, [VP]),
        "gram_matcher_new": (C.c_int, [C.POINTER(VP), VP, C.c_int32, C.POINTER(Err)]),
        "gram_matcher_free": (None, [VP]),
        "gram_matcher_fill_mask": (C.c_int, [VP, VP, C.POINTER(Err)]),
        "gram_matcher_accept": (C.c_int, [VP, C.c_int32, C.POINTER(Err)]),
        "gram_matcher_accept_bytes": (C.c_int, [VP, C.c_char_p, C.c_size_t, C.POINTER(Err)]),
        "gram_matcher_can_end": (C.c_bool, [VP]),
        "gguf_open": (C.c_int, [C.POINTER(VP), C.c_char_p, C.POINTER(Err)]),
        "gguf_close": (None, [VP]),
        "tok_new_from_gguf": (C.c_int, [C.POINTER(VP), VP, C.POINTER(Err)]),
        "tok_free": (None, [VP]),
        "tok_piece": (C.c_void_p, [VP, C.c_int32, C.POINTER(C.c_size_t)]),
        "tok_n_vocab": (C.c_int32, [VP]),
        "tok_eog_ids": (C.POINTER(C.c_int32), [VP, C.POINTER(C.c_size_t)]),
    }
    for name, (res, args) in sig.items():
        f = getattr(so, name)
        f.restype, f.argtypes = res, args
    return so


class Vocab:
    """A gram_vocab with each token's bytes, the end-of-generation ids and the "structural"
    tokens (holding a byte that closes or separates: the walks prefer them, to finish)."""

    def __init__(self, lib, handle, pieces, eog):
        self.lib, self.h, self.pieces, self.eog = lib, handle, pieces, eog
        self.n = len(pieces)
        self.words = (self.n + 31) // 32
        self.structural = np.array([p is not None and any(c in p for c in b'"}],:')
                                    for p in pieces])

    def __del__(self):
        self.lib.gram_vocab_free(self.h)


@pytest.fixture(scope="module")
def byte_vocab(lib):
    pieces = [bytes([i]) for i in range(256)] + [None]
    arr = (C.c_char_p * 257)(*pieces)
    lens = (C.c_size_t * 257)(*([1] * 256 + [0]))
    eog = (C.c_int32 * 1)(256)
    h, e = VP(), Err()
    assert lib.gram_vocab_new_raw(C.byref(h), 257, arr, lens, eog, 1, C.byref(e)) == 0, e.msg
    return Vocab(lib, h, pieces, {256})


@pytest.fixture(scope="module")
def qwen_vocab(lib):
    if not os.path.exists(MODEL):
        pytest.skip("SKIP model absent: %s (make models)" % MODEL)
    g, t, h, e = VP(), VP(), VP(), Err()
    assert lib.gguf_open(C.byref(g), MODEL.encode(), C.byref(e)) == 0, e.msg
    assert lib.tok_new_from_gguf(C.byref(t), g, C.byref(e)) == 0, e.msg
    lib.gguf_close(g)
    assert lib.gram_vocab_new(C.byref(h), t, C.byref(e)) == 0, e.msg
    n = lib.tok_n_vocab(t)
    pieces = []
    for i in range(n):
        ln = C.c_size_t()
        p = lib.tok_piece(t, i, C.byref(ln))
        pieces.append(C.string_at(p, ln.value) if p else b"")
    ne = C.c_size_t()
    ids = lib.tok_eog_ids(t, C.byref(ne))
    v = Vocab(lib, h, pieces, {ids[i] for i in range(ne.value)})
    lib.tok_free(t)  # the gram_vocab copied what it needs
    return v


class Grammar:
    def __init__(self, lib, vocab, schema_text):
        self.lib, self.v = lib, vocab
        self.h, e = VP(), Err()
        data = schema_text.encode()
        rc = lib.gram_compile(C.byref(self.h), vocab.h, GRAM_JSON_SCHEMA, data, len(data), C.byref(e))
        self.error = None if rc == 0 else e.msg.decode()

    def __del__(self):
        if self.error is None:
            self.lib.gram_unref(self.h)

    def matcher(self):
        m, e = VP(), Err()
        assert self.lib.gram_matcher_new(C.byref(m), self.h, 0, C.byref(e)) == 0, e.msg
        return m

    def accepts(self, text):
        m, e = self.matcher(), Err()
        b = text.encode()
        ok = self.lib.gram_matcher_accept_bytes(m, b, len(b), C.byref(e)) == 0 and \
            self.lib.gram_matcher_can_end(m)
        self.lib.gram_matcher_free(m)
        return ok

    def walk(self, rng):
        """A random document of the grammar, as bytes (None when it did not end in STEPS)."""
        lib, v = self.lib, self.v
        m, e = self.matcher(), Err()
        mask = np.zeros(v.words, dtype=np.uint32)
        out = bytearray()
        try:
            for _ in range(STEPS):
                assert lib.gram_matcher_fill_mask(m, mask.ctypes.data, C.byref(e)) == 0, e.msg
                bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:v.n]
                allowed = np.nonzero(bits)[0]
                can_end = lib.gram_matcher_can_end(m)
                assert len(allowed) or can_end, "no token allowed and the grammar is not complete"
                if can_end and (len(allowed) == 0 or rng.random() < 0.4):
                    return bytes(out)
                allowed = allowed[~np.isin(allowed, list(v.eog))]
                if len(allowed) == 0:
                    return bytes(out) if can_end else None
                pref = allowed[v.structural[allowed]]
                t = int(rng.choice(pref) if len(pref) and rng.random() < 0.6 else rng.choice(allowed))
                assert lib.gram_matcher_accept(m, t, C.byref(e)) == 0, \
                    "token %d in the mask was refused: %s" % (t, e.msg)
                out += v.pieces[t]
            return None
        finally:
            lib.gram_matcher_free(m)


def validator_of(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def _nodes(doc, path=()):
    yield path
    if isinstance(doc, dict):
        for k, x in doc.items():
            yield from _nodes(x, path + (k,))
    elif isinstance(doc, list):
        for i, x in enumerate(doc):
            yield from _nodes(x, path + (i,))


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def _set(doc, path, value):
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def mutants(text, rng):
    """Documents near text (some valid, most not)."""
    out = [text[:-1], text[: rng.randrange(1, max(2, len(text)))], text + "x", "", text + text]
    doc = json.loads(text)
    paths = list(_nodes(doc))
    for _ in range(12):
        p = paths[rng.randrange(len(paths))]
        d = copy.deepcopy(doc)
        x = _get(d, p)
        r = rng.randrange(6)
        if r == 0:
            d = _set(d, p, rng.choice([12345, -7, 1.5, "zz", None, True, {}, [], {"k": 1}, [1, "a"]]))
        elif r == 1 and isinstance(x, dict):
            if x and rng.random() < 0.5:
                del x[rng.choice(list(x))]
            else:
                x["zz_extra"] = rng.choice([1, "s", None])
        elif r == 2 and isinstance(x, list):
            if x and rng.random() < 0.5:
                x.pop(rng.randrange(len(x)))
            else:
                x.append(copy.deepcopy(x[0]) if x and rng.random() < 0.5 else None)
        elif r == 3 and isinstance(x, str):
            d = _set(d, p, x + rng.choice(["x" * 300, "-", "Z9", "é", "\n"]))
        elif r == 4 and isinstance(x, (int, float)) and not isinstance(x, bool):
            d = _set(d, p, x + rng.choice([1, -1, 1000000, 0.5, -0.5]))
        else:
            d = _set(d, p, rng.choice(["", 0, False, []]))
        out.append(json.dumps(d, ensure_ascii=False))
    return out


def check_schema(lib, vocab, path, seed, walks, mutate=True):
    with open(path) as f:
        text = f.read()
    schema = json.loads(text)
    g = Grammar(lib, vocab, text)
    assert g.error is None, "%s: refused: %s" % (os.path.basename(path), g.error)
    val = validator_of(schema)
    rng = random.Random(seed)
    docs = []
    for w in range(walks):
        doc = g.walk(rng)
        if doc is None:
            continue
        s = doc.decode("utf-8")  # the grammar emits valid UTF-8 only
        inst = json.loads(s)
        errors = list(val.iter_errors(inst))
        assert not errors, "%s: walk %d produced an invalid document:\n%s\n%s" % (
            os.path.basename(path), w, s, errors[0].message)
        docs.append(s)
    assert docs, "%s: no walk ended within %d steps" % (os.path.basename(path), STEPS)
    refused = 0
    if mutate:
        for s in docs[:3]:
            for mt in mutants(s, rng):
                try:
                    ok = val.is_valid(json.loads(mt))
                except ValueError:
                    ok = False
                if not ok:
                    assert not g.accepts(mt), "%s: the grammar takes an invalid document:\n%s" % (
                        os.path.basename(path), mt)
                    refused += 1
    return len(docs), refused


def test_corpus_size():
    assert len(CORPUS) >= 200, "the corpus has %d schemas (at least 200)" % len(CORPUS)


def test_format_checks_active():
    """The formats the compiler supports are checked by the validator (else the corpus
    could not fail on them): date-time and time need rfc3339-validator."""
    pytest.importorskip("rfc3339_validator")
    fc = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for f, bad in [("date", "2023-02-29"), ("date-time", "2024-01-01 00:00"), ("time", "25:00:00Z"),
                   ("uuid", "x"), ("email", "x"), ("ipv4", "01.2.3.4")]:
        assert not fc.conforms(bad, f), "the %s checker is inactive" % f


@pytest.mark.parametrize("path", CORPUS, ids=[os.path.basename(p)[:-5] for p in CORPUS])
def test_schema_bytes(lib, byte_vocab, path):
    seed = sum(os.path.basename(path).encode())
    n, refused = check_schema(lib, byte_vocab, path, seed, WALKS)
    assert n >= 1


@pytest.mark.parametrize("path", CORPUS[::4], ids=[os.path.basename(p)[:-5] for p in CORPUS[::4]])
def test_schema_qwen_tokens(lib, qwen_vocab, path):
    seed = 7 + sum(os.path.basename(path).encode())
    check_schema(lib, qwen_vocab, path, seed, 1, mutate=False)
