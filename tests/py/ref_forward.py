"""Independent numpy reference forward pass that reads a GGUF file directly.

    python3 tests/py/ref_forward.py MODEL.gguf ID [ID ...]    # prints top-5 per position

Architectures: llama, qwen2, qwen3, gemma3 (dense decoders), qwen3moe and gpt-oss (mixtures
of experts). It reads weights with
gguf-py (GGUFReader + gguf.quants.dequantize, so F32, F16, BF16 and the quantized types
gguf-py knows all work) and follows llama.cpp's GGUF conventions, not Hugging Face's:

- weights are stored {in, out} in GGUF order, i.e. numpy arrays of shape (out, in);
  y = x @ W.T.
- llama uses "normal" RoPE (GGML mode 0): rotates adjacent pairs (x[2i], x[2i+1]); the HF
  converter permuted the rows of attn_q/attn_k so this equals HF's rotate_half.
  qwen2, qwen3, gemma3 use NeoX RoPE: pairs (x[i], x[i + d/2]), nothing permuted.
  An optional rope_freqs tensor (llama3 scaling) divides each frequency: theta_i / f_i.
- RoPE scaling from {arch}.rope.scaling.* (Hugging Face transformers' definitions, written
  by llama.cpp's converter as type/factor/original_context_length, plus yarn_beta_fast,
  yarn_beta_slow, yarn_attn_factor when the HF config sets them):
  linear: every frequency / factor.
  yarn: with low = floor(c(beta_fast)), high = ceil(c(beta_slow)) clamped to [0, d-1],
  where c(r) = d ln(L_orig / (2 pi r)) / (2 ln base) is the pair index whose wavelength
  fits r times into the original context L_orig; ramp_i = clamp((i - low) / (high - low),
  0, 1) (high += 0.001 when equal); frequency_i = f_i / factor * ramp_i + f_i (1 - ramp_i)
  (pairs below low keep their frequency, pairs above high are interpolated); cos and sin
  are multiplied by attention_factor = yarn_attn_factor if given, else 1 + 0.1 ln(factor).
- gemma3: input embeddings × sqrt(n_embd); norm weights already include Gemma's "+1"
  (folded by the converter) so every RMSNorm is x̂·w; attn_q_norm/attn_k_norm per head
  before RoPE; post_attention_norm / post_ffw_norm on the branch outputs; GELU (tanh)
  gate; layer i is sliding-window when i % 6 < 5 (or per `attention.sliding_window_pattern`
  if present), where a key is hidden when pos_q - pos_k >= sliding_window; local layers use
  rope.freq_base_swa (default 10000), global ones rope.freq_base; attention scale
  1/sqrt(head_dim) (llama.cpp's choice; HF's query_pre_attn_scalar equals head_dim in the
  fixtures and in Gemma 3 270M); final tanh softcap when final_logit_softcapping is set.
- qwen3: attn_q_norm/attn_k_norm per head before RoPE, no biases. qwen2: q/k/v biases.
- qwen3moe: qwen3's attention; the FFN of every layer is a mixture of experts: router
  logits h @ ffn_gate_inp.T, softmax over all experts, the expert_used_count largest,
  their probabilities renormalized to sum 1 (always: qwen3moe has no key for it); the
  output is the weighted sum of those experts' down(silu(gate h) * up h), with expert e's
  matrices the slices [e] of ffn_{gate,up,down}_exps (numpy (n_expert, out, in)).
- gpt-oss: q/k/v biases and attn_output.bias; attn_sinks (n_head) is one more logit in
  each head's softmax, with no value; layer i is sliding-window when i % pattern <
  pattern - 1 (`attention.sliding_window_pattern`, default 2), with rope.freq_base_swa
  (default rope.freq_base) and the same scaling; YaRN's correction range is not rounded
  (gpt-oss's HF config has truncate = False; GGUF has no key for it, so it goes with the
  architecture); post_attention_norm is the FFN's pre-norm; the router has a bias
  (ffn_gate_inp.bias), its k largest logits are softmaxed among themselves; an expert is
  down(act(gate h + gb, up h + ub)) + db with act(g, u) = g' sigmoid(1.702 g') (u' + 1),
  g' = min(g, 7), u' = clamp(u, -7, 7) (the constants have no GGUF key either).
- output is `output.weight`, or token_embd when absent (tied).

Computation is float64 for a clean reference. Shapes: ids (n,) -> logits (n, n_vocab).
This file is a reference for tests and debugging, not a product: it is O(n²) and holds the
whole model dequantized in memory.
"""
from __future__ import annotations

import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the tests skip when gguf is absent
    gguf = None


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


class RefModel:
    def __init__(self, path: str):
        if gguf is None:
            raise ImportError("ref_forward needs the gguf package (pip install gguf)")
        r = gguf.GGUFReader(path)
        self.arch = a = _field(r, "general.architecture")
        if a not in ("llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "gpt-oss"):
            raise ValueError(f"{path}: unsupported architecture {a!r}")
        self.n_embd = _field(r, f"{a}.embedding_length")
        self.n_layer = _field(r, f"{a}.block_count")
        self.n_head = _field(r, f"{a}.attention.head_count")
        self.n_head_kv = _field(r, f"{a}.attention.head_count_kv", self.n_head)
        self.head_dim = _field(r, f"{a}.attention.key_length", self.n_embd // self.n_head)
        self.eps = _field(r, f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
        self.rope_base = _field(r, f"{a}.rope.freq_base", 10000.0)
        self.rope_base_swa = _field(r, f"{a}.rope.freq_base_swa",
                                    self.rope_base if a == "gpt-oss" else 10000.0)
        self.rope_dim = _field(r, f"{a}.rope.dimension_count", self.head_dim)
        self.sliding_window = _field(r, f"{a}.attention.sliding_window")
        self.swa_pattern = _field(r, f"{a}.attention.sliding_window_pattern",
                                  2 if a == "gpt-oss" else 6)
        self.yarn_truncate = a != "gpt-oss"
        self.softcap = _field(r, f"{a}.final_logit_softcapping")
        self.scaling = _field(r, f"{a}.rope.scaling.type", "none")
        self.scale_factor = _field(r, f"{a}.rope.scaling.factor", 1.0)
        self.orig_ctx = _field(r, f"{a}.rope.scaling.original_context_length",
                               _field(r, f"{a}.context_length"))
        self.beta_fast = _field(r, f"{a}.rope.scaling.yarn_beta_fast", 32.0)
        self.beta_slow = _field(r, f"{a}.rope.scaling.yarn_beta_slow", 1.0)
        self.yarn_attn_factor = _field(r, f"{a}.rope.scaling.yarn_attn_factor")
        self.n_expert_used = _field(r, f"{a}.expert_used_count")
        if self.scaling not in ("none", "linear", "yarn"):
            raise ValueError(f"{path}: rope scaling {self.scaling!r} is not supported")
        self.t = {}
        for t in r.tensors:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            self.t[t.name] = np.asarray(w, dtype=np.float64).reshape(
                [int(x) for x in reversed(t.shape)])
        self.n_vocab = self.t["token_embd.weight"].shape[0]

    def is_local(self, il: int) -> bool:
        if self.arch not in ("gemma3", "gpt-oss") or not self.sliding_window:
            return False
        pat = self.swa_pattern
        if isinstance(pat, (list, tuple)):  # array form: true = sliding
            return bool(pat[il])
        return il % pat < pat - 1

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope_freqs(self, base, scaled):
        """(inverse frequencies (d/2,), cos/sin multiplier) of a layer; scaled: whether the
        file's rope scaling applies (gemma3's sliding layers are never scaled)."""
        d = self.rope_dim
        inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        ff = self.t.get("rope_freqs.weight")
        if ff is not None:
            inv = inv / ff
        if not scaled or self.scaling == "none":
            return inv, 1.0
        s = self.scale_factor
        if self.scaling == "linear":
            return inv / s, 1.0
        # yarn
        def corr(rot):
            return d * np.log(self.orig_ctx / (rot * 2 * np.pi)) / (2 * np.log(base))
        low, high = corr(self.beta_fast), corr(self.beta_slow)
        if self.yarn_truncate:
            low, high = np.floor(low), np.ceil(high)
        low, high = max(low, 0.0), min(high, d - 1.0)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0.0, 1.0)
        inv = inv / s * ramp + inv * (1 - ramp)
        if self.yarn_attn_factor is not None:
            mscale = self.yarn_attn_factor
        else:
            mscale = 1.0 + 0.1 * np.log(s) if s > 1 else 1.0
        return inv, mscale

    def rope(self, x, pos, base, scaled=True):
        """x: (n, heads, head_dim); rotates the first rope_dim dims."""
        d = self.rope_dim
        inv, mscale = self.rope_freqs(base, scaled)
        ang = pos[:, None] * inv[None, :]           # (n, d/2)
        cos = np.cos(ang)[:, None, :] * mscale
        sin = np.sin(ang)[:, None, :] * mscale
        out = x.copy()
        if self.arch == "llama":                    # normal: adjacent pairs
            x0, x1 = x[..., 0:d:2], x[..., 1:d:2]
            out[..., 0:d:2] = x0 * cos - x1 * sin
            out[..., 1:d:2] = x0 * sin + x1 * cos
        else:                                       # neox: halves
            h = d // 2
            x0, x1 = x[..., :h], x[..., h:d]
            out[..., :h] = x0 * cos - x1 * sin
            out[..., h:d] = x0 * sin + x1 * cos
        return out

    def glu(self, h, wg, wu, wd, bias=None):
        gate, up = h @ wg.T, h @ wu.T
        if self.arch == "gpt-oss":
            gb, ub, db = bias
            g = np.minimum(gate + gb, 7.0)
            u = np.clip(up + ub, -7.0, 7.0)
            return (g / (1 + np.exp(-1.702 * g)) * (u + 1)) @ wd.T + db
        if self.arch == "gemma3":
            act = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
        else:
            act = gate / (1 + np.exp(-gate))
        return (act * up) @ wd.T

    def moe(self, h, p):
        """Mixture of experts on the normed rows h (n, n_embd)."""
        T, k = self.t, self.n_expert_used
        logits = h @ T[p + "ffn_gate_inp.weight"].T          # (n, n_expert)
        if self.arch == "gpt-oss":  # biased logits, softmax over the k largest
            logits = logits + T[p + "ffn_gate_inp.bias"]
            out = np.zeros_like(h)
            for i in range(h.shape[0]):
                top = np.argsort(-logits[i], kind="stable")[:k]
                w = np.exp(logits[i, top] - logits[i, top].max())
                w /= w.sum()
                for e, we in zip(top, w):
                    bias = [T[p + f"ffn_{x}_exps.bias"][e] for x in ("gate", "up", "down")]
                    out[i] += we * self.glu(h[i:i + 1], T[p + "ffn_gate_exps.weight"][e],
                                            T[p + "ffn_up_exps.weight"][e],
                                            T[p + "ffn_down_exps.weight"][e], bias)[0]
            return out
        prob = np.exp(logits - logits.max(axis=1, keepdims=True))
        prob /= prob.sum(axis=1, keepdims=True)
        out = np.zeros_like(h)
        for i in range(h.shape[0]):
            top = np.argsort(-prob[i], kind="stable")[:k]
            w = prob[i, top] / prob[i, top].sum()
            for e, we in zip(top, w):
                out[i] += we * self.glu(h[i:i + 1], T[p + "ffn_gate_exps.weight"][e],
                                        T[p + "ffn_up_exps.weight"][e],
                                        T[p + "ffn_down_exps.weight"][e])[0]
        return out

    def forward(self, ids, return_hidden=False):
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        pos = np.arange(n, dtype=np.float64)
        T = self.t
        x = T["token_embd.weight"][ids]
        if self.arch == "gemma3":
            x = x * np.sqrt(self.n_embd)
        H, Hkv, hd = self.n_head, self.n_head_kv, self.head_dim
        hidden = [x]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self.rmsnorm(x, T[p + "attn_norm.weight"])
            q = h @ T[p + "attn_q.weight"].T
            k = h @ T[p + "attn_k.weight"].T
            v = h @ T[p + "attn_v.weight"].T
            if p + "attn_q.bias" in T:
                q = q + T[p + "attn_q.bias"]
                k = k + T[p + "attn_k.bias"]
                v = v + T[p + "attn_v.bias"]
            q, k, v = q.reshape(n, H, hd), k.reshape(n, Hkv, hd), v.reshape(n, Hkv, hd)
            if p + "attn_q_norm.weight" in T:
                q = self.rmsnorm(q, T[p + "attn_q_norm.weight"])
                k = self.rmsnorm(k, T[p + "attn_k_norm.weight"])
            local = self.is_local(il)
            base = self.rope_base_swa if local else self.rope_base
            scaled = not local or self.arch == "gpt-oss"
            q, k = self.rope(q, pos, base, scaled), self.rope(k, pos, base, scaled)
            # mask: causal, plus the sliding window on local layers
            dq = pos[:, None] - pos[None, :]
            visible = dq >= 0
            if local:
                visible &= dq < self.sliding_window
            g = H // Hkv
            att = np.empty((n, H, hd))
            for hh in range(H):
                s = q[:, hh, :] @ k[:, hh // g, :].T / np.sqrt(hd)
                s = np.where(visible, s, -np.inf)
                sink = T[p + "attn_sinks.weight"][hh] if p + "attn_sinks.weight" in T else -np.inf
                mx = np.maximum(s.max(axis=1, keepdims=True), sink)
                s = np.exp(s - mx)
                s /= s.sum(axis=1, keepdims=True) + np.exp(sink - mx)
                att[:, hh, :] = s @ v[:, hh // g, :]
            o = att.reshape(n, H * hd) @ T[p + "attn_output.weight"].T
            if p + "attn_output.bias" in T:
                o = o + T[p + "attn_output.bias"]
            if self.arch == "gemma3":
                o = self.rmsnorm(o, T[p + "post_attention_norm.weight"])
            x = x + o
            ffn_norm = "post_attention_norm" if self.arch == "gpt-oss" else "ffn_norm"
            h = self.rmsnorm(x, T[p + ffn_norm + ".weight"])
            if p + "ffn_gate_inp.weight" in T:
                f = self.moe(h, p)
            else:
                f = self.glu(h, T[p + "ffn_gate.weight"], T[p + "ffn_up.weight"],
                             T[p + "ffn_down.weight"])
            if p + "post_ffw_norm.weight" in T:
                f = self.rmsnorm(f, T[p + "post_ffw_norm.weight"])
            x = x + f
            hidden.append(x)
        x = self.rmsnorm(x, T["output_norm.weight"])
        out_w = T.get("output.weight", T["token_embd.weight"])
        logits = x @ out_w.T
        if self.softcap:
            logits = self.softcap * np.tanh(logits / self.softcap)
        return (logits, hidden) if return_hidden else logits


def main(argv):
    if len(argv) < 3:
        print(__doc__.split("\n\n")[0])
        return 2
    m = RefModel(argv[1])
    ids = [int(x) for x in argv[2:]]
    logits = m.forward(ids)
    for i, row in enumerate(logits):
        top = np.argsort(-row)[:5]
        print(i, ids[i], " ".join(f"{t}:{row[t]:.4f}" for t in top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
