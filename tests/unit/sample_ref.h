/* The sampler's reference for the tests (test_sample, test_spec): the distribution of a
 * logits row after penalties, bias, temperature, top-k, top-p and min-p, written out
 * independently of engine/sample.c (a full sort, exact softmax, explicit masks), and a
 * chi-square check of draws against it. */
#ifndef SMELT_TEST_SAMPLE_REF_H
#define SMELT_TEST_SAMPLE_REF_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sample.h"
#include "t.h"

struct ref_entry {
    int32_t tok;
    double logit;
};

static inline int ref_cmp(const void *a, const void *b) {
    const struct ref_entry *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->tok - y->tok;
}

/* Reference probabilities after temperature, top-k, top-p, min-p (in that order). */
static inline void ref_probs(const float *logits, int nv, const struct sample_params *p, double *prob) {
    struct ref_entry *v = malloc(sizeof *v * (size_t)nv);
    for (int i = 0; i < nv; i++) v[i] = (struct ref_entry){i, logits[i]};
    qsort(v, (size_t)nv, sizeof *v, ref_cmp);
    int n = nv;
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double mx = v[0].logit, tot = 0;
    for (int i = 0; i < n; i++) tot += exp((v[i].logit - mx) / p->temperature);
    int keep = n;
    if (p->top_p < 1.0f) {
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += exp((v[i].logit - mx) / p->temperature) / tot;
            if (acc >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    int keep2 = keep;
    if (p->min_p > 0) {
        for (int i = 1; i < keep; i++)
            if (exp((v[i].logit - mx) / p->temperature) < p->min_p) {
                keep2 = i;
                break;
            }
    }
    memset(prob, 0, sizeof *prob * (size_t)nv);
    double z = 0;
    for (int i = 0; i < keep2; i++) z += exp((v[i].logit - mx) / p->temperature);
    for (int i = 0; i < keep2; i++) prob[v[i].tok] = exp((v[i].logit - mx) / p->temperature) / z;
    free(v);
}

/* Reference probabilities of the adjusted distribution (penalties from a history of
 * generated tokens, then the bias), written out independently. */
static inline void ref_probs_adjusted(const float *logits, int nv, const struct sample_params *p,
                               const int32_t *hist, int n_hist, double *prob) {
    float *a = malloc(sizeof *a * (size_t)nv);
    int *cnt = calloc((size_t)nv, sizeof *cnt);
    for (int i = 0; i < n_hist; i++) cnt[hist[i]]++;
    for (int i = 0; i < nv; i++) {
        float l = logits[i];
        if (cnt[i]) {
            if (p->repetition_penalty != 1.0f) l = l > 0 ? l / p->repetition_penalty : l * p->repetition_penalty;
            l -= p->presence_penalty + p->frequency_penalty * (float)cnt[i];
        }
        a[i] = l;
    }
    for (int i = 0; i < p->n_bias; i++)
        a[p->bias[i].token] = p->bias[i].bias <= -100.0f ? -INFINITY : a[p->bias[i].token] + p->bias[i].bias;
    ref_probs(a, nv, p, prob);
    free(a);
    free(cnt);
}

/* Chi-square of hits against prob over bins with expected count >= 5 (the rest pooled). */
static inline void check_chi2(const int *hits, const double *prob, int nv, int draws, const char *what) {
    double chi2 = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < nv; i++) {
        double ex = prob[i] * draws;
        if (prob[i] == 0) {
            T_CHECKF(hits[i] == 0, "%s: token %d has p=0 but was drawn %d times", what, i, hits[i]);
            continue;
        }
        if (ex < 5) {
            pool_e += ex;
            pool_o += hits[i];
            continue;
        }
        chi2 += (hits[i] - ex) * (hits[i] - ex) / ex;
        bins++;
    }
    if (pool_e > 0) {
        chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    double df = bins - 1, bound = df + 6 * sqrt(2 * df) + 10;
    T_CHECKF(chi2 < bound, "%s: chi2 %.1f over %d bins (bound %.1f)", what, chi2, bins, bound);
}

#endif
