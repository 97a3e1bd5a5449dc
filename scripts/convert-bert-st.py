#!/usr/bin/env python3
"""Converts a sentence-transformers BERT model folder (config.json, model.safetensors,
tokenizer.json, modules.json, 1_Pooling/config.json) into a GGUF file as llama.cpp's
convert_hf_to_gguf.py writes the "bert" architecture (the facts are llama.cpp's; the code is
ours), for the real embedding test model (scripts/fetch-test-models.sh, docs/models.md).

    python3 scripts/convert-bert-st.py MODEL_DIR OUT.gguf [--f32]

Needs numpy and gguf only: the safetensors file is read directly (an 8-byte header
length, a JSON header, then the raw little-endian tensors).
- keys: bert.context_length (max_position_embeddings), embedding_length, block_count,
  feed_forward_length, attention.head_count, attention.layer_norm_epsilon,
  attention.causal false, pooling_type (from 1_Pooling: mean, cls or last);
- vocabulary: tokenizer.ggml.model "bert", tokens in the "phantom space" form (a
  bracketed token as it is, a "##" continuation without it, any other "\u2581" + itself),
  token types (special added tokens control, other added tokens user-defined, the rest
  normal), [CLS]/[SEP] as bos/eos (tokenizer.json's TemplateProcessing), unk, pad, mask,
  add_bos/add_eos, normalizer.lowercase and .strip_accents (BertNormalizer's; null strip
  follows lowercase);
- tensors: token_embd, token_types, position_embd, token_embd_norm, per layer attn_q/k/v,
  attn_output, attn_output_norm, ffn_up, ffn_down, layer_output_norm (weights and biases);
  the pooler is dropped. 2-D weights in F16 (the default) or F32; vectors in F32.
"""
import argparse
import json
import os
import sys

import numpy as np
import gguf

DT = {"F32": np.float32, "F16": np.float16, "BF16": None}

MAP = {
    "attention.self.query": "attn_q", "attention.self.key": "attn_k",
    "attention.self.value": "attn_v", "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm", "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down", "output.LayerNorm": "layer_output_norm",
}
FIXED = {
    "embeddings.word_embeddings.weight": "token_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > 100 << 20:
            sys.exit("%s: header of %d bytes" % (path, n))
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if name.endswith("position_ids"):  # (an int64 buffer: not a weight)
            continue
        a, b = t["data_offsets"]
        raw = data[a:b]
        if t["dtype"] == "BF16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] in DT:
            arr = np.frombuffer(raw, DT[t["dtype"]]).astype(np.float32)
        else:
            sys.exit("%s: tensor %s of type %s" % (path, name, t["dtype"]))
        out[name] = arr.reshape(t["shape"])
    return out


def gguf_name(name):
    for p in ("bert.", "0.auto_model."):
        if name.startswith(p):
            name = name[len(p):]
    if name in FIXED:
        return FIXED[name]
    if name.startswith("pooler.") or name == "embeddings.position_ids":
        return None
    if not name.startswith("encoder.layer."):
        sys.exit("unexpected tensor %s" % name)
    _, _, bid, rest = name.split(".", 3)
    mod, kind = rest.rsplit(".", 1)
    return "blk.%s.%s.%s" % (bid, MAP[mod], kind)


def phantom(tok):
    if tok.startswith("[") and tok.endswith("]"):
        return tok
    return tok[2:] if tok.startswith("##") else "\u2581" + tok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--f32", action="store_true", help="2-D weights in F32 (default F16)")
    a = ap.parse_args()
    d = a.model_dir
    cfg = json.load(open(os.path.join(d, "config.json")))
    if cfg.get("model_type") != "bert" or cfg.get("position_embedding_type", "absolute") != "absolute":
        sys.exit("not an absolute-position BERT: %s" % cfg.get("model_type"))
    if cfg.get("hidden_act") != "gelu":
        sys.exit("hidden_act %s: smelt's bert runs the exact GELU" % cfg.get("hidden_act"))
    pool = json.load(open(os.path.join(d, "1_Pooling", "config.json")))
    modes = [k for k in ("pooling_mode_mean_tokens", "pooling_mode_cls_token",
                         "pooling_mode_lasttoken") if pool.get(k)]
    others = [k for k, v in pool.items() if k.startswith("pooling_mode") and v and k not in modes]
    if len(modes) != 1 or others:
        sys.exit("pooling %s: one of mean, cls, lasttoken is supported" % (modes + others))
    pooling = {"pooling_mode_mean_tokens": gguf.PoolingType.MEAN,
               "pooling_mode_cls_token": gguf.PoolingType.CLS,
               "pooling_mode_lasttoken": gguf.PoolingType.LAST}[modes[0]]
    tj = json.load(open(os.path.join(d, "tokenizer.json")))
    if tj["model"]["type"] != "WordPiece" or tj["normalizer"]["type"] != "BertNormalizer":
        sys.exit("tokenizer: %s / %s, not BERT's WordPiece" % (tj["model"]["type"], tj["normalizer"]["type"]))
    vocab = tj["model"]["vocab"]
    n_vocab = max(vocab.values()) + 1
    tokens = [None] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    added = {x["id"]: x for x in tj.get("added_tokens", [])}
    for i, x in added.items():
        tokens[i] = x["content"]
    if any(t is None for t in tokens):
        sys.exit("tokenizer: vocabulary ids are not contiguous")
    types = [(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
             if i in added else gguf.TokenType.NORMAL for i in range(n_vocab)]
    ids = {t: i for i, t in enumerate(tokens)}
    norm = tj["normalizer"]
    lower = bool(norm.get("lowercase", True))
    strip = norm.get("strip_accents")
    strip = lower if strip is None else bool(strip)

    w = gguf.GGUFWriter(a.out, "bert")
    w.add_type("model")
    w.add_name(os.path.basename(os.path.normpath(d)))
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if a.f32 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_pooling_type(pooling)
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")
    w.add_token_list([phantom(t) for t in tokens])
    w.add_token_types(types)
    w.add_token_type_count(cfg.get("type_vocab_size", 2))
    w.add_bos_token_id(ids["[CLS]"])
    w.add_eos_token_id(ids["[SEP]"])
    w.add_unk_token_id(ids[tj["model"]["unk_token"]])
    w.add_sep_token_id(ids["[SEP]"])
    if "[PAD]" in ids:
        w.add_pad_token_id(ids["[PAD]"])
    if "[MASK]" in ids:
        w.add_mask_token_id(ids["[MASK]"])
    w.add_uint32("tokenizer.ggml.cls_token_id", ids["[CLS]"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lower)
    w.add_bool("tokenizer.ggml.normalizer.strip_accents", strip)
    for name, arr in read_safetensors(os.path.join(d, "model.safetensors")).items():
        g = gguf_name(name)
        if g is None:
            continue
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if arr.ndim == 2 and not a.f32:
            arr = arr.astype(np.float16)
        w.add_tensor(g, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote %s: %d tokens, %d layers, pooling %s" % (a.out, n_vocab, cfg["num_hidden_layers"],
                                                          pooling.name.lower()))


if __name__ == "__main__":
    main()
