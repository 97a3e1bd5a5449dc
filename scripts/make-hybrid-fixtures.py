#!/usr/bin/env python3
"""Generates the tiny hybrid-recurrent reference models and logits under tests/data/ref-hybrid/
(committed): transformers' own Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and
Qwen3NextForCausalLM with random weights, written as GGUF.

    pip install torch transformers gguf numpy   # once; NOT in tests/requirements.txt
    python3 scripts/make-hybrid-fixtures.py [--out tests/data/ref-hybrid] [--only NAME,...]

The models share a shape: 6 layers, Gated DeltaNet on layers 0, 1, 3, 4 and gated full
attention on 2 and 5 (full_attention_interval 3); 2 key heads of 16 shared by 4 value heads
of 16 (the grouped-value case), conv kernel 4; 4 query heads / 2 KV heads of 32 with
partial rotary (8 of 32 dims); untied output; an MTP layer. qwen35 has a dense FFN of 96
and mrope sections [2, 1, 1]; qwen35moe the same attention with a mixture of 16 experts of
16, 4 per token, and a shared expert of 24 with its sigmoid gate (no intermediate_size, as
Qwen3.5's MoE configs); qwen3next that FFN (norm_topk_prob, every layer sparse),
Qwen3-Next's packed projections and plain RoPE. Value heads are as wide as key heads, as in
every released Qwen3.5 / Qwen3.6 / Qwen3-Next model (128 and 128): llama.cpp's loader takes
head_v from ssm.state_size (the GGUF has no key of its own for it) and refuses a file whose
head_v differs ("attn_qkv has wrong shape"), and these files are to load in llama.cpp too,
as a cross-check. smelt reads head_v as ssm.inner_size / ssm.time_step_rank and runs
head_k != head_v as well (test_cpu_ssm covers that at the op level). Written as llama.cpp's
converter (conversion/qwen.py: Qwen3_5TextModel, Qwen3_5MoeTextModel, Qwen3NextModel)
writes them (facts only; the code is ours):
  - tensors blk.N.{attn_norm, post_attention_norm, ffn_gate/up/down}; DeltaNet layers
    attn_qkv (in_proj_qkv), attn_gate (in_proj_z), ssm_beta (in_proj_b), ssm_alpha
    (in_proj_a), ssm_conv1d (the (C, 1, K) kernel squeezed to (C, K)), ssm_dt.bias
    (dt_bias), ssm_a (= -exp(A_log)), ssm_norm (the gated norm), ssm_out (out_proj);
    attention layers attn_q (q and gate interleaved per head, as HF's q_proj), attn_k,
    attn_v, attn_output, attn_q_norm, attn_k_norm;
  - MoE layers: the router ffn_gate_inp (mlp.gate), experts ffn_gate_exps / ffn_up_exps
    (experts.gate_up_proj split in halves) and ffn_down_exps, the shared expert
    ffn_{gate,up,down}_shexp and its gate ffn_gate_inp_shexp (mlp.shared_expert_gate, (1,
    n_embd)); keys expert_count, expert_used_count, expert_feed_forward_length,
    expert_shared_feed_forward_length;
  - every RMSNorm weight but ssm_norm stored as w + 1 (these norms compute x(1 + w));
  - qwen35, qwen35moe: value heads reordered from HF's grouped order (value head h reads
    key head h // (n_v / n_k)) to the tiled order (h reads h % n_k): the V rows of
    in_proj_qkv and the conv kernel, the rows of in_proj_z / in_proj_a / in_proj_b,
    A_log, dt_bias and the columns of out_proj;
  - qwen3next: value heads stay grouped; in_proj_qkvz (per key head [q | k | v | z]) is
    split into attn_qkv ([q heads | k heads | v heads]) and attn_gate (z), or, as files
    converted before that split hold it, kept whole as ssm_in; in_proj_ba (per key head
    [b | a]) is ssm_ba;
  - keys {arch}.ssm.conv_kernel / state_size (head_k) / group_count (key heads) /
    time_step_rank (value heads) / inner_size (value heads * head_v),
    full_attention_interval, rope.dimension_count (partial rotary), rope.dimension_sections
    (the Qwen3.5 ones), key_length / value_length; block_count counts the MTP layer
    (nextn_predict_layers 1, blk.6.nextn.{eh_proj, enorm, hnorm, shared_head_norm} and a
    full-attention block of random weights with the model's FFN: loaded and kept, not
    run, so the logits do not depend on it);
  - types as the converter's --outtype f16: 2-D and 3-D weights F16 but the routers
    (ffn_gate_inp, ffn_gate_inp_shexp) and ssm_conv1d F32 (llama.cpp's ssm_conv takes F32
    kernels only), vectors F32.
  scripts/check-hybrid-converter.py checks all of that by running llama.cpp's own
  convert_hf_to_gguf.py on these models (saved with save_pretrained, mtp.* tensors added):
  the same tensor names, ggml shapes, types and values and the same {arch}.* keys, but for
  the layout variants (attention.recurrent_layers, ssm_in) and the MTP layer's random
  values (llama.cpp d32676d7, transformers 5.24.0: no difference);
  scripts/check-hybrid-llamacpp.py runs llama.cpp's forward on the files.
  Files: qwen35 F32 (layer pattern by full_attention_interval) and F16 (by the explicit
  attention.recurrent_layers array); qwen35moe F16; qwen3next F16 split and F16 ssm_in.
  2-D and 3-D weights are float16-exact, so all files of a model hold the same numbers.
Records transformers' logits (float32, a full forward without cache; eager experts) for
three prompts (1, 7 and 150 tokens: the long one spans three 64-token chunks) and, as an
independent check of the cached path, verifies that transformers' own prefill +
token-by-token decode (its recurrent kernel) reproduces them. It refuses weights under
which float32 rounding alone moves the logits by more than F64_BOUND (a float64 forward
as the yardstick: some random weights amplify rounding, and a correct float32 forward
would then miss the tests' tolerance), and, for the MoE models, weights whose routing is
too uniform (distinct expert sets per layer, experts used).
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
from transformers import (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig,
                          Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM)

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("mrf", ROOT / "scripts" / "make-ref-fixtures.py")
mrf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mrf)

SEED = 20260315
N_VOCAB = mrf.N_VOCAB
PROMPT_LENGTHS = (1, 7, 150)
F64_BOUND = 3e-5
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

# Shapes all three share: 6 layers (DeltaNet on 0, 1, 3, 4), 2 key heads of 16 for 4
# value heads of 16 (head_v = head_k, as llama.cpp requires), 4 query / 2 KV heads of 32
# with partial rotary (8 of 32 dims).
COMMON = dict(
    vocab_size=N_VOCAB, hidden_size=64, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, max_position_embeddings=256,
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4,
    layer_types=["linear_attention", "linear_attention", "full_attention"] * 2,
    tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
# The MoE variants: 16 experts of 16, 4 per token, a shared expert of 24.
MOE = dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=16,
           shared_expert_intermediate_size=24)

# name: (HF class, config, GGUF architecture, seed, files: kind -> (f16, layout variant))
#   qwen35, qwen35moe: "interval" (full_attention_interval) or "explicit"
#   (attention.recurrent_layers); qwen3next: "split" (attn_qkv + attn_gate, today's
#   converter) or "ssm_in" (the packed in_proj_qkvz of files converted before that split)
MODELS = {
    "qwen35": lambda: (Qwen3_5ForCausalLM, Qwen3_5TextConfig(
        intermediate_size=96, **COMMON,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}),
        SEED + 16, {"f32": (False, "interval"), "f16": (True, "explicit")}),
    "qwen35moe": lambda: (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig(
        **COMMON, **MOE,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}),
        SEED + 9, {"f16": (True, "interval")}),
    "qwen3next": lambda: (Qwen3NextForCausalLM, Qwen3NextConfig(
        intermediate_size=96, **COMMON, **MOE, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25}),
        SEED + 10, {"f16": (True, "split"), "f16-ssm_in": (True, "ssm_in")}),
}


def f16x(t):
    return t.half().float()


def init_weights(model, gen):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("conv1d.weight"):  # (C, 1, K)
                p.copy_(f16x(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1])))
            elif p.dim() == 3:  # experts (n_expert, out, in)
                p.copy_(f16x(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[2])))
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


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.experts.down_proj": "ffn_down_exps.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.in_proj_ba.weight": "ssm_ba.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias", "linear_attn.A_log": "ssm_a",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight"}


def gguf_tensors(model, cfg, arch, layout):
    sd = {k: v.detach().float() for k, v in model.state_dict().items()}
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    hk, hv, nvk = cfg.linear_key_head_dim, cfg.linear_value_head_dim, nv // nk
    reorder = arch != "qwen3next"  # Qwen3.5's value heads tiled; Qwen3-Next's stay grouped
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
        if rest == "mlp.experts.gate_up_proj":  # (n_expert, 2 n_ff_exp, n_embd)
            f = w.shape[1] // 2
            out.append((f"blk.{bid}.ffn_gate_exps.weight", w[:, :f, :]))
            out.append((f"blk.{bid}.ffn_up_exps.weight", w[:, f:, :]))
            continue
        if rest == "linear_attn.in_proj_qkvz.weight":  # per key head [q | k | v | z]
            if layout == "ssm_in":
                out.append((f"blk.{bid}.ssm_in.weight", w))
                continue
            parts = torch.split(w.reshape(nk, -1, w.shape[1]), [hk, hk, nvk * hv, nvk * hv], 1)
            q, k, v, z = (t.reshape(-1, w.shape[1]) for t in parts)
            out.append((f"blk.{bid}.attn_qkv.weight", torch.cat([q, k, v])))
            out.append((f"blk.{bid}.attn_gate.weight", z))
            continue
        g = GGUF_NAMES[rest]
        if rest.endswith("norm.weight") and rest != "linear_attn.norm.weight":
            w = w + 1
        if rest == "linear_attn.conv1d.weight":
            w = w.squeeze(1)
        if rest == "linear_attn.A_log":
            w = -torch.exp(w)
        if reorder and rest in ("linear_attn.in_proj_qkv.weight", "linear_attn.conv1d.weight"):
            qk = 2 * nk * hk
            w = torch.cat([w[:qk], tiled(w[qk:], 0, nk, nvk, hv)])
        elif reorder and rest == "linear_attn.in_proj_z.weight":
            w = tiled(w, 0, nk, nvk, hv)
        elif reorder and rest in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                                  "linear_attn.dt_bias", "linear_attn.A_log"):
            w = tiled(w, 0, nk, nvk, 1)
        elif reorder and rest == "linear_attn.out_proj.weight":
            w = tiled(w, 1, nk, nvk, hv)
        out.append((f"blk.{bid}.{g}", w))
    return [(n, w.numpy()) for n, w in out]


def mtp_tensors(cfg, gen, moe):
    """A random MTP layer blk.{n_layer} (eh_proj, enorm, hnorm, shared_head_norm (the
    checkpoints' mtp.norm) and a full-attention block, with the model's kind of FFN): smelt
    loads and keeps it; the logits do not depend on it."""
    E, L = cfg.hidden_size, cfg.num_hidden_layers
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def r(*shape):
        return f16x(torch.randn(*shape, generator=gen) / math.sqrt(shape[-1])).numpy()

    def one(n):
        return np.ones(n, dtype=np.float32)
    t = [(f"blk.{L}.nextn.eh_proj.weight", r(E, 2 * E)), (f"blk.{L}.nextn.enorm.weight", one(E)),
         (f"blk.{L}.nextn.hnorm.weight", one(E)), (f"blk.{L}.nextn.shared_head_norm.weight", one(E)),
         (f"blk.{L}.attn_norm.weight", one(E)),
         (f"blk.{L}.post_attention_norm.weight", one(E)),
         (f"blk.{L}.attn_q.weight", r(2 * hd * nh, E)), (f"blk.{L}.attn_k.weight", r(hd * nkv, E)),
         (f"blk.{L}.attn_v.weight", r(hd * nkv, E)), (f"blk.{L}.attn_output.weight", r(E, hd * nh)),
         (f"blk.{L}.attn_q_norm.weight", one(hd)), (f"blk.{L}.attn_k_norm.weight", one(hd))]
    if not moe:
        ff = cfg.intermediate_size
        return t + [(f"blk.{L}.ffn_gate.weight", r(ff, E)), (f"blk.{L}.ffn_up.weight", r(ff, E)),
                    (f"blk.{L}.ffn_down.weight", r(E, ff))]
    X, F, S = cfg.num_experts, cfg.moe_intermediate_size, cfg.shared_expert_intermediate_size
    return t + [(f"blk.{L}.ffn_gate_inp.weight", r(X, E)),
                (f"blk.{L}.ffn_gate_exps.weight", r(X, F, E)),
                (f"blk.{L}.ffn_up_exps.weight", r(X, F, E)),
                (f"blk.{L}.ffn_down_exps.weight", r(X, E, F)),
                (f"blk.{L}.ffn_gate_shexp.weight", r(S, E)), (f"blk.{L}.ffn_up_shexp.weight", r(S, E)),
                (f"blk.{L}.ffn_down_shexp.weight", r(E, S)),
                (f"blk.{L}.ffn_gate_inp_shexp.weight", r(1, E))]


def write_gguf(path, name, arch, model, cfg, mtp, f16, layout):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name(f"smelt ref {name}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers + 1)
    w.add_nextn_predict_layers(1)
    if arch != "qwen35moe":  # Qwen3.5's MoE config has no intermediate_size
        w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch != "qwen35":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    rp = cfg.rope_parameters
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_rope_dimension_count(int(cfg.head_dim * rp["partial_rotary_factor"]))
    if "mrope_section" in rp:
        w.add_rope_dimension_sections(list(rp["mrope_section"]) + [0])
    w.add_ssm_conv_kernel(cfg.linear_conv_kernel_dim)
    w.add_ssm_state_size(cfg.linear_key_head_dim)
    w.add_ssm_group_count(cfg.linear_num_key_heads)
    w.add_ssm_time_step_rank(cfg.linear_num_value_heads)
    w.add_ssm_inner_size(cfg.linear_value_head_dim * cfg.linear_num_value_heads)
    if layout == "explicit":
        flags = [t == "linear_attention" for t in cfg.layer_types] + [False]
        w.add_array(f"{arch}.attention.recurrent_layers", flags)
    else:
        w.add_full_attention_interval(3)
    mrf.add_vocab(w, "qwen2")
    w.add_chat_template(CHATML)
    mrf.write_tensors(w, gguf_tensors(model, cfg, arch, layout) + mtp, "f16" if f16 else "f32")


def route_stats(model, cfg, prompts):
    """Each position's top-k expert set per layer (transformers' router, on the prompts'
    full forward): the distinct sets per layer, the experts ever chosen per layer, and the
    smallest gap between a position's k-th and (k+1)-th router probability (how far
    rounding would have to move a row to change its experts)."""
    k = cfg.num_experts_per_tok
    seen = [[] for _ in range(cfg.num_hidden_layers)]
    hooks = [layer.mlp.gate.register_forward_hook(
        lambda mod, inp, out, il=il: seen[il].append(out[0].detach()))
        for il, layer in enumerate(model.model.layers)]
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    sets, used, gap = [], [], math.inf
    for il in range(cfg.num_hidden_layers):
        probs = torch.softmax(torch.cat(seen[il]).float(), dim=-1)
        top = torch.topk(probs, k + 1, dim=-1).values
        gap = min(gap, float((top[:, k - 1] - top[:, k]).min()))
        idx = torch.topk(probs, k, dim=-1).indices
        s = {tuple(sorted(t.tolist())) for t in idx}
        sets.append(len(s))
        used.append(len({e for t in s for e in t}))
    return sets, used, gap


def make_model(name, out):
    cls, cfg, seed, kinds = MODELS[name]()
    arch = name
    moe = arch != "qwen35"
    gen = torch.Generator().manual_seed(seed)
    extra = {"experts_implementation": "eager"} if moe else {}
    model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32, **extra)
    model.eval()
    init_weights(model, gen)
    mtp = mtp_tensors(cfg, gen, moe)
    files = {}
    for kind, (f16, layout) in kinds.items():
        p = out / f"{name}-{kind}.gguf"
        write_gguf(p, name, arch, model, cfg, mtp, f16, layout)
        files[kind] = {"file": p.name, "sha256": mrf.sha256(p), "bytes": p.stat().st_size,
                       "layout": layout}
    rng = np.random.default_rng(SEED + 1)
    prompts = []
    all_ids = [[int(x) for x in rng.integers(0, N_VOCAB, size=n)] for n in PROMPT_LENGTHS]
    for pi, ids in enumerate(all_ids):
        n = len(ids)
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
            sys.exit(f"{name}: prompt {pi}: transformers' cached path differs by {d:.3g}")
        lf = out / f"{name}-p{pi}.f32"
        logits.astype("<f4").tofile(lf)
        top2 = np.sort(logits, axis=1)[:, -2:]
        prompts.append({"ids": ids, "logits": lf.name, "shape": list(logits.shape),
                        "argmax": [int(x) for x in np.argmax(logits, axis=1)],
                        "max_abs_logit": scale,
                        "min_top1_margin": float(np.min(top2[:, 1] - top2[:, 0]))})
        print(f"{name}: prompt {pi} n={n} ok (cached path within {d:.2g})")
    c = cfg
    info = {"name": name, "arch": arch, "hf_class": cls.__name__, "files": files,
            "n_vocab": c.vocab_size, "n_embd": c.hidden_size, "n_layer": c.num_hidden_layers,
            "layer_types": c.layer_types, "n_head": c.num_attention_heads,
            "n_head_kv": c.num_key_value_heads, "head_dim": c.head_dim,
            "linear_key_heads": c.linear_num_key_heads,
            "linear_value_heads": c.linear_num_value_heads,
            "linear_key_head_dim": c.linear_key_head_dim,
            "linear_value_head_dim": c.linear_value_head_dim,
            "conv_kernel": c.linear_conv_kernel_dim, "rms_eps": c.rms_norm_eps,
            "rope_parameters": c.rope_parameters, "mtp_layers": 1}
    if not moe:
        info["n_ff"] = c.intermediate_size
    else:
        sets, used, gap = route_stats(model, cfg, all_ids)
        n_pos = sum(PROMPT_LENGTHS)
        if min(sets) < n_pos // 4 or min(used) < c.num_experts * 3 // 4:
            sys.exit(f"{name}: routing too uniform (sets {sets}, experts used {used})")
        info.update(n_expert=c.num_experts, n_expert_used=c.num_experts_per_tok,
                    n_ff_exp=c.moe_intermediate_size,
                    n_ff_shexp=c.shared_expert_intermediate_size,
                    routing={"distinct_expert_sets_per_layer": sets,
                             "experts_used_per_layer": used, "positions": n_pos,
                             "min_kth_probability_gap": gap})
        print(f"{name}: routing: {sets} distinct sets of {n_pos} positions, "
              f"experts used {used}, smallest k-th gap {gap:.2g}")
    # conditioning: float32 rounding alone must move no logit by more than F64_BOUND
    # (relative to the largest), or a correct float32 forward could miss the tolerance
    # of the tests (some random weights amplify rounding: near-zero vectors through the
    # L2 and RMS norms; seed SEED + 3 gave 8.3e-5 for qwen3next; with head_v 16 the seeds
    # SEED + 2..8 gave 3.5e-5..7.4e-5 for one MoE model or the other, hence + 9 and + 10).
    # F16 activations (cuBLAS on a GPU, llama.cpp's CPU against F16 weights) move them far
    # more: qwen35's seed is + 16 because llama.cpp's F16 file was 1.9e-2 off there against
    # 5.7e-2 with SEED (2.6e-2 .. 3.9e-2 with + 12, + 14), and test_cuda_forward holds its
    # cuBLAS path to 4e-2
    model.double()
    worst = 0.0
    with torch.no_grad():
        for ids, pr in zip(all_ids, prompts):
            l64 = model(torch.tensor([ids])).logits[0].numpy()
            l32 = np.fromfile(out / pr["logits"], dtype="<f4").reshape(l64.shape)
            worst = max(worst, float(np.max(np.abs(l32 - l64)) / np.max(np.abs(l64))))
    if worst > F64_BOUND:
        sys.exit(f"{name}: float32 logits differ from float64 by {worst:.3g} (relative); "
                 "ill-conditioned weights: pick another seed")
    print(f"{name}: float32 vs float64 logits: {worst:.2g}")
    info["float32_vs_float64"] = worst
    info["prompts"] = prompts
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "ref-hybrid"))
    ap.add_argument("--only", help="comma-separated model names (default: all); the "
                    "manifest keeps the others' entries")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    names = args.only.split(",") if args.only else list(MODELS)
    old = {}
    if (out / "manifest.json").exists():
        old = {m["name"]: m for m in json.loads((out / "manifest.json").read_text())["models"]}
    made = {name: make_model(name, out) for name in names}
    manifest = {
        "generator": "scripts/make-hybrid-fixtures.py",
        "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
        "seed": SEED, "logits_format": "raw little-endian float32, row-major [n_tokens, n_vocab]",
        "models": [made.get(n) or old[n] for n in MODELS if n in made or n in old],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({total} bytes)")


if __name__ == "__main__":
    main()
