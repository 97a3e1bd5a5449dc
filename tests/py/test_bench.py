"""`smelt bench` against llama-bench's documented interface (tools/llama-bench/README.md and
its printers): the flags (comma lists, repeated flags, ranges, -pg pairs), the test order
(pp, tg, pg for each -t/-b/-ub/-d combination), the md table's columns and formats, and
the json/jsonl/csv fields. Figures are checked against an independent reading of the file
(gguf-py: size, parameters, KV bytes) and of the samples (statistics: mean, sample
standard deviation). Runs on the CPU backend with a tiny random-weight fixture."""
import csv
import io
import json
import os
import pathlib
import re
import statistics
import subprocess

import gguf
import pytest

SMELT = os.environ.get("SMELT_BIN", "build/smelt")
ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "data" / "ref" / "qwen2-f32.gguf"

FIELDS = ["build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
          "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads",
          "type_k", "type_v", "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth",
          "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "n_seqs", "bw_pct", "bw_gbs"]


def git_head():
    """(short commit, commit count) of the checkout, or ("unknown", 0) outside a git clone:
    what the binary must report when it was built from this tree (cmake/build_info.cmake)."""
    try:
        c = subprocess.run(["git", "rev-parse", "--short=8", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        n = subprocess.run(["git", "rev-list", "--count", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ("unknown", 0)
    if c.returncode or n.returncode:
        return ("unknown", 0)
    return (c.stdout.strip(), int(n.stdout.strip()))


HEAD = git_head()


def test_version_names_the_commit():
    r = subprocess.run([SMELT, "--version"], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0
    assert re.fullmatch(r"smelt \S+ \(commit %s, build %d\)\n" % HEAD, r.stdout), r.stdout


def bench(*args, check=True, model=TINY):
    r = subprocess.run([SMELT, "bench", "-m", str(model), "--backend", "cpu", "-t", "1",
                        *map(str, args)], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def bench_json(*args, model=TINY):
    return json.loads(bench("-o", "json", *args, model=model).stdout)


def test_json_fields_and_statistics():
    rows = bench_json("-p", "16", "-n", "4", "-r", "3")
    assert [(r["n_prompt"], r["n_gen"]) for r in rows] == [(16, 0), (0, 4)]
    reader = gguf.GGUFReader(TINY)
    size = sum(int(t.n_bytes) for t in reader.tensors)
    params = sum(int(t.n_elements) for t in reader.tensors)
    for r in rows:
        assert list(r)[:len(FIELDS)] == FIELDS and list(r)[len(FIELDS):] == ["samples_ns", "samples_ts"]
        assert r["model_size"] == size and r["model_n_params"] == params
        assert r["model_type"] == "qwen2 ?B all F32"  # arch, size label, llama.cpp's ftype name
        assert r["backends"] == "CPU" and r["n_threads"] == 1 and r["n_depth"] == 0
        assert r["n_batch"] == 2048 and r["n_ubatch"] == 512 and r["type_k"] == "f16"
        assert r["build_commit"] == HEAD[0] and r["build_number"] == HEAD[1]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", r["test_time"])
        ns, ts = r["samples_ns"], r["samples_ts"]
        assert len(ns) == 3 and len(ts) == 3
        n_tok = r["n_prompt"] + r["n_gen"]
        for a, b in zip(ns, ts):
            assert b == pytest.approx(1e9 * n_tok / a, rel=1e-5)
        assert r["avg_ns"] == pytest.approx(statistics.mean(ns), abs=1)
        assert r["stddev_ns"] == pytest.approx(statistics.stdev(ns), abs=1)
        assert r["avg_ts"] == pytest.approx(statistics.mean(ts), rel=1e-4)
        assert r["stddev_ts"] == pytest.approx(statistics.stdev(ts), rel=1e-3, abs=1e-3)
        assert r["bw_pct"] is None and r["bw_gbs"] is None  # no bandwidth on the CPU unless --bw


def test_lists_ranges_and_order():
    rows = bench_json("-p", "8-32*2", "-n", "2,3", "-n", "4", "-pg", "8,2", "-pg", "4,1",
                      "-d", "0,4", "-r", "1")
    got = [(r["n_depth"], r["n_prompt"], r["n_gen"]) for r in rows]
    want = []
    for d in (0, 4):  # for each depth: pp tests, tg tests, pg tests
        want += [(d, p, 0) for p in (8, 16, 32)] + [(d, 0, g) for g in (2, 3, 4)]
        want += [(d, 8, 2), (d, 4, 1)]
    assert got == want
    rows = bench_json("-p", "0", "-n", "2", "-b", "8,16", "-ub", "4", "-r", "1")
    assert [(r["n_batch"], r["n_ubatch"], r["n_gen"]) for r in rows] == [(8, 4, 2), (16, 4, 2)]


def test_threads_list():
    r = subprocess.run([SMELT, "bench", "-m", str(TINY), "--backend", "cpu", "-t", "1,2",
                        "-p", "0", "-n", "2", "-r", "1", "-o", "jsonl"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["n_threads"] for x in rows] == [1, 2]


def test_md_table():
    out = bench("-p", "16", "-n", "4", "-pg", "8,2", "-d", "0,8", "-r", "1").stdout
    lines = out.splitlines()
    # llama-bench's columns on the CPU backend, widths and alignment
    assert lines[0] == ("| model                          |       size |     params | backend    "
                        "| threads |            test |                  t/s |")
    assert lines[1] == ("| ------------------------------ | ---------: | ---------: | ---------- "
                        "| ------: | --------------: | -------------------: |")
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:] if ln.startswith("|")]
    assert [r[5] for r in rows] == ["pp16", "tg4", "pp8+tg2", "pp16 @ d8", "tg4 @ d8", "pp8+tg2 @ d8"]
    size = sum(int(t.n_bytes) for t in gguf.GGUFReader(TINY).tensors)
    for r in rows:
        assert r[0] == "qwen2 ?B all F32" and r[3] == "CPU" and r[4] == "1"
        assert r[1] == f"{size / 2**20:.2f} MiB" and r[2] == "0.07 M"
        assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", r[6]), r[6]
    assert re.fullmatch(r"build: ([0-9a-f]{8}|unknown) \(\d+\)", lines[-1]), lines[-1]
    # non-default -b / -ub get their columns
    head = bench("-p", "8", "-n", "0", "-b", "64", "-ub", "32", "-r", "1").stdout.splitlines()[0]
    assert [c.strip() for c in head.strip("|").split("|")] == [
        "model", "size", "params", "backend", "threads", "n_batch", "n_ubatch", "test", "t/s"]


def test_csv_and_jsonl_match_json_fields():
    out = bench("-p", "8", "-n", "2", "-r", "2", "-o", "csv").stdout
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == FIELDS and len(rows) == 3
    assert all(out.splitlines()[1].startswith('"') for _ in [0])  # values quoted as llama-bench
    recs = [dict(zip(rows[0], r)) for r in rows[1:]]
    assert [(x["n_prompt"], x["n_gen"]) for x in recs] == [("8", "0"), ("0", "2")]
    float(recs[0]["avg_ts"]), int(recs[0]["avg_ns"])
    lines = bench("-p", "8", "-n", "2", "-r", "2", "-o", "jsonl").stdout.splitlines()
    assert len(lines) == 2 and list(json.loads(lines[0]))[:len(FIELDS)] == FIELDS


def step_bytes(path, ns, ctx):
    """Bytes a decode step of ns sequences moves at context ctx, from gguf-py's reading of
    the file: every tensor but the MTP layers' (blk.N for N >= block_count -
    nextn_predict_layers), token_embd's gathered rows (untied), the expected share of each
    expert tensor an MoE step selects (gpt-oss's expert biases too), the F16 K and V of every
    sequence in the attention layers (on gpt-oss's sliding layers, the window's only), and,
    with Gated DeltaNet layers, each sequence's F32 state read and written (and the conv
    kernels as the F32 the loader makes of them)."""
    reader = gguf.GGUFReader(path)
    kv = {f.name: f for f in reader.fields.values()}
    arch = kv["general.architecture"].contents()

    def u32(k, default=None):
        return int(kv[k].parts[kv[k].data[0]][0]) if k in kv else default

    n_layer, n_embd = u32(f"{arch}.block_count"), u32(f"{arch}.embedding_length")
    n_layer -= u32(f"{arch}.nextn_predict_layers", 0)
    n_head, n_kv = u32(f"{arch}.attention.head_count"), u32(f"{arch}.attention.head_count_kv")
    head_dim = u32(f"{arch}.attention.key_length", n_embd // n_head)
    n_exp, k = u32(f"{arch}.expert_count", 0), u32(f"{arch}.expert_used_count", 0)
    share = 1 - (1 - k / n_exp) ** ns if n_exp else 1
    tied = "output.weight" not in {t.name for t in reader.tensors}
    attn_layers, state = list(range(n_layer)), 0
    if f"{arch}.ssm.conv_kernel" in kv:  # qwen35 family: full attention every interval layers
        interval = u32(f"{arch}.full_attention_interval")
        attn_layers = [il for il in range(n_layer) if (il + 1) % interval == 0]
        hk, nk, nv = (u32(f"{arch}.ssm.{k}") for k in ("state_size", "group_count", "time_step_rank"))
        d_inner, conv = u32(f"{arch}.ssm.inner_size"), u32(f"{arch}.ssm.conv_kernel")
        per_layer = (conv - 1) * (2 * nk * hk + d_inner) + d_inner * hk
        state = 2 * 4 * per_layer * (n_layer - len(attn_layers)) * ns
    w = state
    for t in reader.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layer:
            continue  # an MTP layer: not run
        b = int(t.n_bytes)
        if t.name.endswith("ssm_conv1d.weight"):
            b = 4 * int(t.n_elements)  # held as F32 (the loader converts it)
        if t.name == "token_embd.weight" and not tied:
            b = b // int(t.shape[1]) * ns  # only the gathered rows
        if t.name.endswith("_exps.weight"):
            assert int(t.shape[2]) == n_exp
            b *= share  # a mixture of experts: the active bytes
        if t.name.endswith("_exps.bias"):
            assert int(t.shape[1]) == n_exp
            b *= share
        w += b
    window = u32(f"{arch}.attention.sliding_window", 0) if arch == "gpt-oss" else 0
    for il in attn_layers:  # gpt-oss: the even layers see the last `window` positions
        keys = min(ctx, window) if window and il % 2 == 0 else ctx
        w += 2 * n_kv * head_dim * 2 * keys * ns  # K and V, F16
    return w


def test_batched_and_bandwidth_bound():
    bw = 20.0  # GB/s: any figure; the percent must follow from the bytes of a step
    rows = bench_json("-p", "0", "-n", "6", "-B", "3", "-d", "4", "-r", "2", "--bw", bw)
    assert [(r["n_gen"], r["n_seqs"]) for r in rows] == [(6, 1), (6, 3)]
    for r in rows:
        ns = r["n_seqs"]
        want = 100 * (r["avg_ts"] / ns) / (bw * 1e9 / step_bytes(TINY, ns, 4 + 6 / 2))
        assert r["bw_pct"] == pytest.approx(want, rel=1e-3)
        assert r["bw_gbs"] == bw
        # aggregate tokens per second: ns rows per step
        assert r["samples_ts"][0] == pytest.approx(1e9 * 6 * ns / r["samples_ns"][0], rel=1e-5)
    md = bench("-p", "0", "-n", "6", "-B", "3", "-r", "1", "--bw", bw).stdout.splitlines()
    assert md[0].rstrip().endswith(" bw % |") and "tg6 x3" in md[3]


def check_bound(model, batch, depth=4):
    """tg6 at `depth`, alone and as a batch of `batch`: bw_pct against step_bytes."""
    bw = 20.0
    rows = bench_json("-p", "0", "-n", "6", "-B", batch, "-d", depth, "-r", "2", "--bw", bw,
                      model=model)
    assert [r["n_seqs"] for r in rows] == [1, batch]
    for r in rows:
        ns = r["n_seqs"]
        want = 100 * (r["avg_ts"] / ns) / (bw * 1e9 / step_bytes(model, ns, depth + 6 / 2))
        assert r["bw_pct"] == pytest.approx(want, rel=1e-3)


def test_moe_active_bytes_bound():
    """A mixture of experts reads, per decode step, only the experts its rows select: k of
    n_expert expert matrices for one row, n (1 - (1 - k/n)^B) expected for B rows routed at
    random. The bound is that step's bytes (the qwen3moe fixture: 16 experts, 4 used)."""
    check_bound(TINY.parent / "qwen3moe-q8_0.gguf", 3)


def test_gpt_oss_active_bytes_bound():
    """gpt-oss: the experts' biases follow their experts, and a sliding layer reads only its
    window of K/V (the gpt-oss fixture: 16 experts, 4 used, window 8 on layer 0, at a context
    of 16 + 6 / 2)."""
    check_bound(TINY.parent / "gpt-oss-mxfp4.gguf", 3, depth=16)


def test_hybrid_moe_bound():
    """A hybrid MoE file (the qwen35moe fixture: 4 of 16 experts, a shared expert, 4
    DeltaNet and 2 attention layers, an MTP layer): the bound counts the active experts,
    the shared expert whole, K/V of the attention layers only, the recurrent state read and
    written per sequence, and not the MTP layer."""
    check_bound(ROOT / "tests" / "data" / "ref-hybrid" / "qwen35moe-f16.gguf", 2)


def test_measured_bandwidth():
    """--bw measure: the CPU's STREAM-like read bandwidth over a step's bytes, printed on
    stderr and used as the bound (bw_gbs) of the decode rows only."""
    r = bench("-p", "8", "-n", "4", "-r", "1", "-o", "json", "--bw", "measure")
    m = re.search(r"read bandwidth ([0-9.]+) GB/s \(1 threads over [0-9]+ MiB", r.stderr)
    assert m, r.stderr
    gbs = float(m.group(1))
    assert 0.1 < gbs < 10000
    rows = json.loads(r.stdout)
    pp, tg = rows
    assert pp["bw_pct"] is None and pp["bw_gbs"] is None
    assert tg["bw_gbs"] == pytest.approx(gbs, abs=0.051) and 0 < tg["bw_pct"]


def test_bad_arguments():
    for args in (["-p", "8-4"], ["-p", "x"], ["-pg", "8"], ["-o", "xml"], ["-B", "65"],
                 ["-r", "0"], ["--frobnicate", "1"]):
        r = bench(*args, check=False)
        assert r.returncode == 2, (args, r.stderr)
    r = subprocess.run([SMELT, "bench", "-p", "8"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "-m MODEL" in r.stderr
