#!/usr/bin/env python3
"""Compare the tensors of two GGUF files by name: type, shape and bytes.

For checking `smelt quantize` against `llama-quantize` on the same F16 input:

    python3 ../shared/bench/mkmodel.py llama3-1b f16.gguf      # or any F16/BF16 GGUF
    llama-quantize f16.gguf ref.gguf Q4_K_M
    smelt quantize f16.gguf ours.gguf Q4_K_M
    scripts/compare-gguf-tensors.py ref.gguf ours.gguf

Tensor order and metadata may differ (llama-quantize writes tensors sorted by layer); only
tensor contents are compared. Pure Python (no numpy, no gguf package), so it runs on any
machine. Exit status 0 when every tensor matches.
"""
import struct
import sys

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def index(path):
    with open(path, "rb") as f:
        head = f.read(256 << 20)
    pos = 0

    def rd(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, head, pos)[0]
        pos += struct.calcsize("<" + fmt)
        return v

    def skip(vt):
        nonlocal pos
        if vt == 8:
            n = rd("Q")
            pos += n
        elif vt == 9:
            et, n = rd("I"), rd("Q")
            if et in SIZES:
                pos += SIZES[et] * n
            else:
                for _ in range(n):
                    skip(et)
        else:
            pos += SIZES[vt]

    if rd("I") != 0x46554747:
        sys.exit(f"{path}: not a GGUF file")
    rd("I")
    n_t, n_kv = rd("Q"), rd("Q")
    align = 32
    for _ in range(n_kv):
        n = rd("Q")
        key = head[pos:pos + n]
        pos += n
        vt = rd("I")
        if key == b"general.alignment" and vt == 4:
            align = rd("I")
        else:
            skip(vt)
    infos = []
    for _ in range(n_t):
        n = rd("Q")
        name = head[pos:pos + n].decode()
        pos += n
        nd = rd("I")
        ne = tuple(rd("Q") for _ in range(nd))
        infos.append((name, ne, rd("I"), rd("Q")))
    start = (pos + align - 1) // align * align
    offs = sorted(o for _, _, _, o in infos)
    out = {}
    with open(path, "rb") as f:
        f.seek(0, 2)
        end = f.tell()
    for name, ne, t, off in infos:
        nxt = [o for o in offs if o > off]
        out[name] = (ne, t, start + off, (start + nxt[0] if nxt else end))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = index(sys.argv[1]), index(sys.argv[2])
    bad = 0
    fa, fb = open(sys.argv[1], "rb"), open(sys.argv[2], "rb")
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print(f"{name}: only in {'first' if name in a else 'second'} file")
            bad += 1
            continue
        (ne1, t1, s1, e1), (ne2, t2, s2, e2) = a[name], b[name]
        if ne1 != ne2 or t1 != t2:
            print(f"{name}: shape/type {ne1}/{t1} vs {ne2}/{t2}")
            bad += 1
            continue
        n = min(e1 - s1, e2 - s2)  # the aligned span; padding past the data is ignored
        fa.seek(s1)
        fb.seek(s2)
        same, first, done = True, None, 0
        while done < n:
            k = min(64 << 20, n - done)
            x, y = fa.read(k), fb.read(k)
            if x != y:
                same = False
                first = done + next(i for i in range(k) if x[i] != y[i])
                break
            done += k
        if not same:
            # differences in the trailing alignment padding are not data differences
            print(f"{name}: bytes differ from offset {first}")
            bad += 1
    print(f"{len(set(a) & set(b))} common tensors, {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
