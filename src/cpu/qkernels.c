/* qkernels.c: the scalar kernel table (the g32.c reference wrapped in the
 * qkernels.h interface) and run-time dispatch to the fastest variant this
 * CPU supports.
 *
 * The scalar table reads the float activations directly: act_bytes() is 0
 * and prepare() does nothing. rows() is spx_q_dot_row for one token and
 * spx_q_dot_rows (row dequantized once into scratch[cols], double sums)
 * for several. It is the oracle the SIMD variants are tested against and
 * the fallback where a CPU lacks their features.
 *
 * Variants live in their own files (qkernels_avx2.c, qkernels_avx512.c,
 * qkernels_amx.c; later neon)
 * and export one getter each, declared below; a getter returns NULL where
 * the variant is not compiled in. Dispatch checks the CPU features itself,
 * so a variant's getter never runs its code on a CPU that lacks them. */
#include "cpu/qkernels.h"
#include "cpu/ops.h"
#include "core/half.h"
#include "core/err.h"
#include "engine/tuning.h"
#include "quant/g32.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Variant getters (one per file; NULL when not compiled for this target). */
const spx_qkernels *spx_qkernels_avx2_table(void);
const spx_qkernels *spx_qkernels_avx512_table(void);
const spx_qkernels *spx_qkernels_amx_table(void); /* avx512 + AMX prompt products */
int spx_amx_usable(void);                           /* qkernels_amx.c */

/* ======================================================================
 * Scalar table
 * ==================================================================== */

static size_t scalar_act_bytes(int64_t T, int64_t cols, int group) { return 0; }

static size_t scalar_scratch_bytes(int64_t T, int64_t cols, int group) {
    return (size_t)cols * sizeof(float);
}

static void scalar_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {}

static void scalar_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y,
                        int64_t y_stride, int64_t r0, int64_t r1, void *scratch) {
    if (T == 1) {
        for (int64_t r = r0; r < r1; r++) y[r] = spx_q_dot_row(q, r, x);
        return;
    }
    for (int64_t r = r0; r < r1; r++)
        spx_q_dot_rows(q, r, x, T, q->cols, y + r, y_stride, (float *)scratch);
}

static float scalar_dot_f16(const float *q, const uint16_t *h, int64_t n) {
    float d = 0;
    for (int64_t j = 0; j < n; j++) d += q[j] * spx_f16_to_f32(h[j]);
    return d;
}

static void scalar_axpy_f16(float *out, float a, const uint16_t *h, int64_t n) {
    for (int64_t j = 0; j < n; j++) out[j] += a * spx_f16_to_f32(h[j]);
}

static void scalar_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n,
                              int64_t d, float scale, float *out, int64_t os) {
    for (int g = 0; g < G; g++)
        for (int64_t i = 0; i < n; i++) out[g * os + i] = scalar_dot_f16(q + g * qs, h + i * stride, d) * scale;
}

static void scalar_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h, int64_t stride,
                          int64_t n, int64_t d) {
    for (int g = 0; g < G; g++)
        for (int64_t i = 0; i < n; i++) scalar_axpy_f16(out + g * os, p[g * ps + i], h + i * stride, d);
}

static void scalar_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *cd, float *out) {
    for (int g = 0; g < G; g++) {
        const float *qg = q + g * qs;
        float acc = 0;
        for (int k = 0; k < 16; k++) acc += (float)(cd[k] & 15) * qg[k] + (float)(cd[k] >> 4) * qg[k + 16];
        out[g] = acc;
    }
}

static void scalar_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *cd) {
    for (int g = 0; g < G; g++)
        for (int k = 0; k < 16; k++) {
            o[g * os + k] += a[g] * (float)((cd[k] & 15) - z);
            o[g * os + k + 16] += a[g] * (float)((cd[k] >> 4) - z);
        }
}

static const spx_qkernels g_scalar = {
    .name = "scalar",
    .act_bytes = scalar_act_bytes,
    .scratch_bytes = scalar_scratch_bytes,
    .prepare = scalar_prepare,
    .rows = scalar_rows,
    .scores_f16 = scalar_scores_f16,
    .wv_f16 = scalar_wv_f16,
    .dot_q4g = scalar_dot_q4g,
    .axpy_q4g = scalar_axpy_q4g,
    .softmax = spx_cpu_softmax,
};

const spx_qkernels *spx_qkernels_scalar(void) { return &g_scalar; }

/* ======================================================================
 * Dispatch
 * ==================================================================== */

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <cpuid.h>

/* AVX2 + FMA + F16C usable: the CPU has them (CPUID) and the OS saves the
 * ymm state (OSXSAVE, XCR0 bits 1-2). Read directly because clang's
 * __builtin_cpu_supports does not know "f16c". */
/* XCR0: the register state the OS saves (call only with OSXSAVE set). */
static unsigned xcr0(void) {
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    return xlo;
}

static int cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned fma = 1u << 12, osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((c & (fma | osxsave | avx | f16c)) != (fma | osxsave | avx | f16c)) return 0;
    if ((xcr0() & 6u) != 6u) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1u; /* AVX2 */
}

/* AVX-512 F/BW/VL/DQ/VNNI usable (besides AVX2): CPUID leaf 7 and the OS
 * saves the opmask and all 32 zmm registers (XCR0 bits 5-7). */
static int cpu_has_avx512(void) {
    if (!cpu_has_avx2()) return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned f = 1u << 16, dq = 1u << 17, bw = 1u << 30, vl = 1u << 31, vnni = 1u << 11;
    if ((b & (f | dq | bw | vl)) != (f | dq | bw | vl) || !(c & vnni)) return 0;
    return (xcr0() & 0xe6u) == 0xe6u;
}
#else
static int cpu_has_avx2(void) { return 0; }
static int cpu_has_avx512(void) { return 0; }
int spx_amx_usable(void) { return 0; }
#endif

const spx_qkernels *spx_qkernels_get(const char *name) {
    if (!name) return NULL;
    if (strcmp(name, "scalar") == 0) return &g_scalar;
    if (strcmp(name, "avx2") == 0) return cpu_has_avx2() ? spx_qkernels_avx2_table() : NULL;
    if (strcmp(name, "avx512") == 0) return cpu_has_avx512() ? spx_qkernels_avx512_table() : NULL;
    if (strcmp(name, "amx") == 0) return cpu_has_avx512() && spx_amx_usable() ? spx_qkernels_amx_table() : NULL;
    return NULL;
}

static const spx_qkernels *g_best;
static pthread_once_t g_best_once = PTHREAD_ONCE_INIT;

static void best_init(void) {
    const spx_tuning *t = spx_tuning_get(); /* SPECTRA_KERNELS */
    if (t->kernels != SPX_TUNE_KERNELS_AUTO) {
        const spx_qkernels *k = spx_qkernels_get(t->kernels_text);
        if (k) {
            g_best = k;
            return;
        }
        if (t->kernels == SPX_TUNE_KERNELS_UNKNOWN)
            spx_log(SPX_LOG_WARN,
                    "SPECTRA_KERNELS=%s: unknown kernel set (expected scalar, avx2, avx512 or amx); using scalar",
                    t->kernels_text);
        else
            spx_log(SPX_LOG_WARN, "SPECTRA_KERNELS=%s: this CPU (or build, or OS) lacks its features; using scalar",
                    t->kernels_text);
        g_best = &g_scalar;
        return;
    }
    static const char *const order[] = {"amx", "avx512", "avx2"};
    g_best = &g_scalar;
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const spx_qkernels *k = spx_qkernels_get(order[i]);
        if (k) {
            g_best = k;
            break;
        }
    }
}

const spx_qkernels *spx_qkernels_best(void) {
    pthread_once(&g_best_once, best_init);
    return g_best;
}
