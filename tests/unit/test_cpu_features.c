/* CPU feature detection and the SMELT_CPU_ISA override (set before the first query: the
 * level is computed once per process). The independent reference is /proc/cpuinfo's flag
 * list, which the kernel builds from CPUID and its own XSAVE state. */
#include <stdlib.h>

#include "backend/cpu/cpu_features.h"
#include "t.h"

/* 1 when /proc/cpuinfo lists `flag` for the first CPU, 0 when not, -1 when unreadable. */
static int cpuinfo_has(const char *flag) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return -1;
    static char line[65536];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0) continue;
        found = 0;
        for (char *tok = strtok(line + 5, " \t\n:"); tok; tok = strtok(NULL, " \t\n:"))
            if (strcmp(tok, flag) == 0) found = 1;
        break;
    }
    fclose(f);
    return found;
}

static void test_features_match_cpuinfo(void) {
    const struct cpu_features *f = cpu_features_get();
    if (cpuinfo_has("fpu") != 1) {
        t_skip("no x86 /proc/cpuinfo flags");
        return;
    }
    struct {
        bool have;
        const char *flag;
    } list[] = {
        {f->avx2, "avx2"},         {f->fma, "fma"},           {f->f16c, "f16c"},
        {f->bmi2, "bmi2"},         {f->avx512f, "avx512f"},   {f->avx512bw, "avx512bw"},
        {f->avx512vl, "avx512vl"}, {f->avx512dq, "avx512dq"}, {f->avx512vnni, "avx512_vnni"}};
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        int want = cpuinfo_has(list[i].flag);
        /* The kernel hides AVX flags whose state it does not save; CPUID may still show them,
         * which is why the ISA level also checks XCR0. So only demand: cpuinfo => CPUID. */
        if (want == 1)
            T_CHECKF(list[i].have, "/proc/cpuinfo has %s, CPUID detection does not", list[i].flag);
    }
    if (cpuinfo_has("avx512_vnni") == 1 && cpuinfo_has("avx512bw") == 1 &&
        cpuinfo_has("avx512vl") == 1 && cpuinfo_has("avx512dq") == 1)
        T_EQ_INT(cpu_isa_supported(), CPU_ISA_AVX512);
    else if (cpuinfo_has("avx2") == 1 && cpuinfo_has("fma") == 1 && cpuinfo_has("f16c") == 1 &&
             cpuinfo_has("bmi2") == 1)
        T_EQ_INT(cpu_isa_supported(), CPU_ISA_AVX2);
    printf("cpu: \"%s\", supported isa %s\n", f->model, cpu_isa_name(cpu_isa_supported()));
}

static void test_env_override(void) {
    /* set in main() before any query */
    enum cpu_isa want = cpu_isa_supported() < CPU_ISA_AVX2 ? cpu_isa_supported() : CPU_ISA_AVX2;
    T_EQ_INT(cpu_isa_best(), want);
    T_EQ_STR(cpu_isa_name(cpu_isa_best()), cpu_isa_name(want));
}

int main(void) {
    setenv("SMELT_CPU_ISA", "avx2", 1);
    T_RUN(test_features_match_cpuinfo);
    T_RUN(test_env_override);
    return t_done();
}
