#!/usr/bin/env python3
"""Generates the corpus of hand-made broken GGUF files and expected.txt, and the fuzz seeds.

Each file is paired with a substring its error message must contain (expected.txt,
FILE<TAB>substring); tests/unit/test_gguf.c opens each with gguf_open (and, except the
split cases, gguf_open_memory) and checks. Standard library only. Rerun after changing
a case:  python3 tests/data/gguf-bad/make.py   (writes beside this script)
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32_T, F16_T, Q4_0_T, Q8_0_T, Q4_K_T = 0, 1, 2, 8, 12


def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def kv_u32(key, v):
    return kv(key, U32, struct.pack("<I", v))


def kv_str(key, v):
    return kv(key, STR, s(v))


def tinfo(name, dims, ttype, offset):
    return (s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in dims)
            + struct.pack("<IQ", ttype, offset & (2**64 - 1)))


def header(n_t, n_kv, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_t, n_kv)


def gguf(kvs=(), tinfos=(), data=b"", align=32, n_t=None, n_kv=None, version=3):
    """A file: header, KVs, tensor infos, padding to align, data."""
    body = header(len(tinfos) if n_t is None else n_t, len(kvs) if n_kv is None else n_kv, version)
    body += b"".join(kvs) + b"".join(tinfos)
    if tinfos or data:
        body += b"\0" * ((-len(body)) % align)
    return body + data


BASE_KVS = [kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 2)]
W = [tinfo("w", [32, 2], F32_T, 0)]
W_DATA = bytes(range(256))  # 32*2*4 bytes of F32


def valid():
    return gguf(BASE_KVS, W, W_DATA)


cases = []


def case(name, data, want):
    cases.append((name, data, want))


# --- header ---
case("bad_magic.gguf", b"GGUX" + valid()[4:], "bad magic")
case("short_magic.gguf", b"GG", "bad magic")
case("ggml_legacy.gguf", b"lmgg" + b"\0" * 60, "pre-GGUF")
case("version1.gguf", b"GGUF" + struct.pack("<III", 1, 0, 0) + b"\0" * 16, "GGUF version 1 is not supported")
case("version4.gguf", header(0, 0, 4), "GGUF version 4 is not supported")
case("version0.gguf", header(0, 0, 0), "GGUF version 0 is not supported")
case("big_endian.gguf", b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian")
case("empty.gguf", b"", "empty file")
case("trunc_header.gguf", header(0, 0)[:14], "header: truncated")
case("trunc_version.gguf", b"GGUF\3\0", "header: truncated")
case("huge_n_kv.gguf", header(0, 2**63) + b"\0" * 64, "header claims 9223372036854775808 metadata entries")
case("huge_n_tensors.gguf", header(2**64 - 1, 0) + b"\0" * 64, "more than the file's")
case("count_exceeds_bytes.gguf", header(0, 5) + BASE_KVS[0], "more than the file's")

# --- metadata ---
# Truncations: two KVs, the second cut at each field (the first KV pads the file so
# the count bound passes and the parser reaches the cut).
pad_kv = kv_str("general.name", "x" * 64)
second = kv("a.b", U64, struct.pack("<Q", 7))
case("trunc_kv_keylen.gguf", header(0, 2) + pad_kv + second[:4], "metadata entry #1: key: truncated")
case("trunc_kv_key.gguf", header(0, 2) + pad_kv + second[:9], "metadata entry #1: key: string length 3 past end of file")
case("trunc_kv_type.gguf", header(0, 2) + pad_kv + second[:13], "key 'a.b': truncated")
case("trunc_kv_value.gguf", header(0, 2) + pad_kv + second[:19], "key 'a.b': truncated")
case("trunc_kv_strvalue.gguf", header(0, 2) + pad_kv + kv_str("a.s", "hello world")[:25],
     "key 'a.s': string length 11 past end of file")
arr_kv = kv("a.arr", ARR, struct.pack("<IQ", I32, 1000) + b"\0" * 40)
case("trunc_array_header.gguf", header(0, 2) + pad_kv + arr_kv[:20], "key 'a.arr': truncated")
case("trunc_array_elems.gguf", header(0, 2) + pad_kv + arr_kv, "key 'a.arr': array of 1000 INT32 elements past end of file")
case("huge_string_len.gguf", header(0, 1) + struct.pack("<Q", 2**64 - 1) + b"\0" * 32,
     "string length 18446744073709551615 past end of file")
case("huge_array_count.gguf", gguf([kv("a.arr", ARR, struct.pack("<IQ", U32, 2**62) + b"\0" * 16)]),
     "array of 4611686018427387904 UINT32 elements past end of file")
case("huge_string_array.gguf", gguf([kv("a.arr", ARR, struct.pack("<IQ", STR, 2**61) + b"\0" * 16)]),
     "array of 2305843009213693952 STRING elements past end of file")
case("string_in_array_past_eof.gguf",
     gguf([kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 2) + s("ok") + struct.pack("<Q", 99) + b"abc")]),
     "key 'tokenizer.ggml.tokens': string length 99 past end of file")
case("bad_value_type.gguf", gguf([kv("a.b", 13, b"\0" * 16)]), "key 'a.b': unknown value type 13")
case("bad_value_type_huge.gguf", gguf([kv("a.b", 0xFFFFFFFF, b"\0" * 16)]), "unknown value type 4294967295")
case("bad_array_elem_type.gguf", gguf([kv("a.arr", ARR, struct.pack("<IQ", 99, 1) + b"\0" * 16)]),
     "key 'a.arr': unknown array element type 99")


def nested(depth):
    """depth arrays, each holding one array; the innermost holds one INT8."""
    payload = struct.pack("<IQ", I8, 1) + b"\x05"
    for _ in range(depth - 1):
        payload = struct.pack("<IQ", ARR, 1) + payload
    return payload


case("nested_too_deep.gguf", gguf([kv("a.deep", ARR, nested(9))]), "key 'a.deep': arrays nested deeper than 8")
case("nested_very_deep.gguf", gguf([kv("a.deep", ARR, nested(10000))]), "arrays nested deeper than 8")
case("duplicate_key.gguf", gguf(BASE_KVS + [kv_u32("llama.block_count", 3)], W, W_DATA),
     "duplicate key 'llama.block_count' (metadata entries #1 and #2)")
case("empty_key.gguf", gguf([kv_u32("", 1)]), "metadata entry #0: empty key")
case("key_with_nul.gguf", gguf([kv_u32("a\0b", 1)]), "key 'a?b': contains a NUL byte")

# --- alignment ---
case("alignment_zero.gguf", gguf(BASE_KVS + [kv_u32("general.alignment", 0)], W, W_DATA),
     "key 'general.alignment': 0 is not a power of two")
case("alignment_48.gguf", gguf(BASE_KVS + [kv_u32("general.alignment", 48)], W, W_DATA, align=48),
     "key 'general.alignment': 48 is not a power of two")
case("alignment_huge.gguf", gguf(BASE_KVS + [kv("general.alignment", U64, struct.pack("<Q", 2**40))]),
     "key 'general.alignment': 1099511627776 is not a power of two in [1, 2^30]")
case("alignment_string.gguf", gguf(BASE_KVS + [kv_str("general.alignment", "32")]),
     "key 'general.alignment': must be an unsigned integer, not STRING")
case("alignment_negative.gguf", gguf(BASE_KVS + [kv("general.alignment", I32, struct.pack("<i", -32))]),
     "key 'general.alignment': must be an unsigned integer, not INT32")

# --- tensor infos ---
t_full = tinfo("blk.0.attn_q.weight", [32, 2], F32_T, 0)
hdr_t = header(2, 2) + b"".join(BASE_KVS)
pad_t = tinfo("pad" * 20, [32], F32_T, 0)  # a first, whole tensor info so the count bound passes
case("trunc_tensor_namelen.gguf", hdr_t + pad_t + t_full[:5], "tensor info #1: name: truncated")
case("trunc_tensor_name.gguf", hdr_t + pad_t + t_full[:12], "tensor info #1: name: string length 19 past end of file")
case("trunc_tensor_ndims.gguf", hdr_t + pad_t + t_full[:29], "tensor 'blk.0.attn_q.weight': truncated")
case("trunc_tensor_dims.gguf", hdr_t + pad_t + t_full[:40], "tensor 'blk.0.attn_q.weight': truncated")
case("trunc_tensor_type.gguf", hdr_t + pad_t + t_full[:49], "tensor 'blk.0.attn_q.weight': truncated")
case("trunc_tensor_offset.gguf", hdr_t + pad_t + t_full[:55], "tensor 'blk.0.attn_q.weight': truncated")
case("trunc_data.gguf", valid()[:-10], "tensor 'w': data [")
case("trunc_data_padding.gguf", gguf(BASE_KVS, W)[:-3], "tensor 'w': data [")
case("bad_tensor_type.gguf", gguf(BASE_KVS, [tinfo("blk.3.attn_q.weight", [32, 2], 4, 0)], W_DATA),
     "tensor 'blk.3.attn_q.weight': unknown type id 4")
case("bad_tensor_type_huge.gguf", gguf(BASE_KVS, [tinfo("w", [32], 123456, 0)], W_DATA), "tensor 'w': unknown type id 123456")
case("zero_dim.gguf", gguf(BASE_KVS, [tinfo("w", [32, 0], F32_T, 0)], W_DATA), "tensor 'w': dimension 1 is 0")
case("negative_dim.gguf", gguf(BASE_KVS, [tinfo("w", [-5, 2], F32_T, 0)], W_DATA), "tensor 'w': dimension 0 is -5")
case("too_many_dims.gguf", gguf(BASE_KVS, [tinfo("w", [1, 1, 1, 1, 32], F32_T, 0)], W_DATA), "tensor 'w': 5 dimensions (max 4)")
case("huge_n_dims.gguf", gguf(BASE_KVS, [s("w") + struct.pack("<I", 2**31) + b"\0" * 64]), "tensor 'w': 2147483648 dimensions")
case("dims_overflow.gguf", gguf(BASE_KVS, [tinfo("w", [2**32, 2**32], F32_T, 0)], W_DATA),
     "tensor 'w': element count of shape [4294967296, 4294967296] overflows")
case("bytes_overflow.gguf", gguf(BASE_KVS, [tinfo("w", [2**31, 2**31], F32_T, 0)], W_DATA), "tensor 'w': byte size overflows")
case("row_not_block_multiple.gguf", gguf(BASE_KVS, [tinfo("w", [100, 2], Q4_K_T, 0)], W_DATA),
     "tensor 'w': row length 100 is not a multiple of the Q4_K block size 256")
case("misaligned_offset.gguf", gguf(BASE_KVS, [tinfo("w", [8], F32_T, 4)], W_DATA),
     "tensor 'w': offset 4 is not a multiple of the alignment 32")
case("data_past_eof.gguf", gguf(BASE_KVS, [tinfo("blk.3.attn_q.weight", [32, 2], F32_T, 64)], W_DATA),
     "tensor 'blk.3.attn_q.weight': data [")
case("offset_overflow.gguf", gguf(BASE_KVS, [tinfo("w", [8], F32_T, 2**64 - 32)], W_DATA), "tensor 'w': data [")
case("overlap.gguf", gguf(BASE_KVS, [tinfo("a", [32], F32_T, 0), tinfo("b", [32], F32_T, 96)], W_DATA),
     "tensors 'a' [")
case("duplicate_tensor.gguf", gguf(BASE_KVS, [tinfo("w", [8], F32_T, 0), tinfo("w", [8], F32_T, 32)], W_DATA),
     "duplicate tensor name 'w'")
case("empty_tensor_name.gguf", gguf(BASE_KVS, [tinfo("", [8], F32_T, 0)], W_DATA), "tensor info #0: empty name")

# --- split sets (gguf_open only: they need the file name) ---
split_kvs = BASE_KVS + [kv("split.no", U16, struct.pack("<H", 0)), kv("split.count", U16, struct.pack("<H", 2)),
                        kv("split.tensors.count", I32, struct.pack("<i", 2))]
case("split-missing-00001-of-00002.gguf", gguf(split_kvs, W, W_DATA), "split 2 of 2 missing or unreadable")
case("split_badname.gguf", gguf(split_kvs, W, W_DATA), "the file name is not NAME-00001-of-00002.gguf")
second_kvs = [kv("split.no", U16, struct.pack("<H", 1)), kv("split.count", U16, struct.pack("<H", 2))]
case("split-second-00002-of-00002.gguf", gguf(second_kvs, W, W_DATA), "this is split 2 of 2: open the first file")
case("split_count_zero.gguf", gguf(BASE_KVS + [kv("split.count", U16, struct.pack("<H", 0))]),
     "key 'split.count': 0 out of range")
case("split_count_string.gguf", gguf(BASE_KVS + [kv_str("split.count", "2")]),
     "key 'split.count': must be a non-negative integer, not STRING")
case("split_tensors_count.gguf", gguf(BASE_KVS + [kv("split.count", U16, struct.pack("<H", 1)),
                                                  kv("split.tensors.count", I32, struct.pack("<i", 9))], W, W_DATA),
     "split.tensors.count is 9 but the 1 splits hold 1 tensors")


# --- valid seeds for the fuzzer (fuzz/corpus/gguf), plus a few broken ones ---
def seeds():
    out = {}
    out["valid_small.gguf"] = valid()
    out["valid_empty.gguf"] = header(0, 0)
    out["valid_v2.gguf"] = gguf(BASE_KVS, W, W_DATA, version=2)
    scalars = [kv("s.u8", U8, b"\x07"), kv("s.i8", I8, b"\xf9"), kv("s.u16", U16, struct.pack("<H", 7)),
               kv("s.i16", I16, struct.pack("<h", -7)), kv("s.i32", I32, struct.pack("<i", -7)),
               kv("s.f32", F32, struct.pack("<f", 0.5)), kv("s.bool", BOOL, b"\x01"),
               kv("s.u64", U64, struct.pack("<Q", 2**64 - 1)), kv("s.i64", I64, struct.pack("<q", -2**63)),
               kv("s.f64", F64, struct.pack("<d", 1e-300)), kv_str("s.str", "h\u00e9llo")]
    out["valid_all_scalars.gguf"] = gguf(scalars)
    toks = [b"<s>", b"</s>", b"hello", b"\xc4\xa0world", b""]
    tok_kvs = [kv_str("general.architecture", "llama"), kv_str("tokenizer.ggml.model", "gpt2"),
               kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, len(toks)) + b"".join(s(t) for t in toks)),
               kv("tokenizer.ggml.token_type", ARR, struct.pack("<IQ", I32, len(toks)) + struct.pack("<5i", 3, 3, 1, 1, 1)),
               kv("tokenizer.ggml.merges", ARR, struct.pack("<IQ", STR, 1) + s("h e")),
               kv_u32("tokenizer.ggml.bos_token_id", 0)]
    out["valid_tokenizer.gguf"] = gguf(tok_kvs)
    out["valid_nested8.gguf"] = gguf([kv("a.deep", ARR, nested(8)),
                                      kv("a.strs", ARR, struct.pack("<IQ", ARR, 2) + struct.pack("<IQ", STR, 1) + s("x")
                                         + struct.pack("<IQ", STR, 0))])
    q8 = [tinfo("blk.0.attn_q.weight", [32, 2], Q8_0_T, 0), tinfo("blk.0.ffn_up.weight", [256], Q4_K_T, 128),
          tinfo("output_norm.weight", [16], F32_T, 384), tinfo("token_embd.weight", [4, 2], F16_T, 448)]
    out["valid_tensors_align64.gguf"] = gguf(BASE_KVS + [kv_u32("general.alignment", 64)], q8,
                                             bytes(range(256)) * 2, align=64)
    for name in ("nested_too_deep.gguf", "overlap.gguf", "dims_overflow.gguf", "trunc_array_elems.gguf",
                 "duplicate_key.gguf", "misaligned_offset.gguf"):
        out["bad_" + name] = dict((c[0], c[1]) for c in cases)[name]
    return out


def main():
    for f in os.listdir(HERE):
        if f.endswith(".gguf"):
            os.remove(os.path.join(HERE, f))
    names = set()
    with open(os.path.join(HERE, "expected.txt"), "w") as m:
        m.write("# FILE<TAB>substring of the error message (generated by make.py)\n")
        for name, data, want in cases:
            assert name not in names, name
            names.add(name)
            with open(os.path.join(HERE, name), "wb") as f:
                f.write(data)
            m.write(f"{name}\t{want}\n")
    print(f"wrote {len(cases)} files")
    seed_dir = os.path.join(HERE, "..", "..", "..", "fuzz", "corpus", "gguf")
    os.makedirs(seed_dir, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(seed_dir, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds())} fuzz seeds to fuzz/corpus/gguf")


if __name__ == "__main__":
    main()
