/* CPU RoPE: rotary position embedding, in place on (head_dim, n_head, n_tokens).
 *
 * Angles are computed in double per token once and applied to every head of that
 * token, so the cost is n_rot/2 sin/cos per token, not per head; the table of a step's
 * positions is kept for the next call with the same parameters (rope_table). The math follows
 * HF transformers' rotary embeddings (default, linear, Llama-3 frequency factors, YaRN)
 * and llama.cpp's parameterization of them (freq_scale = 1/factor, ext_factor, beta_fast
 * / beta_slow, attn_factor):
 *   inv_freq_i  = base^(-2i/n_rot) / freq_factors[i]
 *   theta_ext   = pos * inv_freq_i,  theta_int = freq_scale * theta_ext
 *   YaRN:  ramp_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), mixed = ramp_i *
 *          ext_factor; theta = theta_int (1 - mixed) + theta_ext mixed; the magnitude
 *          gets (1 + 0.1 ln(1/freq_scale)), with lo/hi the correction range of beta_fast
 *          / beta_slow rotations over n_ctx_orig, floored / ceiled to whole pairs unless
 *          yarn_unrounded (HF's truncate = False, gpt-oss).
 * NORM rotates adjacent pairs (2i, 2i+1); NEOX rotates (i, i + n_rot/2). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "util/array.h"

/* The dimension index at which a frequency makes n_rotations turns over n_ctx_orig. */
static double corr_dim(int n_rot, int n_ctx_orig, double n_rotations, double base) {
    return n_rot * log(n_ctx_orig / (n_rotations * 2 * M_PI)) / (2 * log(base));
}

void cpu_rope_cache(const struct rope_params *p, int32_t pos, float *cos_out, float *sin_out) {
    int half = p->n_rot / 2;
    const float *ff = p->freq_factors ? p->freq_factors->data : NULL;
    double lo = 0, hi = 0, mscale = p->attn_factor;
    if (p->ext_factor != 0) {
        lo = corr_dim(p->n_rot, p->n_ctx_orig, p->beta_fast, p->freq_base);
        hi = corr_dim(p->n_rot, p->n_ctx_orig, p->beta_slow, p->freq_base);
        if (!p->yarn_unrounded) {
            lo = floor(lo);
            hi = ceil(hi);
        }
        if (lo < 0) lo = 0;
        if (hi > p->n_rot - 1) hi = p->n_rot - 1;
        mscale *= 1.0 + 0.1 * log(1.0 / p->freq_scale);
    }
    for (int i = 0; i < half; i++) {
        double inv_freq = pow((double)p->freq_base, -2.0 * i / p->n_rot);
        if (ff) inv_freq /= ff[i];
        double theta_ext = (double)pos * inv_freq;
        double theta = p->freq_scale * theta_ext;
        if (p->ext_factor != 0) {
            double y = (i - lo) / fmax(0.001, hi - lo);
            double ramp = 1.0 - fmin(1.0, fmax(0.0, y));
            double mix = ramp * p->ext_factor;
            theta = theta * (1 - mix) + theta_ext * mix;
        }
        cos_out[i] = (float)(cos(theta) * mscale);
        sin_out[i] = (float)(sin(theta) * mscale);
    }
}

struct rope_fill_ctx {
    const struct rope_params *p;
    const int32_t *pos;
    float *tab; /* (n_tokens, n_rot): cos then sin per token */
};

static void rope_fill_range(void *vctx, int ith, int64_t t0, int64_t t1) {
    struct rope_fill_ctx *c = vctx;
    (void)ith;
    const int n_rot = c->p->n_rot;
    for (int64_t t = t0; t < t1; t++) {
        float *cs = c->tab + (size_t)t * (size_t)n_rot;
        cpu_rope_cache(c->p, c->pos[t], cs, cs + n_rot / 2);
    }
}

struct rope_ctx {
    struct tensor *x;
    const struct rope_params *p;
    const float *tab; /* rope_fill_ctx's */
};

static void rope_range(void *vctx, int ith, int64_t t0, int64_t t1) {
    struct rope_ctx *c = vctx;
    (void)ith;
    const struct rope_params *p = c->p;
    int half = p->n_rot / 2;
    for (int64_t t = t0; t < t1; t++) {
        const float *cs = c->tab + (size_t)t * (size_t)p->n_rot, *sn = cs + half;
        for (int64_t h = 0; h < c->x->ne[1]; h++) {
            float *x = tensor_row(c->x, h, t, 0);
            if (p->mode == ROPE_NEOX) {
                for (int i = 0; i < half; i++) {
                    float x0 = x[i], x1 = x[i + half];
                    x[i] = x0 * cs[i] - x1 * sn[i];
                    x[i + half] = x0 * sn[i] + x1 * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float x0 = x[2 * i], x1 = x[2 * i + 1];
                    x[2 * i] = x0 * cs[i] - x1 * sn[i];
                    x[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
                }
            }
        }
    }
}

/* The memo's params are p's (every field; the frequency factors by value). */
static bool same_params(const struct cpu_rope_memo *m, const struct rope_params *p) {
    const struct rope_params *a = &m->p;
    if (!(a->mode == p->mode && a->n_rot == p->n_rot && a->freq_base == p->freq_base &&
          a->freq_scale == p->freq_scale && a->ext_factor == p->ext_factor && a->attn_factor == p->attn_factor &&
          a->beta_fast == p->beta_fast && a->beta_slow == p->beta_slow && a->n_ctx_orig == p->n_ctx_orig &&
          a->yarn_unrounded == p->yarn_unrounded && !a->freq_factors == !p->freq_factors))
        return false;
    return !p->freq_factors || !memcmp(m->ff, p->freq_factors->data, (size_t)(p->n_rot / 2) * sizeof(float));
}

/* The cos / sin table of (p, pos[0..n)): one of the two remembered, or computed into the
 * older entry (the same function as before, so the same bits; a layer's q and k, and every
 * layer with the same base, reuse it: when each call computed its own, for every token in
 * each thread, sin / cos and pow were ~3% of Gemma 3 270M's prefill samples, and the prefill
 * went 491-514 -> 542-549 tok/s at one thread without them). n > 0; NULL when out of
 * memory. Not in the step arena, so it outlives the per-layer rewinds; the positions are
 * compared, not trusted. */
static const float *rope_table(struct cpu_backend *cb, const struct rope_params *p, const int32_t *pos, int64_t n) {
    for (int i = 0; i < 2; i++) {
        struct cpu_rope_memo *m = &cb->rope[i];
        if (m->n == n && same_params(m, p) && !memcmp(m->pos, pos, (size_t)n * sizeof *pos))
            return m->tab;
    }
    struct cpu_rope_memo *m = &cb->rope[cb->rope_next];
    cb->rope_next ^= 1;
    m->n = 0;
    const size_t nf = p->freq_factors ? (size_t)(p->n_rot / 2) : 0;
    if (!array_grow((void **)&m->pos, &m->cap_pos, (size_t)n, sizeof *m->pos) ||
        !array_grow((void **)&m->tab, &m->cap_tab, (size_t)n * (size_t)p->n_rot, sizeof *m->tab) ||
        (nf && !array_grow((void **)&m->ff, &m->cap_ff, nf, sizeof *m->ff)))
        return NULL;
    if (nf) memcpy(m->ff, p->freq_factors->data, nf * sizeof *m->ff);
    struct rope_fill_ctx c = {p, pos, m->tab};
    cpu_parallel(cb, rope_fill_range, &c, n, 1);
    memcpy(m->pos, pos, (size_t)n * sizeof *pos);
    m->p = *p;
    m->n = n;
    return m->tab;
}

void cpu_op_rope(struct backend *b, struct tensor *x, const struct tensor *pos,
                 const struct rope_params *p) {
    struct cpu_backend *cb = cpu_of(b);
    if (x->ne[2] <= 0) return;
    const float *tab = rope_table(cb, p, pos->data, x->ne[2]);
    if (!tab) {
        bk_fail(b, SMELT_ERR_NOMEM, "CPU rope: out of memory for the angles of %lld tokens", (long long)x->ne[2]);
        return;
    }
    struct rope_ctx c = {x, p, tab};
    cpu_parallel(cb, rope_range, &c, x->ne[2], 1);
}
