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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = os.environ.get("SMELT_SHARED_DIR", os.path.join(ROOT, "..", "shared"))
    ap.add_argument("--templates", default=os.path.join(shared, "data", "chat-templates"))
    ap.add_argument("--conversations", default=os.path.join(ROOT, "tests", "data", "tmpl", "conversations"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "tmpl", "expected"))
    args = ap.parse_args()
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
