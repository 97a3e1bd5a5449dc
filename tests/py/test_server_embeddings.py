"""/v1/embeddings through `smelt serve`, with the official `openai` SDK's
client.embeddings.create and raw HTTP, on the tiny embedding fixtures of
tests/data/ref-embed (scripts/make-embed-fixtures.py): a BERT encoder (WordPiece, mean
pooling) whose references are sentence-transformers' own embeddings of texts, and a Qwen3
decoder (last-token pooling) whose references are transformers' on token ids.

- Every input of a request comes back in order, L2-normalized, within cosine 0.9999 of the
  reference; usage counts HF's tokens; base64 (the SDK's default) and float carry the same
  float32 values; dimensions cuts and normalizes again.
- Requests are refused in OpenAI's error shape naming the field: unknown fields, bad
  input shapes, token ids out of range, an input past the model's limit, dimensions past
  the model's size.
- An embedding model refuses the generation routes (chat, completions, Anthropic
  Messages) and a generative model refuses /v1/embeddings, each saying why; both served by
  one server, each request routed to its model.
One server per model, module-scoped."""
import base64
import json
import os
import struct

import pytest

from smelt_server import ROOT, SMELT, Server

openai = pytest.importorskip("openai")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.skipif(not os.path.exists(SMELT), reason=f"no smelt binary at {SMELT}")

DIR = os.path.join(ROOT, "tests", "data", "ref-embed")
MANIFEST = json.load(open(os.path.join(DIR, "manifest.json")))
MODELS = {m["name"]: m for m in MANIFEST["models"]}


def cosine(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def bert():
    s = Server(os.path.join(DIR, "bert-f16.gguf"), "--served-model-name", "minibert", "--quiet")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def qwen():
    s = Server(os.path.join(DIR, "qwen3emb-f32.gguf"), "--quiet")
    yield s
    assert s.stop() == 0, s.log()


def client(s):
    return openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=60, max_retries=0)


def test_sdk_texts_match_sentence_transformers(bert):
    ref = MODELS["bert"]["inputs"]
    texts = [x["text"] for x in ref]
    c = client(bert)
    r = c.embeddings.create(model="minibert", input=texts)  # the SDK asks for base64
    assert r.object == "list" and r.model == "minibert"
    assert [d.index for d in r.data] == list(range(len(texts)))
    for d, x in zip(r.data, ref):
        assert d.object == "embedding" and len(d.embedding) == MODELS["bert"]["n_embd"]
        assert cosine(d.embedding, x["embedding"]) >= 0.9999, x["text"]
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-5
    n_tokens = sum(len(x["ids"]) for x in ref)  # HF's WordPiece ids, [CLS] and [SEP] included
    assert r.usage.prompt_tokens == n_tokens and r.usage.total_tokens == n_tokens
    # one string, and floats on the wire
    one = c.embeddings.create(model="minibert", input=texts[1], encoding_format="float")
    assert len(one.data) == 1
    assert np.array_equal(np.float32(one.data[0].embedding), np.float32(r.data[1].embedding))


def test_base64_is_the_float32_values(bert):
    body = {"input": ["Hello, world!", "naïve café"]}
    st, f = bert.post("/v1/embeddings", body)
    assert st == 200, f
    st, b = bert.post("/v1/embeddings", dict(body, encoding_format="base64"))
    assert st == 200, b
    for x, y in zip(f["data"], b["data"]):
        raw = base64.b64decode(y["embedding"])
        got = struct.unpack("<%df" % (len(raw) // 4), raw)
        assert np.array_equal(np.float32(got), np.float32(x["embedding"]))


def test_token_ids_and_dimensions(qwen):
    ref = MODELS["qwen3emb"]["inputs"]
    st, j = qwen.post("/v1/embeddings", {"input": [x["ids"] for x in ref]})
    assert st == 200, j
    for d, x in zip(j["data"], ref):
        assert cosine(d["embedding"], x["embedding"]) >= 0.9999
    assert j["usage"]["prompt_tokens"] == sum(len(x["ids"]) for x in ref)
    # one list of ids is one input
    st, one = qwen.post("/v1/embeddings", {"input": ref[2]["ids"]})
    assert st == 200 and len(one["data"]) == 1
    assert cosine(one["data"][0]["embedding"], ref[2]["embedding"]) >= 0.9999
    # dimensions: the first 16 values, normalized again (the SDK's parameter)
    r = client(qwen).embeddings.create(model="qwen3emb-f32", input=[ref[1]["ids"]],
                                       dimensions=16)
    want = np.asarray(ref[1]["embedding"][:16])
    assert len(r.data[0].embedding) == 16
    assert cosine(r.data[0].embedding, want) >= 0.9999
    assert abs(np.linalg.norm(r.data[0].embedding) - 1) < 1e-5


@pytest.mark.parametrize("body,param,words", [
    ({}, "input", "required"),
    ({"input": []}, "input", "empty list"),
    ({"input": 7}, "input", "must be a string"),
    ({"input": ["a", 7]}, "input", "input 1"),
    ({"input": [[1, 2], []]}, "input", "input 1 is empty"),
    ({"input": [[1, 99999]]}, "input", "not a token id"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "base64"),
    ({"input": "a", "dimensions": 0}, "dimensions", None),
    ({"input": "a", "dimensions": 33}, "dimensions", "32"),
    ({"input": "a", "stream": True}, "stream", "Unrecognized"),
    ({"input": "a", "temperature": 0.5}, "temperature", "Unrecognized"),
    ({"input": "a", "model": "nope"}, "model", "does not exist"),
    ({"input": " ".join(["fox"] * 80)}, "input", "maximum input length is 64"),
])
def test_refusals_name_the_field(bert, body, param, words):
    st, j = bert.post("/v1/embeddings", body)
    assert st in (400, 404), (st, j)
    err = j["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    if words:
        assert words in err["message"], err


def test_embedding_model_refuses_generation(bert):
    c = client(bert)
    with pytest.raises(openai.BadRequestError) as ex:
        c.chat.completions.create(model="minibert", messages=[{"role": "user", "content": "hi"}])
    assert "embedding model" in str(ex.value) and "/v1/embeddings" in str(ex.value)
    st, j = bert.post("/v1/completions", {"prompt": "hi"})
    assert st == 400 and j["error"]["code"] == "model_not_supported", j
    # Anthropic Messages: the same refusal in Anthropic's error shape
    st, j = bert.post("/v1/messages", {"model": "minibert", "max_tokens": 4,
                                       "messages": [{"role": "user", "content": "hi"}]})
    assert st == 400 and j["type"] == "error" and "embedding model" in j["error"]["message"], j
    # /tokenize serves it (WordPiece ids, [CLS] ... [SEP])
    st, j = bert.post("/tokenize", {"content": MODELS["bert"]["inputs"][0]["text"]})
    assert st == 200 and j["tokens"] == MODELS["bert"]["inputs"][0]["ids"], j


def test_embedding_and_generative_models_in_one_server():
    """An embedding model and a generative one served together: each route finds its model
    by the request's "model" (the second loads on its first request), and each refuses the
    other's route."""
    s = Server(os.path.join(DIR, "bert-f16.gguf"),
               os.path.join(ROOT, "tests", "data", "ref", "qwen3-f32.gguf"), "--quiet")
    try:
        c = client(s)
        ref = MODELS["bert"]["inputs"]
        r = c.embeddings.create(model="bert-f16", input=[x["text"] for x in ref])
        assert min(cosine(d.embedding, x["embedding"]) for d, x in zip(r.data, ref)) >= 0.9999
        assert r.model == "bert-f16"
        # no "model": the first (default) model, here the embedding one
        st, j = s.post("/v1/embeddings", {"input": ref[0]["text"]})
        assert st == 200 and j["model"] == "bert-f16", j
        st, j = s.post("/v1/completions", {"model": "qwen3-f32", "prompt": [1, 2, 3],
                                           "max_tokens": 3, "temperature": 0})
        assert st == 200 and j["model"] == "qwen3-f32" and j["usage"]["completion_tokens"] == 3, j
        with pytest.raises(openai.BadRequestError) as ex:
            c.embeddings.create(model="qwen3-f32", input="hello")
        assert "'qwen3-f32' is not an embedding model" in str(ex.value)
        assert ex.value.body["param"] == "model" and ex.value.body["code"] == "model_not_supported"
        with pytest.raises(openai.BadRequestError) as ex:
            c.chat.completions.create(model="bert-f16",
                                      messages=[{"role": "user", "content": "hi"}])
        assert "'bert-f16' is an embedding model" in str(ex.value)
        # the embedding model still answers after the generative one ran
        st, j = s.post("/v1/embeddings", {"model": "bert-f16", "input": [ref[1]["ids"]]})
        assert st == 200 and cosine(j["data"][0]["embedding"], ref[1]["embedding"]) >= 0.9999, j
    finally:
        assert s.stop() == 0, s.log()
    # the start-up lines are per model: the embedding one's says what it serves, and neither
    # the ChatML fallback nor sampling defaults are announced for it
    log = s.log()
    assert "bert-f16: an embedding model (mean pooling, 32 dimensions, inputs of up to 64 tokens)" \
        in log, log
    assert "bert-f16: sampling defaults" not in log and "qwen3-f32: sampling defaults" in log, log
    assert "bert-f16: the model has no chat template" not in log, log
    assert "qwen3-f32: the model has no chat template" in log, log


MINILM = os.path.join(ROOT, "models", "all-minilm-l6-v2-f16.gguf")


def test_real_minilm_matches_sentence_transformers():
    """The real all-MiniLM-L6-v2 (F16, converted by scripts/fetch-test-models.sh) against
    sentence-transformers' own embeddings of the same texts, and HF's WordPiece ids."""
    if not os.path.exists(MINILM):
        pytest.skip(f"model absent: {MINILM} (make models)")
    ref = json.load(open(os.path.join(DIR, "minilm.json")))
    s = Server(MINILM, "--served-model-name", "all-MiniLM-L6-v2", "--quiet")
    try:
        texts = [x["text"] for x in ref["inputs"]]
        r = client(s).embeddings.create(model="all-MiniLM-L6-v2", input=texts)
        cos = [cosine(d.embedding, x["embedding"]) for d, x in zip(r.data, ref["inputs"])]
        assert min(cos) >= 0.9999, cos
        assert r.usage.prompt_tokens == sum(len(x["ids"]) for x in ref["inputs"])
        for x in ref["inputs"]:
            st, j = s.post("/tokenize", {"content": x["text"]})
            assert st == 200 and j["tokens"] == x["ids"], x["text"]
        # the paraphrase is nearer than the physics
        e = [np.asarray(d.embedding) for d in r.data]
        assert e[0] @ e[1] > 0.5 > e[0] @ e[2]
    finally:
        assert s.stop() == 0, s.log()


def test_encoder_pool_holds_one_step(bert):
    """A bidirectional model's input runs whole in one step and is never cached: its KV pool
    is one step's tokens (--max-batch-tokens 512 + 64 sequences x a 16-token block), not a
    generation-sized pool."""
    import re
    m = re.search(r"KV pool (\d+) tokens", bert.log())
    assert m, bert.log()
    assert int(m[1]) == 512 + 64 * 16
