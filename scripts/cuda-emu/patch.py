#!/usr/bin/env python3
"""Copies src/ to OUT/src with the CUDA sources rewritten for the CPU emulator (emu.h):
<<<...>>> launches become EMU_CHEVRON(...) calls, and the few inline-PTX helpers (cp.async,
ldmatrix, mma.sync, f16x2 arithmetic, lop3, %globaltimer, the L2 prefetch hint) and the extern __shared__ arrays
become their emulations. Every rewrite must match: when a kernel source changes shape, this
script stops and names the pattern, rather than leave PTX the host compiler cannot build.

    usage: patch.py SRC_DIR OUT_DIR
"""
import pathlib
import re
import shutil
import sys


def rewrite(text, pat, rep, name, flags=re.S):
    new, n = re.subn(pat, rep, text, flags=flags)
    if n == 0:
        sys.exit(f"cuda-emu patch: '{name}' matched nothing (the kernel source changed: update patch.py)")
    return new


def main():
    src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    if (out / "src").exists():
        shutil.rmtree(out / "src")
    shutil.copytree(src, out / "src")
    cu = out / "src" / "backend" / "cuda"
    for p in sorted(list(cu.glob("*.cu")) + list(cu.glob("*.cuh"))):
        t = p.read_text()
        # kernel<<<grid, block, smem, stream>>>(args) -> EMU_CHEVRON((kernel), grid, block, smem, stream)(args)
        t = re.sub(r"(\b[A-Za-z_]\w*(?:<[^<>;]*>)?)<<<(.+?)>>>\(", r"EMU_CHEVRON((\1), \2)(", t)
        if p.name == "cuda_gate.cu":
            t = rewrite(t, r'asm volatile\("mov\.u64 %0, %%globaltimer;" : "=l"\((t0?)\)\);', r"\1 = 0;", "globaltimer")
        if p.name == "cuda_attn.cu":
            t = rewrite(t, r'asm volatile\("cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16, %2;\\n".*?: "memory"\);',
                        "emu_cp_async16(dst, src, src_bytes);", "attn cp.async")
            t = rewrite(t, r'asm volatile\("cp\.async\.commit_group;\\n" ::: "memory"\);', "", "attn commit")
            t = rewrite(t, r'asm volatile\("cp\.async\.wait_group %0;\\n" ::"n"\(N\) : "memory"\);', "", "attn wait")
            t = rewrite(t, r'asm\("mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32.*?\);\n',
                        "emu_mma(c, a, b0, b1, false);\n", "attn mma f16")
            t = rewrite(t, r'asm\("mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32.*?\);\n',
                        "emu_mma(c, a, b0, b1, true);\n", "attn mma bf16")
            t = rewrite(t, r'asm volatile\("ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16.*?\);\n',
                        "emu_ldsm(r, p, false);\n", "attn ldmatrix")
            t = rewrite(t, r'asm volatile\("ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16.*?\);\n',
                        "emu_ldsm(r, p, true);\n", "attn ldmatrix trans")
            t = rewrite(t, r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];",
                        r"unsigned char *\1 = (unsigned char *)emu::dyn_smem();", "attn extern shared")
        if p.name == "cuda_common.cuh":  # a cache hint: nothing to emulate
            t = rewrite(t, r'asm volatile\("prefetch\.global\.L2 \[%0\];" ::"l"\(c \+ o\)\);', "(void)(c + o);",
                        "L2 prefetch")
            t = rewrite(t, r'asm volatile\("cp\.async\.bulk\.prefetch\.L2\.global \[%0\], %1;" ::"l"\(p\), "r"\(bytes\) : "memory"\);',
                        "(void)p;", "bulk L2 prefetch")
            # one thread runs at a time: the ordering comes free
            t = rewrite(t, r'asm volatile\("atom\.acq_rel\.gpu\.global\.add\.s32 .*?: "memory"\);',
                        "old = atomicAdd(p, v);", "acq_rel atomic")
        if p.name == "cuda_mma.cuh":
            t = rewrite(t, r"(void cp_async16\(void \*smem, const void \*gmem\) \{).*?\n\}",
                        r"\1 memcpy(smem, gmem, 16); }", "mmq cp.async 16")
            t = rewrite(t, r"(void cp_async4\(void \*smem, const void \*gmem\) \{).*?\n\}",
                        r"\1 memcpy(smem, gmem, 4); }", "mmq cp.async 4")
            t = rewrite(t, r'asm volatile\("cp\.async\.commit_group;\\n" ::: "memory"\);', "", "mmq commit")
            t = rewrite(t, r'asm volatile\("cp\.async\.wait_group %0;\\n" ::"n"\(N\) : "memory"\);', "", "mmq wait")
            t = rewrite(t, r'asm volatile\("ldmatrix\.sync.*?\);\n',
                        "emu_ldsm(r, (const void *)(uintptr_t)addr, false);\n", "mmq ldmatrix")
            t = rewrite(t, r'asm\("mma\.sync\.aligned\.m16n8k16.*?\);\n', "emu_mma(c, a, b0, b1, false);\n", "mmq mma")
            t = rewrite(t, r'asm\("sub\.rn\.f16x2.*?\);\n', "d = emu_h2op(a, b, 0, 0);\n", "mmq sub.f16x2")
            t = rewrite(t, r'asm\("mul\.rn\.f16x2.*?\);\n', "d = emu_h2op(a, b, 0, 1);\n", "mmq mul.f16x2")
            t = rewrite(t, r'asm\("fma\.rn\.f16x2.*?\);\n', "d = emu_h2op(a, b, c, 2);\n", "mmq fma.f16x2")
            t = rewrite(t, r'asm\("lop3\.b32.*?\);\n', "d = (a & B) | c;\n", "mmq lop3")
            # wgmma (SMELT_WGMMA is 1 in emu.h): the descriptor keeps the whole 32-bit address
            # (fields: address / 16 in bits 0..29, the 128-byte swizzle flag in bit 30, sbo / 16
            # in 48..63); the product runs at issue, so the fence, commit and wait have nothing to do
            t = rewrite(t, r"(uint64_t wg_desc_sw128\(uint32_t saddr\) \{).*?\n\}",
                        r"\1 return (uint64_t)(saddr >> 4) | (uint64_t)1 << 30 | (uint64_t)(1024 >> 4) << 48; }",
                        "wgmma descriptor")
            t = rewrite(t, r'asm volatile\("wgmma\.fence\.sync\.aligned;\\n" ::: "memory"\);', "", "wgmma fence")
            t = rewrite(t, r'asm volatile\("wgmma\.commit_group\.sync\.aligned;\\n" ::: "memory"\);', "",
                        "wgmma commit")
            t = rewrite(t, r'asm volatile\("wgmma\.wait_group\.sync\.aligned %0;\\n" ::"n"\(N\) : "memory"\);', "",
                        "wgmma wait")
            t = rewrite(t, r'asm volatile\("" : "\+f"\(v\)::"memory"\);', "(void)v;", "wgmma pin")
            t = rewrite(t, r'asm volatile\("fence\.proxy\.async\.shared::cta;\\n" ::: "memory"\);', "",
                        "wgmma smem fence")
            t = rewrite(t, r'asm volatile\(\s*"\{\\n\.reg \.pred p;[^"]*"\s*"wgmma\.mma_async\.sync\.aligned\.m64n128k16.*?"n"\(1\)\);',
                        "emu_wgmma(&d[0][0], a, desc, 128);", "wgmma m64n128k16")
            t = rewrite(t, r'asm volatile\(\s*"\{\\n\.reg \.pred p;[^"]*"\s*"wgmma\.mma_async\.sync\.aligned\.m64n64k16.*?"n"\(1\)\);',
                        "emu_wgmma(&d[0][0], a, desc, 64);", "wgmma m64n64k16")
        if p.name in ("cuda_mmq.cu", "cuda_mmb.cu"):
            t = rewrite(t, r"extern __shared__ __align__\((?:16|1024)\) unsigned char (\w+)\[\];",
                        r"unsigned char *\1 = (unsigned char *)emu::dyn_smem();", f"{p.stem} extern shared")
        if p.name == "cuda_moe.cu":
            t = rewrite(t, r"extern __shared__ __align__\(16\) unsigned char (\w+)\[\];",
                        r"unsigned char *\1 = (unsigned char *)emu::dyn_smem();", "moe extern shared")
        left = [ln for ln in t.split("\n") if re.search(r"\basm\b", ln) and "griddepcontrol" not in ln
                and not ln.strip().startswith(("*", "/"))]
        if left:
            sys.exit(f"cuda-emu patch: {p.name} keeps inline PTX the emulator has no twin for:\n  " + "\n  ".join(left))
        p.write_text(t)


if __name__ == "__main__":
    main()
