/* Sampler tests against a straightforward reference: full sort, exact softmax, explicit
 * top-k / top-p / min-p masks. Empirical frequencies of many seeded draws must match the
 * reference probabilities. */
#include "t.h"

#include <time.h>

#include "engine/sample.h"

#define NV 64

struct ref_entry {
    int32_t tok;
    double logit;
};

static int ref_cmp(const void *a, const void *b) {
    const struct ref_entry *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->tok - y->tok;
}

/* Reference probabilities after temperature, top-k, top-p, min-p (in that order). */
static void ref_probs(const float *logits, int nv, const struct sample_params *p, double *prob) {
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

static void random_logits(float *l, int n, unsigned long long *rs) {
    for (int i = 0; i < n; i++) l[i] = 3.0f * t_randn(rs);
}

/* Draws `draws` tokens and checks every token's frequency against the reference within
 * 5 standard deviations (plus a small floor), and that no zero-probability token appears. */
static void check_distribution(const struct sample_params *p, unsigned long long seed) {
    unsigned long long rs = seed;
    float logits[NV], work[NV];
    random_logits(logits, NV, &rs);
    double prob[NV];
    ref_probs(logits, NV, p, prob);
    struct sampler *s;
    struct err e;
    T_EQ_INT(sampler_new(&s, p, NV, &e), SMELT_OK);
    const int draws = 40000;
    int hits[NV] = {0};
    for (int d = 0; d < draws; d++) {
        memcpy(work, logits, sizeof work);
        struct sample_result r;
        T_EQ_INT(sampler_sample(s, work, &r, &e), SMELT_OK);
        T_CHECK(r.token >= 0 && r.token < NV);
        if (r.token >= 0 && r.token < NV) hits[r.token]++;
    }
    for (int i = 0; i < NV; i++) {
        double expect = prob[i] * draws;
        double sd = sqrt(draws * prob[i] * (1 - prob[i]));
        if (prob[i] == 0) T_CHECKF(hits[i] == 0, "token %d has p=0 but was drawn %d times", i, hits[i]);
        else T_CHECKF(fabs(hits[i] - expect) <= 5 * sd + 3, "token %d: %d draws, expected %.1f", i, hits[i], expect);
    }
    sampler_free(s);
}

static void test_distributions(void) {
    struct sample_params p;
    sample_params_default(&p);
    p.seed = 42;
    check_distribution(&p, 1); /* plain temperature 1 */
    p.temperature = 0.7f;
    p.top_k = 10;
    check_distribution(&p, 2);
    p.top_k = 0;
    p.top_p = 0.8f;
    check_distribution(&p, 3);
    p.top_p = 1.0f;
    p.min_p = 0.05f;
    check_distribution(&p, 4);
    p.top_k = 20;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    p.temperature = 1.3f;
    check_distribution(&p, 5);
}

static void test_greedy_and_logprobs(void) {
    unsigned long long rs = 7;
    float logits[NV];
    random_logits(logits, NV, &rs);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    p.n_logprobs = 5;
    struct sampler *s;
    struct err e;
    T_EQ_INT(sampler_new(&s, &p, NV, &e), SMELT_OK);
    float work[NV];
    memcpy(work, logits, sizeof work);
    struct sample_result r;
    T_EQ_INT(sampler_sample(s, work, &r, &e), SMELT_OK);
    int best = 0;
    double mx = logits[0], sum = 0;
    for (int i = 1; i < NV; i++)
        if (logits[i] > mx) mx = logits[best = i];
    for (int i = 0; i < NV; i++) sum += exp(logits[i] - mx);
    double lse = mx + log(sum);
    T_EQ_INT(r.token, best);
    T_NEAR(r.logprob, logits[best] - lse, 1e-5);
    T_EQ_INT(r.n_top, 5);
    T_EQ_INT(r.top[0].token, best);
    for (int i = 1; i < r.n_top; i++) {
        T_CHECK(r.top[i].logprob <= r.top[i - 1].logprob);
        T_NEAR(r.top[i].logprob, logits[r.top[i].token] - lse, 1e-5);
    }
    sampler_free(s);
}

static void test_penalties_and_bias(void) {
    float logits[8] = {1.0f, -1.0f, 2.0f, 0.5f, 3.0f, -2.0f, 0.0f, 1.5f};
    struct logit_bias bias[2] = {{4, -100.0f}, {6, 5.0f}};
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.bias = bias;
    p.n_bias = 2;
    p.n_logprobs = 0;
    struct sampler *s;
    struct err e;
    T_EQ_INT(sampler_new(&s, &p, 8, &e), SMELT_OK);
    sampler_accept(s, 0, false); /* prompt: repetition only */
    sampler_accept(s, 2, true);
    sampler_accept(s, 2, true);
    sampler_accept(s, 1, true);
    float w[8];
    memcpy(w, logits, sizeof w);
    struct sample_result r;
    T_EQ_INT(sampler_sample(s, w, &r, &e), SMELT_OK);
    T_NEAR(w[0], 0.5, 1e-6);                      /* 1/2 */
    T_NEAR(w[2], 2.0 / 2 - 0.5 - 0.25 * 2, 1e-6); /* 0 */
    T_NEAR(w[1], -1.0 * 2 - 0.5 - 0.25, 1e-6);
    T_CHECK(isinf(w[4]) && w[4] < 0);             /* banned */
    T_NEAR(w[6], 5.0, 1e-6);
    T_EQ_INT(r.token, 6);
    /* logprob is of the raw distribution */
    double mx = 3.0, sum = 0;
    for (int i = 0; i < 8; i++) sum += exp(logits[i] - mx);
    T_NEAR(r.logprob, logits[6] - (mx + log(sum)), 1e-5);
    sampler_free(s);
}

static void test_window(void) {
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    p.presence_penalty = 1.0f;
    p.penalty_last_n = 2;
    struct sampler *s;
    struct err e;
    T_EQ_INT(sampler_new(&s, &p, 4, &e), SMELT_OK);
    sampler_accept(s, 0, true);
    sampler_accept(s, 1, true);
    sampler_accept(s, 2, true); /* token 0 leaves the window */
    float w[4] = {0, 0, 0, 0};
    struct sample_result r;
    T_EQ_INT(sampler_sample(s, w, &r, &e), SMELT_OK);
    T_NEAR(w[0], 0, 0);
    T_NEAR(w[1], -1, 0);
    T_NEAR(w[2], -1, 0);
    T_EQ_INT(r.token, 0);
    /* many tokens through a small window: the count table stays bounded and correct */
    for (int i = 0; i < 10000; i++) sampler_accept(s, i % 4, true);
    float w2[4] = {0, 0, 0, 0};
    T_EQ_INT(sampler_sample(s, w2, &r, &e), SMELT_OK);
    int n_pen = 0;
    for (int i = 0; i < 4; i++) n_pen += w2[i] == -1.0f;
    T_EQ_INT(n_pen, 2);
    sampler_free(s);
}

static void test_seed_reproducible(void) {
    unsigned long long rs = 9;
    float logits[NV], w[NV];
    random_logits(logits, NV, &rs);
    struct sample_params p;
    sample_params_default(&p);
    p.seed = 1234;
    int32_t a[50], b[50];
    for (int run = 0; run < 2; run++) {
        struct sampler *s;
        struct err e;
        T_EQ_INT(sampler_new(&s, &p, NV, &e), SMELT_OK);
        for (int i = 0; i < 50; i++) {
            memcpy(w, logits, sizeof w);
            struct sample_result r;
            sampler_sample(s, w, &r, &e);
            (run ? b : a)[i] = r.token;
        }
        sampler_free(s);
    }
    T_CHECK(memcmp(a, b, sizeof a) == 0);
}

static void test_errors(void) {
    struct sample_params p;
    sample_params_default(&p);
    struct err e;
    struct sampler *s;
    p.top_p = 0;
    T_EQ_INT(sampler_new(&s, &p, 10, &e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "top_p") != NULL);
    sample_params_default(&p);
    struct logit_bias b = {10, 1.0f};
    p.bias = &b;
    p.n_bias = 1;
    T_EQ_INT(sampler_new(&s, &p, 10, &e), SMELT_ERR_INVALID);
    T_CHECK(strstr(e.msg, "logit_bias") != NULL);
    /* everything banned or NaN */
    sample_params_default(&p);
    T_EQ_INT(sampler_new(&s, &p, 3, &e), SMELT_OK);
    float w[3] = {NAN, -INFINITY, NAN};
    struct sample_result r;
    T_EQ_INT(sampler_sample(s, w, &r, &e), SMELT_ERR_INVALID);
    sampler_free(s);
}

/* A 152k vocabulary: the non-top-k path must stay cheap (a few passes, small sort). */
static void test_large_vocab_speed(void) {
    const int nv = 151936;
    float *logits = malloc(sizeof *logits * nv), *w = malloc(sizeof *w * nv);
    unsigned long long rs = 11;
    for (int i = 0; i < nv; i++) logits[i] = 2.0f * t_randn(&rs);
    struct sample_params p;
    sample_params_default(&p);
    p.temperature = 0.8f;
    p.top_p = 0.95f;
    p.n_logprobs = 5;
    struct sampler *s;
    struct err e;
    T_EQ_INT(sampler_new(&s, &p, nv, &e), SMELT_OK);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const int iters = 50;
    for (int i = 0; i < iters; i++) {
        memcpy(w, logits, sizeof *w * nv);
        struct sample_result r;
        T_EQ_INT(sampler_sample(s, w, &r, &e), SMELT_OK);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = ((t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6) / iters;
    printf("sample: 152k vocab, T=0.8 top_p=0.95 + 5 logprobs: %.2f ms/token\n", ms);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
    /* Only a gross regression (a full sort of the vocabulary per token) is caught here:
     * the box is shared and loaded, so the bound is 100x the measured 1.5 ms. Sanitizer
     * builds (clang) skip it. */
    T_CHECK(ms < 150);
#endif
    sampler_free(s);
    free(logits);
    free(w);
}

int main(void) {
    T_RUN(test_distributions);
    T_RUN(test_greedy_and_logprobs);
    T_RUN(test_penalties_and_bias);
    T_RUN(test_window);
    T_RUN(test_seed_reproducible);
    T_RUN(test_errors);
    T_RUN(test_large_vocab_speed);
    return t_done();
}
