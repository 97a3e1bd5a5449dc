#!/usr/bin/env python3
"""Renders every shared chat template x every test conversation with Python jinja2,
configured exactly as Hugging Face transformers' apply_chat_template does, and writes the
expected outputs that tests/unit/test_tmpl.c and tests/py/test_tmpl.py compare smelt to.

transformers (chat_template_utils._compile_jinja_template / render_jinja_template):
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[AssistantTracker, loopcontrols])
  env.filters["tojson"] = tojson      # json.dumps(x, ensure_ascii=False, indent=None,
                                      #            separators=None, sort_keys=False)
  env.globals["raise_exception"]      # raises TemplateError(message)
  env.globals["strftime_now"]         # datetime.now().strftime(fmt)
  template.render(messages=..., tools=..., documents=None, add_generation_prompt=...,
                  **special_tokens_map, **kwargs)

This script mirrors that without importing transformers (it needs only jinja2). For
reproducible output, strftime_now formats a fixed time (NOW, in UTC); smelt's tests pass
the same time with --now. bos_token / eos_token are "<s>" / "</s>" for every template.

Rerun after changing a conversation or when ../shared/data/chat-templates changes:
    python3 scripts/make-tmpl-expected.py

It also writes src/template/tmpl_unicode.c (--unicode-tables): the Unicode case mappings
and str.is*() properties of this Python, so that smelt's upper/lower/title/isalpha/...
agree with the Python that renders HF templates. Rerun it when moving to a new Python.
Output: tests/data/tmpl/expected/<template>.json =
    {"template_sha256": ..., "jinja2": version,
     "results": {conversation: {"output": text} | {"error": message, "error_type": name}}}
"""
import argparse
import datetime
import hashlib
import json
import os
import sys

import jinja2
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOW = 1764460800  # 2025-11-30 00:00:00 UTC
BOS, EOS = "<s>", "</s>"


class AssistantTracker(Extension):
    """transformers' {% generation %} tag; outside training it renders its body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def hf_environment():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, tz=datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def context(conv):
    """The variables apply_chat_template passes for a conversation file."""
    ctx = {
        "messages": conv["messages"],
        "tools": conv.get("tools"),
        "documents": None,
        "add_generation_prompt": conv.get("add_generation_prompt", True),
        "bos_token": BOS,
        "eos_token": EOS,
    }
    for k, v in conv.items():
        if k not in ("messages", "tools", "add_generation_prompt"):
            ctx[k] = v
    return ctx


def render(env, source, conv):
    try:
        return {"output": env.from_string(source).render(**context(conv))}
    except Exception as e:  # noqa: BLE001 - the expected outcome is the exception itself
        return {"error": str(e), "error_type": type(e).__name__}


def _runs(pairs):
    """[(cp, value)] sorted by cp -> runs (lo, hi, delta, stride) with value = cp + delta."""
    runs = []
    for cp, v in pairs:
        d = v - cp
        if runs:
            lo, hi, dd, st = runs[-1]
            if dd == d and ((st in (0, 1) and cp == hi + 1) or (st in (0, 2) and cp == hi + 2)):
                runs[-1] = (lo, cp, d, 1 if cp == hi + 1 else 2)
                continue
        runs.append((cp, cp, d, 0))
    return [(lo, hi, d, st or 1) for lo, hi, d, st in runs]


def _ranges(pred):
    out, start = [], None
    for cp in range(0x110000):
        if pred(cp):
            if start is None:
                start = cp
        elif start is not None:
            out.append((start, cp - 1))
            start = None
    if start is not None:
        out.append((start, 0x10FFFF))
    return out


def unicode_tables(path):
    import unicodedata

    def ch(cp):
        return chr(cp) if not 0xD800 <= cp <= 0xDFFF else None

    lower, upper, title, special = [], [], [], []
    for cp in range(0x110000):
        c = ch(cp)
        if c is None:
            continue
        for kind, f, lst in (("lower", c.lower, lower), ("upper", c.upper, upper), ("title", c.title, title)):
            m = f()
            if kind == "title" and len(m) == 1 and m != c.upper():
                lst.append((cp, ord(m)))  # only where title differs from upper (may be identity)
            elif kind != "title" and len(m) == 1 and ord(m) != cp:
                lst.append((cp, ord(m)))
            elif len(m) > 1:
                special.append((kind, cp, [ord(x) for x in m]))
    props = {
        "alpha": lambda c: c.isalpha(), "decimal": lambda c: c.isdecimal(), "digit": lambda c: c.isdigit(),
        "numeric": lambda c: c.isnumeric(), "space": lambda c: c.isspace(), "printable": lambda c: c.isprintable(),
        "lower": lambda c: c.islower(), "upper": lambda c: c.isupper(),
        "cased": lambda c: c.islower() or c.isupper() or c.istitle(),
        # case-ignorable (for the final-sigma rule): Mn, Me, Cf, Lm, Sk, and Word_Break MidLetter/MidNumLet/Single_Quote
        "case_ignorable": lambda c: unicodedata.category(c) in ("Mn", "Me", "Cf", "Lm", "Sk") or c in "'.:\u00b7\u0387\u05f4\u2018\u2019\u2024\u2027\ufe13\ufe52\ufe55\uff07\uff0e\uff1a",
    }
    o = ["/* Generated by scripts/make-tmpl-expected.py --unicode-tables from Python %s"
         " (Unicode %s): do not edit." % (sys.version.split()[0], unicodedata.unidata_version),
         " * Case mappings and str.is*() properties, so that smelt's upper/lower/title/isalpha/...",
         " * agree with the Python that renders HF chat templates. */",
         '#include "template/tmpl_int.h"', ""]
    for name, lst in (("lower", lower), ("upper", upper), ("title", title)):
        runs = _runs(lst)
        o.append(f"const struct tmpl_case_run tmpl_case_{name}[] = {{")
        o += [f"    {{0x{lo:x}, 0x{hi:x}, {d}, {st}}}," for lo, hi, d, st in runs]
        o.append("};")
        o.append(f"const size_t tmpl_case_{name}_n = {len(runs)};")
        o.append("")
    o.append("const struct tmpl_case_special tmpl_case_special[] = {")
    kinds = {"lower": 0, "upper": 1, "title": 2}
    for kind, cp, m in special:
        o.append(f"    {{{kinds[kind]}, 0x{cp:x}, {len(m)}, {{{', '.join(hex(x) for x in m)}}}}},")
    o.append("};")
    o.append(f"const size_t tmpl_case_special_n = {len(special)};")
    o.append("")
    for name, pred in props.items():
        rs = _ranges(lambda cp, pred=pred: ch(cp) is not None and pred(ch(cp)))
        o.append(f"const struct tmpl_cp_range tmpl_prop_{name}[] = {{")
        line = "   "
        for lo, hi in rs:
            item = f" {{0x{lo:x}, 0x{hi:x}}},"
            if len(line) + len(item) > 100:
                o.append(line)
                line = "   "
            line += item
        o.append(line)
        o.append("};")
        o.append(f"const size_t tmpl_prop_{name}_n = {len(rs)};")
        o.append("")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(o))
    print(f"wrote {path}")


def bench(template, conversation, runs):
    """Median jinja2 compile and render times, for comparison with `smelt template --bench`."""
    import time

    with open(template, encoding="utf-8") as f:
        source = f.read()
    with open(conversation, encoding="utf-8") as f:
        ctx = context(json.load(f))
    env = hf_environment()
    tc, tr = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        t = env.from_string(source)
        t1 = time.perf_counter()
        out = t.render(**ctx)
        tr.append(time.perf_counter() - t1)
        tc.append(t1 - t0)
    tc.sort()
    tr.sort()
    print(f"jinja2 {jinja2.__version__}: {runs} runs, {len(out.encode())} bytes out: compile median "
          f"{tc[runs // 2] * 1e6:.1f} us, render median {tr[runs // 2] * 1e6:.1f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = os.environ.get("SMELT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--templates", default=os.path.join(shared, "data", "chat-templates"))
    ap.add_argument("--conversations", default=os.path.join(ROOT, "tests", "data", "tmpl", "conversations"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "tmpl", "expected"))
    ap.add_argument("--unicode-tables", default=os.path.join(ROOT, "src", "tokenizer", "tmpl_unicode.c"))
    ap.add_argument("--bench", nargs=2, metavar=("TEMPLATE", "CONVERSATION"),
                    help="only time jinja2 on one template and conversation")
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    if args.bench:
        bench(args.bench[0], args.bench[1], args.runs)
        return
    unicode_tables(args.unicode_tables)
    if not os.path.isdir(args.templates):
        sys.exit(f"no templates at {args.templates}")
    convs = {}
    for f in sorted(os.listdir(args.conversations)):
        if f.endswith(".json"):
            with open(os.path.join(args.conversations, f), encoding="utf-8") as fh:
                convs[f[:-5]] = json.load(fh)
    env = hf_environment()
    os.makedirs(args.out, exist_ok=True)
    n_ok = n_err = 0
    for f in sorted(os.listdir(args.templates)):
        if not f.endswith(".jinja"):
            continue
        with open(os.path.join(args.templates, f), "rb") as fh:
            raw = fh.read()
        source = raw.decode("utf-8")
        results = {}
        for name, conv in convs.items():
            r = render(env, source, conv)
            results[name] = r
            n_ok += "output" in r
            n_err += "error" in r
        doc = {"template_sha256": hashlib.sha256(raw).hexdigest(), "jinja2": jinja2.__version__,
               "now": NOW, "bos_token": BOS, "eos_token": EOS, "results": results}
        with open(os.path.join(args.out, f[:-6] + ".json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, ensure_ascii=False, indent=1, sort_keys=True)
            fh.write("\n")
    print(f"wrote {args.out}: {n_ok} renders, {n_err} expected errors")


if __name__ == "__main__":
    main()
