/* smelt inspect FILE [--tensors] [--json]: what a GGUF file holds.
 *
 * One model of the report is built as a jansson document; --json prints it, otherwise the
 * same document is rendered as text, so both always carry the same content. Long arrays
 * (token lists, merges, scores) are summarized as {type, n, head}, never dumped.
 */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/modelref.h"
#include "format/gguf.h"
#include "quant/quant.h"

#define ARR_FULL 16      /* arrays up to this many elements are shown whole */
#define ARR_HEAD 8       /* longer ones show their first elements */
#define STR_MAX 2048     /* strings longer than this are cut (JSON keeps a "len") */
#define TEXT_STR_MAX 160 /* text output cuts strings here (at a UTF-8 boundary) */

static void usage(FILE *out) {
    fprintf(out,
            "usage: smelt inspect MODEL [--tensors] [--json]\n"
            "  MODEL: a GGUF file, a directory holding one, or org/repo[:quant] in the HF cache\n"
            "\n"
            "Validates a GGUF file (or the first file of a split set NAME-00001-of-0000N.gguf)\n"
            "and prints: format version and size; general.* metadata and the file type; the\n"
            "architecture's hyper-parameters (every <arch>.* key); a tokenizer summary\n"
            "(model, pre-tokenizer, vocab size, merges, special tokens with their text, chat\n"
            "template length); other metadata; parameter count; bytes and tensors per type.\n"
            "Long arrays are summarized.\n"
            "\n"
            "  --tensors  also list every tensor: name, type, shape, bytes, offset\n"
            "  --json     print one JSON document instead of text\n"
            "  -h, --help this help\n"
            "\n"
            "Exit status: 0 ok, 1 the file is unreadable or invalid (the reason is printed),\n"
            "2 usage error.\n");
}

/* A JSON string from arbitrary bytes: invalid UTF-8 bytes become U+FFFD. */
static json_t *jstr(struct gguf_str s, uint64_t max) {
    uint64_t n = s.len < max ? s.len : max;
    json_t *j = json_stringn(s.ptr, (size_t)n);
    if (j) return j;
    /* Slow path: copy, replacing bytes that do not start valid sequences. */
    char *buf = malloc((size_t)n * 3 + 1);
    if (!buf) return json_string("");
    size_t k = 0;
    for (uint64_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s.ptr[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        json_t *t =
            (len && c != 0 && i + (uint64_t)len <= n) ? json_stringn(s.ptr + i, (size_t)len) : NULL;
        if (t) {
            json_decref(t);
            memcpy(buf + k, s.ptr + i, (size_t)len);
            k += (size_t)len;
            i += (uint64_t)len;
        } else {
            memcpy(buf + k, "\xef\xbf\xbd", 3);
            k += 3;
            i++;
        }
    }
    j = json_stringn(buf, k);
    free(buf);
    return j ? j : json_string("");
}

/* A float32 as the shortest decimal that reads back as the same float (1e-05, not
 * 9.99999975e-06), so JSON and text show what the converter wrote. */
static json_t *jf32(double x) {
    float f = (float)x;
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)f);
        if (strtof(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

static json_t *jscalar(const struct gguf_value *v) {
    switch (v->type) {
    case GGUF_T_UINT8:
    case GGUF_T_UINT16:
    case GGUF_T_UINT32:
    case GGUF_T_UINT64:
        return v->v.u > INT64_MAX ? json_real((double)v->v.u) : json_integer((json_int_t)v->v.u);
    case GGUF_T_INT8:
    case GGUF_T_INT16:
    case GGUF_T_INT32:
    case GGUF_T_INT64:
        return json_integer(v->v.i);
    case GGUF_T_FLOAT32:
        return jf32(v->v.f);
    case GGUF_T_FLOAT64:
        return json_real(v->v.f);
    case GGUF_T_BOOL:
        return json_boolean(v->v.b);
    default:
        return json_null();
    }
}

/* A metadata value as JSON: scalars and strings as themselves (long strings cut, with
 * their length beside), short arrays whole, long arrays as {type, n, head}. */
static json_t *jvalue(const struct gguf_value *v) {
    if (v->type == GGUF_T_STRING) {
        if (v->v.s.len <= STR_MAX) return jstr(v->v.s, STR_MAX);
        return json_pack("{s:o, s:I}", "text", jstr(v->v.s, STR_MAX), "len",
                         (json_int_t)v->v.s.len);
    }
    if (v->type != GGUF_T_ARRAY) return jscalar(v);
    uint64_t n = v->v.arr.n, show = n <= ARR_FULL ? n : ARR_HEAD;
    json_t *items = json_array();
    for (uint64_t i = 0; i < show; i++) {
        enum gguf_vtype et = v->v.arr.type;
        json_t *it;
        if (et == GGUF_T_STRING || et == GGUF_T_ARRAY) {
            it = jvalue(&v->v.arr.items[i]);
        } else if (et == GGUF_T_FLOAT32) {
            it = jf32(gguf_arr_f64(v, i));
        } else if (et == GGUF_T_FLOAT64) {
            it = json_real(gguf_arr_f64(v, i));
        } else if (et == GGUF_T_BOOL) {
            it = json_boolean(gguf_arr_i64(v, i));
        } else if (et == GGUF_T_UINT64) {
            uint64_t u = (uint64_t)gguf_arr_i64(v, i);
            it = u > INT64_MAX ? json_real((double)u) : json_integer((json_int_t)u);
        } else {
            it = json_integer(gguf_arr_i64(v, i));
        }
        json_array_append_new(items, it);
    }
    if (n <= ARR_FULL) return items;
    return json_pack("{s:s, s:s, s:I, s:o}", "array", "summary", "type",
                     gguf_vtype_name(v->v.arr.type), "n", (json_int_t)n, "head", items);
}

static const char *ftype_name(uint64_t ft) {
    static const char *names[] = {
        [0] = "ALL_F32",        [1] = "MOSTLY_F16",      [2] = "MOSTLY_Q4_0",
        [3] = "MOSTLY_Q4_1",    [7] = "MOSTLY_Q8_0",     [8] = "MOSTLY_Q5_0",
        [9] = "MOSTLY_Q5_1",    [10] = "MOSTLY_Q2_K",    [11] = "MOSTLY_Q3_K_S",
        [12] = "MOSTLY_Q3_K_M", [13] = "MOSTLY_Q3_K_L",  [14] = "MOSTLY_Q4_K_S",
        [15] = "MOSTLY_Q4_K_M", [16] = "MOSTLY_Q5_K_S",  [17] = "MOSTLY_Q5_K_M",
        [18] = "MOSTLY_Q6_K",   [19] = "MOSTLY_IQ2_XXS", [20] = "MOSTLY_IQ2_XS",
        [21] = "MOSTLY_Q2_K_S", [22] = "MOSTLY_IQ3_XS",  [23] = "MOSTLY_IQ3_XXS",
        [24] = "MOSTLY_IQ1_S",  [25] = "MOSTLY_IQ4_NL",  [26] = "MOSTLY_IQ3_S",
        [27] = "MOSTLY_IQ3_M",  [28] = "MOSTLY_IQ2_S",   [29] = "MOSTLY_IQ2_M",
        [30] = "MOSTLY_IQ4_XS", [31] = "MOSTLY_IQ1_M",   [32] = "MOSTLY_BF16",
        [36] = "MOSTLY_TQ1_0",  [37] = "MOSTLY_TQ2_0",   [38] = "MOSTLY_MXFP4_MOE",
    };
    if (ft >= sizeof names / sizeof names[0] || !names[ft]) return "unknown";
    return names[ft];
}

static bool has_prefix(struct gguf_str s, const char *p) {
    size_t n = strlen(p);
    return s.len >= n && !memcmp(s.ptr, p, n);
}

static json_t *special_token(const struct gguf_file *f, const struct gguf_value *tokens,
                             const char *key) {
    uint64_t id;
    struct err e;
    if (gguf_get_u64(f, key, &id, &e)) return NULL;
    json_t *j = json_pack("{s:I}", "id", (json_int_t)id);
    if (tokens && id < tokens->v.arr.n)
        json_object_set_new(j, "text", jstr(gguf_arr_str(tokens, id), 256));
    return j;
}

static json_t *tokenizer_summary(const struct gguf_file *f) {
    json_t *t = json_object();
    struct err e;
    struct gguf_str s;
    if (!gguf_get_str(f, "tokenizer.ggml.model", &s, &e))
        json_object_set_new(t, "model", jstr(s, 256));
    if (!gguf_get_str(f, "tokenizer.ggml.pre", &s, &e)) json_object_set_new(t, "pre", jstr(s, 256));
    const struct gguf_value *tokens = NULL, *a;
    if (!gguf_get_arr(f, "tokenizer.ggml.tokens", GGUF_T_STRING, &tokens, &e))
        json_object_set_new(t, "vocab_size", json_integer((json_int_t)tokens->v.arr.n));
    else
        tokens = NULL;
    if (!gguf_get_arr(f, "tokenizer.ggml.merges", GGUF_T_COUNT, &a, &e))
        json_object_set_new(t, "merges", json_integer((json_int_t)a->v.arr.n));
    if (!gguf_get_arr(f, "tokenizer.ggml.scores", GGUF_T_COUNT, &a, &e))
        json_object_set_new(t, "scores", json_integer((json_int_t)a->v.arr.n));
    if (!gguf_get_arr(f, "tokenizer.ggml.token_type", GGUF_T_COUNT, &a, &e))
        json_object_set_new(t, "token_types", json_integer((json_int_t)a->v.arr.n));
    static const char *specials[] = {"bos",     "eos",       "eot",  "eom", "unknown",
                                     "padding", "separator", "mask", "cls"};
    json_t *sp = json_object();
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        char key[96];
        snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", specials[i]);
        json_t *j = special_token(f, tokens, key);
        if (j) json_object_set_new(sp, specials[i], j);
    }
    json_object_set_new(t, "special", sp);
    /* Named templates (tokenizer.chat_template.NAME): presence and length, like the
     * default one. */
    json_t *named = json_object();
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (!has_prefix(kv->key, "tokenizer.chat_template.") || kv->val.type != GGUF_T_STRING)
            continue;
        char name[256];
        gguf_str_copy(kv->key, name, sizeof name);
        json_object_set_new(named, name + strlen("tokenizer.chat_template."),
                            json_pack("{s:I}", "length", (json_int_t)kv->val.v.s.len));
    }
    if (json_object_size(named))
        json_object_set_new(t, "chat_templates", named);
    else
        json_decref(named);
    if (!gguf_get_str(f, "tokenizer.chat_template", &s, &e))
        json_object_set_new(t, "chat_template",
                            json_pack("{s:b, s:I}", "present", 1, "length", (json_int_t)s.len));
    else
        json_object_set_new(t, "chat_template", json_pack("{s:b}", "present", 0));
    /* Every other tokenizer.* key, generically (named templates, add_bos_token, ...). */
    static const char *done[] = {"tokenizer.ggml.model",   "tokenizer.ggml.pre",
                                 "tokenizer.ggml.tokens",  "tokenizer.ggml.merges",
                                 "tokenizer.ggml.scores",  "tokenizer.ggml.token_type",
                                 "tokenizer.chat_template"};
    json_t *other = json_object();
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        if (!has_prefix(kv->key, "tokenizer.")) continue;
        bool skip = false;
        for (size_t k = 0; k < sizeof done / sizeof done[0]; k++)
            skip |= gguf_str_eq(kv->key, done[k]);
        if (has_prefix(kv->key, "tokenizer.chat_template.") && kv->val.type == GGUF_T_STRING)
            skip = true;
        if (has_prefix(kv->key, "tokenizer.ggml.") && kv->key.len > 9 &&
            !memcmp(kv->key.ptr + kv->key.len - 9, "_token_id", 9))
            skip = true;
        char name[256];
        gguf_str_copy(kv->key, name, sizeof name);
        if (!skip) json_object_set_new(other, name + strlen("tokenizer."), jvalue(&kv->val));
    }
    json_object_set_new(t, "other", other);
    return t;
}

static void human(double x, const char *const *units, double base, char *buf, size_t n) {
    int u = 0;
    while (x >= base && units[u + 1]) {
        x /= base;
        u++;
    }
    if (u == 0)
        snprintf(buf, n, "%.0f%s", x, units[0]);
    else
        snprintf(buf, n, "%.2f %s", x, units[u]);
}

static void human_bytes(uint64_t b, char *buf, size_t n) {
    static const char *const units[] = {" B", "KiB", "MiB", "GiB", "TiB", NULL};
    human((double)b, units, 1024, buf, n);
}

static void human_count(uint64_t c, char *buf, size_t n) {
    static const char *const units[] = {"", "K", "M", "B", "T", NULL};
    human((double)c, units, 1000, buf, n);
}

static json_t *build_report(const char *path, const struct gguf_file *f, bool with_tensors) {
    json_t *r = json_object();
    json_object_set_new(r, "file", json_string(path));
    json_object_set_new(r, "version", json_integer(gguf_version(f)));
    json_object_set_new(r, "alignment", json_integer(gguf_alignment(f)));
    json_object_set_new(r, "splits", json_integer(gguf_n_splits(f)));
    json_object_set_new(r, "file_size", json_integer((json_int_t)gguf_file_size(f)));
    json_object_set_new(r, "n_kv", json_integer(gguf_n_kv(f)));
    json_object_set_new(r, "n_tensors", json_integer(gguf_n_tensors(f)));

    struct err e;
    struct gguf_str arch = {"", 0};
    char archp[128] = "";
    if (!gguf_get_str(f, "general.architecture", &arch, &e)) {
        json_object_set_new(r, "architecture", jstr(arch, 100));
        gguf_str_copy(arch, archp, sizeof archp - 1);
        strcat(archp, ".");
    } else {
        json_object_set_new(r, "architecture", json_null());
    }
    uint64_t ft;
    if (!gguf_get_u64(f, "general.file_type", &ft, &e))
        json_object_set_new(r, "file_type",
                            json_pack("{s:I, s:s}", "id", (json_int_t)ft, "name", ftype_name(ft)));

    json_t *general = json_object(), *hp = json_object(), *other = json_object();
    for (int64_t i = 0; i < gguf_n_kv(f); i++) {
        const struct gguf_kv *kv = gguf_kv_at(f, i);
        char name[512];
        gguf_str_copy(kv->key, name, sizeof name);
        if (has_prefix(kv->key, "general."))
            json_object_set_new(general, name + 8, jvalue(&kv->val));
        else if (archp[1] && has_prefix(kv->key, archp))
            json_object_set_new(hp, name + strlen(archp), jvalue(&kv->val));
        else if (!has_prefix(kv->key, "tokenizer."))
            json_object_set_new(other, name, jvalue(&kv->val));
    }
    json_object_set_new(r, "general", general);
    json_object_set_new(r, "hparams", hp);
    json_object_set_new(r, "tokenizer", tokenizer_summary(f));
    json_object_set_new(r, "other", other);

    /* Per-type totals, parameter count. */
    struct {
        int64_t count;
        uint64_t bytes, params;
    } by[QT_COUNT] = {{0}};
    uint64_t params = 0, bytes = 0;
    json_t *tl = with_tensors ? json_array() : NULL;
    for (int64_t i = 0; i < gguf_n_tensors(f); i++) {
        const struct gguf_tensor *t = gguf_tensor_at(f, i);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            nel *= (uint64_t)t->ne[d]; /* checked on open */
        params += nel;
        bytes += t->nbytes;
        if (t->type < QT_COUNT) {
            by[t->type].count++;
            by[t->type].bytes += t->nbytes;
            by[t->type].params += nel;
        }
        if (tl) {
            json_t *shape = json_array();
            for (uint32_t d = 0; d < t->n_dims; d++)
                json_array_append_new(shape, json_integer(t->ne[d]));
            json_t *jt = json_pack("{s:o, s:s, s:o, s:I, s:I}", "name", jstr(t->name, 512), "type",
                                   qtype_name(t->type), "shape", shape, "bytes",
                                   (json_int_t)t->nbytes, "offset", (json_int_t)t->offset);
            if (gguf_n_splits(f) > 1) json_object_set_new(jt, "split", json_integer(t->split));
            json_array_append_new(tl, jt);
        }
    }
    json_object_set_new(r, "parameters", json_integer((json_int_t)params));
    json_object_set_new(r, "tensor_bytes", json_integer((json_int_t)bytes));
    /* Bits per weight over all tensors: the figure quant mixes are compared by. */
    json_object_set_new(r, "bits_per_weight", json_real(params ? bytes * 8.0 / (double)params : 0));
    json_t *types = json_array();
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        if (!by[t].count) continue;
        json_array_append_new(types,
                              json_pack("{s:s, s:I, s:I, s:I}", "type", qtype_name(t), "count",
                                        (json_int_t)by[t].count, "bytes", (json_int_t)by[t].bytes,
                                        "parameters", (json_int_t)by[t].params));
    }
    json_object_set_new(r, "types", types);
    if (tl) json_object_set_new(r, "tensors", tl);
    return r;
}

/* ---- text rendering of the report ---- */

static void print_json_value(FILE *out, json_t *v) {
    if (json_is_string(v)) {
        /* Quoted, with control characters escaped, UTF-8 kept as is. */
        const char *s = json_string_value(v);
        size_t n = json_string_length(v), full = n;
        if (n > TEXT_STR_MAX) {
            n = TEXT_STR_MAX;
            while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
                n--;
        }
        fputc('"', out);
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)s[i];
            if (c == '\n')
                fputs("\\n", out);
            else if (c == '\t')
                fputs("\\t", out);
            else if (c == '"' || c == '\\')
                fprintf(out, "\\%c", c);
            else if (c < 0x20 || c == 0x7f)
                fprintf(out, "\\x%02x", c);
            else
                fputc(c, out);
        }
        fputc('"', out);
        if (n < full) fprintf(out, "... (%zu bytes)", full);
        return;
    }
    json_t *sum = json_object_get(v, "array");
    if (json_is_object(v) && sum) {
        fprintf(out, "[%s x %" JSON_INTEGER_FORMAT "] ",
                json_string_value(json_object_get(v, "type")),
                json_integer_value(json_object_get(v, "n")));
        print_json_value(out, json_object_get(v, "head"));
        fputs(" ...", out);
        return;
    }
    if (json_is_object(v) && json_object_get(v, "len")) {
        print_json_value(out, json_object_get(v, "text"));
        fprintf(out, "... (%" JSON_INTEGER_FORMAT " bytes)",
                json_integer_value(json_object_get(v, "len")));
        return;
    }
    if (json_is_array(v)) {
        fputc('[', out);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) fputs(", ", out);
            print_json_value(out, json_array_get(v, i));
        }
        fputc(']', out);
        return;
    }
    if (json_is_real(v)) {
        /* Shortest decimal that reads back as the same double. */
        char buf[40];
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, sizeof buf, "%.*g", prec, json_real_value(v));
            if (strtod(buf, NULL) == json_real_value(v)) break;
        }
        fputs(buf, out);
        return;
    }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    fputs(s ? s : "?", out);
    free(s);
}

static void print_section(FILE *out, const char *title, json_t *obj, const char *prefix) {
    if (!json_object_size(obj)) return;
    fprintf(out, "\n%s\n", title);
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        char key[300];
        snprintf(key, sizeof key, "%s%s", prefix, k);
        fprintf(out, "  %-40s ", key);
        print_json_value(out, v);
        fputc('\n', out);
    }
}

static void print_text(FILE *out, json_t *r) {
    char b1[64], b2[64];
    human_bytes((uint64_t)json_integer_value(json_object_get(r, "file_size")), b1, sizeof b1);
    fprintf(out, "file          %s\n", json_string_value(json_object_get(r, "file")));
    fprintf(out,
            "format        GGUF v%" JSON_INTEGER_FORMAT ", alignment %" JSON_INTEGER_FORMAT
            ", %" JSON_INTEGER_FORMAT " file%s, %s\n",
            json_integer_value(json_object_get(r, "version")),
            json_integer_value(json_object_get(r, "alignment")),
            json_integer_value(json_object_get(r, "splits")),
            json_integer_value(json_object_get(r, "splits")) > 1 ? "s" : "", b1);
    fprintf(out,
            "contents      %" JSON_INTEGER_FORMAT " metadata keys, %" JSON_INTEGER_FORMAT
            " tensors\n",
            json_integer_value(json_object_get(r, "n_kv")),
            json_integer_value(json_object_get(r, "n_tensors")));
    json_t *arch = json_object_get(r, "architecture");
    fprintf(out, "architecture  %s\n", json_is_string(arch) ? json_string_value(arch) : "(none)");
    json_t *ft = json_object_get(r, "file_type");
    if (ft)
        fprintf(out, "file type     %s (%" JSON_INTEGER_FORMAT ")\n",
                json_string_value(json_object_get(ft, "name")),
                json_integer_value(json_object_get(ft, "id")));
    human_count((uint64_t)json_integer_value(json_object_get(r, "parameters")), b1, sizeof b1);
    human_bytes((uint64_t)json_integer_value(json_object_get(r, "tensor_bytes")), b2, sizeof b2);
    fprintf(out, "parameters    %s (%" JSON_INTEGER_FORMAT "), tensor data %s, %.2f bits/weight\n",
            b1, json_integer_value(json_object_get(r, "parameters")), b2,
            json_real_value(json_object_get(r, "bits_per_weight")));

    print_section(out, "general", json_object_get(r, "general"), "general.");
    char pre[140] = "";
    if (json_is_string(arch)) snprintf(pre, sizeof pre, "%s.", json_string_value(arch));
    char title[200];
    snprintf(title, sizeof title, "hyper-parameters (%s*)", pre[0] ? pre : "");
    print_section(out, title, json_object_get(r, "hparams"), pre);

    json_t *t = json_object_get(r, "tokenizer");
    fprintf(out, "\ntokenizer\n");
    const char *fields[][2] = {{"model", "model"},           {"pre", "pre-tokenizer"},
                               {"vocab_size", "vocab size"}, {"merges", "merges"},
                               {"scores", "scores"},         {"token_types", "token types"}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(t, fields[i][0]);
        if (!v) continue;
        fprintf(out, "  %-40s ", fields[i][1]);
        if (json_is_string(v))
            fputs(json_string_value(v), out);
        else
            print_json_value(out, v);
        fputc('\n', out);
    }
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(t, "special"), k, v) {
        char label[64];
        snprintf(label, sizeof label, "%s token", k);
        fprintf(out, "  %-40s %" JSON_INTEGER_FORMAT, label,
                json_integer_value(json_object_get(v, "id")));
        json_t *tx = json_object_get(v, "text");
        if (tx) {
            fputc(' ', out);
            print_json_value(out, tx);
        } else {
            fputs(" (out of vocab range)", out);
        }
        fputc('\n', out);
    }
    json_t *ct = json_object_get(t, "chat_template");
    if (json_is_true(json_object_get(ct, "present")))
        fprintf(out, "  %-40s present, %" JSON_INTEGER_FORMAT " bytes\n", "chat template",
                json_integer_value(json_object_get(ct, "length")));
    else
        fprintf(out, "  %-40s absent\n", "chat template");
    json_object_foreach(json_object_get(t, "chat_templates"), k, v) {
        char label[300];
        snprintf(label, sizeof label, "chat template '%s'", k);
        fprintf(out, "  %-40s present, %" JSON_INTEGER_FORMAT " bytes\n", label,
                json_integer_value(json_object_get(v, "length")));
    }
    json_object_foreach(json_object_get(t, "other"), k, v) {
        char key[300];
        snprintf(key, sizeof key, "tokenizer.%s", k);
        fprintf(out, "  %-40s ", key);
        print_json_value(out, v);
        fputc('\n', out);
    }
    print_section(out, "other metadata", json_object_get(r, "other"), "");

    json_t *types = json_object_get(r, "types");
    if (json_array_size(types)) {
        fprintf(out, "\ntensors by type\n  %-8s %8s %16s %14s\n", "type", "count", "bytes",
                "parameters");
        size_t i;
        json_array_foreach(types, i, v) {
            fprintf(out,
                    "  %-8s %8" JSON_INTEGER_FORMAT " %16" JSON_INTEGER_FORMAT
                    " %14" JSON_INTEGER_FORMAT "\n",
                    json_string_value(json_object_get(v, "type")),
                    json_integer_value(json_object_get(v, "count")),
                    json_integer_value(json_object_get(v, "bytes")),
                    json_integer_value(json_object_get(v, "parameters")));
        }
    }
    json_t *tl = json_object_get(r, "tensors");
    if (tl) {
        bool split = json_integer_value(json_object_get(r, "splits")) > 1;
        fprintf(out, "\ntensors\n  %-48s %-8s %-28s %14s %14s%s\n", "name", "type", "shape",
                "bytes", "offset", split ? "  split" : "");
        size_t i;
        json_array_foreach(tl, i, v) {
            char shape[128] = "";
            size_t n = 0, d;
            json_t *x;
            json_array_foreach(json_object_get(v, "shape"), d, x) {
                n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%" JSON_INTEGER_FORMAT,
                                      d ? " x " : "", json_integer_value(x));
                if (n >= sizeof shape) break;
            }
            fprintf(out, "  %-48s %-8s %-28s %14" JSON_INTEGER_FORMAT " %14" JSON_INTEGER_FORMAT,
                    json_string_value(json_object_get(v, "name")),
                    json_string_value(json_object_get(v, "type")), shape,
                    json_integer_value(json_object_get(v, "bytes")),
                    json_integer_value(json_object_get(v, "offset")));
            if (split)
                fprintf(out, "  %" JSON_INTEGER_FORMAT,
                        json_integer_value(json_object_get(v, "split")) + 1);
            fputc('\n', out);
        }
    }
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool tensors = false, as_json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tensors")) {
            tensors = true;
        } else if (!strcmp(a, "--json")) {
            as_json = true;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "smelt inspect: unknown option '%s'\n\n", a);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "smelt inspect: one file at a time ('%s' and '%s')\n\n", path, a);
            usage(stderr);
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        fprintf(stderr, "smelt inspect: no file given\n\n");
        usage(stderr);
        return 2;
    }
    struct err e;
    struct gguf_file *f;
    char resolved[4096];
    /* a file, a directory, or org/repo[:quant] already in the Hugging Face cache */
    if (cli_resolve_model(path, false, resolved, sizeof resolved, &e)) return cli_fail("inspect", &e);
    if (gguf_open(&f, resolved, &e)) return cli_fail("inspect", &e);
    json_t *r = build_report(resolved, f, tensors);
    int rc = 0;
    if (as_json) {
        if (json_dumpf(r, stdout, JSON_INDENT(2)) != 0) rc = 1;
        fputc('\n', stdout);
    } else {
        print_text(stdout, r);
    }
    json_decref(r);
    gguf_close(f);
    if (fflush(stdout) != 0) rc = 1;
    return rc;
}
