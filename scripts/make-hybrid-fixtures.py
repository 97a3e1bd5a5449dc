#!/usr/bin/env python3
"""Generates the tiny hybrid-recurrent reference model and logits under tests/data/ref-hybrid/
(committed): transformers' own Qwen3_5ForCausalLM with random weights, written as GGUF.

    pip install torch transformers gguf numpy   # once; NOT in tests/requirements.txt
    python3 scripts/make-hybrid-fixtures.py [--out tests/data/ref-hybrid]

The model: 6 layers, Gated DeltaNet on layers 0, 1, 3, 4 and gated full attention on 2
and 5 (full_attention_interval 3); 2 key heads of 16 shared by 4 value heads of 24 (the
grouped-value case, head_k != head_v), conv kernel 4; 4 query heads / 2 KV heads of 32
with partial rotary (8 of 32 dims) and mrope sections [2, 1, 1]; untied output. Written
as llama.cpp's converter (conversion/qwen.py, Qwen3_5TextModel) writes Qwen3.5 (facts
only; the code is ours):
  - tensors blk.N.{attn_norm, post_attention_norm, ffn_gate/up/down}; DeltaNet layers
    attn_qkv (in_proj_qkv), attn_gate (in_proj_z), ssm_beta (in_proj_b), ssm_alpha
    (in_proj_a), ssm_conv1d (the (C, 1, K) kernel squeezed to (C, K)), ssm_dt.bias
    (dt_bias), ssm_a (= -exp(A_log)), ssm_norm (the gated norm), ssm_out (out_proj);
    attention layers attn_q (q and gate interleaved per head, as HF's q_proj), attn_k,
    attn_v, attn_output, attn_q_norm, attn_k_norm;
  - every RMSNorm weight but ssm_norm stored as w + 1 (Qwen3.5 norms compute x(1 + w));
  - value heads reordered from HF's grouped order (value head h reads key head
    h // (n_v / n_k)) to the tiled order (h reads h % n_k): the V rows of in_proj_qkv and
    the conv kernel, the rows of in_proj_z / in_proj_a / in_proj_b, A_log, dt_bias and
    the columns of out_proj;
  - keys {arch}.ssm.conv_kernel / state_size (head_k) / group_count (key heads) /
    time_step_rank (value heads) / inner_size (value heads * head_v),
    full_attention_interval, rope.dimension_count (partial rotary), rope.dimension_sections,
    key_length / value_length; block_count counts an MTP layer (nextn_predict_layers 1,
    blk.6.nextn.{eh_proj, enorm, hnorm} and a full-attention block of random weights:
    loaded and kept, not run, so the logits do not depend on it).
  The F32 file gives the layer pattern by full_attention_interval, the F16 file by the
  explicit attention.recurrent_layers array (the same pattern): both must give the same
  logits. 2-D weights are float16-exact, so both files hold the same numbers.
Records transformers' logits (float32, a full forward without cache) for three prompts
(1, 7 and 150 tokens: the long one spans three 64-token chunks) and, as an independent
check of the cached path, verifies that transformers' own prefill + token-by-token decode
(its recurrent kernel) reproduces them.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import pathlib
import sys

import numpy as np
import torch
import gguf
import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mrf", ROOT / "scripts" / "make-ref-fixtures.py")
mrf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mrf)

SEED = 20260315
N_VOCAB = mrf.N_VOCAB
PROMPT_LENGTHS = (1, 7, 150)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def config():
    return Qwen3_5TextConfig(
        vocab_size=N_VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
        max_position_embeddings=256, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=24, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]},
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def f16x(t):
    return t.half().float()


def init_weights(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("conv1d.weight"):  # (C, 1, K)
                p.copy_(f16x(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])))
            elif p.dim() == 2:
                big = "embed_tokens" in name or "lm_head" in name
                std = (2.0 if big else 1.0) / math.sqrt(p.shape[1])
                p.copy_(f16x(torch.randn(p.shape, generator=gen) * std))
            elif name.endswith("linear_attn.norm.weight"):  # gated norm: x * w
                p.copy_(f16x(1 + 0.2 * torch.randn(p.shape, generator=gen)))
            elif name.endswith("norm.weight"):  # x * (1 + w): stored w + 1 float16-exact
                p.copy_(f16x(1 + 0.2 * torch.randn(p.shape, generator=gen)) - 1)
            elif name.endswith("A_log"):
                p.copy_(torch.log(0.5 + 1.5 * torch.rand(p.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def tiled(t, dim, nk, nvk, hd):
    """HF's grouped value heads -> the converter's tiled order, along dim (its size is
    nk * nvk * hd)."""
    shape = list(t.shape)
    dim = dim % len(shape)
    t = t.reshape(*shape[:dim], nk, nvk, hd, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).reshape(shape)


def gguf_tensors(model, cfg):
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    hk, hv, nvk = cfg.linear_key_head_dim, cfg.linear_value_head_dim, nv // nk
    out = []
    for name, w in sd.items():
        if name == "lm_head.weight":
            out.append(("output.weight", w))
            continue
        if name == "model.embed_tokens.weight":
            out.append(("token_embd.weight", w))
            continue
        if name == "model.norm.weight":
            out.append(("output_norm.weight", w + 1))
            continue
        _, _, bid, rest = name.split(".", 3)
        g = {"input_layernorm.weight": "attn_norm.weight",
             "post_attention_layernorm.weight": "post_attention_norm.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight",
             "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight",
             "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
             "linear_attn.in_proj_z.weight": "attn_gate.weight",
             "linear_attn.in_proj_b.weight": "ssm_beta.weight",
             "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
             "linear_attn.conv1d.weight": "ssm_conv1d.weight",
             "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.A_log": "ssm_a",
             "linear_attn.norm.weight": "ssm_norm.weight",
             "linear_attn.out_proj.weight": "ssm_out.weight"}[rest]
        if rest.endswith("norm.weight") and rest != "linear_attn.norm.weight":
            w = w + 1
        if rest == "linear_attn.in_proj_qkv.weight":
            qk = 2 * nk * hk
            w = torch.cat([w[:qk], tiled(w[qk:], 0, nk, nvk, hv)])
        elif rest == "linear_attn.conv1d.weight":
            w = w.squeeze(1)
            qk = 2 * nk * hk
            w = torch.cat([w[:qk], tiled(w[qk:], 0, nk, nvk, hv)])
        elif rest == "linear_attn.in_proj_z.weight":
            w = tiled(w, 0, nk, nvk, hv)
        elif rest in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                      "linear_attn.dt_bias"):
            w = tiled(w, 0, nk, nvk, 1)
        elif rest == "linear_attn.A_log":
            w = -torch.exp(tiled(w, 0, nk, nvk, 1))
        elif rest == "linear_attn.out_proj.weight":
            w = tiled(w, 1, nk, nvk, hv)
        out.append((f"blk.{bid}.{g}", w))
    return [(n, w.numpy()) for n, w in out]


def mtp_tensors(cfg, gen):
    """A random MTP layer blk.{n_layer} (eh_proj, enorm, hnorm and a full-attention
    block): smelt loads and keeps it; the logits do not depend on it."""
    E, L = cfg.hidden_size, cfg.num_hidden_layers
    hd, nh, nkv, ff = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size

    def r(*shape):
        return f16x(torch.randn(*shape, generator=gen) / math.sqrt(shape[-1])).numpy()

    def one(n):
        return np.ones(n, dtype=np.float32)
    return [(f"blk.{L}.nextn.eh_proj.weight", r(E, 2 * E)), (f"blk.{L}.nextn.enorm.weight", one(E)),
            (f"blk.{L}.nextn.hnorm.weight", one(E)), (f"blk.{L}.attn_norm.weight", one(E)),
            (f"blk.{L}.post_attention_norm.weight", one(E)),
            (f"blk.{L}.attn_q.weight", r(2 * hd * nh, E)), (f"blk.{L}.attn_k.weight", r(hd * nkv, E)),
            (f"blk.{L}.attn_v.weight", r(hd * nkv, E)), (f"blk.{L}.attn_output.weight", r(E, hd * nh)),
            (f"blk.{L}.attn_q_norm.weight", one(hd)), (f"blk.{L}.attn_k_norm.weight", one(hd)),
            (f"blk.{L}.ffn_gate.weight", r(ff, E)), (f"blk.{L}.ffn_up.weight", r(ff, E)),
            (f"blk.{L}.ffn_down.weight", r(E, ff))]


def write_gguf(path, model, cfg, mtp, f16, explicit_pattern):
    arch = "qwen35"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name("smelt ref qwen35")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers + 1)
    w.add_nextn_predict_layers(1)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    rp = cfg.rope_parameters
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_rope_dimension_count(int(cfg.head_dim * rp["partial_rotary_factor"]))
    w.add_rope_dimension_sections(list(rp["mrope_section"]) + [0])
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    if explicit_pattern:
        flags = [t == "linear_attention" for t in cfg.layer_types] + [False]
        w.add_array(f"{arch}.attention.recurrent_layers", flags)
    else:
        w.add_full_attention_interval(3)
    mrf.add_vocab(w, "qwen2")
    w.add_chat_template(CHATML)
    mrf.write_tensors(w, gguf_tensors(model, cfg) + mtp, "f16" if f16 else "f32")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "ref-hybrid"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    cfg = config()
    gen = torch.Generator().manual_seed(SEED)
    model = Qwen3_5ForCausalLM._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    init_weights(model, gen)
    mtp = mtp_tensors(cfg, gen)
    files = {}
    for kind in ("f32", "f16"):
        p = out / f"qwen35-{kind}.gguf"
        write_gguf(p, model, cfg, mtp, f16=kind == "f16", explicit_pattern=kind == "f16")
        files[kind] = {"file": p.name, "sha256": mrf.sha256(p), "bytes": p.stat().st_size}
    rng = np.random.default_rng(SEED + 1)
    prompts = []
    for pi, n in enumerate(PROMPT_LENGTHS):
        ids = [int(x) for x in rng.integers(0, N_VOCAB, size=n)]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            # transformers' cached path: prefill half, then one token at a time
            k = max(1, n // 2)
            o = model(torch.tensor([ids[:k]]), use_cache=True)
            cached, cache = [o.logits[0]], o.cache if hasattr(o, "cache") else o.past_key_values
            for t in range(k, n):
                o = model(torch.tensor([[ids[t]]]), cache=cache, use_cache=True)
                cache = o.cache if hasattr(o, "cache") else o.past_key_values
                cached.append(o.logits[0])
            cached = torch.cat(cached).float().numpy()
        d = float(np.max(np.abs(cached - logits)))
        scale = float(np.max(np.abs(logits)))
        if d > 1e-4 * max(1.0, scale):
            sys.exit(f"prompt {pi}: transformers' cached path differs by {d:.3g}")
        lf = out / f"qwen35-p{pi}.f32"
        logits.astype("<f4").tofile(lf)
        top2 = np.sort(logits, axis=1)[:, -2:]
        prompts.append({"ids": ids, "logits": lf.name, "shape": list(logits.shape),
                        "argmax": [int(x) for x in np.argmax(logits, axis=1)],
                        "max_abs_logit": scale,
                        "min_top1_margin": float(np.min(top2[:, 1] - top2[:, 0]))})
        print(f"qwen35: prompt {pi} n={n} ok (cached path within {d:.2g})")
    c = cfg
    manifest = {
        "generator": "scripts/make-hybrid-fixtures.py",
        "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
        "seed": SEED, "logits_format": "raw little-endian float32, row-major [n_tokens, n_vocab]",
        "models": [{
            "name": "qwen35", "arch": "qwen35", "hf_class": "Qwen3_5ForCausalLM", "files": files,
            "n_vocab": c.vocab_size, "n_embd": c.hidden_size, "n_layer": c.num_hidden_layers,
            "layer_types": c.layer_types, "n_ff": c.intermediate_size,
            "n_head": c.num_attention_heads, "n_head_kv": c.num_key_value_heads,
            "head_dim": c.head_dim, "linear_key_heads": c.linear_num_key_heads,
            "linear_value_heads": c.linear_num_value_heads,
            "linear_key_head_dim": c.linear_key_head_dim,
            "linear_value_head_dim": c.linear_value_head_dim,
            "conv_kernel": c.linear_conv_kernel_dim, "rms_eps": c.rms_norm_eps,
            "rope_parameters": c.rope_parameters, "mtp_layers": 1, "prompts": prompts}],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
