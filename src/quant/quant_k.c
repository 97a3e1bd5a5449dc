/* K-quants: 256-element super-blocks with 6-bit (or 4/8-bit) sub-block scales.
 *
 * Dequantize mirrors gguf-py's numpy arithmetic (f16 scales widened to f32, then
 * d*sc, then (d*sc)*q - dmin*m), so it is bit-exact against it.
 *
 * Quantize implements ggml's reference algorithms (quantize_row_q*_K_ref: what
 * llama-quantize uses without an importance matrix), in the same f32 operation order so
 * that files can match llama-quantize byte for byte:
 *   Q2_K: per 16-element sub-block a weighted (|x|) scale+min fit searched over 16 scale
 *         candidates (fit_scale_min, use_mad), then 4-bit super-quantized scales/mins.
 *   Q3_K: signed scale per 16 by an iterative weighted (x^2) refinement (fit_q3), 6-bit
 *         scales relative to the largest.
 *   Q4_K/Q5_K: scale+min per 32 with weights sqrt(mean x^2) + |x|, 21 / 16 candidates.
 *   Q6_K: signed scale per 16 from a 19-candidate search (fit_signed), int8 scales.
 *   Q8_K: an activation format: x * (-127/max), plus per-16 sums.
 * After the scales are fixed (and rounded to f16) every element is re-quantized against
 * the rounded scale. No gguf-py counterpart exists for these quantizers; the tests
 * report RMSE instead (docs/quant.md).
 */
#include <math.h>

#include "quant/quant_impl.h"

#define GROUP_MAX_EPS 1e-15f

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Signed value of largest magnitude, first on ties; *amax gets its magnitude. */
static float signed_max(const float *x, int n, float *amax) {
    float am = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > am) {
            am = ax;
            mx = x[i];
        }
    }
    *amax = am;
    return mx;
}

/* Symmetric fit x ~ scale * (L - nmax), L in [0, 2*nmax), weights x^2: try
 * iscale = -(nmax + 0.1*is)/max for is in -9..9 and keep the best weighted
 * least-squares scale (ggml make_qx_quants, rmse_type 1). Returns the scale. */
static float fit_signed(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_max(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q3_K sub-block fit (ggml make_q3_quants with do_rmse): start from -nmax/max, then up
 * to 5 passes of single-element moves that raise (sum w x l)^2 / (sum w l^2), w = x^2.
 * L gets values in [0, 2*nmax). */
static float fit_q3(int n, int nmax, const float *x, int8_t *L) {
    float amax;
    const float max = signed_max(x, n, &amax);
    if (amax < GROUP_MAX_EPS) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.f;
    }
    const float iscale = -nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(quant_nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = clampi(quant_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Asymmetric fit x ~ scale * L - the_min, L in [0, nmax], min <= 0 (ggml
 * make_qkx2_quants): start from (max - min)/nmax, then for nstep+1 candidate iscales
 * (rmin + rdelta*is + nmax)/(max - min) solve the weighted least squares for scale and
 * min and keep the candidate with the least weighted error (|diff| when use_mad).
 * Returns the scale; *the_min gets -min (>= 0). */
static float fit_scale_min(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                           float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                           bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; i++) {
        int l = quant_nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)clampi(l, 0, nmax);
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(quant_nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; i++) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* ---- 4-lane versions of the two fits ----
 *
 * The fits above run a long sequential chain per sub-block; a super-block has 8 (or 16)
 * independent sub-blocks, so these versions run 4 sub-blocks at once, one per lane of a
 * GCC/Clang 128-bit vector (baseline SSE2 code, no ISA flags needed). Every lane performs exactly
 * the scalar function's IEEE operations in the same order (no reassociation, no FMA), so
 * the results are bit-identical; tests/unit/test_quant.c checks that on random and edge
 * data. About 5x faster for Q4_K on this machine. */

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f vsel(v4i m, v4f a, v4f b) { return (v4f)((m & (v4i)a) | (~m & (v4i)b)); }
static inline v4i vseli(v4i m, v4i a, v4i b) { return (m & a) | (~m & b); }
static inline v4f vabs(v4f x) { return (v4f)((v4i)x & 0x7fffffff); }
static inline v4f vsplat(float f) { return (v4f){f, f, f, f}; }
static inline v4i vsplati(int i) { return (v4i){i, i, i, i}; }
static inline v4i vnearest(v4f x) {
    const v4f v = x + 12582912.f;
    return ((v4i)v & 0x007fffff) - 0x00400000;
}
static inline v4i vclamp(v4i v, int lo, int hi) {
    v = vseli(v < lo, vsplati(lo), v);
    return vseli(v > hi, vsplati(hi), v);
}
static inline v4f vf(v4i v) { return __builtin_convertvector(v, v4f); }
/* Lane k of the vector at element i: sub-block k starts at x + n*k. */
static inline v4f vgather(const float *x, int n, int i) {
    return (v4f){x[i], x[n + i], x[2 * n + i], x[3 * n + i]};
}

/* fit_scale_min on 4 consecutive sub-blocks of n elements (n <= 32): scales[4],
 * the_min[4], L[4*n] exactly as 4 scalar calls would give. */
static void fit_scale_min4(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                           float *scales, float *the_min, float rmin, float rdelta, int nstep,
                           bool use_mad) {
    v4f xv[32], wv[32];
    v4i Lv[32], La[32];
    for (int i = 0; i < n; i++) {
        xv[i] = vgather(x, n, i);
        wv[i] = vgather(weights, n, i);
    }
    v4f min = xv[0], max = xv[0];
    v4f sum_w = wv[0];
    v4f sum_x = sum_w * xv[0];
    for (int i = 1; i < n; i++) {
        min = vsel(xv[i] < min, xv[i], min);
        max = vsel(xv[i] > max, xv[i], max);
        sum_w += wv[i];
        sum_x += wv[i] * xv[i];
    }
    min = vsel(min > 0, vsplat(0), min);
    const v4i flat = max == min;
    v4f iscale = (float)nmax / (max - min);
    v4f scale = 1 / iscale;
    v4f best_error = vsplat(0);
    for (int i = 0; i < n; i++) {
        Lv[i] = vclamp(vnearest(iscale * (xv[i] - min)), 0, nmax);
        v4f diff = scale * vf(Lv[i]) + min - xv[i];
        diff = use_mad ? vabs(diff) : diff * diff;
        best_error += wv[i] * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (max - min); /* min moves as fits are accepted */
        v4f sum_l = vsplat(0), sum_l2 = vsplat(0), sum_xl = vsplat(0);
        for (int i = 0; i < n; i++) {
            La[i] = vclamp(vnearest(iscale * (xv[i] - min)), 0, nmax);
            const v4f l = vf(La[i]);
            sum_l += wv[i] * l;
            sum_l2 += wv[i] * l * l;
            sum_xl += wv[i] * l * xv[i];
        }
        const v4f D = sum_w * sum_l2 - sum_l * sum_l;
        v4f this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        v4f this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        const v4i pos = this_min > 0;
        this_min = vsel(pos, vsplat(0), this_min);
        this_scale = vsel(pos, sum_xl / sum_l2, this_scale);
        v4f cur_error = vsplat(0);
        for (int i = 0; i < n; i++) {
            v4f diff = this_scale * vf(La[i]) + this_min - xv[i];
            diff = use_mad ? vabs(diff) : diff * diff;
            cur_error += wv[i] * diff;
        }
        const v4i acc = (D > 0) & (cur_error < best_error) & ~flat;
        for (int i = 0; i < n; i++) Lv[i] = vseli(acc, La[i], Lv[i]);
        best_error = vsel(acc, cur_error, best_error);
        scale = vsel(acc, this_scale, scale);
        min = vsel(acc, this_min, min);
    }
    scale = vsel(flat, vsplat(0), scale);
    for (int k = 0; k < 4; k++) {
        scales[k] = scale[k];
        the_min[k] = -min[k];
        for (int i = 0; i < n; i++) L[n * k + i] = flat[k] ? 0 : (uint8_t)Lv[i][k];
    }
}

/* fit_signed on 4 consecutive sub-blocks of n elements (n <= 32). */
static void fit_signed4(int n, int nmax, const float *x, int8_t *L, float *scales) {
    v4f xv[32], wv[32];
    v4i Lv[32], La[32];
    v4f am = vsplat(0), max = vsplat(0);
    for (int i = 0; i < n; i++) {
        xv[i] = vgather(x, n, i);
        wv[i] = xv[i] * xv[i];
        const v4f ax = vabs(xv[i]);
        const v4i gt = ax > am;
        am = vsel(gt, ax, am);
        max = vsel(gt, xv[i], max);
    }
    const v4i zero = am < GROUP_MAX_EPS;
    v4f iscale = (float)-nmax / max;
    v4f sumlx = vsplat(0), suml2 = vsplat(0);
    for (int i = 0; i < n; i++) {
        const v4i l = vclamp(vnearest(iscale * xv[i]), -nmax, nmax - 1);
        Lv[i] = l + nmax;
        const v4f lf = vf(l);
        sumlx += wv[i] * xv[i] * lf;
        suml2 += wv[i] * lf * lf;
    }
    v4f scale = vsel(suml2 != 0, sumlx / suml2, vsplat(0));
    v4f best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -(nmax + 0.1f * is) / max;
        sumlx = suml2 = vsplat(0);
        for (int i = 0; i < n; i++) {
            const v4i l = vclamp(vnearest(iscale * xv[i]), -nmax, nmax - 1);
            La[i] = l + nmax;
            const v4f lf = vf(l);
            sumlx += wv[i] * xv[i] * lf;
            suml2 += wv[i] * lf * lf;
        }
        const v4i acc = (suml2 > 0) & (sumlx * sumlx > best * suml2);
        for (int i = 0; i < n; i++) Lv[i] = vseli(acc, La[i], Lv[i]);
        scale = vsel(acc, sumlx / suml2, scale);
        best = vsel(acc, scale * sumlx, best);
    }
    for (int k = 0; k < 4; k++) {
        scales[k] = zero[k] ? 0.f : scale[k];
        for (int i = 0; i < n; i++) L[n * k + i] = zero[k] ? 0 : (int8_t)Lv[i][k];
    }
}

/* 6-bit scale/min pair k of a Q4_K/Q5_K block (layout in blocks.h). */
static inline void scale_min_k4(int k, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (k < 4) {
        *sc = q[k] & 63;
        *m = q[k + 4] & 63;
    } else {
        *sc = (uint8_t)((q[k + 4] & 0xF) | (q[k - 4] >> 6) << 4);
        *m = (uint8_t)((q[k + 4] >> 4) | (q[k] >> 6) << 4);
    }
}

/* Packs 2-bit values L[0..255] the Q2_K/Q3_K way: qs[32h + l] holds elements
 * 128h + l + 32s at bits 2s. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 |
                                      L[j + l + 96] << 6);
}

/* ---- Q2_K ---- */

void quant_from_q2_K(const void *src, float *dst, int64_t n) {
    const struct block_q2_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d), dmin = quant_h(b[i].dmin);
        for (int k = 0; k < 16; k++) {
            const uint8_t sc = b[i].scales[k];
            const float dl = d * (float)(sc & 0xF);
            const float ml = dmin * (float)(sc >> 4);
            for (int e = 0; e < 16; e++) {
                const int nn = 16 * k + e, h = nn / 128, s = (nn % 128) / 32, l = nn % 32;
                const int q = (b[i].qs[32 * h + l] >> (2 * s)) & 3;
                dst[nn] = dl * (float)q - ml;
            }
        }
        dst += QK_K;
    }
}

static void to_q2_K(const float *x, void *dst, int64_t n, bool vec) {
    struct block_q2_K *y = dst;
    uint8_t L[QK_K], Laux[16];
    float weights[QK_K], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_min = 0;
        for (int l = 0; l < QK_K; l++) weights[l] = fabsf(x[l]);
        if (vec) {
            for (int j = 0; j < QK_K / 16; j += 4)
                fit_scale_min4(16, 3, x + 16 * j, weights + 16 * j, L + 16 * j, scales + j, mins + j,
                               -0.5f, 0.1f, 15, true);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            if (!vec)
                scales[j] = fit_scale_min(16, 3, x + 16 * j, weights + 16 * j, L + 16 * j, &mins[j],
                                          Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] = (uint8_t)quant_nearest_int(iscale * scales[j]);
            y[i].d = f32_to_f16(max_scale / q4scale);
        } else {
            for (int j = 0; j < QK_K / 16; j++) y[i].scales[j] = 0;
            y[i].d = f32_to_f16(0.f);
        }
        if (max_min > 0) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                y[i].scales[j] |= (uint8_t)((unsigned)quant_nearest_int(iscale * mins[j]) << 4);
            y[i].dmin = f32_to_f16(max_min / q4scale);
        } else {
            y[i].dmin = f32_to_f16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = quant_h(y[i].d) * (y[i].scales[j] & 0xF);
            if (d == 0) continue;
            const float dm = quant_h(y[i].dmin) * (y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (uint8_t)clampi(quant_nearest_int((x[16 * j + ii] + dm) / d), 0, 3);
        }
        pack_2bit(L, y[i].qs);
    }
}

void quant_to_q2_K(const float *x, void *dst, int64_t n) { to_q2_K(x, dst, n, true); }
void quant_to_q2_K_scalar(const float *x, void *dst, int64_t n) { to_q2_K(x, dst, n, false); }

/* ---- Q3_K ---- */

static int q3_scale(const uint8_t *scales, int k) {
    int lo = k < 8 ? scales[k] & 0xF : scales[k - 8] >> 4;
    int hi = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
    return (lo | hi << 4) - 32;
}

void quant_from_q3_K(const void *src, float *dst, int64_t n) {
    const struct block_q3_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        for (int k = 0; k < 16; k++) {
            const float dl = d * (float)q3_scale(b[i].scales, k);
            for (int e = 0; e < 16; e++) {
                const int nn = 16 * k + e, h = nn / 128, s = (nn % 128) / 32, l = nn % 32;
                const int lo = (b[i].qs[32 * h + l] >> (2 * s)) & 3;
                const int hb = (b[i].hmask[l] >> (4 * h + s)) & 1;
                dst[nn] = dl * (float)(lo - (hb ? 0 : 4));
            }
        }
        dst += QK_K;
    }
}

void quant_to_q3_K(const float *x, void *dst, int64_t n) {
    struct block_q3_K *y = dst;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = fit_q3(16, 4, x + 16 * j, L + 16 * j);
            float scale = fabsf(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        memset(y[i].scales, 0, 12);
        if (max_scale != 0) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                int l = (int8_t)quant_nearest_int(iscale * scales[j]);
                l = clampi(l, -32, 31) + 32;
                if (j < 8) y[i].scales[j] = (uint8_t)(l & 0xF);
                else y[i].scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                l >>= 4;
                y[i].scales[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
            }
            y[i].d = f32_to_f16(1 / iscale);
        } else {
            y[i].d = f32_to_f16(0.f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = quant_h(y[i].d) * q3_scale(y[i].scales, j);
            if (d == 0) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] = (int8_t)(clampi(quant_nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        memset(y[i].hmask, 0, QK_K / 8);
        uint8_t U[QK_K];
        int m = 0;
        uint8_t hm = 1;
        for (int j = 0; j < QK_K; j++) {
            int v = L[j];
            if (v > 3) {
                y[i].hmask[m] |= hm;
                v -= 4;
            }
            U[j] = (uint8_t)v;
            if (++m == QK_K / 8) {
                m = 0;
                hm = (uint8_t)(hm << 1);
            }
        }
        pack_2bit(U, y[i].qs);
    }
}

/* ---- Q4_K / Q5_K ---- */

/* The shared first half of Q4_K and Q5_K: fit each 32-element sub-block, store the
 * 6-bit scales/mins and d/dmin, then re-quantize every element into L[0..255]. */
static void fit_k4(const float *x, int nmax, float rmin, int nstep, uint16_t *d, uint16_t *dmin,
                   uint8_t scales12[12], uint8_t L[QK_K], bool vec) {
    uint8_t Laux[32];
    float weights[QK_K], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[32 * j + l] = av_x + fabsf(x[32 * j + l]);
    }
    if (vec)
        for (int j = 0; j < QK_K / 32; j += 4)
            fit_scale_min4(32, nmax, x + 32 * j, weights + 32 * j, L + 32 * j, scales + j, mins + j,
                           rmin, 0.1f, nstep, false);
    for (int j = 0; j < QK_K / 32; j++) {
        if (!vec)
            scales[j] = fit_scale_min(32, nmax, x + 32 * j, weights + 32 * j, L + 32 * j, &mins[j],
                                      Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)quant_nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)quant_nearest_int(inv_min * mins[j]);
        if (ls > 63) ls = 63;
        if (lm > 63) lm = 63;
        if (j < 4) {
            scales12[j] = ls;
            scales12[j + 4] = lm;
        } else {
            scales12[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            scales12[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales12[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = f32_to_f16(max_scale / 63.f);
    *dmin = f32_to_f16(max_min / 63.f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        scale_min_k4(j, scales12, &sc, &m);
        const float dd = quant_h(*d) * sc;
        if (dd == 0) continue;
        const float dm = quant_h(*dmin) * m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)clampi(quant_nearest_int((x[32 * j + ii] + dm) / dd), 0, nmax);
    }
}

void quant_from_q4_K(const void *src, float *dst, int64_t n) {
    const struct block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d), dmin = quant_h(b[i].dmin);
        for (int k = 0; k < 8; k++) {
            uint8_t sc, m;
            scale_min_k4(k, b[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const int p = k / 2, t = k % 2;
            for (int l = 0; l < 32; l++)
                dst[32 * k + l] = dl * (float)((b[i].qs[32 * p + l] >> (4 * t)) & 15) - ml;
        }
        dst += QK_K;
    }
}

static void to_q4_K(const float *x, void *dst, int64_t n, bool vec) {
    struct block_q4_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint16_t d, dmin;
        fit_k4(x, 15, -1.f, 20, &d, &dmin, y[i].scales, L, vec);
        y[i].d = d;
        y[i].dmin = dmin;
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * p + l] = (uint8_t)(L[64 * p + l] | L[64 * p + l + 32] << 4);
    }
}

void quant_to_q4_K(const float *x, void *dst, int64_t n) { to_q4_K(x, dst, n, true); }
void quant_to_q4_K_scalar(const float *x, void *dst, int64_t n) { to_q4_K(x, dst, n, false); }

void quant_from_q5_K(const void *src, float *dst, int64_t n) {
    const struct block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d), dmin = quant_h(b[i].dmin);
        for (int k = 0; k < 8; k++) {
            uint8_t sc, m;
            scale_min_k4(k, b[i].scales, &sc, &m);
            const float dl = d * (float)sc, ml = dmin * (float)m;
            const int p = k / 2, t = k % 2;
            for (int l = 0; l < 32; l++) {
                int q = ((b[i].qs[32 * p + l] >> (4 * t)) & 15) | ((b[i].qh[l] >> k) & 1) << 4;
                dst[32 * k + l] = dl * (float)q - ml;
            }
        }
        dst += QK_K;
    }
}

static void to_q5_K(const float *x, void *dst, int64_t n, bool vec) {
    struct block_q5_K *y = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint16_t d, dmin;
        fit_k4(x, 31, -0.5f, 15, &d, &dmin, y[i].scales, L, vec);
        y[i].d = d;
        y[i].dmin = dmin;
        memset(y[i].qh, 0, QK_K / 8);
        for (int p = 0; p < 4; p++) {
            for (int l = 0; l < 32; l++) {
                int l1 = L[64 * p + l], l2 = L[64 * p + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    y[i].qh[l] |= (uint8_t)(1u << (2 * p));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y[i].qh[l] |= (uint8_t)(2u << (2 * p));
                }
                y[i].qs[32 * p + l] = (uint8_t)(l1 | l2 << 4);
            }
        }
    }
}

void quant_to_q5_K(const float *x, void *dst, int64_t n) { to_q5_K(x, dst, n, true); }
void quant_to_q5_K_scalar(const float *x, void *dst, int64_t n) { to_q5_K(x, dst, n, false); }

/* ---- Q6_K ---- */

void quant_from_q6_K(const void *src, float *dst, int64_t n) {
    const struct block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_h(b[i].d);
        for (int k = 0; k < 16; k++) {
            const float dl = d * (float)b[i].scales[k];
            for (int e = 0; e < 16; e++) {
                const int nn = 16 * k + e, h = nn / 128, s = (nn % 128) / 32, l = nn % 32;
                const int lo = (b[i].ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 15;
                const int hi = (b[i].qh[32 * h + l] >> (2 * s)) & 3;
                dst[nn] = dl * (float)((lo | hi << 4) - 32);
            }
        }
        dst += QK_K;
    }
}

static void to_q6_K(const float *x, void *dst, int64_t n, bool vec) {
    struct block_q6_K *y = dst;
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float max_scale = 0, max_abs_scale = 0;
        if (vec)
            for (int ib = 0; ib < QK_K / 16; ib += 4) fit_signed4(16, 32, x + 16 * ib, L + 16 * ib, scales + ib);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const float scale = vec ? scales[ib] : fit_signed(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            if (fabsf(scale) > max_abs_scale) {
                max_abs_scale = fabsf(scale);
                max_scale = scale;
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = f32_to_f16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            int v = quant_nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = quant_h(y[i].d) * y[i].scales[j];
            if (d == 0) continue;
            for (int ii = 0; ii < 16; ii++)
                L[16 * j + ii] =
                    (int8_t)(clampi(quant_nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
        }
        for (int h = 0; h < 2; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = y[i].ql + 64 * h, *qh = y[i].qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                const uint8_t q1 = Lh[l] & 0xF, q2 = Lh[l + 32] & 0xF;
                const uint8_t q3 = Lh[l + 64] & 0xF, q4 = Lh[l + 96] & 0xF;
                ql[l] = (uint8_t)(q1 | q3 << 4);
                ql[l + 32] = (uint8_t)(q2 | q4 << 4);
                qh[l] = (uint8_t)((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 |
                                  (Lh[l + 96] >> 4) << 6);
            }
        }
    }
}

void quant_to_q6_K(const float *x, void *dst, int64_t n) { to_q6_K(x, dst, n, true); }
void quant_to_q6_K_scalar(const float *x, void *dst, int64_t n) { to_q6_K(x, dst, n, false); }

/* ---- Q8_K ---- */

void quant_from_q8_K(const void *src, float *dst, int64_t n) {
    const struct block_q8_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        const float d = b[i].d;
        for (int j = 0; j < QK_K; j++) dst[j] = d * (float)b[i].qs[j];
    }
}

void quant_to_q8_K(const float *x, void *dst, int64_t n) {
    struct block_q8_K *y = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax;
        const float max = signed_max(x, QK_K, &amax);
        if (amax == 0) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; j++) {
            int v = quant_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int ii = 0; ii < 16; ii++) sum += y[i].qs[16 * j + ii];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}
