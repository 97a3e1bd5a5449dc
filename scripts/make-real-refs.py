#!/usr/bin/env python3
"""Records reference outputs of the real test models into tests/data/ref-real/ (committed).

    scripts/fetch-test-models.sh                          # models/*.gguf
    pip install torch transformers accelerate gguf numpy  # once; NOT in tests/requirements.txt
    python3 scripts/make-real-refs.py [--out tests/data/ref-real] [--skip-numpy]

For each real model (docs/models.md) it loads the GGUF with transformers
(`AutoModelForCausalLM.from_pretrained(models/, gguf_file=...)`, which dequantizes every
tensor to float32: the same weights the quantized file holds, computed in float32, eager
attention) and its tokenizer from the same GGUF, then records for a few prompts:
- the prompt's token ids (from transformers' GGUF-converted tokenizer),
- the top-20 logits and their token ids at every position,
- one greedy continuation of 32 tokens for one fixed prompt, with the top-2 margin of each
  step (a step whose margin is tiny may legitimately differ in an engine that computes
  on the quantized blocks).
Unless --skip-numpy, it cross-checks transformers against tests/py/ref_forward.py (numpy,
llama.cpp conventions) on every prompt and stores the largest difference, which guards
against transformers' GGUF loader mapping something differently from llama.cpp.
Output: one JSON file per model, plus the report printed at the end.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import time

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "py"))
import ref_forward  # noqa: E402

TOPK = 20
N_GREEDY = 32

LONG_TEXT = (
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "clockmaker named Elias. Every morning he opened the shutters of his workshop, wound the "
    "hundred clocks that hung on its walls, and listened to them tick in a slightly different "
    "rhythm each. The villagers said that he could tell the weather, the harvest and even the "
    "mood of his neighbours from the way the clocks sounded. One winter a traveller arrived "
    "with a broken pocket watch that had belonged to her grandmother. "
)


def long_prompt(tok, n_min):
    """Deterministic text that tokenizes to at least n_min tokens."""
    text, i = "", 0
    while len(tok(text).input_ids) < n_min:
        text += LONG_TEXT.replace("Elias", ["Elias", "Mara", "Tobin", "Ilse"][i % 4])
        i += 1
    return text


def model_prompts(name, tok):
    """name -> list of (label, text). Gemma 3 270M is a base model without a chat
    template; Qwen's chat template comes from its GGUF."""
    if name.startswith("gemma3"):
        return [
            ("short", "The capital of France is"),
            ("turns", "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n"
                      "<start_of_turn>model\n"),
            # longer than gemma3.attention.sliding_window (512): exercises local layers
            ("long", long_prompt(tok, 600)),
        ]
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the sum of a list."}],
        tokenize=False, add_generation_prompt=True)
    return [
        ("short", "The capital of France is"),
        ("chat", chat),
        ("long", long_prompt(tok, 200)),
    ]


def greedy_prompt(name):
    return "short"


def topk(logits):
    idx = np.argsort(-logits, axis=1, kind="stable")[:, :TOPK]
    vals = np.take_along_axis(logits, idx, axis=1)
    return idx, vals


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "ref-real"))
    ap.add_argument("--models", default=str(ROOT / "models"))
    ap.add_argument("--skip-numpy", action="store_true")
    ap.add_argument("--only", help="one model file name")
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    sums = dict(reversed(l.split()) for l in (ROOT / "scripts" / "test-models.sha256")
                .read_text().splitlines() if l.strip())
    for fname in sorted(sums):
        if args.only and fname != args.only:
            continue
        path = pathlib.Path(args.models) / fname
        if not path.exists():
            sys.exit(f"{path} missing: run scripts/fetch-test-models.sh")
        if sha256(path) != sums[fname]:
            sys.exit(f"{path} has the wrong sha256")
        t0 = time.time()
        tok = AutoTokenizer.from_pretrained(args.models, gguf_file=fname)
        model = AutoModelForCausalLM.from_pretrained(
            args.models, gguf_file=fname, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        print(f"{fname}: loaded {type(model).__name__} in {time.time() - t0:.0f}s", flush=True)
        ref = None if args.skip_numpy else ref_forward.RefModel(str(path))
        name = fname[:-len(".gguf")]
        rec = {
            "model_file": fname, "sha256": sums[fname],
            "generator": "scripts/make-real-refs.py",
            "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "hf_class": type(model).__name__,
            "note": "transformers dequantized the GGUF to float32 (eager attention); "
                    "token ids come from transformers' tokenizer converted from the GGUF",
            "topk": TOPK, "prompts": [],
        }
        for label, text in model_prompts(name, tok):
            ids = tok(text).input_ids
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0].float().numpy()
            idx, vals = topk(logits)
            p = {"label": label, "text": text, "ids": [int(i) for i in ids],
                 "topk_ids": idx.tolist(),
                 "topk_logits": [[round(float(v), 4) for v in row] for row in vals]}
            if ref is not None:
                mine = ref.forward(ids)
                p["numpy_ref_max_abs_diff"] = round(float(np.max(np.abs(mine - logits))), 6)
                p["numpy_ref_argmax_agree"] = int(np.sum(np.argmax(mine, 1) == idx[:, 0]))
            rec["prompts"].append(p)
            print(f"  {label}: {len(ids)} tokens, numpy diff {p.get('numpy_ref_max_abs_diff')}, "
                  f"argmax agree {p.get('numpy_ref_argmax_agree')}/{len(ids)}", flush=True)
        g = next(p for p in rec["prompts"] if p["label"] == greedy_prompt(name))
        ids = list(g["ids"])
        steps = []
        with torch.no_grad():
            for _ in range(N_GREEDY):  # plain loop, no cache: each step a full forward
                lg = model(torch.tensor([ids])).logits[0, -1].float().numpy()
                top2 = np.argsort(-lg, kind="stable")[:2]
                steps.append({"id": int(top2[0]), "margin": round(float(lg[top2[0]] - lg[top2[1]]), 4)})
                ids.append(int(top2[0]))
        rec["greedy"] = {
            "prompt_label": g["label"], "prompt_ids": g["ids"], "n_tokens": N_GREEDY,
            "ids": [s["id"] for s in steps], "margins": [s["margin"] for s in steps],
            "text": tok.decode([s["id"] for s in steps]),
        }
        print(f"  greedy: {rec['greedy']['text']!r}", flush=True)
        (out / f"{name}.json").write_text(json.dumps(rec, separators=(",", ":")) + "\n")
        print(f"  wrote {out / (name + '.json')} ({time.time() - t0:.0f}s)", flush=True)
        del model, ref


if __name__ == "__main__":
    main()
