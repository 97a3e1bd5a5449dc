/* The logits part of test_cuda_forward's check on one GGUF (a 40-token prefill and 8
 * teacher-forced decode steps, the same ids): every row's cosine against the CPU backend
 * and the argmax agreement, printed; exit status 1 when a row falls under 0.999. For real
 * checkpoints too large for forward.c's full check on the emulator (greedy text and batch
 * invariance add ~70 steps). */
#define main test_main
#include "unit/test_cuda_forward.c"
#undef main
int main(int argc, char **argv) {
    struct err e;
    if (argc < 2) return fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]), 2;
    struct gguf_file *f;
    struct runner rc, rg;
    if (cpu_backend_new(&cpu, 0, &e) != SMELT_OK || cuda_backend_new(&gpu, 0, &e) != SMELT_OK ||
        gguf_open(&f, argv[1], &e) != SMELT_OK)
        return fprintf(stderr, "%s\n", e.msg), 1;
    if (!runner_init(&rc, f, cpu, QT_F32, 64) || !runner_init(&rg, f, gpu, QT_F16, 64)) return 1;
    const int nv = rc.m->hp.n_vocab, total = PROMPT + DECODE;
    int32_t ids[PROMPT + DECODE];
    unsigned long long rs = 0xabcdef; /* test_cuda_forward's ids */
    for (int i = 0; i < total; i++) ids[i] = (int32_t)(t_rand_u64(&rs) % (unsigned)(nv > 1000 ? 1000 : nv));
    float *lc = malloc(sizeof(float) * (size_t)nv * total), *lg = malloc(sizeof(float) * (size_t)nv * total);
    struct kv_seq sc, sg;
    kv_seq_init(&sc);
    kv_seq_init(&sg);
    bool ok = step(&rc, &sc, ids, PROMPT, 0, lc) && step(&rg, &sg, ids, PROMPT, 0, lg);
    for (int i = PROMPT; ok && i < total; i++) {
        ok = step(&rc, &sc, ids + i, 1, i, lc + (size_t)i * nv) && step(&rg, &sg, ids + i, 1, i, lg + (size_t)i * nv);
        fprintf(stderr, "decode step %d of %d\n", i - PROMPT + 1, DECODE);
    }
    double worst = 1, worst_dec = 1;
    int agree = 0;
    for (int i = 0; ok && i < total; i++) {
        const double c = cosine(lc + (size_t)i * nv, lg + (size_t)i * nv, nv);
        if (c < worst) worst = c;
        if (i >= PROMPT && c < worst_dec) worst_dec = c;
        const bool same = same_pick(lc + (size_t)i * nv, lg + (size_t)i * nv, nv);
        agree += same;
        if (!same) { /* the picks and the CPU's gap between them, relative to its largest |logit| */
            const float *r = lc + (size_t)i * nv;
            const int a = argmax(r, nv), b = argmax(lg + (size_t)i * nv, nv);
            float mx = 0;
            for (int j = 0; j < nv; j++) mx = fmaxf(mx, fabsf(r[j]));
            printf("row %d: CPU picks %d, the GPU %d; the CPU's gap %.3g of its largest |logit| (row cosine %.6f)\n", i,
                   a, b, (r[a] - r[b]) / mx, c);
        }
    }
    printf("%s: %s, worst row cosine %.6f (decode rows %.6f), argmax %d/%d\n", argv[1], ok ? "ran" : "FAILED", worst,
           worst_dec, agree, total);
    return ok && worst >= 0.999 ? 0 : 1;
}
