/* qkernels_amx.c: the amx table's AMX prompt products (qkernels_avx512.h).
 * PLACEHOLDER while the AMX kernels are written: never usable. */
#include "cpu/qkernels_avx512.h"
#include "cpu/qkernels.h"

#if defined(__x86_64__) || defined(__i386__)
const spx_qkernels *spx_qkernels_avx2_table(void);
int spx_amx_usable(void) { return 0; }
size_t spx_amx_act_bytes(int64_t T, int64_t cols, int group) {
    return spx_qkernels_avx2_table()->act_bytes(T, cols, group);
}
size_t spx_amx_scratch_bytes(int64_t T, int64_t cols, int group) {
    return spx_qkernels_avx2_table()->scratch_bytes(T, cols, group);
}
void spx_amx_prepare(const float *x, int64_t T, int64_t cols, int group, void *act) {
    spx_qkernels_avx2_table()->prepare(x, T, cols, group, act);
}
void spx_amx_rows(const spx_qtensor *q, const void *act, const float *x, int64_t T, float *y, int64_t y_stride,
                  int64_t r0, int64_t r1, void *scratch) {
    spx_qkernels_avx2_table()->rows(q, act, x, T, y, y_stride, r0, r1, scratch);
}
#endif
