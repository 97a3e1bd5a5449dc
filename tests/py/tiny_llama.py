"""Tiny random llama GGUF files written with gguf-py, of any vocabulary size (the server tests
serve several at once: different vocabularies make a request routed to the wrong model
visible). The vocabulary is the synthetic SentencePiece one `smelt quantize --random` writes
(<unk> <s> </s>, 256 byte tokens, then "\u2581t0", "\u2581t1", ...); the weights are
N(0, 0.02) from a seeded generator, F32; heads of 64 (a size every backend's attention
takes)."""
import numpy as np

import gguf


def write_tiny_llama(path, n_vocab, seed=0, sampling=None, n_embd=128, n_layer=1, n_head=2,
                     n_head_kv=1, n_ff=256, n_ctx=4096, chat_template=None):
    """Writes the model to path; sampling: {"temp": 0.0, "top_k": 1, ...} as
    general.sampling.* keys (temp, top_p, min_p, penalty_repeat: f32; top_k: u32;
    penalty_last_n: i32)."""
    assert n_vocab > 259
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"tiny-v{n_vocab}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(n_vocab)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += ["\u2581t%d" % i for i in range(n_vocab - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (n_vocab - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(n_vocab - 259)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for k, v in (sampling or {}).items():
        key = "general.sampling." + k
        if k == "top_k":
            w.add_uint32(key, v)
        elif k == "penalty_last_n":
            w.add_int32(key, v)
        else:
            w.add_float32(key, v)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def norm(n):
        return (1.0 + rng.standard_normal(n) * 0.05).astype(np.float32)

    hd = n_embd // n_head
    w.add_tensor("token_embd.weight", mat(n_vocab, n_embd))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(n_embd))
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff))
    w.add_tensor("output_norm.weight", norm(n_embd))
    w.add_tensor("output.weight", mat(n_vocab, n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
