#!/usr/bin/env python3
"""Generates the tiny reference models and logits under tests/data/ref/ (committed).

    pip install torch transformers gguf numpy accelerate   # once; NOT in tests/requirements.txt
    python3 scripts/make-ref-fixtures.py [--out tests/data/ref] [--only NAME[,NAME...]]

For each architecture smelt's forward pass supports (llama, qwen2, qwen3, gemma3,
qwen3moe) plus variants with RoPE scaling (Llama-3 rope_freqs, linear, YaRN), it:
1. builds a Hugging Face model with random weights (fixed seed) and tiny shapes,
   float32, eager attention (and eager experts: transformers' per-expert loop). 2-D
   weights are rounded to float16-representable values, so the F32 and F16 GGUF files
   hold exactly the same numbers and both must reproduce the same logits (up to float32
   arithmetic). Expert weights (3-D) are rounded further, to values Q8_0 stores exactly
   (each block of 32 is an integer in [-127, 127] times a power of two, with one element
   at +-127, so Q8_0's scale amax / 127 is that power of two): the MoE model's Q8_0 file
   holds the same numbers too.
2. writes it as GGUF F32 and F16 (and, for MoE models, Q8_0 experts with the rest as in
   the F16 file) with gguf-py's GGUFWriter, following llama.cpp's convert_hf_to_gguf.py
   conventions (facts only; the code is ours):
   - tensor names token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output,
     ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm, output (absent when tied);
     qwen2 attn_{q,k,v}.bias; qwen3/gemma3 attn_q_norm/attn_k_norm; gemma3
     post_attention_norm/post_ffw_norm; llama3 scaling as the F32 tensor rope_freqs.
   - linear and YaRN scaling as the converter writes them: {arch}.rope.scaling.type
     ("linear" / "yarn"), .factor, and for YaRN .original_context_length, plus
     .yarn_beta_fast / .yarn_beta_slow / .yarn_attn_factor only when the HF config sets
     beta_fast / beta_slow / attention_factor.
   - llama: the rows of q_proj/k_proj are permuted (per head, the two halves that HF's
     rotate_half pairs are interleaved) so that ggml's "normal" RoPE on adjacent pairs
     computes what HF computes. qwen2/qwen3/gemma3 use NeoX RoPE and are not permuted.
   - gemma3: Gemma's RMSNorm computes x̂·(1 + w); the converter stores w + 1 in every
     *norm.weight (incl. q/k norms), so readers multiply by the stored weight directly.
     As in llama.cpp's converter, 1-D tensors (norms, biases, rope_freqs) stay F32 in the
     F16 file.
   - qwen3moe (Qwen2MoeModel's conversion): transformers' fused experts.gate_up_proj
     (n_expert, 2 n_ff_exp, n_embd) splits into ffn_gate_exps (the first n_ff_exp rows of
     each expert) and ffn_up_exps, GGUF shape {n_embd, n_ff_exp, n_expert};
     experts.down_proj is ffn_down_exps {n_ff_exp, n_embd, n_expert}; the router
     mlp.gate is ffn_gate_inp {n_embd, n_expert}, kept F32 in every file (the converter
     keeps it F32 and llama-quantize never quantizes it); keys expert_count,
     expert_used_count, expert_feed_forward_length.
   - a complete synthetic tokenizer (SentencePiece-style "llama" vocab for llama/gemma3,
     byte-level "gpt2" vocab with merges for qwen2/qwen3/qwen3moe) of exactly n_vocab tokens; the
     tests feed token ids directly.
3. records transformers' logits (float32) for three prompts of random token ids
   (lengths 1, 7 and 24; 24 > gemma3's sliding window of 8) as raw little-endian
   float32 files [n_tokens, n_vocab], and a manifest.json describing everything.
4. verifies its own output: tests/py/ref_forward.py (an independent numpy forward that
   reads the GGUF) must reproduce every logits file from both the F32 and F16 GGUF.
5. loads every GGUF back with transformers' own GGUF reader (which dequantizes and undoes
   llama.cpp's q/k permutation with its own code) and runs the same prompts: an
   independent check of the weights as written, the llama permutation above all. The
   model config comes from transformers' reading of the GGUF where that reading is
   complete; otherwise (it ignores rope_freqs, rope.scaling.* and attention.key_length
   for these architectures, and gemma3's softcap and query_pre_attn_scalar) from the HF
   config the file was made from, so only the weights come from the GGUF.

--only regenerates the named models and keeps the manifest entries of the others (their
files are not touched); by default everything is regenerated (deterministic, byte for
byte with the same transformers and torch).
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import pathlib
import sys

os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF reader's progress bars

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          GptOssConfig, GptOssForCausalLM, LlamaConfig, LlamaForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "py"))
import ref_forward  # noqa: E402

SEED = 20240611
N_VOCAB = 320
PROMPT_LENGTHS = (1, 7, 24)

# ---------------------------------------------------------------------------- configs


def specs():
    """name -> (gguf arch, HF class, HF config). Shapes chosen to exercise GQA/MQA,
    head_dim * n_head != n_embd (qwen3, gemma3), tied and untied outputs."""
    common = dict(vocab_size=N_VOCAB, max_position_embeddings=128, bos_token_id=1,
                  eos_token_id=2, pad_token_id=None)
    return {
        "llama": ("llama", LlamaForCausalLM, LlamaConfig(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            tie_word_embeddings=False, **common)),
        "llama3": ("llama", LlamaForCausalLM, LlamaConfig(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16},
            tie_word_embeddings=True, **common)),
        "qwen2": ("qwen2", Qwen2ForCausalLM, Qwen2Config(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True, use_sliding_window=False, **common)),
        "qwen3": ("qwen3", Qwen3ForCausalLM, Qwen3Config(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=True, use_sliding_window=False, attention_bias=False, **common)),
        "gemma3": ("gemma3", Gemma3ForCausalLM, Gemma3TextConfig(
            hidden_size=32, intermediate_size=64, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=1, head_dim=16,
            query_pre_attn_scalar=16, rms_norm_eps=1e-6, sliding_window=8,
            layer_types=["sliding_attention"] * 5 + ["full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}},
            final_logit_softcapping=15.0, attn_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
            vocab_size=N_VOCAB, max_position_embeddings=128,
            pad_token_id=0, eos_token_id=1, bos_token_id=2)),
        # RoPE scaling variants (appended: the seeds of the models above stay the same)
        "llama-linear": ("llama", LlamaForCausalLM, LlamaConfig(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
            tie_word_embeddings=True, **common)),
        # YaRN with the defaults (beta_fast 32, beta_slow 1, attention factor 1 + 0.1 ln 4)
        # and an original context of 16 < the 24-token prompt; with rope_dim 16 and
        # theta 1e6 the ramp runs over pairs 0..1 (pair 0 kept, pairs >= 1 interpolated)
        "qwen2-yarn": ("qwen2", Qwen2ForCausalLM, Qwen2Config(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                             "original_max_position_embeddings": 16},
            tie_word_embeddings=True, use_sliding_window=False,
            **dict(common, max_position_embeddings=64))),
        # YaRN with every optional key set: beta_fast 16, beta_slow 2 over an original
        # context of 2048 put the ramp at pairs 5..9 of 16 (rope_dim 32, theta 1e4), and an
        # explicit attention_factor replaces 1 + 0.1 ln(factor)
        "qwen3-yarn": ("qwen3", Qwen3ForCausalLM, Qwen3Config(
            hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                             "original_max_position_embeddings": 2048, "beta_fast": 16.0,
                             "beta_slow": 2.0, "attention_factor": 1.25},
            tie_word_embeddings=True, use_sliding_window=False, attention_bias=False,
            **dict(common, max_position_embeddings=8192))),
        # Mixture of experts, Qwen3-30B-A3B's block at a tiny size: 16 experts, 4 per
        # token (so tokens of a prompt go to different experts), softmax + top-k +
        # renormalization, no shared expert, every layer sparse, untied output
        "qwen3moe": ("qwen3moe", Qwen3MoeForCausalLM, Qwen3MoeConfig(
            hidden_size=32, intermediate_size=96, moe_intermediate_size=32, num_experts=16,
            num_experts_per_tok=4, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            tie_word_embeddings=False, use_sliding_window=False, attention_bias=False,
            **common)),
        # gpt-oss's block at a tiny size: 16 experts of 32, 4 per token, router and expert
        # biases, the clamped SwiGLU (alpha 1.702, limit 7: the expert weights are large
        # enough that gate and up cross the limit), attention sinks, Q/K/V/O biases, layer 0
        # sliding (window 8 < the 24-token prompt) and layer 1 full, and gpt-oss-20b's own
        # YaRN (theta 1.5e5, factor 32 over 4096, truncate False: with head_dim 16 the ramp
        # runs over pairs 2.02..4.35, not the rounded 2..5)
        "gpt-oss": ("gpt-oss", GptOssForCausalLM, GptOssConfig(
            hidden_size=32, intermediate_size=32, num_local_experts=16, num_experts_per_tok=4,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"],
            rms_norm_eps=1e-5, attention_bias=True, swiglu_alpha=1.702, swiglu_limit=7.0,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                             "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                             "original_max_position_embeddings": 4096},
            tie_word_embeddings=False, **dict(common, max_position_embeddings=131072))),
    }


# ---------------------------------------------------------------------------- weights


def q8_0_exact(w):
    """w rounded to values Q8_0 stores exactly, and float16 too: per block of 32 along
    the last dimension, an integer in [-127, 127] times a power of two d, the largest
    magnitude exactly 127 d (so Q8_0's scale amax / 127 is d)."""
    b = w.reshape(-1, 32)
    amax = b.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    d = torch.exp2(torch.ceil(torch.log2(amax / 127)))
    q = torch.round(b / d).clamp(-127, 127)
    top = q.abs().argmax(dim=1, keepdim=True)
    q.scatter_(1, top, 127 * torch.sign(q.gather(1, top) + 0.5))
    return (q * d).reshape(w.shape)


def mxfp4_exact(w):
    """w rounded to values MXFP4 stores exactly (gguf-py's quantizer and ggml's): per
    block of 32 along the last dimension, s * {0, 0.5, 1, 1.5, 2, 3, 4, 6} with sign and s a
    power of two, the largest magnitude exactly 6 s (so the block's E8M0 scale is s / 2 and
    every element is one of its E2M1 values; float16-exact too)."""
    b = w.reshape(-1, 32)
    amax = b.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
    s = torch.exp2(torch.ceil(torch.log2(amax / 6)))
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    q = grid[torch.argmin((b.abs() / s).unsqueeze(-1).sub(grid).abs(), dim=-1)] * torch.sign(b)
    top = b.abs().argmax(dim=1, keepdim=True)
    q.scatter_(1, top, 6 * torch.sign(b.gather(1, top)))
    return (q * s).reshape(w.shape)


def init_weights(model, arch, gen):
    """Random weights with O(1) activations (HF's default init of std 0.02 would give
    nearly uniform logits, a weak test). 2-D weights are made float16-exact, expert
    weights (3-D) Q8_0-exact (gpt-oss: MXFP4-exact along their input dimension, as the
    GGUF stores them)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 3 and arch == "gpt-oss":  # experts (n_expert, in, out)
                # gate_up large enough to cross the SwiGLU's limit of 7 now and then
                gain = 4.0 if "gate_up" in name else 1.0
                w = torch.randn(p.shape, generator=gen) * gain / math.sqrt(p.shape[1])
                p.copy_(mxfp4_exact(w.transpose(1, 2)).transpose(1, 2))
            elif p.dim() == 3:  # experts (n_expert, out, in)
                w = torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[2])
                p.copy_(q8_0_exact(w))
            elif name.endswith("_bias"):  # gpt-oss's expert biases (n_expert, out)
                p.copy_((torch.randn(p.shape, generator=gen) * 0.5).half().float())
            elif name.endswith("sinks"):  # gpt-oss: a logit per head, as large as the scores
                p.copy_((torch.randn(p.shape, generator=gen) * 1.5).half().float())
            elif p.dim() == 2:
                fan_in = p.shape[1]
                # embeddings and lm_head: logits of std ~2 whether tied or not
                big = "embed_tokens" in name or "lm_head" in name
                std = (2.0 if big else 1.0) / math.sqrt(fan_in)
                w = torch.randn(p.shape, generator=gen) * std
                p.copy_(w.half().float())
            elif name.endswith("norm.weight"):
                w = torch.randn(p.shape, generator=gen) * 0.2
                if arch == "gemma3":
                    # HF multiplies by (1 + w); make the stored w + 1 float16-exact too
                    w = (w + 1).half().float() - 1
                else:
                    w = (1 + w).half().float()
                p.copy_(w)
            elif name.endswith(".bias"):
                p.copy_((torch.randn(p.shape, generator=gen) * 0.5).half().float())
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


# ---------------------------------------------------------------------------- vocab


def bytes_to_unicode():
    """GPT-2's byte -> printable unicode map (a published fact of byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def gpt2_vocab(n_vocab, specials):
    """256 byte tokens, then merges of frequent-looking pairs, then special tokens."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    types = [1] * 256
    merges = []
    have = set(tokens)
    sp = b2u[ord(" ")]
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    cands = [(sp, c) for c in letters] + [(a, b) for a in letters[:12] for b in letters[:12]]
    n_merge = n_vocab - 256 - len(specials)
    for a, b in cands:
        if len(merges) == n_merge:
            break
        if a + b in have:
            continue
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        have.add(a + b)
        types.append(1)
    assert len(merges) == n_merge
    for s in specials:
        tokens.append(s)
        types.append(3)  # CONTROL
    return tokens, types, merges


def spm_vocab(n_vocab, head, ctrl):
    """SentencePiece-style: the `head` tokens (ids 0..), 256 byte tokens <0xXX>, then
    pieces with decreasing scores. `ctrl` maps a head token to its type."""
    tokens = list(head)
    types = [ctrl[t] for t in head]
    scores = [0.0] * len(head)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
        scores.append(0.0)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pieces = ["▁"] + [c for c in letters] + ["▁" + c for c in letters] + \
             [a + b for a in letters[:8] for b in letters[:8]]
    i = 0
    while len(tokens) < n_vocab:
        tokens.append(pieces[i])
        types.append(1)
        scores.append(-float(i + 1))
        i += 1
    return tokens, types, scores


def add_vocab(w, arch):
    if arch in ("qwen2", "qwen3", "qwen3moe"):
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        tokens, types, merges = gpt2_vocab(N_VOCAB, specials)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        eot = tokens.index("<|endoftext|>")
        w.add_bos_token_id(eot)
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_pad_token_id(eot)
        w.add_add_bos_token(False)
    elif arch == "gpt-oss":  # o200k's conventions: byte-level BPE, pre-tokenizer gpt-4o
        specials = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>", "<|end|>",
                    "<|message|>", "<|channel|>"]
        tokens, types, merges = gpt2_vocab(N_VOCAB, specials)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-4o")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|startoftext|>"))
        w.add_eos_token_id(tokens.index("<|return|>"))
        w.add_pad_token_id(tokens.index("<|endoftext|>"))
    elif arch == "gemma3":
        head = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
        ctrl = {"<pad>": 3, "<eos>": 3, "<bos>": 3, "<unk>": 2,
                "<start_of_turn>": 4, "<end_of_turn>": 4}
        tokens, types, scores = spm_vocab(N_VOCAB, head, ctrl)
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_unk_token_id(3)
        w.add_pad_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)
    else:
        head = ["<unk>", "<s>", "</s>"]
        tokens, types, scores = spm_vocab(N_VOCAB, head, {"<unk>": 2, "<s>": 3, "</s>": 3})
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    assert len(tokens) == N_VOCAB


# ---------------------------------------------------------------------------- GGUF


def permute_qk(w, n_head):
    """llama.cpp's converter permutation of q/k rows for LLaMA: within each head, row j of
    the first half and row j of the second half (HF rotate_half partners) become rows
    2j and 2j+1. w: (n_head * head_dim, n_in)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(rp, head_dim):
    """Per-frequency divisors for ggml's rope_freqs tensor, derived from the Llama-3
    scaling rule (theta_i / factor_i equals HF's scaled inverse frequency)."""
    base, factor = rp["rope_theta"], rp["factor"]
    lo, hi = rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wl = 2 * math.pi / freq
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.sinks": "attn_sinks.weight",
    "mlp.router.weight": "ffn_gate_inp.weight",
    "mlp.router.bias": "ffn_gate_inp.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_tensors(model, arch, cfg):
    """HF state dict -> list of (gguf name, float32 numpy array in HF (out, in) layout;
    experts (n_expert, out, in))."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = []
    gemma = arch == "gemma3"
    for name, w in sd.items():
        if name == "lm_head.weight":
            if cfg.tie_word_embeddings:
                continue
            out.append(("output.weight", w))
            continue
        if name == "model.embed_tokens.weight":
            out.append(("token_embd.weight", w))
            continue
        if name == "model.norm.weight":
            out.append(("output_norm.weight", w + 1 if gemma else w))
            continue
        assert name.startswith("model.layers."), name
        _, _, bid, rest = name.split(".", 3)
        # gpt-oss (GptOssModel's conversion): its experts are stored (n_expert, in, out);
        # gate_up_proj (n_expert, n_embd, 2 n_ff_exp) is transposed and de-interleaved (gate
        # the even columns, up the odd ones), and so is its bias (n_expert, 2 n_ff_exp)
        if rest == "mlp.experts.down_proj" and arch == "gpt-oss":
            out.append((f"blk.{bid}.ffn_down_exps.weight", w.transpose(0, 2, 1)))
            continue
        if rest == "mlp.experts.gate_up_proj" and arch == "gpt-oss":
            t = w.transpose(0, 2, 1)
            out.append((f"blk.{bid}.ffn_gate_exps.weight", t[:, ::2, :]))
            out.append((f"blk.{bid}.ffn_up_exps.weight", t[:, 1::2, :]))
            continue
        if rest == "mlp.experts.gate_up_proj_bias":
            out.append((f"blk.{bid}.ffn_gate_exps.bias", w[:, ::2]))
            out.append((f"blk.{bid}.ffn_up_exps.bias", w[:, 1::2]))
            continue
        if rest == "mlp.experts.down_proj_bias":
            out.append((f"blk.{bid}.ffn_down_exps.bias", w))
            continue
        if rest == "mlp.experts.gate_up_proj":  # (n_expert, 2 n_ff_exp, n_embd)
            f = w.shape[1] // 2
            out.append((f"blk.{bid}.ffn_gate_exps.weight", w[:, :f, :]))
            out.append((f"blk.{bid}.ffn_up_exps.weight", w[:, f:, :]))
            continue
        if rest == "mlp.experts.down_proj":
            out.append((f"blk.{bid}.ffn_down_exps.weight", w))
            continue
        if rest == "mlp.gate.weight":
            out.append((f"blk.{bid}.ffn_gate_inp.weight", w))
            continue
        if (gemma or arch == "gpt-oss") and rest == "post_attention_layernorm.weight":
            g = "post_attention_norm.weight"
        elif gemma and rest == "pre_feedforward_layernorm.weight":
            g = "ffn_norm.weight"
        elif gemma and rest == "post_feedforward_layernorm.weight":
            g = "post_ffw_norm.weight"
        elif rest == "post_attention_layernorm.weight":
            g = "ffn_norm.weight"
        else:
            g = HF_TO_GGUF[rest]
        if arch == "llama" and rest == "self_attn.q_proj.weight":
            w = permute_qk(w, cfg.num_attention_heads)
        if arch == "llama" and rest == "self_attn.k_proj.weight":
            w = permute_qk(w, cfg.num_key_value_heads)
        if gemma and g.endswith("norm.weight"):
            w = w + 1  # fold Gemma's (1 + w)
        out.append((f"blk.{bid}.{g}", w))
    rp = cfg.rope_parameters
    if arch == "llama" and rp.get("rope_type") == "llama3":
        out.insert(0, ("rope_freqs.weight", llama3_rope_freqs(rp, cfg.head_dim)))
    return out


def add_rope_scaling(w, rp):
    """The {arch}.rope.scaling.* keys llama.cpp's converter writes for HF linear / YaRN
    rope parameters (llama3 scaling goes into the rope_freqs tensor instead)."""
    rt = rp.get("rope_type", rp.get("type"))
    factor = rp.get("factor")
    if rt == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif rt == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        if rp.get("extrapolation_factor") is not None:
            w.add_rope_scaling_yarn_ext_factor(rp["extrapolation_factor"])
        attn = rp.get("attention_factor", rp.get("attn_factor"))
        if attn is not None:
            w.add_rope_scaling_yarn_attn_factor(attn)
        if rp.get("beta_fast") is not None:
            w.add_rope_scaling_yarn_beta_fast(rp["beta_fast"])
        if rp.get("beta_slow") is not None:
            w.add_rope_scaling_yarn_beta_slow(rp["beta_slow"])
    elif rt not in (None, "default", "llama3"):
        raise RuntimeError(f"rope_type {rt} is not written by this script")


def write_gguf(path, name, arch, model, cfg, kind):
    """kind: "f32"; "f16" (matrices F16); "q8_0" / "mxfp4" (experts Q8_0 / MXFP4, other
    matrices F16). Vectors, biases and the router stay F32, as the converter writes them."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_type("model")
    w.add_name(f"smelt ref {name}")
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                     "mxfp4": gguf.LlamaFileType.MOSTLY_MXFP4_MOE}[kind])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rp = cfg.rope_parameters
    if arch == "gemma3":
        w.add_rope_freq_base(rp["full_attention"]["rope_theta"])
        w.add_rope_freq_base_swa(rp["sliding_attention"]["rope_theta"])
        w.add_sliding_window(cfg.sliding_window)
        if cfg.final_logit_softcapping:
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    else:
        w.add_rope_freq_base(rp["rope_theta"])
        add_rope_scaling(w, rp)
        if arch in ("qwen3", "qwen3moe", "gpt-oss"):
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
        if arch in ("qwen3moe", "gpt-oss"):
            w.add_expert_count(cfg.num_experts)
            w.add_expert_used_count(cfg.num_experts_per_tok)
        if arch == "qwen3moe":
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters
            w.add_sliding_window(cfg.sliding_window)
            w.add_expert_feed_forward_length(cfg.intermediate_size)
        if arch == "llama":
            w.add_vocab_size(cfg.vocab_size)
            w.add_rope_dimension_count(head_dim)
    add_vocab(w, arch)
    write_tensors(w, gguf_tensors(model, arch, cfg), kind)


def write_tensors(w, tensors, kind):
    """Adds (name, float32 array) tensors and writes the file. kind "f32": as they are;
    "f16": 2-D and 3-D ones as float16 (they must be float16-exact), but the routers
    (ffn_gate_inp*) and recurrent conv kernels (ssm_conv1d) F32, as llama.cpp's converter
    keeps them (its ssm_conv op takes F32 kernels only); "q8_0": experts (3-D) Q8_0 (they
    must be Q8_0-exact), the rest as "f16"."""
    for tname, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if kind in ("q8_0", "mxfp4") and arr.ndim == 3:
            qt = gguf.GGMLQuantizationType[kind.upper()]
            q = gguf.quants.quantize(arr, qt)
            back = gguf.quants.dequantize(q, qt)
            assert np.array_equal(back.reshape(arr.shape), arr), f"{tname} is not {kind}-exact"
            w.add_tensor(tname, q, raw_dtype=qt)
            continue
        if (kind != "f32" and arr.ndim >= 2 and "ffn_gate_inp" not in tname
                and "ssm_conv1d" not in tname and not tname.endswith(".bias")):
            h = arr.astype(np.float16)
            assert np.array_equal(h.astype(np.float32), arr), f"{tname} is not float16-exact"
            arr = h
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def count_swiglu_clamps(model):
    """Counts, over every later forward of model, the gate values above gpt-oss's SwiGLU
    limit and the up values outside it (a wrapper around each experts module's
    _apply_gate); returns the live counter dict."""
    counts = {"gate": 0, "up": 0, "values": 0}
    for layer in model.model.layers:
        ex = layer.mlp.experts
        orig = ex._apply_gate

        def wrapped(gate_up, orig=orig, lim=ex.limit):
            counts["gate"] += int((gate_up[..., ::2] > lim).sum())
            counts["up"] += int((gate_up[..., 1::2].abs() > lim).sum())
            counts["values"] += gate_up.shape[-1] // 2 * (gate_up.numel() // gate_up.shape[-1])
            return orig(gate_up)
        ex._apply_gate = wrapped
    return counts


# ---------------------------------------------------------------------------- round trip


def max_diff(model, out, prompts):
    worst = 0.0
    for p in prompts:
        want = np.fromfile(out / p["logits"], dtype="<f4").reshape(p["shape"])
        with torch.no_grad():
            got = model(torch.tensor([p["ids"]])).logits[0].float().numpy()
        worst = max(worst, float(np.max(np.abs(got - want))))
    return worst


def check_hf_gguf_roundtrip(out, fname, name, cls, cfg, prompts):
    """Loads out/fname with transformers' GGUF reader and compares its logits with the
    recorded ones. First with the config transformers derives from the GGUF (reported,
    not required: its key mapping is incomplete for some of these files), then with the
    HF config the file was made from (required to match: every weight, as transformers
    reads and un-permutes it, must be the one the logits were recorded with). Except for
    gpt-oss, which transformers' GGUF reader cannot read at all (it fails on llama.cpp's
    rope.scaling keys, and its tensor processor expects ffn_*_projs experts where llama.cpp
    writes ffn_*_exps): reported; the numpy reference is the check of those files."""
    tol = 1e-4 * max(1.0, max(p["max_abs_logit"] for p in prompts))
    transformers.logging.set_verbosity_error()  # the expected load failures are reported below
    transformers.logging.disable_progress_bar()
    try:
        m = AutoModelForCausalLM.from_pretrained(str(out), gguf_file=fname, dtype=torch.float32,
                                                 attn_implementation="eager")
        d = max_diff(m.eval(), out, prompts)
        own = f"{d:.3g}" + ("" if d <= tol else " (differs: transformers' GGUF config mapping)")
    except Exception as ex:  # noqa: BLE001 - reported, not fatal
        own = f"not loadable ({type(ex).__name__}: {str(ex).splitlines()[0][:80]})"
    try:
        m = cls.from_pretrained(str(out), gguf_file=fname, config=copy.deepcopy(cfg),
                                dtype=torch.float32, attn_implementation="eager")
    except Exception as ex:  # noqa: BLE001 - gpt-oss only, see above
        if cls is not GptOssForCausalLM:
            raise
        return f"{fname:22s} not loadable by transformers' GGUF reader ({type(ex).__name__})"
    d = max_diff(m.eval(), out, prompts)
    if d > tol:
        sys.exit(f"ROUND TRIP FAILED {fname}: transformers reading the GGUF gives logits "
                 f"{d:.3g} away from the recorded ones")
    return f"{fname:22s} with the file's HF config: {d:.3g}; with the GGUF-derived config: {own}"


# ---------------------------------------------------------------------------- main


def sha256(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "ref"))
    ap.add_argument("--only", help="comma-separated model names to regenerate; the manifest "
                    "entries of the others are kept as they are")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    all_specs = specs()
    only = set(args.only.split(",")) if args.only else set(all_specs)
    if only - set(all_specs):
        sys.exit(f"unknown model(s): {', '.join(sorted(only - set(all_specs)))}")
    kept = {}
    if args.only:
        old = json.loads((out / "manifest.json").read_text())
        kept = {m["name"]: m for m in old["models"]}
        if old["transformers"] != transformers.__version__:
            print(f"note: the kept models were made with transformers {old['transformers']}",
                  file=sys.stderr)
    torch.use_deterministic_algorithms(True)
    manifest = {
        "generator": "scripts/make-ref-fixtures.py",
        "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
        "seed": SEED, "logits_format": "raw little-endian float32, row-major [n_tokens, n_vocab]",
        "models": [],
    }
    worst = 0.0
    roundtrip = []
    for mi, (name, (arch, cls, cfg)) in enumerate(all_specs.items()):
        if name not in only:
            if name not in kept:
                sys.exit(f"{name}: not in the existing manifest; regenerate it too")
            manifest["models"].append(kept[name])
            continue
        gen = torch.Generator().manual_seed(SEED + mi)
        moe = getattr(cfg, "num_experts", 0) > 0
        extra = {"experts_implementation": "eager"} if moe else {}
        model = cls._from_config(cfg, attn_implementation="eager", torch_dtype=torch.float32,
                                 **extra)
        model.eval()
        init_weights(model, arch, gen)
        files = {}
        qkind = "mxfp4" if arch == "gpt-oss" else "q8_0"  # how the real files store experts
        for kind in ("f32", "f16", qkind) if moe else ("f32", "f16"):
            p = out / f"{name}-{kind}.gguf"
            write_gguf(p, name, arch, model, cfg, kind)
            files[kind] = {"file": p.name, "sha256": sha256(p), "bytes": p.stat().st_size}
        routed = [set() for _ in range(cfg.num_hidden_layers)] if moe else None
        clamped = count_swiglu_clamps(model) if arch == "gpt-oss" else None
        rng = np.random.default_rng(SEED + 100 + mi)
        prompts = []
        refs = {k: ref_forward.RefModel(str(out / v["file"])) for k, v in files.items()}
        for pi, n in enumerate(PROMPT_LENGTHS):
            ids = [int(x) for x in rng.integers(0, N_VOCAB, size=n)]
            with torch.no_grad():
                res = model(torch.tensor([ids]), output_router_logits=moe)
                logits = res.logits[0].float().numpy()
            if moe:  # each position's expert set, per layer
                for il, rl in enumerate(res.router_logits):
                    top = torch.topk(rl.reshape(n, -1), cfg.num_experts_per_tok, dim=-1).indices
                    routed[il].update(tuple(sorted(t.tolist())) for t in top)
            lf = out / f"{name}-p{pi}.f32"
            logits.astype("<f4").tofile(lf)
            for k, ref in refs.items():
                mine = ref.forward(ids)
                err = float(np.max(np.abs(mine - logits)))
                scale = float(np.max(np.abs(logits)))
                worst = max(worst, err / scale)
                if err > 1e-3 * max(1.0, scale) or not np.array_equal(
                        np.argmax(mine, axis=1), np.argmax(logits, axis=1)):
                    sys.exit(f"VERIFY FAILED {name} {k} prompt {pi}: max |diff| {err:.3g} "
                             f"(max |logit| {scale:.3g})")
            top2 = np.sort(logits, axis=1)[:, -2:]
            prompts.append({"ids": ids, "logits": lf.name, "shape": list(logits.shape),
                            "argmax": [int(x) for x in np.argmax(logits, axis=1)],
                            "max_abs_logit": float(np.max(np.abs(logits))),
                            "min_top1_margin": float(np.min(top2[:, 1] - top2[:, 0]))})
            print(f"{name}: prompt {pi} n={n} ok (numpy ref matches, {' and '.join(files)} GGUF)")
        for kind, v in files.items():
            roundtrip.append(check_hf_gguf_roundtrip(out, v["file"], name, cls, cfg, prompts))
        c = cfg
        info = {
            "name": name, "arch": arch, "hf_class": cls.__name__, "files": files,
            "n_vocab": c.vocab_size, "n_embd": c.hidden_size, "n_layer": c.num_hidden_layers,
            "n_ff": c.intermediate_size, "n_head": c.num_attention_heads,
            "n_head_kv": c.num_key_value_heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            "rms_eps": c.rms_norm_eps, "tied_output": bool(c.tie_word_embeddings),
            "rope_parameters": c.rope_parameters,
            "prompts": prompts,
        }
        if moe:
            # routing must really differ between tokens: distinct expert sets per layer
            # over the 32 positions of the three prompts, and experts ever chosen
            sets = [len(r) for r in routed]
            used = [len({e for t in r for e in t}) for r in routed]
            n_pos = sum(PROMPT_LENGTHS)
            if min(sets) < n_pos // 2 or min(used) < c.num_experts * 3 // 4:
                sys.exit(f"{name}: routing too uniform (sets {sets}, experts used {used})")
            info.update(n_expert=c.num_experts, n_expert_used=c.num_experts_per_tok,
                        routing={"distinct_expert_sets_per_layer": sets,
                                 "experts_used_per_layer": used, "positions": n_pos})
            if arch == "qwen3moe":
                info.update(n_ff_exp=c.moe_intermediate_size, norm_topk_prob=c.norm_topk_prob)
        if arch == "gpt-oss":
            # the SwiGLU's limit must act somewhere, on gate (above) and up (both sides)
            if min(clamped["gate"], clamped["up"]) == 0:
                sys.exit(f"{name}: the SwiGLU limit never acts ({clamped})")
            info.update(n_ff_exp=c.intermediate_size, sliding_window=c.sliding_window,
                        layer_types=c.layer_types, swiglu_alpha=c.swiglu_alpha,
                        swiglu_limit=c.swiglu_limit, swiglu_clamped=clamped)
        if arch == "gemma3":
            info.update(sliding_window=c.sliding_window, layer_types=c.layer_types,
                        final_logit_softcapping=c.final_logit_softcapping,
                        query_pre_attn_scalar=c.query_pre_attn_scalar)
        manifest["models"].append(info)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote {out} ({total} bytes); worst numpy-vs-transformers relative error {worst:.2e}")
    print("transformers' GGUF reader vs the recorded logits (max |diff| over all prompts):")
    for line in roundtrip:
        print("  " + line)


if __name__ == "__main__":
    main()
