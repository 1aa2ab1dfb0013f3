/* ops.c: scalar CPU reference operations (see ops.h). Plain C; written so
 * that compilers vectorise the inner loops (independent partial sums), but
 * with no intrinsics. */
#include "cpu/ops.h"
#include "core/half.h"

#include <math.h>
#include <string.h>

float spx_cpu_dot(const float *a, const float *b, int64_t n) {
    /* 16 independent partial sums: lets the compiler use SIMD lanes
     * without -ffast-math, and bounds the rounding error growth. */
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++) acc[k] += a[i + k] * b[i + k];
    float s = 0;
    for (; i < n; i++) s += a[i] * b[i];
    for (int k = 0; k < 16; k++) s += acc[k];
    return s;
}

typedef struct {
    const spx_wmat *w;
    const float *x;
    int64_t T;
    float *y;
    const float *bias;
    float *scratch;
} matmul_job;

static void matmul_task(void *arg, int tid, int nth) {
    const matmul_job *j = arg;
    const spx_wmat *w = j->w;
    int64_t r0, r1;
    spx_pool_range(w->rows, tid, nth, 4, &r0, &r1);
    float *row = j->scratch + (size_t)tid * (size_t)w->cols;
    for (int64_t r = r0; r < r1; r++) {
        spx_wmat_row_f32(w, r, row);
        float b = j->bias ? j->bias[r] : 0.0f;
        for (int64_t t = 0; t < j->T; t++)
            j->y[t * w->rows + r] = spx_cpu_dot(row, j->x + t * w->cols, w->cols) + b;
    }
}

void spx_cpu_matmul(spx_pool *pool, const spx_wmat *w, const float *x, int64_t T, float *y,
                    const float *bias, float *scratch) {
    matmul_job j = {w, x, T, y, bias, scratch};
    spx_pool_run(pool, matmul_task, &j);
}

void spx_cpu_rmsnorm(float *out, const float *x, const float *gain, int64_t n, float eps) {
    double ss = 0; /* float32 in HF; double here costs nothing and is closer */
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv * gain[i];
}

void spx_cpu_rope(float *x, int64_t n_heads, int64_t d, int64_t pos, const float *inv_freq) {
    int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i]; /* float32 product, as transformers */
        float c = cosf(ang), s = sinf(ang);
        for (int64_t h = 0; h < n_heads; h++) {
            float *v = x + h * d;
            float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = b * c + a * s;
        }
    }
}

void spx_cpu_silu_mul(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void spx_cpu_softmax(float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}
