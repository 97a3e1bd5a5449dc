#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/fuzz_model.c: tiny GGUF models (a few KiB) of every
architecture smelt loads, random weights, no tokenizer (the vocabulary is token_embd's
rows). Committed under fuzz/corpus/model; rerun after adding an architecture.

    python3 scripts/make-fuzz-model-seeds.py [--out fuzz/corpus/model]
"""
import argparse
import pathlib

import gguf
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
E, FF, V, H, HKV, HD = 8, 8, 8, 2, 1, 4


def mat(rng, n_out, n_in):
    return (rng.standard_normal((n_out, n_in)) * 0.5).astype(np.float32)


def vec(rng, n, base=1.0):
    return (base + 0.1 * rng.standard_normal(n)).astype(np.float32)


def common(w, arch, n_layer):
    w.add_context_length(64)
    w.add_embedding_length(E)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_layer_norm_rms_eps(1e-6)


def attn(w, rng, i, q_mult=1, norms=False):
    w.add_tensor(f"blk.{i}.attn_q.weight", mat(rng, H * HD * q_mult, E))
    w.add_tensor(f"blk.{i}.attn_k.weight", mat(rng, HKV * HD, E))
    w.add_tensor(f"blk.{i}.attn_v.weight", mat(rng, HKV * HD, E))
    w.add_tensor(f"blk.{i}.attn_output.weight", mat(rng, E, H * HD))
    if norms:
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", vec(rng, HD))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", vec(rng, HD))


def ffn(w, rng, i):
    w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(rng, FF, E))
    w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, FF, E))
    w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, E, FF))


def llama(path, rng, arch="llama"):
    w = gguf.GGUFWriter(str(path), arch)
    common(w, arch, 2)
    w.add_tensor("token_embd.weight", mat(rng, V, E))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", vec(rng, E))
        attn(w, rng, i, norms=arch in ("qwen3", "gemma3"))
        if arch == "qwen2":
            for t, n in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD)):
                w.add_tensor(f"blk.{i}.attn_{t}.bias", vec(rng, n, 0.0))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", vec(rng, E))
        if arch == "gemma3":
            w.add_tensor(f"blk.{i}.post_attention_norm.weight", vec(rng, E))
            w.add_tensor(f"blk.{i}.post_ffw_norm.weight", vec(rng, E))
        ffn(w, rng, i)
    if arch == "gemma3":
        w.add_sliding_window(4)
    w.add_tensor("output_norm.weight", vec(rng, E))
    return w


def moe_ffn(w, rng, i):
    """4 experts of 4, 2 per token, a shared expert of 4 with its gate."""
    w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", mat(rng, 4, E))
    for t in ("gate", "up"):
        w.add_tensor(f"blk.{i}.ffn_{t}_exps.weight", np.stack([mat(rng, 4, E) for _ in range(4)]))
    w.add_tensor(f"blk.{i}.ffn_down_exps.weight", np.stack([mat(rng, E, 4) for _ in range(4)]))
    w.add_tensor(f"blk.{i}.ffn_gate_inp_shexp.weight", mat(rng, 1, E))
    w.add_tensor(f"blk.{i}.ffn_gate_shexp.weight", mat(rng, 4, E))
    w.add_tensor(f"blk.{i}.ffn_up_shexp.weight", mat(rng, 4, E))
    w.add_tensor(f"blk.{i}.ffn_down_shexp.weight", mat(rng, E, 4))


def qwen35(path, rng, mtp, arch="qwen35", ssm_in=False):
    """qwen35, qwen35moe (MoE FFN with a shared expert) or qwen3next (that FFN, packed
    projections: attn_qkv + attn_gate or ssm_in, and ssm_ba)."""
    nk, hk, nv, hv, dc = 1, 4, 2, 4, 3
    ch = 2 * nk * hk + nv * hv
    w = gguf.GGUFWriter(str(path), arch)
    common(w, arch, 2 + mtp)
    w.add_rope_dimension_count(2)
    if arch != "qwen3next":
        w.add_rope_dimension_sections([1, 0, 0, 0])
    if arch != "qwen35":
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(4)
        w.add_expert_shared_feed_forward_length(4)
    w.add_ssm_conv_kernel(dc)
    w.add_ssm_state_size(hk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(nv * hv)
    w.add_full_attention_interval(2)
    if mtp:
        w.add_nextn_predict_layers(1)
    w.add_tensor("token_embd.weight", mat(rng, V, E))
    for i in range(2 + mtp):
        w.add_tensor(f"blk.{i}.attn_norm.weight", vec(rng, E))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", vec(rng, E))
        if i == 0:
            if ssm_in:
                w.add_tensor("blk.0.ssm_in.weight", mat(rng, ch + nv * hv, E))
            else:
                w.add_tensor("blk.0.attn_qkv.weight", mat(rng, ch, E))
                w.add_tensor("blk.0.attn_gate.weight", mat(rng, nv * hv, E))
            w.add_tensor("blk.0.ssm_conv1d.weight", mat(rng, ch, dc))
            w.add_tensor("blk.0.ssm_dt.bias", vec(rng, nv, 0.0))
            w.add_tensor("blk.0.ssm_a", -vec(rng, nv))
            if arch == "qwen3next":
                w.add_tensor("blk.0.ssm_ba.weight", mat(rng, 2 * nv, E))
            else:
                w.add_tensor("blk.0.ssm_beta.weight", mat(rng, nv, E))
                w.add_tensor("blk.0.ssm_alpha.weight", mat(rng, nv, E))
            w.add_tensor("blk.0.ssm_norm.weight", vec(rng, hv))
            w.add_tensor("blk.0.ssm_out.weight", mat(rng, E, nv * hv))
        else:
            attn(w, rng, i, q_mult=2, norms=True)
        if i == 2:
            w.add_tensor("blk.2.nextn.eh_proj.weight", mat(rng, E, 2 * E))
            w.add_tensor("blk.2.nextn.enorm.weight", vec(rng, E))
            w.add_tensor("blk.2.nextn.hnorm.weight", vec(rng, E))
        if arch == "qwen35":
            ffn(w, rng, i)
        else:
            moe_ffn(w, rng, i)
    w.add_tensor("output_norm.weight", vec(rng, E))
    w.add_tensor("output.weight", mat(rng, V, E))
    return w


def moe(path, rng, arch):
    """qwen3moe, or gpt-oss (biases, sinks, post_attention_norm, window, YaRN): 4 experts
    of FF, 2 per token."""
    oai = arch == "gpt-oss"
    n_exp, n_used = 4, 2
    w = gguf.GGUFWriter(str(path), arch)
    common(w, arch, 2)
    w.add_expert_count(n_exp)
    w.add_expert_used_count(n_used)
    w.add_expert_feed_forward_length(FF)
    if oai:
        w.add_sliding_window(2)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(16)
    w.add_tensor("token_embd.weight", mat(rng, V, E))
    for i in range(2):
        w.add_tensor(f"blk.{i}.attn_norm.weight", vec(rng, E))
        attn(w, rng, i, norms=not oai)
        norm = "post_attention_norm" if oai else "ffn_norm"
        w.add_tensor(f"blk.{i}.{norm}.weight", vec(rng, E))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", mat(rng, n_exp, E))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", mat(rng, n_exp * FF, E).reshape(n_exp, FF, E))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", mat(rng, n_exp * FF, E).reshape(n_exp, FF, E))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", mat(rng, n_exp * E, FF).reshape(n_exp, E, FF))
        if oai:
            for t, n in (("q", H * HD), ("k", HKV * HD), ("v", HKV * HD), ("output", E)):
                w.add_tensor(f"blk.{i}.attn_{t}.bias", vec(rng, n, 0.0))
            w.add_tensor(f"blk.{i}.attn_sinks.weight", vec(rng, H, 0.0))
            w.add_tensor(f"blk.{i}.ffn_gate_inp.bias", vec(rng, n_exp, 0.0))
            for t, n in (("gate", FF), ("up", FF), ("down", E)):
                w.add_tensor(f"blk.{i}.ffn_{t}_exps.bias", mat(rng, n_exp, n))
    w.add_tensor("output_norm.weight", vec(rng, E))
    w.add_tensor("output.weight", mat(rng, V, E))
    return w


def bert(path, rng):
    """An encoder embedding model (mean pooling): LayerNorms with biases, learned positions."""
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_context_length(64)
    w.add_embedding_length(E)
    w.add_block_count(2)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_tensor("token_embd.weight", mat(rng, V, E))
    w.add_tensor("token_types.weight", mat(rng, 2, E))
    w.add_tensor("position_embd.weight", mat(rng, 64, E))
    w.add_tensor("token_embd_norm.weight", vec(rng, E))
    w.add_tensor("token_embd_norm.bias", vec(rng, E, 0.0))
    for i in range(2):
        for t, n in (("attn_q", E), ("attn_k", E), ("attn_v", E), ("attn_output", E)):
            w.add_tensor(f"blk.{i}.{t}.weight", mat(rng, n, E))
            w.add_tensor(f"blk.{i}.{t}.bias", vec(rng, n, 0.0))
        for t in ("attn_output_norm", "layer_output_norm"):
            w.add_tensor(f"blk.{i}.{t}.weight", vec(rng, E))
            w.add_tensor(f"blk.{i}.{t}.bias", vec(rng, E, 0.0))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(rng, FF, E))
        w.add_tensor(f"blk.{i}.ffn_up.bias", vec(rng, FF, 0.0))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(rng, E, FF))
        w.add_tensor(f"blk.{i}.ffn_down.bias", vec(rng, E, 0.0))
    return w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "fuzz" / "corpus" / "model"))
    out = pathlib.Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    writers = [llama(out / f"{a}.gguf", rng, a) for a in ("llama", "qwen2", "qwen3", "gemma3")]
    writers += [qwen35(out / "qwen35.gguf", rng, 0), qwen35(out / "qwen35-mtp.gguf", rng, 1)]
    writers += [moe(out / f"{a}.gguf", rng, a) for a in ("qwen3moe", "gpt-oss")]
    writers += [qwen35(out / "qwen35moe-mtp.gguf", rng, 1, "qwen35moe"),
                qwen35(out / "qwen3next.gguf", rng, 0, "qwen3next"),
                qwen35(out / "qwen3next-ssm_in.gguf", rng, 1, "qwen3next", ssm_in=True)]
    writers += [bert(out / "bert.gguf", rng), llama(out / "qwen3emb.gguf", rng, "qwen3")]
    writers[-1].add_pooling_type(gguf.PoolingType.LAST)  # a decoder embedding model
    for w in writers:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    print(f"wrote {len(writers)} seeds to {out}")


if __name__ == "__main__":
    main()
