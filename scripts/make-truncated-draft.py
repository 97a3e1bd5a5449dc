#!/usr/bin/env python3
"""Writes a truncated-layer copy of a GGUF model: its first N blocks, then the final norm and
the output head, everything else (metadata, tokenizer, tensor bytes) unchanged.

A self-speculation draft for tests and measurements (docs/speculative.md): the same vocabulary
as the model by construction, and cheaper by the layers dropped. Its predictions are the
model's early-exit guesses, so greedy acceptance is partial: the verification and the rollback
of rejected drafts run on real weights.

    python3 scripts/make-truncated-draft.py models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf \\
        /tmp/draft-12.gguf --layers 12

Uses gguf-py (tests/requirements.txt). Only architectures whose layers are `blk.N.*` and
whose layer count is `{arch}.block_count` are handled (llama, qwen2, qwen3, gemma3).
"""
import argparse
import re
import sys

import gguf


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True, help="blocks to keep (from the first)")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.src)
    arch = r.fields["general.architecture"].contents()
    key = f"{arch}.block_count"
    n_layer = r.fields[key].contents()
    if not 1 <= a.layers <= n_layer:
        sys.exit(f"--layers must be in 1..{n_layer} ({key})")
    w = gguf.GGUFWriter(a.dst, arch=arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        val = a.layers if f.name == key else f.contents()
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, val, f.types[0], sub_type=sub)
    keep = []
    for t in r.tensors:
        m = re.match(r"blk\.(\d+)\.", t.name)
        if m and int(m.group(1)) >= a.layers:
            continue
        keep.append(t)
        w.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in keep:
        w.write_tensor_data(t.data)
    w.close()
    print(f"{a.dst}: {a.layers} of {n_layer} blocks, {len(keep)} of {len(r.tensors)} tensors")


if __name__ == "__main__":
    main()
