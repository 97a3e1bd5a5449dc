#!/usr/bin/env python3
"""Runs llama.cpp's own converter (convert_hf_to_gguf.py of a llama.cpp source tree) on the
transformers models scripts/make-hybrid-fixtures.py builds, and compares what it writes with
the committed fixtures (tests/data/ref-hybrid): the check that the fixtures are what a real
Qwen3.5 / Qwen3.5-MoE / Qwen3-Next GGUF holds, so that smelt is tested on llama.cpp's
layout and not on one of its own.

    python3 scripts/check-hybrid-converter.py LLAMA_CPP_SRC [--only NAME,...] [--ref DIR]

LLAMA_CPP_SRC holds convert_hf_to_gguf.py, conversion/ and gguf-py/ (e.g. `git archive`
of a llama.cpp commit); needs torch, transformers, numpy and safetensors, as
make-hybrid-fixtures.py. Each model is saved with save_pretrained (its config given
full_attention_interval 3, and mtp.* tensors of the right shapes so that the converter
writes an MTP layer: mtp.layers.0 is a copy of the full-attention layer 2, fc random, the
norms zero), converted with --outtype f16 and a stand-in vocabulary (the converter's
tokenizer checks need a real one; the vocabulary is not compared). Then, for every fixture
file of the model but the ssm_in layout (the converter no longer writes it): every tensor
the converter wrote must be in the fixture under the same name, with the same ggml shape
and type, and, but for the MTP layer (random in both), the same values; the fixture must
hold nothing else; the {arch}.* keys must agree but for the layer-pattern variant
(attention.recurrent_layers instead of full_attention_interval). Exit status 0 when all
of that holds.
"""
import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "data" / "ref-hybrid"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lcpp", help="a llama.cpp source tree")
    ap.add_argument("--only", help="comma-separated model names (default: all)")
    ap.add_argument("--ref", default=str(REF), help="the fixtures' folder (default: %(default)s)")
    args = ap.parse_args()
    ref = pathlib.Path(args.ref)
    lcpp = pathlib.Path(args.lcpp).resolve()
    sys.path.insert(0, str(lcpp))
    sys.path.insert(1, str(lcpp / "gguf-py"))
    import gguf  # llama.cpp's own gguf-py
    from safetensors.torch import load_file, save_file
    import conversion.base
    import convert_hf_to_gguf

    def stand_in_vocab(self):
        toks = [f"t{i}" for i in range(self.hparams["vocab_size"])]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list(toks)
        self.gguf_writer.add_token_types([1] * len(toks))
        self.gguf_writer.add_token_merges([])
    conversion.base.TextModel.set_vocab = stand_in_vocab

    spec = importlib.util.spec_from_file_location("mhf", ROOT / "scripts" / "make-hybrid-fixtures.py")
    mhf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mhf)
    names = args.only.split(",") if args.only else list(mhf.MODELS)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            cls, cfg, seed, kinds = mhf.MODELS[name]()
            extra = {"experts_implementation": "eager"} if name != "qwen35" else {}
            model = cls._from_config(cfg, attn_implementation="eager", dtype=torch.float32, **extra)
            mhf.init_weights(model, torch.Generator().manual_seed(seed))
            hf = pathlib.Path(tmp) / f"{name}-hf"
            model.save_pretrained(hf)
            st = hf / "model.safetensors"
            sd = load_file(st)
            E, L = cfg.hidden_size, cfg.num_hidden_layers
            for k, v in list(sd.items()):
                if k.startswith("model.layers.2."):
                    sd["mtp.layers.0." + k[len("model.layers.2."):]] = v.clone()
            sd["mtp.fc.weight"] = mhf.f16x(torch.randn(E, 2 * E))
            for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
                sd[f"mtp.{n}.weight"] = torch.zeros(E)
            save_file(sd, st, metadata={"format": "pt"})
            c = json.loads((hf / "config.json").read_text())
            c.update(full_attention_interval=3, mtp_num_hidden_layers=1)
            (hf / "config.json").write_text(json.dumps(c))
            out = pathlib.Path(tmp) / f"{name}-llamacpp.gguf"
            sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outfile", str(out), "--outtype", "f16"]
            convert_hf_to_gguf.main()
            A = gguf.GGUFReader(str(out))
            ta = {t.name: t for t in A.tensors}
            for kind, (f16, layout) in kinds.items():
                if layout == "ssm_in":
                    continue
                B = gguf.GGUFReader(str(ref / f"{name}-{kind}.gguf"))
                tb = {t.name: t for t in B.tensors}
                errs = []
                for n, t in ta.items():
                    u = tb.get(n)
                    if u is None:
                        errs.append(f"{n}: not in the fixture")
                        continue
                    sa, sb = [int(x) for x in t.shape], [int(x) for x in u.shape]
                    ty = (t.tensor_type.name, u.tensor_type.name)
                    if sa != sb or (f16 and ty[0] != ty[1]):
                        errs.append(f"{n}: converter {sa} {ty[0]}, fixture {sb} {ty[1]}")
                    elif not n.startswith(f"blk.{L}.") and not np.array_equal(
                            np.asarray(t.data, dtype=np.float32), np.asarray(u.data, dtype=np.float32)):
                        errs.append(f"{n}: values differ")
                errs += [f"{n}: only in the fixture" for n in sorted(set(tb) - set(ta))]
                fa = {f.name: f.contents() for f in A.fields.values() if f.name.startswith(name + ".")}
                fb = {f.name: f.contents() for f in B.fields.values() if f.name.startswith(name + ".")}
                variant = {f"{name}.attention.recurrent_layers", f"{name}.full_attention_interval"}
                if layout != "explicit":
                    variant = set()
                for k in sorted((set(fa) | set(fb)) - variant):
                    if fa.get(k) != fb.get(k):
                        errs.append(f"key {k}: converter {fa.get(k)}, fixture {fb.get(k)}")
                print(f"{name}-{kind}: {len(ta)} tensors, "
                      + ("the converter's layout" if not errs else f"{len(errs)} differences"))
                for e in errs[:20]:
                    print("  " + e)
                bad += len(errs)
    print("ok" if not bad else f"{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
