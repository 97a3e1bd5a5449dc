#!/usr/bin/env python3
"""llama.cpp on the hybrid fixtures (tests/data/ref-hybrid): the cross-check that smelt's
GGUF layout for qwen35 / qwen35moe / qwen3next is llama.cpp's, and a third forward beside
smelt's (tests/unit/test_forward_hybrid.c) and transformers' (the recorded logits).

    cc -O2 scripts/llamacpp-logits.c ... -o /tmp/llamacpp-logits   # its header says how
    python3 scripts/check-hybrid-llamacpp.py /tmp/llamacpp-logits build/smelt

Every fixture file must load in llama.cpp. For each file and prompt, llama.cpp's forward
runs twice (the whole prompt in one batch, then one token per decode) and the script
prints the largest |logit difference| from transformers' over the largest |logit|, and the
rows whose argmax differs (a near tie: transformers scores llama.cpp's pick within 1e-3 of
the largest |logit| of its own best). llama.cpp's CPU rounds the activations to F16 in a
matmul with F16 weights, which these small random models amplify about 400-fold (the
fixtures hold float32 rounding alone to 3e-5, F64_BOUND in make-hybrid-fixtures.py): so
each F16 file is also run as an F32 copy (`smelt quantize FILE COPY F32`; the weights are
float16-exact, so the same numbers), and only the F32 runs must have no argmax flip.
Then 16 greedy tokens after a short text, on the F32 run: llama.cpp's (its own argmax
loop, on the ids `smelt tokenize` gives the text) against `smelt run --raw --temp 0
--ignore-eos` (both as text, invalid UTF-8 replaced, control tokens left out as smelt
prints them). Needs numpy and gguf. Exit status 0
when all of that holds.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import gguf
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "ref-hybrid"
TIE = 1e-3
PROMPT = "Hello there, the quick brown fox"


def llama(tool, path, mode, ids, arg):
    r = subprocess.run([tool, str(path), mode, ",".join(map(str, ids)), str(arg)],
                       capture_output=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"{path.name} {mode}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def byte_decoder():
    """GPT-2's byte-level BPE alphabet: piece character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def logits_check(tool, path, prompts):
    """(max rel err, argmax flips, near ties) of llama.cpp on path over the prompts."""
    worst, flips, ties = 0.0, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "logits.f32"
        for p in prompts:
            ref = np.fromfile(REF / p["logits"], dtype="<f4").reshape(p["shape"])
            scale = float(np.max(np.abs(ref)))
            for mode in ("prefill", "step"):
                llama(tool, path, mode, p["ids"], out)
                got = np.fromfile(out, dtype="<f4").reshape(ref.shape)
                worst = max(worst, float(np.max(np.abs(got - ref))) / scale)
                for r, g in zip(ref, got):
                    if np.argmax(r) != np.argmax(g):
                        near = r[np.argmax(r)] - r[np.argmax(g)] <= TIE * scale
                        ties += int(near)
                        flips += int(not near)
    return worst, flips, ties


def greedy_check(tool, smelt, path):
    t = subprocess.run([smelt, "tokenize", str(path), PROMPT, "--ids"], capture_output=True,
                       text=True, timeout=60, check=True)
    ids = [int(x) for x in t.stdout.replace(",", " ").split()]
    gen = [int(x) for x in llama(tool, path, "greedy", ids, 16).split(b"\n")[0].split(b",")]
    r = gguf.GGUFReader(str(path))
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    kinds = r.fields["tokenizer.ggml.token_type"].contents()
    dec = byte_decoder()
    # smelt run prints no control token (<|endoftext|>, ...)
    theirs = bytes(dec[c] for i in gen if kinds[i] != 3 for c in toks[i]).decode(
        "utf-8", errors="replace")
    s = subprocess.run([smelt, "run", str(path), PROMPT, "--raw", "--temp", "0", "-n", "16",
                        "--ignore-eos"], capture_output=True, timeout=300)
    ours = s.stdout.decode("utf-8", errors="replace").removesuffix("\n")
    return s.returncode == 0 and ours == theirs, gen, theirs, ours


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tool", help="the built scripts/llamacpp-logits.c")
    ap.add_argument("smelt", help="smelt binary")
    args = ap.parse_args()
    man = json.loads((REF / "manifest.json").read_text())
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for m in man["models"]:
            for kind, f in m["files"].items():
                path = REF / f["file"]
                line = f"{m['name']:9} {kind:10}"
                run = path
                if kind.startswith("f16"):
                    w, fl, ti = logits_check(args.tool, path, m["prompts"])
                    line += f" F16: max rel err {w:.1e}, {fl} argmax flips ({ti} near ties);"
                    run = pathlib.Path(tmp) / f"{path.stem}-f32.gguf"
                    subprocess.run([args.smelt, "quantize", str(path), str(run), "F32"],
                                   capture_output=True, timeout=120, check=True)
                w, fl, ti = logits_check(args.tool, run, m["prompts"])
                line += f" F32: max rel err {w:.1e}, {fl} argmax flips ({ti} near ties)"
                same, gen, theirs, ours = greedy_check(args.tool, args.smelt, run)
                line += f"; 16 greedy tokens {'agree' if same else 'DIFFER'}"
                if not same:
                    line += f" (llama.cpp {gen} {theirs!r}, smelt {ours!r})"
                bad += int(fl > 0) + int(not same)
                print(line, flush=True)
    print("ok" if not bad else f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
