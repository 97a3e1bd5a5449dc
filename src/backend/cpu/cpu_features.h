/* CPU feature detection and the choice of SIMD path for the CPU backend.
 *
 * Detection reads CPUID and, for AVX and AVX-512, the OS-enabled register state from
 * XGETBV (XCR0): a CPU may advertise AVX-512 while the kernel does not save ZMM state, and
 * executing it then faults. AMX is detected for the record but never used (it raised
 * SIGILL on the development machines without the arch_prctl permission dance).
 *
 * The usable ISA level is the highest of scalar < avx2 < avx512 whose features are all
 * present and OS-enabled; env SMELT_CPU_ISA=scalar|avx2|avx512 lowers it (never raises
 * it). Both are computed once per process (the hardware does not change under us).
 */
#ifndef SMELT_BACKEND_CPU_FEATURES_H
#define SMELT_BACKEND_CPU_FEATURES_H

#include <stdbool.h>

enum cpu_isa {
    CPU_ISA_SCALAR = 0, /* portable C; any CPU */
    CPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C + BMI2 */
    CPU_ISA_AVX512 = 2, /* AVX2 level + AVX-512 F/BW/VL/DQ + VNNI (Ice Lake, Zen 4 and later) */
    CPU_ISA_COUNT
};

struct cpu_features {
    bool avx, avx2, fma, f16c, bmi2;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512vnni, avx512bf16, avx512fp16;
    bool avx_vnni;
    bool amx_tile, amx_int8; /* informational only: never used */
    bool os_avx;             /* XCR0 has SSE and AVX state */
    bool os_avx512;          /* XCR0 has opmask and ZMM state */
    char model[64];          /* CPUID brand string, trimmed ("" when unavailable) */
    char vendor[13];         /* CPUID leaf 0: "GenuineIntel", "AuthenticAMD", .. ("" off x86) */
};

/* Detected features (computed on first call; thread-safe). */
const struct cpu_features *cpu_features_get(void);
/* Highest ISA level the hardware and OS support, ignoring SMELT_CPU_ISA. */
enum cpu_isa cpu_isa_supported(void);
/* The ISA level to use: cpu_isa_supported() lowered by SMELT_CPU_ISA when set. An unknown
 * value of SMELT_CPU_ISA is ignored with a warning. */
enum cpu_isa cpu_isa_best(void);
/* "scalar", "avx2", "avx512". */
const char *cpu_isa_name(enum cpu_isa isa);
/* Writes a one-line summary ("avx2 fma f16c avx512f ... (using avx512)") into buf. */
void cpu_features_describe(char *buf, unsigned size);

#endif
