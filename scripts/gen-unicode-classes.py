#!/usr/bin/env python3
"""Writes src/tokenizer/tok_unicode_data.h: the character classes of Hugging Face's
pre-tokenizers, probed from the installed `tokenizers` package, and how they differ from
the classes of the system PCRE2 (probed through ctypes).

    pip install tokenizers
    python3 scripts/gen-unicode-classes.py > src/tokenizer/tok_unicode_data.h

Why: HF runs Split patterns with Oniguruma, Digits with Rust's char::is_numeric and
Punctuation with its own table, each at its own Unicode version, while PCRE2 10.42 is at
Unicode 14. Probing every code point gives, exactly:
  TOK_RE_WS         Oniguruma's \\s (25 code points; PCRE2's \\s also has U+180E)
  TOK_RE_<X>_NEW    for each class X the patterns use (L N P M Lu Ll Lt Lm Lo): the code
                    points in Oniguruma's \\p{X} that PCRE2 lacks (assigned after Unicode
                    14); the pre-tokenizer switches to patterns extended with them only for
                    text that holds one (tok_newer)
  tok_numeric       Rust's char::is_numeric (HF Digits)
  tok_punct         HF's Punctuation pre-tokenizer
The script fails if PCRE2 has a code point in a class that HF lacks (the fast patterns
would then be wrong and need another scheme).
"""
import ctypes
import ctypes.util
import sys

import tokenizers
from tokenizers import Regex, pre_tokenizers

# The \\p{X} classes the pre-tokenizer patterns use (tok_pretok.c rewrites each).
CLASSES = ["L", "N", "P", "M", "Lu", "Ll", "Lt", "Lm", "Lo"]

CPS = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF)]
ALL = "".join(chr(c) for c in CPS)
_SUBJ = _INDEX = None  # ALL in UTF-8, and its byte offsets (Pcre2.cls builds them once)


def hf_removed(pt):
    """Code points a pre-tokenizer with behavior 'removed' drops from ALL."""
    kept = bytearray(len(CPS))
    for _, (a, b) in pt.pre_tokenize_str(ALL):
        kept[a:b] = b"\x01" * (b - a)
    return {CPS[i] for i in range(len(CPS)) if not kept[i]}


def hf_class(pat):
    return hf_removed(pre_tokenizers.Split(Regex(pat), behavior="removed"))


def hf_numeric():
    s = "a".join(chr(c) for c in CPS)
    out = set()
    for piece, _ in pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(s):
        if len(piece) == 1 and piece != "a":
            out.add(ord(piece))
    return out


class Pcre2:
    UTF, UCP = 0x00080000, 0x00020000

    def __init__(self):
        self.lib = ctypes.CDLL(ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0")
        self.lib.pcre2_compile_8.restype = ctypes.c_void_p
        self.lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
                                             ctypes.POINTER(ctypes.c_int),
                                             ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
        self.lib.pcre2_match_data_create_8.restype = ctypes.c_void_p
        self.lib.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
        self.lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                           ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                           ctypes.c_void_p]
        self.lib.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(ctypes.c_size_t)
        self.lib.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
        self.lib.pcre2_config_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]

    def version(self):
        buf = ctypes.create_string_buffer(64)
        self.lib.pcre2_config_8(11, buf)  # PCRE2_CONFIG_VERSION
        ubuf = ctypes.create_string_buffer(64)
        self.lib.pcre2_config_8(10, ubuf)  # PCRE2_CONFIG_UNICODE_VERSION
        return buf.value.decode(), ubuf.value.decode()

    def cls(self, pat):
        """The code points PCRE2 matches with pat (one character), found run by run."""
        global _SUBJ, _INDEX
        if _SUBJ is None:
            _SUBJ = ALL.encode("utf-8", "surrogatepass")
            _INDEX, pos = {}, 0  # byte offset -> index in CPS
            for i, c in enumerate(CPS):
                _INDEX[pos] = i
                pos += len(chr(c).encode())
            _INDEX[pos] = len(CPS)
        err, off = ctypes.c_int(), ctypes.c_size_t()
        p = ("(?:%s)+" % pat).encode()
        code = self.lib.pcre2_compile_8(p, len(p), self.UTF | self.UCP, ctypes.byref(err),
                                        ctypes.byref(off), None)
        assert code, pat
        md = self.lib.pcre2_match_data_create_8(1, None)
        subj = _SUBJ
        out, pos = set(), 0
        while pos < len(subj):
            rc = self.lib.pcre2_match_8(code, subj, len(subj), pos, 0, md, None)
            if rc < 0:
                break
            ov = self.lib.pcre2_get_ovector_pointer_8(md)
            a, b = ov[0], ov[1]
            out.update(CPS[_INDEX[a]:_INDEX[b]])
            pos = b if b > a else a + 1
        return out


def ranges(s):
    out = []
    for c in sorted(s):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def re_class_body(s):
    return "".join("\\\\x{%X}" % a if a == b else "\\\\x{%X}-\\\\x{%X}" % (a, b)
                   for a, b in ranges(s))


def c_string_macro(name, body):
    w = sys.stdout.write
    if not body:
        w('#define %s ""\n' % name)
        return
    w("#define %s \\\n" % name)
    parts = [body[i:i + 80] for i in range(0, len(body), 80)]
    # do not split an escape: cut at "\\x{" boundaries
    parts, cur = [], ""
    for tok in body.split("\\\\x{"):
        if not tok:
            continue
        piece = "\\\\x{" + tok
        if len(cur) + len(piece) > 80:
            parts.append(cur)
            cur = ""
        cur += piece
    if cur:
        parts.append(cur)
    for i, p in enumerate(parts):
        w('    "%s"%s\n' % (p, " \\" if i + 1 < len(parts) else ""))


def table(name, s):
    rs = ranges(s)
    w = sys.stdout.write
    w("static const uint32_t %s[%d][2] = {\n" % (name, len(rs)))
    for a, b in rs:
        w("    {0x%X, 0x%X},\n" % (a, b))
    w("};\n\n")


def main():
    pc = Pcre2()
    ver, uver = pc.version()
    ws = hf_class(r"\s")
    new = {}
    for k in CLASSES:
        hf, mine = hf_class(r"\p{%s}" % k), pc.cls(r"\p{%s}" % k)
        extra = mine - hf
        if extra:
            sys.exit("PCRE2 has %d code points in \\p{%s} that HF lacks, e.g. %s" %
                     (len(extra), k, [hex(c) for c in sorted(extra)[:10]]))
        new[k] = hf - mine
    numeric = hf_numeric()
    punct = hf_removed(pre_tokenizers.Punctuation(behavior="removed"))
    newer = set().union(*new.values())

    w = sys.stdout.write
    w("/* Generated by scripts/gen-unicode-classes.py: HF tokenizers %s probed against PCRE2 %s\n"
      " * (Unicode %s). Do not edit. */\n\n" % (tokenizers.__version__, ver, uver))
    w("/* Oniguruma's \\s, as a class body. */\n")
    w('#define TOK_RE_WS "%s"\n\n' % "".join(
        ("\\\\x{%X}" % a if a == b else "\\\\x{%X}-\\\\x{%X}" % (a, b)) for a, b in ranges(ws)))
    for k in CLASSES:
        w("/* In Oniguruma's \\p{%s}, not in PCRE2's: %d code points. */\n" % (k, len(new[k])))
        c_string_macro("TOK_RE_%s_NEW" % k, re_class_body(new[k]))
        w("\n")
    w("/* Any code point of the TOK_RE_*_NEW classes. */\n")
    table("tok_newer", newer)
    w("/* Rust char::is_numeric (HF Digits). */\n")
    table("tok_numeric", numeric)
    w("/* HF Punctuation: ASCII punctuation or its Unicode punctuation table. */\n")
    table("tok_punct", punct)


if __name__ == "__main__":
    main()
