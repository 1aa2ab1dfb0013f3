/* qkernels_avx512.h: what the AVX-512 kernel files share, private to
 * src/cpu: the target attributes, and the entries of the avx512 table that
 * live in their own files: the attention steps (attn_avx512.c; their
 * meaning: qkernels.h) and the AMX prompt products (qkernels_amx.c).
 * x86 only; every function carries the target attribute, so the files
 * build without -mavx512f and nothing here runs unless dispatch
 * (qkernels.c) found AVX-512 F/BW/VL/VNNI, FMA, F16C and the OS's zmm
 * state (and, for AMX, the tile state granted by the kernel). */
#ifndef SPX_QKERNELS_AVX512_H
#define SPX_QKERNELS_AVX512_H

#include "quant/qtensor.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni"
#define AVX512_FN __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(AVX512_TARGET)))

/* attn_avx512.c */
void spx_avx512_scores_f16(const float *q, int64_t qs, int G, const uint16_t *h, int64_t stride, int64_t n,
                           int64_t d, float scale, float *out, int64_t os);
void spx_avx512_wv_f16(float *out, int64_t os, const float *p, int64_t ps, int G, const uint16_t *h,
                       int64_t stride, int64_t n, int64_t d);
void spx_avx512_dot_q4g(const float *q, int64_t qs, int G, const uint8_t *codes, float *out);
void spx_avx512_axpy_q4g(float *o, int64_t os, const float *a, int G, int z, const uint8_t *codes);
void spx_avx512_softmax(float *x, int64_t n);

/* qkernels_amx.c: the AMX prompt products of the amx table, for T >=
 * SPX_AMX_MIN_T tokens (smaller products take the avx512 table's VNNI
 * kernels, whose activation format is different: prepare() and rows()
 * choose by T, which both are given). Meaning as qkernels.h's act_bytes,
 * scratch_bytes, prepare and rows; spx_amx_rows handles every matrix the
 * VNNI kernels handle (bits 2, 3, 4; groups 32, 64, 128; row-major and
 * tiled), with the same outlier columns. */
enum { SPX_AMX_MIN_T = 32 };
size_t spx_amx_act_bytes(int64_t T, int64_t cols, int group);
size_t spx_amx_scratch_bytes(int64_t T, int64_t cols, int group);
void spx_amx_prepare(const float *x, int64_t T, int64_t cols, int group, void *act);
void spx_amx_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y, int64_t y_stride,
                  int64_t r0, int64_t r1, void *scratch);
/* Whether this thread may use the tiles: the CPU has AMX-TILE and
 * AMX-INT8 and the kernel granted the tile state
 * (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process);
 * 0 otherwise, so dispatch falls back to the avx512 table. */
int spx_amx_usable(void);

#endif
#endif
