/* Shared part of the op interface: tensor helpers, the bk_ wrappers (shape contracts
 * checked once here, then the backend's vtable), and the composed versions of fused ops
 * for backends that do not implement them.
 *
 * Shape checks are asserts: the model validated every weight's shape at load, so a
 * mismatch here is a bug in a forward pass, not bad input. */
#include "backend/backend.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BK_ASSERT(cond)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: backend assertion failed: %s\n", __FILE__, __LINE__,       \
                    #cond);                                                                    \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

/* ---- tensors ---- */

bool tensor_init(struct tensor *t, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2,
                 int64_t ne3) {
    memset(t, 0, sizeof *t);
    const struct qtype_info *qi = qtype_get(type);
    if (!qi || ne0 <= 0 || ne1 <= 0 || ne2 <= 0 || ne3 <= 0) return false;
    if (ne0 % qi->blck_size) return false;
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = ne3;
    t->nb[0] = qi->type_size;
    t->nb[1] = (size_t)(ne0 / qi->blck_size) * qi->type_size;
    t->nb[2] = t->nb[1] * (size_t)ne1;
    t->nb[3] = t->nb[2] * (size_t)ne2;
    return true;
}

int64_t tensor_nelem(const struct tensor *t) { return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]; }

int64_t tensor_nrows(const struct tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

size_t tensor_nbytes(const struct tensor *t) { return t->nb[3] * (size_t)t->ne[3]; }

bool tensor_is_contiguous(const struct tensor *t) {
    const struct qtype_info *qi = qtype_get(t->type);
    if (!qi) return false;
    size_t row = (size_t)(t->ne[0] / qi->blck_size) * qi->type_size;
    return t->nb[0] == qi->type_size && t->nb[1] == row && t->nb[2] == row * (size_t)t->ne[1] &&
           t->nb[3] == t->nb[2] * (size_t)t->ne[2];
}

bool tensor_same_shape(const struct tensor *a, const struct tensor *b) {
    for (int i = 0; i < TENSOR_MAX_DIMS; i++)
        if (a->ne[i] != b->ne[i]) return false;
    return true;
}

const char *tensor_shape_str(const struct tensor *t, char *buf, size_t n) {
    int nd = TENSOR_MAX_DIMS;
    while (nd > 1 && t->ne[nd - 1] == 1) nd--;
    size_t o = 0;
    o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "(");
    for (int i = 0; i < nd; i++)
        o += (size_t)snprintf(buf + o, o < n ? n - o : 0, i ? ", %lld" : "%lld",
                              (long long)t->ne[i]);
    snprintf(buf + o, o < n ? n - o : 0, ")");
    return buf;
}

/* ---- backend lifecycle and memory ---- */

void bk_base_init(struct backend *b, const struct backend_ops *ops) {
    b->ops = ops;
    b->status = SMELT_OK;
    b->msg[0] = 0;
    arena_init(&b->meta);
}

void bk_base_free(struct backend *b) { arena_free(&b->meta); }

smelt_status bk_fail(struct backend *b, smelt_status code, const char *fmt, ...) {
    if (b->status != SMELT_OK) return b->status;
    b->status = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->msg, sizeof b->msg, fmt, ap);
    va_end(ap);
    return code;
}

void bk_free(struct backend *b) {
    if (b) b->ops->free(b);
}

smelt_status bk_weight_bind(struct backend *b, struct tensor *t, struct err *e) {
    return b->ops->weight_bind(b, t, e);
}

smelt_status bk_buffer_alloc(struct backend *b, struct tensor *t, struct err *e) {
    BK_ASSERT(tensor_is_contiguous(t));
    return b->ops->buffer_alloc(b, t, e);
}

void bk_buffer_free(struct backend *b, struct tensor *t) {
    if (t && t->data) b->ops->buffer_free(b, t);
    if (t) t->data = NULL;
}

void bk_step_begin(struct backend *b) {
    b->status = SMELT_OK;
    b->msg[0] = 0;
    arena_reset(&b->meta);
    b->ops->step_begin(b);
}

/* A tensor struct in host scratch; on exhaustion records the error and returns a static
 * dummy whose data is NULL (ops skip once the sticky error is set). */
static struct tensor *new_struct(struct backend *b) {
    static struct tensor dummy; /* never written through: every op skips on b->status */
    struct tensor *t = arena_alloc(&b->meta, sizeof *t);
    if (!t) {
        bk_fail(b, SMELT_ERR_NOMEM, "out of host memory for step scratch");
        memset(&dummy, 0, sizeof dummy);
        return &dummy;
    }
    return t;
}

struct tensor *bk_new(struct backend *b, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2) {
    struct tensor *t = new_struct(b);
    if (b->status != SMELT_OK) return t;
    BK_ASSERT(tensor_init(t, type, ne0, ne1, ne2, 1));
    t->backend = b;
    t->data = b->ops->scratch_alloc(b, tensor_nbytes(t));
    if (!t->data)
        bk_fail(b, SMELT_ERR_NOMEM, "out of scratch memory for a (%lld, %lld, %lld) %s tensor",
                (long long)ne0, (long long)ne1, (long long)ne2, qtype_name(type));
    return t;
}

size_t bk_scratch_mark(struct backend *b) { return b->ops->scratch_mark(b); }

void bk_scratch_release(struct backend *b, size_t mark) { b->ops->scratch_release(b, mark); }

struct tensor *bk_reshape(struct backend *b, const struct tensor *t, int64_t ne0, int64_t ne1,
                          int64_t ne2) {
    struct tensor *v = new_struct(b);
    if (b->status != SMELT_OK) return v;
    BK_ASSERT(tensor_is_contiguous(t));
    BK_ASSERT(ne0 * ne1 * ne2 == tensor_nelem(t));
    BK_ASSERT(tensor_init(v, t->type, ne0, ne1, ne2, 1));
    v->data = t->data;
    v->backend = t->backend;
    v->name = t->name;
    return v;
}

struct tensor *bk_view_2d(struct backend *b, const struct tensor *t, int64_t ne0, int64_t ne1,
                          size_t nb1, size_t offset) {
    struct tensor *v = new_struct(b);
    if (b->status != SMELT_OK) return v;
    BK_ASSERT(tensor_init(v, t->type, ne0, ne1, 1, 1));
    BK_ASSERT(nb1 >= v->nb[1]);
    BK_ASSERT(offset + nb1 * (size_t)(ne1 - 1) + v->nb[1] <= tensor_nbytes(t));
    v->nb[1] = nb1;
    v->nb[2] = v->nb[3] = nb1 * (size_t)ne1;
    v->data = (char *)t->data + offset;
    v->backend = t->backend;
    v->name = t->name;
    return v;
}

struct tensor *bk_view_3d(struct backend *b, const struct tensor *t, int64_t ne0, int64_t ne1,
                          int64_t ne2, size_t nb1, size_t nb2, size_t offset) {
    struct tensor *v = new_struct(b);
    if (b->status != SMELT_OK) return v;
    BK_ASSERT(tensor_init(v, t->type, ne0, ne1, ne2, 1));
    BK_ASSERT(nb1 >= v->nb[1] && nb2 >= nb1 * (size_t)(ne1 - 1) + v->nb[1]);
    BK_ASSERT(offset + nb2 * (size_t)(ne2 - 1) + nb1 * (size_t)(ne1 - 1) + v->nb[1] <=
              tensor_nbytes(t));
    v->nb[1] = nb1;
    v->nb[2] = nb2;
    v->nb[3] = nb2 * (size_t)ne2;
    v->data = (char *)t->data + offset;
    v->backend = t->backend;
    v->name = t->name;
    return v;
}

void bk_upload(struct backend *b, struct tensor *dst, const void *src, size_t nbytes) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(nbytes <= tensor_nbytes(dst));
    b->ops->upload(b, dst, src, nbytes);
}

void bk_download(struct backend *b, void *dst, const struct tensor *src, size_t nbytes) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(nbytes <= tensor_nbytes(src));
    b->ops->download(b, dst, src, nbytes);
}

smelt_status bk_sync(struct backend *b, struct err *e) {
    smelt_status st = b->ops->sync(b, e);
    if (st != SMELT_OK) return st;
    if (b->status != SMELT_OK) return err_set(e, b->status, "%s", b->msg);
    return SMELT_OK;
}

bool bk_mem_info(struct backend *b, uint64_t *free_b, uint64_t *total_b) {
    *free_b = *total_b = 0;
    return b->ops->mem_info && b->ops->mem_info(b, free_b, total_b);
}

uint64_t bk_weight_bytes(struct backend *b, uint32_t type, const int64_t ne[TENSOR_MAX_DIMS]) {
    return b->ops->weight_bytes ? b->ops->weight_bytes(b, type, ne) : 0;
}

size_t bk_scratch_peak(struct backend *b) {
    return b->ops->scratch_peak ? b->ops->scratch_peak(b) : 0;
}

smelt_status bk_scratch_reserve(struct backend *b, size_t nbytes, struct err *e) {
    return b->ops->scratch_reserve ? b->ops->scratch_reserve(b, nbytes, e) : SMELT_OK;
}

/* ---- ops: contracts, then dispatch ---- */

static bool is_f32_rows(const struct tensor *t) {
    return t->type == QT_F32 && t->nb[0] == sizeof(float);
}

static bool has(const struct backend *b, uint32_t features) {
    return bk_missing_features(b, features) == 0;
}

/* The feature bits a rope, GLU or attention call uses. */
static uint32_t rope_needs(const struct rope_params *p) {
    return p->yarn_unrounded ? BK_FEAT_YARN_UNROUNDED : 0;
}
static uint32_t glu_needs(enum glu_act act) {
    return act == GLU_SWIGLU_OAI ? BK_FEAT_SWIGLU_OAI : 0;
}
static uint32_t attn_needs(const struct attn_params *p) {
    return (p->sinks ? BK_FEAT_ATTN_SINKS : 0) | (p->non_causal ? BK_FEAT_NON_CAUSAL : 0);
}

uint32_t bk_missing_features(const struct backend *b, uint32_t features) {
    return features & ~b->ops->features;
}

const char *bk_feature_names(uint32_t features, char *buf, size_t n) {
    static const char *const names[] = {"attention sinks", "gpt-oss's clamped SwiGLU",
                                        "expert biases", "unrounded YaRN",
                                        "a per-row GLU gate (shared experts)", "LayerNorm",
                                        "non-gated activations", "bidirectional attention"};
    size_t o = 0;
    if (n) buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (features & (1u << i))
            o += (size_t)snprintf(buf + o, o < n ? n - o : 0, "%s%s", o ? ", " : "", names[i]);
    return buf;
}

void bk_get_rows(struct backend *b, struct tensor *dst, const struct tensor *src,
                 const struct tensor *ids) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(dst) && ids->type == QT_I32);
    BK_ASSERT(dst->ne[0] == src->ne[0] && dst->ne[1] == ids->ne[0]);
    BK_ASSERT(dst->ne[2] == 1 && src->ne[2] == 1);
    b->ops->get_rows(b, dst, src, ids);
}

void bk_rms_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                 const struct tensor *w, float eps) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(x) && is_f32_rows(dst) && tensor_same_shape(dst, x));
    BK_ASSERT(!w || (w->type == QT_F32 && w->ne[0] == x->ne[0]));
    b->ops->rms_norm(b, dst, x, w, eps);
}

void bk_layer_norm(struct backend *b, struct tensor *dst, const struct tensor *x,
                   const struct tensor *w, const struct tensor *bias, float eps) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->layer_norm && has(b, BK_FEAT_LAYER_NORM));
    BK_ASSERT(is_f32_rows(x) && is_f32_rows(dst) && tensor_same_shape(dst, x));
    BK_ASSERT(!w || (w->type == QT_F32 && w->ne[0] == x->ne[0]));
    BK_ASSERT(!bias || (bias->type == QT_F32 && bias->ne[0] == x->ne[0]));
    b->ops->layer_norm(b, dst, x, w, bias, eps);
}

void bk_act(struct backend *b, struct tensor *dst, const struct tensor *x, enum glu_act act) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->act && has(b, BK_FEAT_ACT));
    BK_ASSERT(is_f32_rows(dst) && is_f32_rows(x) && tensor_same_shape(dst, x));
    BK_ASSERT(act == GLU_SILU || act == GLU_GELU_TANH || act == GLU_GELU_ERF);
    b->ops->act(b, dst, x, act);
}

void bk_rope(struct backend *b, struct tensor *x, const struct tensor *pos,
             const struct rope_params *p) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(x) && pos->type == QT_I32 && pos->ne[0] == x->ne[2]);
    BK_ASSERT(p->n_rot > 0 && p->n_rot % 2 == 0 && p->n_rot <= x->ne[0]);
    BK_ASSERT(!p->freq_factors ||
              (p->freq_factors->type == QT_F32 && p->freq_factors->ne[0] >= p->n_rot / 2));
    BK_ASSERT(has(b, rope_needs(p)));
    b->ops->rope(b, x, pos, p);
}

static void check_matmul(const struct tensor *dst, const struct tensor *w,
                         const struct tensor *x) {
    BK_ASSERT(is_f32_rows(x) && is_f32_rows(dst));
    BK_ASSERT(w->ne[0] == x->ne[0] && dst->ne[0] == w->ne[1] && dst->ne[1] == x->ne[1]);
    BK_ASSERT(w->ne[2] == 1 && x->ne[2] == 1 && dst->ne[2] == 1);
}

void bk_matmul(struct backend *b, struct tensor *dst, const struct tensor *w,
               const struct tensor *x) {
    if (b->status != SMELT_OK) return;
    check_matmul(dst, w, x);
    b->ops->matmul(b, dst, w, x);
}

void bk_add(struct backend *b, struct tensor *dst, const struct tensor *a,
            const struct tensor *c) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(dst) && is_f32_rows(a) && is_f32_rows(c));
    BK_ASSERT(tensor_same_shape(dst, a) && c->ne[0] == a->ne[0]);
    BK_ASSERT(tensor_same_shape(a, c) || tensor_nrows(c) == 1);
    b->ops->add(b, dst, a, c);
}

void bk_scale(struct backend *b, struct tensor *dst, const struct tensor *x, float s) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(dst) && is_f32_rows(x) && tensor_same_shape(dst, x));
    b->ops->scale(b, dst, x, s);
}

void bk_glu(struct backend *b, struct tensor *dst, const struct tensor *gate,
            const struct tensor *up, enum glu_act act) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(dst) && is_f32_rows(gate) && is_f32_rows(up));
    BK_ASSERT(tensor_same_shape(dst, up));
    bool row_gate = !tensor_same_shape(dst, gate);
    BK_ASSERT(!row_gate || (gate->ne[0] == 1 && tensor_nrows(gate) == tensor_nrows(up) &&
                            act != GLU_SWIGLU_OAI));
    BK_ASSERT(has(b, glu_needs(act) | (row_gate ? BK_FEAT_GLU_ROW_GATE : 0)));
    b->ops->glu(b, dst, gate, up, act);
}

void bk_norm_gate(struct backend *b, struct tensor *dst, const struct tensor *x,
                  const struct tensor *w, const struct tensor *gate, float eps, enum glu_act act) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(dst) && is_f32_rows(x) && is_f32_rows(gate));
    BK_ASSERT(tensor_is_contiguous(dst) && tensor_is_contiguous(x) && tensor_is_contiguous(gate));
    BK_ASSERT(tensor_same_shape(dst, x) && tensor_same_shape(dst, gate) && x->ne[3] == 1);
    BK_ASSERT(w && w->type == QT_F32 && w->ne[0] > 0 && x->ne[0] % w->ne[0] == 0);
    BK_ASSERT(has(b, glu_needs(act)));
    if (b->ops->norm_gate) {
        b->ops->norm_gate(b, dst, x, w, gate, eps, act);
        return;
    }
    const int64_t g = w->ne[0], groups = tensor_nelem(x) / g;
    struct tensor *t = bk_new(b, QT_F32, x->ne[0], x->ne[1], x->ne[2]);
    bk_rms_norm(b, bk_reshape(b, t, g, groups, 1), bk_reshape(b, x, g, groups, 1), w, eps);
    bk_glu(b, dst, gate, t, act);
}

void bk_softcap(struct backend *b, struct tensor *x, float cap) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(x) && cap > 0);
    b->ops->softcap(b, x, cap);
}

void bk_softmax(struct backend *b, struct tensor *x) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(x));
    b->ops->softmax(b, x);
}

void bk_logits_topk(struct backend *b, struct tensor *dst, const struct tensor *logits,
                    const struct tensor *rows, const struct tensor *adj,
                    const struct tensor *mask) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->logits_topk);
    BK_ASSERT(is_f32_rows(logits) && tensor_is_contiguous(logits) && logits->ne[2] == 1);
    int64_t n_rows = logits->ne[1];
    BK_ASSERT(rows->type == QT_I32 && rows->ne[0] == TOPK_ROW_WORDS && rows->ne[1] == n_rows);
    BK_ASSERT(adj->type == QT_I32 && adj->ne[0] == TOPK_ADJ_WORDS);
    BK_ASSERT(dst->type == QT_I32 && tensor_nelem(dst) == topk_out_words(n_rows, adj->ne[1]));
    BK_ASSERT(!mask || (mask->type == QT_I32 && tensor_is_contiguous(mask) &&
                        mask->ne[0] == topk_mask_words(logits->ne[0]) && mask->ne[1] == n_rows));
    b->ops->logits_topk(b, dst, logits, rows, adj, mask);
}

bool bk_has_logits_topk(const struct backend *b) { return b->ops->logits_topk != NULL; }

void bk_moe_route(struct backend *b, struct tensor *ids, struct tensor *weights,
                  const struct tensor *x, const struct tensor *router, const struct tensor *bias,
                  enum moe_gating gating, const struct prenorm *pre,
                  const struct tensor *sh_gate_inp, struct tensor *sh_logit) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->moe_route);
    BK_ASSERT(!sh_gate_inp == !sh_logit);
    BK_ASSERT(!sh_gate_inp || (sh_gate_inp->type == QT_F32 && sh_gate_inp->ne[0] == x->ne[0] &&
                               tensor_nelem(sh_gate_inp) == x->ne[0]));
    BK_ASSERT(!sh_logit || (is_f32_rows(sh_logit) && tensor_is_contiguous(sh_logit) &&
                            sh_logit->ne[0] == 1 && sh_logit->ne[1] == x->ne[1] &&
                            sh_logit->ne[2] == 1));
    BK_ASSERT(is_f32_rows(x) && tensor_is_contiguous(x) && x->ne[2] == 1);
    BK_ASSERT(router->type == QT_F32 && router->ne[0] == x->ne[0] && router->ne[2] == 1);
    BK_ASSERT(!bias || (bias->type == QT_F32 && bias->ne[0] == router->ne[1]));
    BK_ASSERT(ids->type == QT_I32 && tensor_is_contiguous(ids) && ids->ne[1] == x->ne[1]);
    BK_ASSERT(is_f32_rows(weights) && tensor_same_shape(weights, ids));
    BK_ASSERT(ids->ne[0] >= 1 && ids->ne[0] <= router->ne[1] && ids->ne[2] == 1);
    BK_ASSERT(gating == MOE_SOFTMAX || gating == MOE_SOFTMAX_TOPK);
    BK_ASSERT(!pre || !pre->w || (pre->w->type == QT_F32 && pre->w->ne[0] == x->ne[0]));
    b->ops->moe_route(b, ids, weights, x, router, bias, gating, pre, sh_gate_inp, sh_logit);
}

/* bk_moe_ffn with the experts bound to another backend eb (--n-cpu-moe: b the GPU, eb the
 * CPU): x' (x normed on b), the ids and the weights go to eb, which runs the experts, and
 * their sum comes back to be written or added on b. eb's scratch is its own: nothing else
 * runs on it between its step_begin here and the sync. b waits for its device twice (the
 * rows out, then eb's result in), so such a step cannot be a graph (model.c runs it
 * eagerly). */
static void moe_ffn_elsewhere(struct backend *b, struct backend *eb, struct tensor *dst,
                              const struct tensor *x, const struct moe_experts *w,
                              const struct tensor *ids, const struct tensor *weights,
                              const struct prenorm *pre, bool acc) {
    const int64_t n_embd = x->ne[0], n = x->ne[1], k = ids->ne[0];
    const size_t mark = bk_scratch_mark(b);
    const struct tensor *xn = x;
    if (pre) {
        struct tensor *t = bk_new(b, QT_F32, n_embd, n, 1);
        bk_rms_norm(b, t, x, pre->w, pre->eps);
        xn = t;
    }
    bk_step_begin(eb);
    struct tensor *xh = bk_new(eb, QT_F32, n_embd, n, 1), *yh = bk_new(eb, QT_F32, n_embd, n, 1);
    struct tensor *ih = bk_new(eb, QT_I32, k, n, 1), *wh = bk_new(eb, QT_F32, k, n, 1);
    struct err e;
    if (!xh->data || !yh->data || !ih->data || !wh->data) {
        bk_sync(eb, &e);
        bk_fail(b, e.code, "experts on %s: %s", eb->ops->name, e.msg);
        bk_scratch_release(b, mark);
        return;
    }
    bk_download(b, xh->data, xn, (size_t)(n * n_embd) * sizeof(float));
    bk_download(b, ih->data, ids, (size_t)(n * k) * sizeof(int32_t));
    bk_download(b, wh->data, weights, (size_t)(n * k) * sizeof(float));
    if (bk_sync(b, &e) != SMELT_OK) { /* the sticky error stays b's */
        bk_scratch_release(b, mark);
        return;
    }
    struct moe_experts we = *w; /* the experts only: the shared expert runs on b */
    we.sh_gate = we.sh_up = we.sh_down = we.sh_logit = NULL;
    bk_moe_ffn(eb, yh, xh, &we, ih, wh, NULL, false, NULL);
    if (bk_sync(eb, &e) != SMELT_OK) {
        bk_fail(b, e.code, "experts on %s: %s", eb->ops->name, e.msg);
        bk_scratch_release(b, mark);
        return;
    }
    struct tensor *y = bk_new(b, QT_F32, n_embd, n, 1);
    bk_upload(b, y, yh->data, (size_t)(n * n_embd) * sizeof(float));
    if (acc) bk_add(b, dst, dst, y);
    else bk_scale(b, dst, y, 1.0f);
    bk_scratch_release(b, mark);
}

void bk_moe_ffn(struct backend *b, struct tensor *dst, const struct tensor *x,
                const struct moe_experts *w, const struct tensor *ids,
                const struct tensor *weights, const struct prenorm *pre, bool acc,
                const struct prenorm *next) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->moe_ffn);
    BK_ASSERT(is_f32_rows(x) && tensor_is_contiguous(x) && x->ne[2] == 1);
    BK_ASSERT(is_f32_rows(dst) && tensor_is_contiguous(dst) && tensor_same_shape(dst, x));
    const int64_t n_embd = x->ne[0], n_ff = w->gate->ne[1], n_expert = w->gate->ne[2];
    BK_ASSERT(w->gate->ne[0] == n_embd && tensor_is_contiguous(w->gate));
    BK_ASSERT(tensor_same_shape(w->up, w->gate) && tensor_is_contiguous(w->up));
    BK_ASSERT(w->down->ne[0] == n_ff && w->down->ne[1] == n_embd && w->down->ne[2] == n_expert);
    BK_ASSERT(tensor_is_contiguous(w->down) && w->gate->ne[3] == 1 && w->down->ne[3] == 1);
    BK_ASSERT(ids->type == QT_I32 && tensor_is_contiguous(ids) && ids->ne[1] == x->ne[1]);
    BK_ASSERT(is_f32_rows(weights) && tensor_same_shape(weights, ids) && ids->ne[2] == 1);
    BK_ASSERT(ids->ne[0] >= 1 && ids->ne[0] <= n_expert);
    BK_ASSERT(!pre || !pre->w || (pre->w->type == QT_F32 && pre->w->ne[0] == n_embd));
    const bool bias = w->gate_b || w->up_b || w->down_b;
    BK_ASSERT(!bias || (w->gate_b && w->up_b && w->down_b));
    BK_ASSERT(!bias || (is_f32_rows(w->gate_b) && tensor_is_contiguous(w->gate_b) &&
                        w->gate_b->ne[0] == n_ff && w->gate_b->ne[1] == n_expert));
    BK_ASSERT(!bias || (is_f32_rows(w->up_b) && tensor_is_contiguous(w->up_b) &&
                        tensor_same_shape(w->up_b, w->gate_b)));
    BK_ASSERT(!bias || (is_f32_rows(w->down_b) && tensor_is_contiguous(w->down_b) &&
                        w->down_b->ne[0] == n_embd && w->down_b->ne[1] == n_expert));
    if (w->sh_gate || w->sh_up || w->sh_down) {
        const struct tensor *g = w->sh_gate, *u = w->sh_up, *d = w->sh_down, *l = w->sh_logit;
        BK_ASSERT(g && u && d && g->ne[0] == n_embd && g->ne[2] == 1 && tensor_same_shape(u, g));
        BK_ASSERT(d->ne[0] == g->ne[1] && d->ne[1] == n_embd && d->ne[2] == 1);
        BK_ASSERT(!l || (is_f32_rows(l) && tensor_is_contiguous(l) && l->ne[0] == 1 &&
                         l->ne[1] == x->ne[1] && l->ne[2] == 1));
    } else {
        BK_ASSERT(!w->sh_logit);
    }
    struct backend *eb = w->gate->backend; /* where the experts live */
    if (eb && eb != b) { /* the shared expert stays here, with the step's other weights */
        BK_ASSERT(w->up->backend == eb && w->down->backend == eb);
        BK_ASSERT(!bias || (w->gate_b->backend == eb && w->up_b->backend == eb &&
                            w->down_b->backend == eb));
        BK_ASSERT(has(eb, glu_needs(w->act) | (bias ? BK_FEAT_MOE_BIAS : 0)));
        struct tensor *h = bk_moe_shared_hidden(b, x, w, pre);
        moe_ffn_elsewhere(b, eb, dst, x, w, ids, weights, pre, acc);
        bk_moe_shared_down(b, dst, w, h, next);
        return;
    }
    BK_ASSERT(has(b, glu_needs(w->act) | (bias ? BK_FEAT_MOE_BIAS : 0)));
    b->ops->moe_ffn(b, dst, x, w, ids, weights, pre, acc, next);
}

struct tensor *bk_moe_shared_hidden(struct backend *b, const struct tensor *x,
                                    const struct moe_experts *w, const struct prenorm *pre) {
    if (!w->sh_gate || b->status != SMELT_OK) return NULL;
    struct tensor *h = bk_new(b, QT_F32, w->sh_gate->ne[1], x->ne[1], 1); /* (n_ff_sh, n) */
    bk_ffn_glu(b, h, w->sh_gate, w->sh_up, x, w->act, pre);
    if (w->sh_logit) bk_glu(b, h, w->sh_logit, h, GLU_SIGMOID); /* W_down is linear */
    return h;
}

void bk_moe_shared_down(struct backend *b, struct tensor *dst, const struct moe_experts *w,
                        const struct tensor *h, const struct prenorm *next) {
    if (h) bk_matmul_acc(b, dst, w->sh_down, NULL, h, next);
}

bool bk_has_moe(const struct backend *b) { return b->ops->moe_route && b->ops->moe_ffn; }

static void check_meta(const struct attn_meta *m, int64_t n_tokens) {
    BK_ASSERT(m->pos->type == QT_I32 && m->pos->ne[0] == n_tokens);
    BK_ASSERT(m->seq->type == QT_I32 && m->seq->ne[0] == n_tokens);
    BK_ASSERT(m->slot->type == QT_I32 && m->slot->ne[0] == n_tokens);
    BK_ASSERT(m->blocks->type == QT_I32 && m->block_size > 0);
}

/* Bidirectional attention has its key counts and neither a window nor sinks. */
static void check_non_causal(const struct attn_meta *m, const struct attn_params *p) {
    if (!p->non_causal) return;
    BK_ASSERT(m->n_keys && m->n_keys->type == QT_I32 && m->n_keys->ne[0] == m->blocks->ne[1]);
    BK_ASSERT(p->window == 0 && !p->sinks);
}

/* cache (head_dim, block_size, n_kv_head, n_blocks) against rows (head_dim, n_kv_head, n). */
static void check_cache(const struct tensor *c, const struct tensor *x, int32_t block_size) {
    BK_ASSERT(c->ne[0] == x->ne[0] && c->ne[1] == block_size && c->ne[2] == x->ne[1]);
    BK_ASSERT(tensor_is_contiguous(c));
}

void bk_kv_store(struct backend *b, struct tensor *kc, struct tensor *vc,
                 const struct tensor *k, const struct tensor *v, const struct attn_meta *m) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(k) && is_f32_rows(v) && k->ne[2] == v->ne[2] && k->ne[1] == v->ne[1]);
    check_meta(m, k->ne[2]);
    check_cache(kc, k, m->block_size);
    check_cache(vc, v, m->block_size);
    BK_ASSERT(kc->ne[3] == vc->ne[3] && kc->type == vc->type);
    b->ops->kv_store(b, kc, vc, k, v, m);
}

void bk_attention(struct backend *b, struct tensor *dst, const struct tensor *q,
                  const struct tensor *kc, const struct tensor *vc, const struct attn_meta *m,
                  const struct attn_params *p) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(q) && is_f32_rows(dst) && tensor_is_contiguous(dst));
    check_meta(m, q->ne[2]);
    BK_ASSERT(kc->ne[0] == q->ne[0] && kc->ne[1] == m->block_size && q->ne[1] % kc->ne[2] == 0);
    BK_ASSERT(vc->ne[1] == m->block_size && vc->ne[2] == kc->ne[2] && vc->ne[3] == kc->ne[3]);
    BK_ASSERT(dst->ne[0] == vc->ne[0] && dst->ne[1] == q->ne[1] && dst->ne[2] == q->ne[2]);
    BK_ASSERT(!p->sinks || (p->sinks->type == QT_F32 && p->sinks->ne[0] == q->ne[1]));
    check_non_causal(m, p);
    BK_ASSERT(has(b, attn_needs(p)));
    b->ops->attention(b, dst, q, kc, vc, m, p);
}

void bk_copy(struct backend *b, struct tensor *dst, const struct tensor *src) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(is_f32_rows(dst) && is_f32_rows(src) && tensor_same_shape(dst, src));
    BK_ASSERT(b->ops->copy);
    b->ops->copy(b, dst, src);
}

/* ---- recurrent-state ops ---- */

bool bk_has_recurrent(const struct backend *b) {
    return b->ops->ssm_conv && b->ops->gated_delta_net && b->ops->copy;
}

static void check_state_seqs(const struct tensor *seqs) {
    BK_ASSERT(seqs->type == QT_I32 && seqs->ne[0] == STATE_SEQ_WORDS && seqs->ne[2] == 1);
}

/* bk_ssm_conv's operands other than dst (bk_deltanet's fused form checks them too). */
static void check_conv(const struct tensor *x, const struct tensor *w, const struct tensor *cs,
                       const struct tensor *seqs) {
    BK_ASSERT(is_f32_rows(x) && tensor_is_contiguous(x) && x->ne[2] == 1);
    BK_ASSERT(w->type == QT_F32 && w->ne[1] == x->ne[0] && w->ne[0] >= 2 &&
              tensor_is_contiguous(w));
    BK_ASSERT(cs->type == QT_F32 && tensor_is_contiguous(cs) &&
              cs->ne[0] == (w->ne[0] - 1) * x->ne[0]);
    check_state_seqs(seqs);
}

void bk_ssm_conv(struct backend *b, struct tensor *dst, const struct tensor *x,
                 const struct tensor *w, struct tensor *cs, const struct tensor *seqs, bool silu) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->ssm_conv);
    check_conv(x, w, cs, seqs);
    BK_ASSERT(is_f32_rows(dst) && tensor_same_shape(dst, x) && tensor_is_contiguous(dst) &&
              dst->data != x->data);
    b->ops->ssm_conv(b, dst, x, w, cs, seqs, silu);
}

/* bk_gated_delta_net's operands other than dst (bk_deltanet's fused form checks them too). */
static void check_gdn(const struct tensor *qkv, const struct tensor *a, const struct tensor *bl,
                      const struct tensor *ssm_a, const struct tensor *dt_bias, const struct tensor *ss,
                      const struct tensor *seqs, const struct gdn_params *p) {
    int64_t n = qkv->ne[1], nk = p->n_k_head, hk = p->head_k, nv = p->n_v_head, hv = p->head_v;
    BK_ASSERT(nk > 0 && hk > 0 && nv > 0 && hv > 0 && nv % nk == 0);
    BK_ASSERT(is_f32_rows(qkv) && tensor_is_contiguous(qkv) && qkv->ne[0] == 2 * nk * hk + nv * hv);
    BK_ASSERT(is_f32_rows(a) && is_f32_rows(bl) && a->ne[0] == nv && bl->ne[0] == nv &&
              a->ne[1] == n && bl->ne[1] == n);
    BK_ASSERT(ssm_a->type == QT_F32 && ssm_a->ne[0] == nv && dt_bias->type == QT_F32 &&
              dt_bias->ne[0] == nv);
    BK_ASSERT(ss->type == QT_F32 && tensor_is_contiguous(ss) && ss->ne[0] == nv * hv * hk);
    check_state_seqs(seqs);
}

void bk_gated_delta_net(struct backend *b, struct tensor *dst, const struct tensor *qkv,
                        const struct tensor *a, const struct tensor *bl, const struct tensor *ssm_a,
                        const struct tensor *dt_bias, struct tensor *ss, const struct tensor *seqs,
                        const struct gdn_params *p) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(b->ops->gated_delta_net);
    check_gdn(qkv, a, bl, ssm_a, dt_bias, ss, seqs, p);
    BK_ASSERT(is_f32_rows(dst) && tensor_is_contiguous(dst) && dst->ne[0] == p->head_v &&
              dst->ne[1] == p->n_v_head && dst->ne[2] == qkv->ne[1]);
    b->ops->gated_delta_net(b, dst, qkv, a, bl, ssm_a, dt_bias, ss, seqs, p);
}

void bk_deltanet(struct backend *b, struct tensor *z, const struct tensor *qkv, const struct tensor *a,
                 const struct tensor *bl, const struct deltanet_w *w, struct tensor *cs,
                 struct tensor *ss, const struct tensor *seqs, const struct gdn_params *p,
                 bool one_row) {
    if (b->status != SMELT_OK) return;
    const int64_t n = qkv->ne[1], vdim = (int64_t)p->n_v_head * p->head_v;
    BK_ASSERT(is_f32_rows(z) && tensor_is_contiguous(z) && z->ne[0] == vdim && z->ne[1] == n &&
              z->ne[2] == 1);
    BK_ASSERT(w->norm && w->norm->type == QT_F32 && w->norm->ne[0] == p->head_v);
    if (one_row && b->ops->deltanet) {
        /* the conv's output has qkv's shape: the delta rule's checks apply to qkv */
        check_conv(qkv, w->conv, cs, seqs);
        check_gdn(qkv, a, bl, w->ssm_a, w->dt_bias, ss, seqs, p);
        if (b->ops->deltanet(b, z, qkv, a, bl, w, cs, ss, seqs, p)) return;
    }
    struct tensor *xc = bk_new(b, QT_F32, qkv->ne[0], n, 1);
    bk_ssm_conv(b, xc, qkv, w->conv, cs, seqs, true);
    struct tensor *o = bk_new(b, QT_F32, p->head_v, p->n_v_head, n);
    bk_gated_delta_net(b, o, xc, a, bl, w->ssm_a, w->dt_bias, ss, seqs, p);
    bk_norm_gate(b, z, bk_reshape(b, o, vdim, n, 1), w->norm, z, w->norm_eps, GLU_SILU);
}

/* x, or a fresh tensor holding rms_norm(x) * pre->w. */
static const struct tensor *apply_prenorm(struct backend *b, const struct tensor *x,
                                          const struct prenorm *pre) {
    if (!pre) return x;
    struct tensor *h = bk_new(b, QT_F32, x->ne[0], x->ne[1], x->ne[2]);
    bk_rms_norm(b, h, x, pre->w, pre->eps);
    return h;
}

void bk_matmul_group(struct backend *b, int n, struct tensor *const *dst,
                     const struct tensor *const *w, const struct tensor *const *bias,
                     const struct tensor *x, const struct prenorm *pre) {
    if (b->status != SMELT_OK) return;
    for (int i = 0; i < n; i++) {
        check_matmul(dst[i], w[i], x);
        BK_ASSERT(!bias || !bias[i] || (bias[i]->type == QT_F32 && bias[i]->ne[0] == dst[i]->ne[0]));
    }
    BK_ASSERT(!pre || !pre->w || (pre->w->type == QT_F32 && pre->w->ne[0] == x->ne[0]));
    if (b->ops->matmul_group) {
        b->ops->matmul_group(b, n, dst, w, bias, x, pre);
        return;
    }
    x = apply_prenorm(b, x, pre);
    for (int i = 0; i < n; i++) {
        bk_matmul(b, dst[i], w[i], x);
        if (bias && bias[i]) bk_add(b, dst[i], dst[i], bias[i]);
    }
}

void bk_matmul_acc(struct backend *b, struct tensor *dst, const struct tensor *w,
                   const struct tensor *bias, const struct tensor *x, const struct prenorm *next) {
    if (b->status != SMELT_OK) return;
    check_matmul(dst, w, x);
    BK_ASSERT(!bias || (bias->type == QT_F32 && bias->ne[0] == dst->ne[0]));
    if (b->ops->matmul_acc) {
        b->ops->matmul_acc(b, dst, w, bias, x, next);
        return;
    }
    struct tensor *t = bk_new(b, QT_F32, dst->ne[0], dst->ne[1], 1);
    bk_matmul(b, t, w, x);
    if (bias) bk_add(b, t, t, bias);
    bk_add(b, dst, dst, t);
}

void bk_ffn_glu(struct backend *b, struct tensor *dst, const struct tensor *w_gate,
                const struct tensor *w_up, const struct tensor *x, enum glu_act act,
                const struct prenorm *pre) {
    if (b->status != SMELT_OK) return;
    check_matmul(dst, w_gate, x);
    check_matmul(dst, w_up, x);
    BK_ASSERT(!pre || !pre->w || (pre->w->type == QT_F32 && pre->w->ne[0] == x->ne[0]));
    if (b->ops->ffn_glu) {
        BK_ASSERT(has(b, glu_needs(act)));
        b->ops->ffn_glu(b, dst, w_gate, w_up, x, act, pre);
        return;
    }
    struct tensor *up = bk_new(b, QT_F32, dst->ne[0], dst->ne[1], 1);
    struct tensor *outs[2] = {dst, up};
    const struct tensor *ws[2] = {w_gate, w_up};
    bk_matmul_group(b, 2, outs, ws, NULL, x, pre);
    bk_glu(b, dst, dst, up, act);
}

void bk_ffn(struct backend *b, struct tensor *dst, const struct tensor *x, const struct tensor *w_gate,
            const struct tensor *w_up, const struct tensor *w_down, enum glu_act act,
            const struct prenorm *pre, bool acc, const struct prenorm *next) {
    if (b->status != SMELT_OK) return;
    const int64_t n_ff = w_gate->ne[1], n = x->ne[1];
    BK_ASSERT(w_up->ne[0] == w_gate->ne[0] && w_up->ne[1] == n_ff && w_down->ne[0] == n_ff);
    BK_ASSERT(is_f32_rows(dst) && dst->ne[0] == w_down->ne[1] && dst->ne[1] == n && dst->ne[2] == 1);
    if (b->ops->ffn && x->ne[0] == w_gate->ne[0] && x->ne[2] == 1) {
        BK_ASSERT(has(b, glu_needs(act)));
        if (b->ops->ffn(b, dst, x, w_gate, w_up, w_down, act, pre, acc)) return;
    }
    struct tensor *h = bk_new(b, QT_F32, n_ff, n, 1);
    bk_ffn_glu(b, h, w_gate, w_up, x, act, pre);
    if (acc) bk_matmul_acc(b, dst, w_down, NULL, h, next);
    else bk_matmul(b, dst, w_down, h);
}

void bk_rope_kv_store(struct backend *b, struct tensor *q, struct tensor *k,
                      const struct tensor *v, struct tensor *kc, struct tensor *vc,
                      const struct attn_meta *m, const struct qk_prep *p) {
    if (b->status != SMELT_OK) return;
    BK_ASSERT(!p->q_norm || (p->q_norm->type == QT_F32 && p->q_norm->ne[0] == q->ne[0]));
    BK_ASSERT(!p->k_norm || (p->k_norm->type == QT_F32 && p->k_norm->ne[0] == k->ne[0]));
    if (b->ops->rope_kv_store) {
        BK_ASSERT(is_f32_rows(q) && is_f32_rows(k) && q->ne[2] == k->ne[2]);
        check_meta(m, k->ne[2]);
        check_cache(kc, k, m->block_size);
        check_cache(vc, v, m->block_size);
        BK_ASSERT(has(b, rope_needs(p->rope)));
        b->ops->rope_kv_store(b, q, k, v, kc, vc, m, p);
        return;
    }
    if (p->q_norm) bk_rms_norm(b, q, q, p->q_norm, p->eps);
    if (p->k_norm) bk_rms_norm(b, k, k, p->k_norm, p->eps);
    bk_rope(b, q, m->pos, p->rope);
    bk_rope(b, k, m->pos, p->rope);
    bk_kv_store(b, kc, vc, k, v, m);
}

void bk_rope_attention(struct backend *b, struct tensor *dst, struct tensor *q, struct tensor *k,
                       const struct tensor *v, struct tensor *kc, struct tensor *vc,
                       const struct attn_meta *m, const struct qk_prep *qp,
                       const struct attn_params *ap) {
    if (b->status != SMELT_OK) return;
    if (!b->ops->rope_attention) {
        bk_rope_kv_store(b, q, k, v, kc, vc, m, qp);
        bk_attention(b, dst, q, kc, vc, m, ap);
        return;
    }
    BK_ASSERT(!qp->q_norm || (qp->q_norm->type == QT_F32 && qp->q_norm->ne[0] == q->ne[0]));
    BK_ASSERT(!qp->k_norm || (qp->k_norm->type == QT_F32 && qp->k_norm->ne[0] == k->ne[0]));
    BK_ASSERT(is_f32_rows(q) && is_f32_rows(k) && q->ne[2] == k->ne[2]);
    BK_ASSERT(is_f32_rows(dst) && tensor_is_contiguous(dst));
    check_meta(m, q->ne[2]);
    check_cache(kc, k, m->block_size);
    check_cache(vc, v, m->block_size);
    BK_ASSERT(kc->ne[0] == q->ne[0] && q->ne[1] % kc->ne[2] == 0);
    BK_ASSERT(dst->ne[0] == vc->ne[0] && dst->ne[1] == q->ne[1] && dst->ne[2] == q->ne[2]);
    BK_ASSERT(!ap->sinks || (ap->sinks->type == QT_F32 && ap->sinks->ne[0] == q->ne[1]));
    check_non_causal(m, ap);
    BK_ASSERT(has(b, rope_needs(qp->rope) | attn_needs(ap)));
    b->ops->rope_attention(b, dst, q, k, v, kc, vc, m, qp, ap);
}

/* ---- step graphs ---- */

bool bk_graph_replay(struct backend *b, uint64_t key) {
    return b->ops->graph_replay && b->status == SMELT_OK && b->ops->graph_replay(b, key);
}

void bk_graph_begin(struct backend *b, uint64_t key) {
    if (b->ops->graph_begin) b->ops->graph_begin(b, key);
}

void bk_graph_end(struct backend *b) {
    if (b->ops->graph_end) b->ops->graph_end(b);
}
