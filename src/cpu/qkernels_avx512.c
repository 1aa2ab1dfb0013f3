/* qkernels_avx512.c: the avx512 and amx kernel tables (qkernels.h).
 * PLACEHOLDER while the VNNI kernels are written: the AVX2 products. */
#include "cpu/qkernels.h"
#include "cpu/qkernels_avx512.h"

#include <stddef.h>

const spx_qkernels *spx_qkernels_avx512_table(void);
const spx_qkernels *spx_qkernels_amx_table(void);

#if defined(__x86_64__) || defined(__i386__)
const spx_qkernels *spx_qkernels_avx2_table(void);

static size_t v_act_bytes(int64_t T, int64_t cols, int group) {
    return spx_qkernels_avx2_table()->act_bytes(T, cols, group);
}
static size_t v_scratch_bytes(int64_t T, int64_t cols, int group) {
    return spx_qkernels_avx2_table()->scratch_bytes(T, cols, group);
}
static void v_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    spx_qkernels_avx2_table()->prepare(x, T, cols, group, act);
}
static void v_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y, int64_t y_stride,
                   int64_t r0, int64_t r1, void *scratch) {
    spx_qkernels_avx2_table()->rows(q, act, x, T, y, y_stride, r0, r1, scratch);
}

static const spx_qkernels g_avx512 = {
    .name = "avx512",
    .act_bytes = v_act_bytes,
    .scratch_bytes = v_scratch_bytes,
    .prepare = v_prepare,
    .rows = v_rows,
    .scores_f16 = spx_avx512_scores_f16,
    .wv_f16 = spx_avx512_wv_f16,
    .dot_q4g = spx_avx512_dot_q4g,
    .axpy_q4g = spx_avx512_axpy_q4g,
    .softmax = spx_avx512_softmax,
};

/* The amx table: the avx512 table, except that products of T >=
 * SPX_AMX_MIN_T tokens take the tiles (qkernels_amx.c), with their own
 * activation format; prepare() and rows() both choose by T. */
static size_t amx_act_bytes(int64_t T, int64_t cols, int group) {
    return T >= SPX_AMX_MIN_T ? spx_amx_act_bytes(T, cols, group) : v_act_bytes(T, cols, group);
}
static size_t amx_scratch_bytes(int64_t T, int64_t cols, int group) {
    return T >= SPX_AMX_MIN_T ? spx_amx_scratch_bytes(T, cols, group) : v_scratch_bytes(T, cols, group);
}
static void amx_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    if (T >= SPX_AMX_MIN_T) spx_amx_prepare(x, T, cols, group, act);
    else v_prepare(x, T, cols, group, act);
}
static void amx_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y, int64_t y_stride,
                     int64_t r0, int64_t r1, void *scratch) {
    if (T >= SPX_AMX_MIN_T) spx_amx_rows(q, act, x, T, y, y_stride, r0, r1, scratch);
    else v_rows(q, act, x, T, y, y_stride, r0, r1, scratch);
}

static const spx_qkernels g_amx = {
    .name = "amx",
    .act_bytes = amx_act_bytes,
    .scratch_bytes = amx_scratch_bytes,
    .prepare = amx_prepare,
    .rows = amx_rows,
    .scores_f16 = spx_avx512_scores_f16,
    .wv_f16 = spx_avx512_wv_f16,
    .dot_q4g = spx_avx512_dot_q4g,
    .axpy_q4g = spx_avx512_axpy_q4g,
    .softmax = spx_avx512_softmax,
};

const spx_qkernels *spx_qkernels_avx512_table(void) { return &g_avx512; }
const spx_qkernels *spx_qkernels_amx_table(void) { return &g_amx; }

#else
const spx_qkernels *spx_qkernels_avx512_table(void) { return NULL; }
const spx_qkernels *spx_qkernels_amx_table(void) { return NULL; }
#endif
