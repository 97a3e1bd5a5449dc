/* Row-interleaved weight layout of the repacked decode kernels (cpu_kernels.h, "Repacked
 * weights"): the section table per type and a generic (any G, scalar) repack and
 * unrepack. The SIMD levels bring their own transposing versions for their G; these are
 * the reference the tests compare them with, and the path for a ragged last group.
 *
 * Sections follow the block structs of quant/blocks.h: f16 scales as 2-byte units,
 * everything else in 4-byte units in the file's byte order (so four consecutive bytes of
 * quants of one row stay together, which is what a vpdpbusd lane wants). Blocks whose
 * f16 fields sit at the end (Q2_K, Q3_K, Q6_K, TQ) keep that order.
 */
#include <string.h>

#include "backend/cpu/cpu_kernels.h"

bool cpu_rp_layout(uint32_t type, struct cpu_rp_layout *out) {
#define L2(o0, l0, u0, o1, l1, u1) (struct cpu_rp_layout){2, {{o0, l0, u0}, {o1, l1, u1}}}
    switch (type) {
    case QT_Q4_0:
    case QT_IQ4_NL:
        *out = L2(0, 2, 2, 2, 16, 4);
        return true;
    case QT_Q4_1:
        *out = L2(0, 4, 2, 4, 16, 4);
        return true;
    case QT_Q5_0:
        *out = L2(0, 2, 2, 2, 20, 4);
        return true;
    case QT_Q5_1:
        *out = L2(0, 4, 2, 4, 20, 4);
        return true;
    case QT_Q8_0:
        *out = L2(0, 2, 2, 2, 32, 4);
        return true;
    case QT_Q2_K:
        *out = L2(0, 80, 4, 80, 4, 2);
        return true;
    case QT_Q3_K:
        *out = L2(0, 108, 4, 108, 2, 2);
        return true;
    case QT_Q4_K:
        *out = L2(0, 4, 2, 4, 140, 4);
        return true;
    case QT_Q5_K:
        *out = L2(0, 4, 2, 4, 172, 4);
        return true;
    case QT_Q6_K:
        *out = L2(0, 208, 4, 208, 2, 2);
        return true;
    case QT_IQ4_XS:
        *out = L2(0, 4, 2, 4, 132, 4);
        return true;
    case QT_MXFP4:
        *out = L2(0, 1, 1, 1, 16, 4);
        return true;
    case QT_TQ1_0:
        *out = L2(0, 52, 4, 52, 2, 2);
        return true;
    case QT_TQ2_0:
        *out = L2(0, 64, 4, 64, 2, 2);
        return true;
    default:
        return false;
    }
#undef L2
}

/* Copies nr rows between the file layout (row r at w + r*ws) and one group, blocks
 * b0..b1-1: to_group, or back. Rows nr..G-1 of the group are zeroed on the way in. */
static void rp_copy(int G, uint32_t type, int64_t b0, int64_t b1, char *w, size_t ws, char *grp,
                    int nr, bool to_group) {
    struct cpu_rp_layout lay;
    const struct qtype_info *qi = qtype_get(type);
    if (!qi || !cpu_rp_layout(type, &lay)) return;
    const size_t bb = qi->type_size, tile = (size_t)G * bb;
    for (int64_t b = b0; b < b1; b++)
        for (int s = 0; s < lay.n; s++) {
            const struct cpu_rp_sec *sc = &lay.sec[s];
            char *base = grp + (size_t)b * tile + (size_t)G * sc->off;
            for (int j = 0; j < sc->len / sc->unit; j++)
                for (int r = 0; r < G; r++) {
                    const int slot = sc->unit == 4 ? cpu_rp_slot(type, G, j) : j;
                    char *u = base + ((size_t)slot * G + r) * sc->unit;
                    char *f = w + r * ws + b * bb + sc->off + j * sc->unit;
                    /* constant sizes: plain moves, not a library call per unit */
                    if (r >= nr) {
                        if (to_group) memset(u, 0, sc->unit);
                    } else if (sc->unit == 2) {
                        to_group ? memcpy(u, f, 2) : memcpy(f, u, 2);
                    } else if (sc->unit == 1) {
                        to_group ? (void)(*u = *f) : (void)(*f = *u);
                    } else {
                        to_group ? memcpy(u, f, 4) : memcpy(f, u, 4);
                    }
                }
        }
}

void cpu_rp_pack_any(int G, uint32_t type, int64_t k, const void *w, size_t ws, int nr, void *dst) {
    rp_copy(G, type, 0, k / qtype_get(type)->blck_size, (char *)w, ws, dst, nr, true);
}

void cpu_rp_unpack_any(int G, uint32_t type, int64_t k, const void *grp, int nr, void *dst,
                       size_t ds) {
    rp_copy(G, type, 0, k / qtype_get(type)->blck_size, dst, ds, (char *)grp, nr, false);
}

