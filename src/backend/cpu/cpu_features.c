/* CPUID + XGETBV feature detection; see cpu_features.h. */
#include "backend/cpu/cpu_features.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HAVE_X86 1
#else
#define HAVE_X86 0
#endif

static struct cpu_features g_feat;
static enum cpu_isa g_supported, g_best;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#if HAVE_X86
static unsigned long long xgetbv0(void) {
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void detect_x86(struct cpu_features *f) {
    unsigned a, b, c, d;
    unsigned max = __get_cpuid_max(0, NULL);
    __cpuid(0, a, b, c, d);
    memcpy(f->vendor, &b, 4);
    memcpy(f->vendor + 4, &d, 4);
    memcpy(f->vendor + 8, &c, 4);
    f->vendor[12] = 0;
    if (max < 1) return;
    __cpuid(1, a, b, c, d);
    bool osxsave = (c >> 27) & 1;
    f->fma = (c >> 12) & 1;
    f->avx = (c >> 28) & 1;
    f->f16c = (c >> 29) & 1;
    if (osxsave) {
        unsigned long long xcr0 = xgetbv0();
        f->os_avx = (xcr0 & 0x6) == 0x6;                   /* XMM | YMM */
        f->os_avx512 = f->os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask | ZMM_Hi256 | Hi16_ZMM */
    }
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        f->avx2 = (b >> 5) & 1;
        f->bmi2 = (b >> 8) & 1;
        f->avx512f = (b >> 16) & 1;
        f->avx512dq = (b >> 17) & 1;
        f->avx512bw = (b >> 30) & 1;
        f->avx512vl = (b >> 31) & 1;
        f->avx512vnni = (c >> 11) & 1;
        f->avx512fp16 = (d >> 23) & 1;
        f->amx_tile = (d >> 24) & 1;
        f->amx_int8 = (d >> 25) & 1;
        unsigned max7 = a;
        if (max7 >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            f->avx_vnni = (a >> 4) & 1;
            f->avx512bf16 = (a >> 5) & 1;
        }
    }
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        unsigned r[12];
        for (unsigned i = 0; i < 3; i++)
            __cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
        char s[49];
        memcpy(s, r, 48);
        s[48] = 0;
        const char *p = s;
        while (*p == ' ')
            p++;
        snprintf(f->model, sizeof f->model, "%s", p);
        size_t n = strlen(f->model);
        while (n && f->model[n - 1] == ' ')
            f->model[--n] = 0;
    }
}
#endif

static void detect(void) {
    memset(&g_feat, 0, sizeof g_feat);
#if HAVE_X86
    detect_x86(&g_feat);
#endif
    const struct cpu_features *f = &g_feat;
    g_supported = CPU_ISA_SCALAR;
    if (f->os_avx && f->avx && f->avx2 && f->fma && f->f16c && f->bmi2) {
        g_supported = CPU_ISA_AVX2;
        if (f->os_avx512 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq &&
            f->avx512vnni)
            g_supported = CPU_ISA_AVX512;
    }
    g_best = g_supported;
    const char *env = getenv("SMELT_CPU_ISA");
    if (env && *env) {
        enum cpu_isa want = CPU_ISA_COUNT;
        for (int i = 0; i < CPU_ISA_COUNT; i++)
            if (strcmp(env, cpu_isa_name((enum cpu_isa)i)) == 0) want = (enum cpu_isa)i;
        if (want == CPU_ISA_COUNT)
            log_warn("SMELT_CPU_ISA=%s: unknown (scalar, avx2, avx512); ignored", env);
        else if (want < g_best)
            g_best = want;
    }
}

const struct cpu_features *cpu_features_get(void) {
    pthread_once(&g_once, detect);
    return &g_feat;
}

enum cpu_isa cpu_isa_supported(void) {
    pthread_once(&g_once, detect);
    return g_supported;
}

enum cpu_isa cpu_isa_best(void) {
    pthread_once(&g_once, detect);
    return g_best;
}

const char *cpu_isa_name(enum cpu_isa isa) {
    switch (isa) {
    case CPU_ISA_SCALAR:
        return "scalar";
    case CPU_ISA_AVX2:
        return "avx2";
    case CPU_ISA_AVX512:
        return "avx512";
    default:
        return "?";
    }
}

void cpu_features_describe(char *buf, unsigned size) {
    const struct cpu_features *f = cpu_features_get();
    struct {
        bool on;
        const char *name;
    } list[] = {
        {f->avx2, "avx2"},
        {f->fma, "fma"},
        {f->f16c, "f16c"},
        {f->bmi2, "bmi2"},
        {f->avx512f, "avx512f"},
        {f->avx512bw, "avx512bw"},
        {f->avx512vl, "avx512vl"},
        {f->avx512dq, "avx512dq"},
        {f->avx512vnni, "avx512vnni"},
        {f->avx512bf16, "avx512bf16"},
        {f->avx_vnni, "avxvnni"},
        {f->amx_int8, "amx(unused)"},
    };
    size_t off = 0;
    if (size == 0) return;
    buf[0] = 0;
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        if (!list[i].on) continue;
        int w = snprintf(buf + off, size - off, "%s ", list[i].name);
        if (w < 0 || (size_t)w >= size - off) return;
        off += (size_t)w;
    }
    if (!f->os_avx512 && f->avx512f) {
        int w = snprintf(buf + off, size - off, "(avx512 not OS-enabled) ");
        if (w < 0 || (size_t)w >= size - off) return;
        off += (size_t)w;
    }
    snprintf(buf + off, size - off, "(using %s)", cpu_isa_name(cpu_isa_best()));
}
