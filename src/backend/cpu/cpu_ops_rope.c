/* CPU RoPE: rotary position embedding, in place on (head_dim, n_head, n_tokens).
 *
 * Angles are computed in double per token once and applied to every head of that
 * token, so the cost is n_rot/2 sin/cos per token, not per head. The math follows
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

#include "backend/cpu/cpu_backend.h"

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

struct rope_ctx {
    struct tensor *x;
    const int32_t *pos;
    const struct rope_params *p;
    float *buf; /* (n_rot) per thread: cos then sin */
};

static void rope_range(void *vctx, int ith, int64_t t0, int64_t t1) {
    struct rope_ctx *c = vctx;
    const struct rope_params *p = c->p;
    int half = p->n_rot / 2;
    float *cs = c->buf + (size_t)ith * (size_t)p->n_rot, *sn = cs + half;
    for (int64_t t = t0; t < t1; t++) {
        cpu_rope_cache(p, c->pos[t], cs, sn);
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

void cpu_op_rope(struct backend *b, struct tensor *x, const struct tensor *pos,
                 const struct rope_params *p) {
    struct cpu_backend *cb = cpu_of(b);
    struct rope_ctx c = {x, pos->data, p, NULL};
    c.buf = cpu_scratch(cb, (size_t)cb->n_threads * (size_t)p->n_rot * sizeof(float));
    if (!c.buf) return;
    cpu_parallel(cb, rope_range, &c, x->ne[2], 1);
}
