/* ops.c: scalar CPU reference operations (see ops.h). Plain C; written so
 * that compilers vectorise the inner loops (independent partial sums), but
 * with no intrinsics. */
#include "cpu/ops.h"
#include "core/half.h"
#include "refine/rmat.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Built twice, plain and for AVX2+FMA, and chosen by the loader from the
 * CPU (GCC/clang function multiversioning): the same C, wider vectors. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
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

void spx_cpu_ctx_init(spx_cpu_ctx *c, spx_pool *pool, const spx_qkernels *qk) {
    memset(c, 0, sizeof *c);
    c->pool = pool;
    c->qk = qk ? qk : spx_qkernels_scalar();
}

void spx_cpu_ctx_free(spx_cpu_ctx *c) {
    free(c->act);
    free(c->scratch);
    free(c->sel);
    free(c->cols);
    free(c->skip);
    free(c->nrn);
    free(c->nsel);
    free(c->nbun);
    memset(c, 0, sizeof *c);
}

static int grow(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 1;
    void *n = realloc(*p, need);
    if (!n) return 0;
    *p = n;
    *cap = need;
    return 1;
}

/* Several products of the same input x, run as one parallel section:
 * the rows of all matrices form one range split across threads (fewer
 * hand-offs per decode step: q/k/v, gate/up). */
typedef struct {
    spx_cpu_ctx *c;
    int n;
    const spx_wmat *const *w;
    const float *x;
    int64_t T;
    float *const *y;
    const float *const *bias;
    int64_t total;
    /* refinement of a one-token launch (refine/rmat.h): n_sel selected
     * channels, each refined matrix's column pointers (NULL: resident) */
    int64_t n_sel;
    const int32_t *sel;
    const uint8_t *const *col[SPX_MATMUL_MAX];
    const spx_refine_kernels *kern;
    /* spx_cpu_matmul_each: matrix k's own input xs[k] and its prepared
     * activations at act + k * act_stride (NULL: every matrix reads x) */
    const float *const *xs;
    size_t act_stride;
} matmul_job;

static void rows_one(const matmul_job *j, int k, int64_t r0, int64_t r1, void *scratch) {
    const spx_wmat *w = j->w[k];
    float *y = j->y[k];
    const float *x = j->xs ? j->xs[k] : j->x;
    if (w->kind == SPX_WM_QUANT) {
        j->c->qk->rows(&w->q, (uint8_t *)j->c->act + (j->xs ? (size_t)k * j->act_stride : 0), x, j->T, y, w->rows, r0,
                       r1, scratch);
    } else {
        float *row = scratch;
        for (int64_t r = r0; r < r1; r++) {
            spx_wmat_row_f32(w, r, row);
            for (int64_t t = 0; t < j->T; t++) y[t * w->rows + r] = spx_cpu_dot(row, x + t * w->cols, w->cols);
        }
    }
    if (j->n_sel > 0 && w->ref) { /* T == 1: the selected columns of the residual, on these rows */
        if (w->ref->f32) spx_refine_f32_apply(w->ref->f32, j->sel, j->n_sel, j->x, y, r0, r1);
        else j->kern->apply(&w->ref->q4, j->sel, j->col[k], j->n_sel, j->x, y, r0, r1);
    }
    if (j->bias[k])
        for (int64_t t = 0; t < j->T; t++)
            for (int64_t r = r0; r < r1; r++) y[t * w->rows + r] += j->bias[k][r];
}

static void matmul_task(void *arg, int tid, int nth) {
    const matmul_job *j = arg;
    int64_t g0, g1;
    spx_pool_range(j->total, tid, nth, 16, &g0, &g1); /* whole 16-row tiles (SPX_Q_TILED) per thread */
    void *scratch = j->c->scratch + (size_t)tid * j->c->scratch_stride;
    int64_t base = 0;
    for (int k = 0; k < j->n && g0 < g1; k++) {
        int64_t rows = j->w[k]->rows;
        int64_t r0 = g0 - base, r1 = g1 - base;
        if (r0 < rows && r1 > 0) {
            r0 = r0 < 0 ? 0 : r0;
            r1 = r1 > rows ? rows : r1;
            rows_one(j, k, r0, r1, scratch);
        }
        base += rows;
    }
}

/* The refinement of a one-token launch (refine/rmat.h): the selection,
 * shared by the launch's matrices (one input), and each refined matrix's
 * columns; one thread, before the rows. */
static spx_status refine_prepare(spx_cpu_ctx *c, int n, const spx_wmat *const *w, const float *x, matmul_job *j,
                                 spx_err *e) {
    spx_refine_rt *rt = c->refine;
    const spx_wmat_refine *r0 = NULL;
    for (int k = 0; k < n && !r0; k++) r0 = w[k]->ref;
    if (!r0 || spx_refine_rt_k(rt, r0->set) <= 0) return SPX_OK;
    const int64_t cols = w[0]->cols, kk = spx_refine_rt_k(rt, r0->set);
    const int64_t cap = spx_refine_topk_max(cols, SPX_REFINE_CHUNK, kk);
    if (!grow((void **)&c->sel, &c->sel_cap, (size_t)cap * sizeof *c->sel) ||
        !grow((void **)&c->cols, &c->cols_cap, (size_t)(cap * n) * sizeof *c->cols))
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for the refinement's selection");
    const uint8_t *skip = NULL;
    /* outlier channels (stored exactly in fp16: a residual of rounding only)
     * are left out of a partial budget; a budget of whole chunks takes
     * every channel */
    if (w[0]->kind == SPX_WM_QUANT && w[0]->q.n_outliers > 0 && kk < SPX_REFINE_CHUNK) {
        if (!grow((void **)&c->skip, &c->skip_cap, (size_t)cols))
            return spx_fail(e, SPX_ERR_NOMEM, "out of memory for the refinement's selection");
        spx_refine_skip_outliers(&w[0]->q, c->skip);
        skip = c->skip;
    }
    j->n_sel = spx_refine_topk(x, cols, SPX_REFINE_CHUNK, kk, skip, c->sel);
    j->sel = c->sel;
    j->kern = rt->kern;
    rt->st.launches++;
    for (int k = 0; k < n; k++) {
        const spx_wmat_refine *r = w[k]->ref;
        j->col[k] = NULL;
        if (!r) continue;
        rt->st.selected += (uint64_t)j->n_sel;
        if (r->f32 || r->q4.codes) { /* resident */
            rt->st.applied += (uint64_t)j->n_sel;
            continue;
        }
        const uint8_t **cp = c->cols + (size_t)k * (size_t)cap;
        SPX_TRY(spx_tier_get_cols(rt->tier, r->file_off, (uint64_t)r->q4.col_stride, (uint32_t)r->q4.col_bytes, j->sel,
                                  j->n_sel, cp, e));
        for (int64_t i = 0; i < j->n_sel; i++) rt->st.applied += cp[i] != NULL;
        j->col[k] = cp;
    }
    return SPX_OK;
}

spx_status spx_cpu_matmul_n(spx_cpu_ctx *c, int n, const spx_wmat *const *w, const float *x, int64_t T,
                            float *const *y, const float *const *bias, spx_err *e) {
    if (n < 1 || n > SPX_MATMUL_MAX) return spx_fail(e, SPX_ERR_INTERNAL, "matmul_n: %d matrices", n);
    size_t per_thread = 0, ab = 0;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (w[k]->cols != w[0]->cols || (w[k]->kind == SPX_WM_QUANT && w[0]->kind == SPX_WM_QUANT &&
                                         w[k]->q.group != w[0]->q.group) || w[k]->kind != w[0]->kind)
            return spx_fail(e, SPX_ERR_INTERNAL, "matmul_n: matrices of different input layout");
        size_t pt = (size_t)w[k]->cols * sizeof(float);
        if (w[k]->kind == SPX_WM_QUANT) {
            size_t sb = c->qk->scratch_bytes(T, w[k]->cols, w[k]->q.group);
            if (sb > pt) pt = sb;
            ab = c->qk->act_bytes(T, w[k]->cols, w[k]->q.group);
        }
        if (pt > per_thread) per_thread = pt;
        total += w[k]->rows;
    }
    if (!grow(&c->act, &c->act_cap, ab))
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for %zu bytes of activations", ab);
    per_thread = (per_thread + 63) & ~(size_t)63;
    if (per_thread > c->scratch_stride) {
        size_t nth = (size_t)spx_pool_size(c->pool);
        uint8_t *nb = aligned_alloc(64, nth * per_thread);
        if (!nb) return spx_fail(e, SPX_ERR_NOMEM, "out of memory for matmul scratch");
        free(c->scratch);
        c->scratch = nb;
        c->scratch_stride = per_thread;
    }
    if (c->observe) c->observe(c->observe_user, n, w, x, T);
    if (w[0]->kind == SPX_WM_QUANT) c->qk->prepare(x, T, w[0]->cols, w[0]->q.group, c->act);
    matmul_job j = {c, n, w, x, T, y, bias, total, 0, NULL, {NULL}, NULL, NULL, 0};
    if (T == 1 && c->refine) SPX_TRY(refine_prepare(c, n, w, x, &j, e));
    spx_pool_run(c->pool, matmul_task, &j);
    return SPX_OK;
}

spx_status spx_cpu_matmul_each(spx_cpu_ctx *c, int n, const spx_wmat *const *w, const float *const *x,
                               float *const *y, spx_err *e) {
    if (n < 1 || n > SPX_MATMUL_MAX) return spx_fail(e, SPX_ERR_INTERNAL, "matmul_each: %d matrices", n);
    size_t per_thread = 0, ab = 0;
    int64_t total = 0;
    for (int k = 0; k < n; k++) {
        if (w[k]->kind != w[0]->kind || w[k]->ref)
            return spx_fail(e, SPX_ERR_INTERNAL, "matmul_each: matrices of different kinds, or refined");
        size_t pt = (size_t)w[k]->cols * sizeof(float);
        if (w[k]->kind == SPX_WM_QUANT) {
            const size_t sb = c->qk->scratch_bytes(1, w[k]->cols, w[k]->q.group),
                         a = c->qk->act_bytes(1, w[k]->cols, w[k]->q.group);
            if (sb > pt) pt = sb;
            if (a > ab) ab = a;
        }
        if (pt > per_thread) per_thread = pt;
        total += w[k]->rows;
    }
    ab = (ab + 63) & ~(size_t)63;
    if (!grow(&c->act, &c->act_cap, ab * (size_t)n))
        return spx_fail(e, SPX_ERR_NOMEM, "out of memory for %zu bytes of activations", ab * (size_t)n);
    per_thread = (per_thread + 63) & ~(size_t)63;
    if (per_thread > c->scratch_stride) {
        size_t nth = (size_t)spx_pool_size(c->pool);
        uint8_t *nb = aligned_alloc(64, nth * per_thread);
        if (!nb) return spx_fail(e, SPX_ERR_NOMEM, "out of memory for matmul scratch");
        free(c->scratch);
        c->scratch = nb;
        c->scratch_stride = per_thread;
    }
    for (int k = 0; k < n; k++) {
        if (c->observe) c->observe(c->observe_user, 1, &w[k], x[k], 1);
        if (w[k]->kind == SPX_WM_QUANT) c->qk->prepare(x[k], 1, w[k]->cols, w[k]->q.group, (uint8_t *)c->act + (size_t)k * ab);
    }
    static const float *const no_bias[SPX_MATMUL_MAX];
    matmul_job j = {c, n, w, x[0], 1, y, no_bias, total, 0, NULL, {NULL}, NULL, x, ab};
    spx_pool_run(c->pool, matmul_task, &j);
    return SPX_OK;
}

spx_status spx_cpu_matmul(spx_cpu_ctx *c, const spx_wmat *w, const float *x, int64_t T, float *y,
                          const float *bias, spx_err *e) {
    return spx_cpu_matmul_n(c, 1, &w, x, T, &y, &bias, e);
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
