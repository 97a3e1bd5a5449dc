"""The GGUF layout of every hybrid (qwen35, qwen35moe, qwen3next) file smelt makes, against
llama.cpp's: the ref-hybrid fixtures (scripts/make-hybrid-fixtures.py) and the
`smelt quantize --random` hybrid presets. Real Qwen3.5 / Qwen3.6 / Qwen3-Next GGUFs come
from llama.cpp's converter, so a file of ours that llama.cpp would refuse means smelt's idea
of the layout has drifted from the one it must read (issue: llama-bench printed no row on
the random qwen3.5-9b file; the fixtures had head_v != head_k and F16 conv kernels).

The expected tensors are computed here from the file's hyper-parameters the way llama.cpp's
loader computes them (facts read from llama.cpp d32676d7: src/models/qwen35.cpp,
qwen35moe.cpp, qwen3next.cpp load_arch_hparams / load_arch_tensors, the loader's
check_tensor_dims and its refusal of unused tensors, ggml's ssm_conv taking F32 kernels
only, conversion/base.py's F32 tensors), not from smelt's code:
  - ssm.state_size is head_k and head_v both (llama.cpp has no head_v of its own), so
    ssm.inner_size must be state_size * time_step_rank;
  - recurrent layers: attn_qkv (n_embd, 2 key_dim + value_dim) and attn_gate (n_embd,
    value_dim), or qwen3next's older ssm_in (n_embd, 2 key_dim + 2 value_dim); ssm_conv1d
    (d_conv, 2 key_dim + value_dim) F32; ssm_dt.bias and ssm_a (n_v_head); ssm_beta and
    ssm_alpha (n_embd, n_v_head), or qwen3next's ssm_ba (n_embd, 2 n_v_head); ssm_norm
    (head_v); ssm_out (value_dim, n_embd);
  - attention layers: attn_q (n_embd, 2 n_head head_dim: q and its gate), attn_k, attn_v,
    attn_output, attn_q_norm / attn_k_norm (head_dim);
  - the MTP layers (nextn_predict_layers, the last of block_count): a full-attention block,
    the model's FFN, nextn.eh_proj (2 n_embd, n_embd), enorm, hnorm, and optionally
    embed_tokens, shared_head_head, shared_head_norm;
  - norms, routers (ffn_gate_inp*), vectors and conv kernels F32; nothing else in the file.
With LLAMA_BIN_DIR set to a llama.cpp build's bin/ folder, llama-bench must also load and
run each file (scripts/check-hybrid-llamacpp.py goes further: logits and greedy tokens).
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

ROOT = Path(__file__).resolve().parents[2]
SMELT = os.environ.get("SMELT_BIN", str(ROOT / "build" / "smelt"))
REF = ROOT / "tests" / "data" / "ref-hybrid"
LLAMA_BIN = os.environ.get("LLAMA_BIN_DIR")
F32_ONLY = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight",
            "ssm_conv1d.weight", "ssm_a", "ssm_dt.bias")


def expected(arch, kv):
    """name -> (ggml shape, required) for a file of arch with metadata kv (key -> value),
    and the names of which at least one group must be present per recurrent layer."""
    def k(suffix, default=None):
        v = kv.get(f"{arch}.{suffix}", default)
        assert v is not None, f"{arch}.{suffix} is missing (llama.cpp requires it)"
        return v
    E, L_all, V = k("embedding_length"), k("block_count"), kv["n_vocab"]
    n_mtp = k("nextn_predict_layers", 0)
    L = L_all - n_mtp
    nh, nkv = k("attention.head_count"), k("attention.head_count_kv")
    hd = k("attention.key_length", E // nh)
    assert k("attention.value_length", hd) == hd
    k("attention.layer_norm_rms_epsilon")
    if arch != "qwen3next":
        assert len(k("rope.dimension_sections")) <= 4
    d_conv, d_inner = k("ssm.conv_kernel"), k("ssm.inner_size")
    d_state, nv, nk = k("ssm.state_size"), k("ssm.time_step_rank"), k("ssm.group_count")
    key_dim, value_dim = d_state * nk, d_state * nv  # head_v = head_k = state_size
    assert d_inner == value_dim, (
        f"ssm.inner_size {d_inner} != state_size {d_state} x time_step_rank {nv}: llama.cpp "
        "reads head_v as state_size")
    conv_dim = 2 * key_dim + value_dim
    recr = kv.get(f"{arch}.attention.recurrent_layers")
    if recr is not None:
        assert len(recr) == L_all
        recr = [bool(x) for x in recr]
    else:
        iv = k("full_attention_interval", 4)
        recr = [i < L and (i + 1) % iv != 0 for i in range(L_all)]
    assert not any(recr[L:]), "an MTP layer must be full attention"
    moe = arch != "qwen35"
    if moe:
        n_exp, n_used = k("expert_count"), k("expert_used_count")
        n_ff_exp = kv.get(f"{arch}.expert_feed_forward_length") or k("feed_forward_length") // n_used
        n_ff_sh = kv.get(f"{arch}.expert_shared_feed_forward_length") or k("feed_forward_length")
    else:
        n_ff = k("feed_forward_length")
    want = {"token_embd.weight": ((E, V), True), "output_norm.weight": ((E,), True),
            "output.weight": ((E, V), False)}
    groups = []

    def add(i, name, shape, req=True):
        want[f"blk.{i}.{name}"] = (tuple(shape), req)
    for i in range(L_all):
        add(i, "attn_norm.weight", (E,))
        add(i, "post_attention_norm.weight", (E,))
        if recr[i]:
            add(i, "attn_qkv.weight", (E, conv_dim), False)
            add(i, "attn_gate.weight", (E, value_dim), False)
            g = [[f"blk.{i}.attn_qkv.weight", f"blk.{i}.attn_gate.weight"]]
            if arch == "qwen3next":
                add(i, "ssm_in.weight", (E, 2 * key_dim + 2 * value_dim), False)
                g.append([f"blk.{i}.ssm_in.weight"])
                add(i, "ssm_ba.weight", (E, 2 * nv))
            else:
                add(i, "ssm_beta.weight", (E, nv))
                add(i, "ssm_alpha.weight", (E, nv))
            groups.append(g)
            add(i, "ssm_conv1d.weight", (d_conv, conv_dim))
            add(i, "ssm_dt.bias", (nv,))
            add(i, "ssm_a", (nv,))
            add(i, "ssm_norm.weight", (d_state,))
            add(i, "ssm_out.weight", (value_dim, E))
        else:
            add(i, "attn_q.weight", (E, hd * nh * 2))
            add(i, "attn_k.weight", (E, hd * nkv))
            add(i, "attn_v.weight", (E, hd * nkv))
            add(i, "attn_output.weight", (hd * nh, E))
            add(i, "attn_q_norm.weight", (hd,))
            add(i, "attn_k_norm.weight", (hd,))
        if moe:
            add(i, "ffn_gate_inp.weight", (E, n_exp))
            add(i, "ffn_gate_exps.weight", (E, n_ff_exp, n_exp))
            add(i, "ffn_up_exps.weight", (E, n_ff_exp, n_exp))
            add(i, "ffn_down_exps.weight", (n_ff_exp, E, n_exp))
            add(i, "ffn_gate_inp_shexp.weight", (E,))
            add(i, "ffn_gate_shexp.weight", (E, n_ff_sh))
            add(i, "ffn_up_shexp.weight", (E, n_ff_sh))
            add(i, "ffn_down_shexp.weight", (n_ff_sh, E))
        else:
            add(i, "ffn_gate.weight", (E, n_ff))
            add(i, "ffn_up.weight", (E, n_ff))
            add(i, "ffn_down.weight", (n_ff, E))
        if i >= L:
            add(i, "nextn.eh_proj.weight", (2 * E, E))
            add(i, "nextn.enorm.weight", (E,))
            add(i, "nextn.hnorm.weight", (E,))
            add(i, "nextn.embed_tokens.weight", (E, V), False)
            add(i, "nextn.shared_head_head.weight", (E, V), False)
            add(i, "nextn.shared_head_norm.weight", (E,), False)
    return want, groups


def check_layout(arch, kv, tensors):
    """tensors: name -> (ggml shape, type name). Asserts llama.cpp's loader would take them."""
    want, groups = expected(arch, kv)
    errs = []
    for name, (shape, ty) in tensors.items():
        shape = tuple(int(x) for x in shape)
        while len(shape) > 1 and shape[-1] == 1:  # ggml ignores trailing 1s
            shape = shape[:-1]
        if name not in want:
            errs.append(f"{name}: not a tensor llama.cpp's {arch} loads (it refuses the file)")
        elif shape != want[name][0]:
            errs.append(f"{name}: shape {shape}, llama.cpp expects {want[name][0]}")
        if name.endswith(F32_ONLY) and ty != "F32":
            errs.append(f"{name}: {ty}, llama.cpp's converter writes F32")
    errs += [f"{n}: missing" for n, (_, req) in want.items() if req and n not in tensors]
    for g in groups:
        if not any(all(n in tensors for n in alt) for alt in g):
            errs.append(f"none of {g} is present")
    assert not errs, "\n".join(errs[:20])


def read(path):
    r = gguf.GGUFReader(str(path))
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("tokenizer.")}
    kv["n_vocab"] = len(r.fields["tokenizer.ggml.tokens"].data)
    arch = kv["general.architecture"]
    return arch, kv, {t.name: (list(t.shape), t.tensor_type.name) for t in r.tensors}


def llama_bench(path):
    exe = Path(LLAMA_BIN or "") / "llama-bench"
    if not LLAMA_BIN or not exe.exists():
        return
    r = subprocess.run([str(exe), "-m", str(path), "-p", "8", "-n", "2", "-r", "1", "-t", "2"],
                       capture_output=True, text=True, timeout=600)
    rows = [ln for ln in r.stdout.splitlines() if ln.startswith("| ") and "pp8" in ln]
    assert r.returncode == 0 and rows, r.stderr[-2000:]


FIXTURES = [f["file"] for m in json.loads((REF / "manifest.json").read_text())["models"]
            for f in m["files"].values()]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_layout_is_llamacpps(name):
    check_layout(*read(REF / name))
    llama_bench(REF / name)


def smelt_quantize(*args):
    if not os.path.exists(SMELT):
        pytest.skip(f"SKIP smelt binary not built ({SMELT})")
    r = subprocess.run([SMELT, "quantize", *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("qtype", ["F16", "Q4_K_M"])
def test_random_tiny_qwen35moe_layout_is_llamacpps(tmp_path, qtype):
    out = tmp_path / "tiny.gguf"
    smelt_quantize("--random", "tiny-qwen35moe", out, qtype, "--threads", "2")
    check_layout(*read(out))
    llama_bench(out)


# The big presets' hyper-parameters from their public configs (Qwen/Qwen3.5-9B,
# Qwen/Qwen3.5-35B-A3B: text_config), as their converted GGUFs hold them; the tensors from
# the preset's plan (--dry-run writes nothing).
PRESETS = {
    "qwen3.5-9b": ("qwen35", {"embedding_length": 4096, "block_count": 33,
                              "nextn_predict_layers": 1, "attention.head_count": 16,
                              "attention.head_count_kv": 4, "attention.key_length": 256,
                              "attention.value_length": 256, "feed_forward_length": 12288,
                              "full_attention_interval": 4}),
    "qwen3.5-35b-a3b": ("qwen35moe", {"embedding_length": 2048, "block_count": 41,
                                      "nextn_predict_layers": 1, "attention.head_count": 16,
                                      "attention.head_count_kv": 2, "attention.key_length": 256,
                                      "attention.value_length": 256, "expert_count": 256,
                                      "expert_used_count": 8, "expert_feed_forward_length": 512,
                                      "expert_shared_feed_forward_length": 512,
                                      "full_attention_interval": 4}),
}
SSM = {"ssm.conv_kernel": 4, "ssm.state_size": 128, "ssm.group_count": 16,
       "ssm.time_step_rank": 32, "ssm.inner_size": 4096, "attention.layer_norm_rms_epsilon": 1e-6,
       "rope.dimension_sections": [11, 11, 10, 0]}


@pytest.mark.parametrize("preset", list(PRESETS))
def test_random_preset_plan_is_llamacpps(preset):
    arch, hp = PRESETS[preset]
    kv = {f"{arch}.{k}": v for k, v in {**hp, **SSM}.items()}
    kv["n_vocab"] = 248320
    rows = {}
    for line in smelt_quantize("--random", preset, "/nonexistent.gguf", "Q4_K_M",
                               "--dry-run").splitlines()[:-1]:
        p = line.split()
        rows[p[0]] = ([int(x) for x in p[1].split("x")], p[4])
    check_layout(arch, kv, rows)
