#!/usr/bin/env python3
"""Serving throughput under a JSON schema against the same load without one (issue #20's
floor: >= 90%), in one run against one server (smelt serve or llama-server).

C clients each send R streaming /v1/completions requests in a row: a unique prompt of ~P
words, at most N tokens, temperature 0. The same load runs twice: first with every request
carrying the schema (the llama.cpp field `json_schema`, which smelt and llama-server both
take on /v1/completions), then plain. Prints one JSON line per pass (generated tok/s over
the pass, requests, tokens, TTFT p50/p90, inter-token p50/p90) and the ratios.

A schema request ends where its document closes, so it can be shorter than N. By default
the plain pass generates exactly as many tokens per request as the same request (client,
index) did under the schema (`max_tokens` = that count, `ignore_eos`): both passes do the
same prefill and decode work, and the ratio of their tok/s is the grammar's cost alone.
--free: the plain pass runs to N or its end-of-generation token instead (the loads differ).

usage: schema-load.py BASE_URL MODEL C R P N [--schema FILE] [--only schema|plain] [--free]
  default schema: a typical tool call (a function name from an enum, an object of typed
  arguments with ranges and an enum), written below."""
import asyncio
import json
import sys
import time

import aiohttp

TOOL_CALL = {
    "type": "object", "additionalProperties": False, "required": ["name", "arguments"],
    "properties": {
        "name": {"enum": ["get_weather", "search_flights", "create_event"]},
        "arguments": {
            "type": "object", "additionalProperties": False,
            "required": ["city", "days", "units", "notes"],
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "units": {"enum": ["metric", "imperial"]},
                "notes": {"type": "array", "items": {"type": "string", "maxLength": 60},
                          "maxItems": 8}}}}}
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
         "rho sigma tau upsilon phi chi psi omega").split()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else None


async def one(session, base, model, prompt, n, schema, st, ignore_eos=False, key=None):
    body = {"model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if schema is not None:
        body["json_schema"] = schema
    if ignore_eos:
        body["ignore_eos"] = True
    t0 = time.perf_counter()
    last, chunks, usage = None, 0, None
    async with session.post(base + "/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        async for line in r.content:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            d = json.loads(line[6:])
            if d.get("usage"):
                usage = d["usage"]
            if not d.get("choices") or not d["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            (st["ttft"] if last is None else st["itl"]).append(now - (t0 if last is None else last))
            last = now
            chunks += 1
    got = usage["completion_tokens"] if usage and usage.get("completion_tokens") else chunks
    st["tokens"] += got
    st["requests"] += 1
    if key is not None:
        st["lens"][key] = got


async def run_pass(base, model, C, R, P, N, schema, tag, lens=None):
    """lens: {(client, index): tokens} to generate exactly (ignore_eos), else up to N."""
    st = {"ttft": [], "itl": [], "tokens": 0, "requests": 0, "lens": {}}
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=3600)) as s:
        await one(s, base, model, f"warm-up {tag}", 8, schema,
                  {"ttft": [], "itl": [], "tokens": 0, "requests": 0, "lens": {}})

        async def client(c):
            for i in range(R):
                body = " ".join(WORDS[(c * 7 + i * 3 + k) % len(WORDS)] for k in range(P))
                prompt = f"request {tag}.{c}.{i}.{time.time_ns()}: {body}\nAnswer with a tool call as JSON:"
                n = max(1, lens.get((c, i), N)) if lens is not None else N
                await one(s, base, model, prompt, n, schema, st, lens is not None, (c, i))

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(C)))
        dt = time.perf_counter() - t0
    return {"pass": tag, "tok_s": round(st["tokens"] / dt, 1), "requests": st["requests"],
            "tokens": st["tokens"], "seconds": round(dt, 2),
            "ttft_p50": pct(st["ttft"], .5), "ttft_p90": pct(st["ttft"], .9),
            "itl_p50": pct(st["itl"], .5), "itl_p90": pct(st["itl"], .9),
            "matched": lens is not None}, st["lens"]


def main():
    argv = sys.argv[1:]
    opts, args, i = {}, [], 0
    while i < len(argv):
        if argv[i] in ("--schema", "--only"):
            if i + 1 >= len(argv):
                print(__doc__)
                return 2
            opts[argv[i]] = argv[i + 1]
            i += 2
        elif argv[i].startswith("--"):
            opts[argv[i]] = True
            i += 1
        else:
            args.append(argv[i])
            i += 1
    if len(args) != 6 or set(opts) - {"--schema", "--only", "--free"}:
        print(__doc__)
        return 2
    schema = TOOL_CALL
    if "--schema" in opts:
        with open(opts["--schema"]) as f:
            schema = json.load(f)
    only = opts.get("--only")
    base, model = args[0].rstrip("/"), args[1]
    C, R, P, N = map(int, args[2:6])
    res, lens = {}, None
    for tag, sch in (("schema", schema), ("plain", None)):
        if only and only != tag:
            continue
        match = lens if tag == "plain" and "--free" not in opts else None
        res[tag], got = asyncio.run(run_pass(base, model, C, R, P, N, sch, tag, match))
        if tag == "schema":
            lens = got
        print(json.dumps(res[tag]), flush=True)
    if len(res) == 2:
        sc, pl = res["schema"], res["plain"]
        out = {"schema_over_plain": round(sc["tok_s"] / pl["tok_s"], 3) if pl["tok_s"] else None}
        if sc["itl_p50"] and pl["itl_p50"]:
            out["itl_p50_schema_over_plain"] = round(sc["itl_p50"] / pl["itl_p50"], 3)
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
