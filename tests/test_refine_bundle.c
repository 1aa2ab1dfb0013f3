/* test_refine_bundle.c: neuron bundles and the neuron-wise MLP refinement
 * (refine/bundle.h, engine/ffn_neuron.h, paper eq. 6):
 *   - one bundle's bytes on a tiny shape (H = 3: odd, padded), and its
 *     codes and scales read back;
 *   - bundles built from 4-bit residuals hold the refine4 codes (gate/up
 *     rows, down column) and d's codes by the row-scale rule;
 *   - on fixtures: exact residuals and exact d with every neuron selected
 *     (and every channel of q/k/v and o) decode the dense layers' logits
 *     (named tolerance); k_n = 0 is the channel path with the MLP sets off,
 *     bit for bit; the 4-bit bundles with every neuron move the logits
 *     toward the dense ones; the .refine's bundles (mapped, and from disk
 *     with wait) give the in-memory bits; a cold cache in skip mode misses
 *     every bundle and is the base bit for bit;
 *   - a model without a gated MLP (ReLU^2) gets no bundles, its .refine is
 *     byte-identical to one written without --refine-bundles, and neuron
 *     mode is refused with a message naming the file.
 * The scalar kernel table throughout (as test_refine_model). */
#include "testlib.h"
#include "engine/session.h"
#include "format/trdc.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "refine/attach.h"
#include "refine/bundle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* dense layers vs base + exact residuals + exact bundles: per projection
 * two float32 roundings (base, then residual in double) instead of one,
 * and for the MLP h' recomputed in float from g + R_g x (float) and the
 * down update in two double sums; fixtures' logits are O(1-10) */
#define EXACT_TOL 2e-5
#define N_TOK 10

static void test_pack(void) {
    const int8_t g[3] = {1, -2, 7}, u[3] = {0, -7, 3}, cd[3] = {-1, 2, -3}, d[3] = {4, 5, -6};
    CHECK(spx_bundle_part_bytes(3) == 16 && spx_bundle_bytes(3) == 72 && spx_bundle_stride(3) == 128,
          "sizes %lld %lld %lld", (long long)spx_bundle_part_bytes(3), (long long)spx_bundle_bytes(3),
          (long long)spx_bundle_stride(3));
    CHECK(spx_bundle_part_bytes(512) == 256 && spx_bundle_bytes(512) == 1032 && spx_bundle_stride(512) == 1088,
          "sizes for 512");
    uint8_t b[128];
    memset(b, 0x55, sizeof b); /* poison */
    spx_bundle_pack(3, 128, g, u, cd, d, 0.5f, -0.25f, b);
    uint8_t want[128];
    memset(want, 0x88, 64);
    memset(want + 64, 0, 64);
    const uint8_t lead[4][2] = {{0x69, 0x8f}, {0x18, 0x8b}, {0xa7, 0x85}, {0xdc, 0x82}};
    for (int k = 0; k < 4; k++) memcpy(want + 16 * k, lead[k], 2);
    const uint8_t sc[8] = {0x00, 0x00, 0x00, 0x3f, 0x00, 0x00, 0x80, 0xbe}; /* 0.5f, -0.25f little-endian */
    memcpy(want + 64, sc, 8);
    int first = -1;
    for (int i = 0; i < 128 && first < 0; i++)
        if (b[i] != want[i]) first = i;
    CHECK(first < 0, "bundle byte %d is %02x, expected %02x", first, first < 0 ? 0 : b[first],
          first < 0 ? 0 : want[first]);
    const int8_t *parts[4] = {g, u, cd, d};
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < 3; c++)
            CHECK(spx_refine_code(spx_bundle_part(b, 3, k), c) == parts[k][c], "part %d code %d", k, c);
    CHECK(spx_bundle_row_scale(b, 3, 0) == 0.5f && spx_bundle_row_scale(b, 3, 1) == -0.25f, "scales");
}

/* A random [rows, cols] 4-bit residual (codes and scales as a builder would
 * leave them). */
static void rand_res(spx_refine_q4buf *r, int64_t rows, int64_t cols, uint64_t *rng) {
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_refine_q4buf_init(r, rows, cols, 0, &e) == SPX_OK, "%s", e.msg);
    for (int64_t i = 0; i < cols; i++)
        for (int64_t j = 0; j < rows; j++) {
            const int q = (int)(tl_rand_u64(rng) % 15) - 7;
            uint8_t *byte = r->codes + i * r->v.col_stride + j / 2;
            const uint8_t nib = (uint8_t)(q + 8);
            *byte = (j & 1) ? (uint8_t)((*byte & 0x0f) | (nib << 4)) : (uint8_t)((*byte & 0xf0) | nib);
        }
    for (int64_t j = 0; j < rows; j++) r->scales[j] = 1e-3f * (1.0f + tl_rand_uniform(rng));
}

static void test_build(void) {
    uint64_t rng = 42;
    const int64_t H = 37, I = 29;
    spx_refine_q4buf gu, dn; /* a fused gate_up [2I, H] and down [H, I] */
    rand_res(&gu, 2 * I, H, &rng);
    rand_res(&dn, H, I, &rng);
    float *w = malloc((size_t)(H * I) * sizeof *w);
    for (int64_t i = 0; i < H * I; i++) w[i] = 0.02f * tl_rand_normal(&rng);
    spx_bundle_buf b;
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_bundle_build(&b, &gu.v, 0, &gu.v, I, &dn.v, w, 0, &e) == SPX_OK, "%s", e.msg);
    int bad = 0;
    int8_t *row = malloc((size_t)I);
    for (int64_t r = 0; r < H && !bad; r++) {
        const float s = spx_refine_q4_row_scale(w + r * I, I);
        spx_refine_q4_row_codes(w + r * I, I, s, row);
        bad |= b.v.d_scales[r] != s || b.v.cd_scales[r] != dn.scales[r];
        for (int64_t j = 0; j < I; j++)
            bad |= spx_refine_code(spx_bundle_part(b.data + j * b.v.stride, H, SPX_BUNDLE_D), r) != row[j];
    }
    CHECK(!bad, "d codes or the shared scales differ from the row-scale rule");
    for (int64_t j = 0; j < I && !bad; j++) {
        const uint8_t *bj = b.data + j * b.v.stride;
        bad |= spx_bundle_row_scale(bj, H, 0) != gu.scales[j] || spx_bundle_row_scale(bj, H, 1) != gu.scales[I + j];
        for (int64_t c = 0; c < H; c++) {
            bad |= spx_refine_code(spx_bundle_part(bj, H, SPX_BUNDLE_GATE), c) != spx_refine_code(gu.v.codes + c * gu.v.col_stride, j);
            bad |= spx_refine_code(spx_bundle_part(bj, H, SPX_BUNDLE_UP), c) != spx_refine_code(gu.v.codes + c * gu.v.col_stride, I + j);
        }
        bad |= memcmp(spx_bundle_part(bj, H, SPX_BUNDLE_CD), dn.codes + j * dn.v.col_stride, (size_t)(H + 1) / 2) != 0;
    }
    CHECK(!bad, "bundle codes differ from the residuals' (gate/up rows, down column)");
    /* a shape that is not one MLP is refused */
    spx_bundle_buf b2;
    spx_err_clear(&e);
    CHECK(spx_bundle_build(&b2, &gu.v, 0, &gu.v, I + 1, &dn.v, w, 0, &e) == SPX_ERR_ARG && strstr(e.msg, "one MLP"),
          "bad shape: %s", e.msg);
    w[5] = NAN;
    spx_err_clear(&e);
    const spx_status sn = spx_bundle_build(&b2, &gu.v, 0, &gu.v, I, &dn.v, w, 0, &e);
    CHECK(sn == SPX_ERR_ARG && strstr(e.msg, "not finite"), "NaN: %d %s", (int)sn, e.msg);
    if (sn == SPX_OK) spx_bundle_buf_free(&b2);
    free(row), free(w);
    spx_bundle_buf_free(&b);
    spx_refine_q4buf_free(&gu);
    spx_refine_q4buf_free(&dn);
}

/* The kernel tables' row dot: the avx2 entry gives the scalar's bits, and
 * the scalar's value is the sum to float rounding. */
static void test_dot(void) {
    uint64_t rng = 7;
    const int64_t ns[5] = {1, 7, 8, 37, 512};
    uint8_t codes[256];
    float x[512];
    const spx_refine_kernels *s = spx_refine_kernels_scalar(), *v = spx_refine_kernels_avx2();
    for (int t = 0; t < 5; t++) {
        const int64_t n = ns[t];
        for (size_t i = 0; i < sizeof codes; i++) codes[i] = (uint8_t)tl_rand_u64(&rng);
        for (int64_t i = 0; i < n; i++) x[i] = tl_rand_normal(&rng);
        double ref = 0;
        for (int64_t c = 0; c < n; c++) ref += (double)x[c] * spx_refine_code(codes, c);
        const float a = s->dot(codes, x, n);
        CHECK(fabs(a - ref) <= 1e-5 * (1 + fabs(ref)) * (double)n, "scalar dot n %lld: %g vs %g", (long long)n, a, ref);
        if (v) {
            const float b = v->dot(codes, x, n);
            CHECK(memcmp(&a, &b, 4) == 0, "avx2 dot n %lld: %.9g vs scalar %.9g", (long long)n, b, a);
        }
    }
}

static spx_model *open_model(const char *path) {
    spx_model *m = NULL;
    spx_model_params mp = {.n_threads = 2};
    CHECK(spx_model_open(path, &mp, &m) == SPX_OK, "%s: %s", path, spx_last_error());
    if (m) m->qk = spx_qkernels_scalar();
    return m;
}


static spx_status compress(const char *name, const char *out, const char *rpath, int bundles) {
    char dir[256];
    snprintf(dir, sizeof dir, "models/%s", name);
    spx_compress_opts o = {.src_dir = tl_shared(dir), .out_path = out, .bits = 4, .group = 32,
                           .outlier_mode = SPX_OUTLIERS_AUTO, .method = SPX_Q_MSE, .n_threads = 2,
                           .refine_path = rpath, .refine_bundles = bundles};
    spx_compress_stats st;
    spx_err e;
    spx_err_clear(&e);
    spx_status s = spx_compress(&o, &st, &e);
    CHECK(s == SPX_OK, "%s: compress: %s", name, e.msg);
    return s;
}

static void run_fixture(const char *name) {
    char out[600], rpath[640], dir[256];
    snprintf(dir, sizeof dir, "models/%s", name);
    snprintf(out, sizeof out, "%s/%s.trdc", tl_tmpdir(), name);
    snprintf(rpath, sizeof rpath, "%s/%s.refine", tl_tmpdir(), name);
    if (compress(name, out, rpath, 1) != SPX_OK) return;
    spx_model *dense = open_model(tl_shared(dir)), *m = open_model(out), *mix = open_model(out);
    spx_err e;
    spx_err_clear(&e);
    float *ref = NULL, *base = NULL, *ex = NULL, *z = NULL, *ch = NULL, *q4 = NULL, *fq = NULL, *fd = NULL;
    if (!dense || !m || !mix) goto done;
    const int64_t V = spx_model_vocab_size(m), I = m->cfg.intermediate_size;
    const size_t nv = (size_t)N_TOK * (size_t)V;
    int32_t ids[N_TOK];
    for (int t = 0; t < N_TOK; t++) ids[t] = (int32_t)((11 + 41 * t) % V);
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int sl = 0; sl < SPX_SL_COUNT; sl++)
            if (spx_slots[sl].mat && m->layers[l].w[sl].rows) mix->layers[l].w[sl] = dense->layers[l].w[sl];
    ref = tl_decode_steps(mix, ids, N_TOK);
    base = tl_decode_steps(m, ids, N_TOK);
    const int64_t all[SPX_RSET_COUNT] = {SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK};
    const int64_t attn[SPX_RSET_COUNT] = {SPX_REFINE_CHUNK, SPX_REFINE_CHUNK, 0, 0};
    const int64_t none[SPX_RSET_COUNT] = {0, 0, 0, 0};

    /* exact residuals, exact bundles, every channel and neuron: the dense layers */
    CHECK(spx_refine_build(m, dense, 1, &e) == SPX_OK && spx_refine_build_bundles(m, dense, &e) == SPX_OK, "%s: %s",
          name, e.msg);
    CHECK(spx_refine_set_budget(m, all, &e) == SPX_OK && spx_refine_set_mlp(m, SPX_REFINE_MLP_NEURON, SPX_REFINE_CHUNK, &e) == SPX_OK,
          "%s", e.msg);
    ex = tl_decode_steps(m, ids, N_TOK);
    const double ex_err = tl_max_diff(ex, ref, nv);
    const spx_refine_stats st = m->refine->rt.st;
    printf("%s: %lld bundle layers; exact bundles, every neuron: max |dlogit| %.2e vs dense layers (tol %g); base mean "
           "%.4f\n",
           name, (long long)m->refine->n_bundle_layers, ex_err, EXACT_TOL, tl_mean_diff(base, ref, nv));
    CHECK(ex_err <= EXACT_TOL, "%s: exact neuron refinement max |d| %g > %g", name, ex_err, EXACT_TOL);
    CHECK(st.selected >= (uint64_t)(N_TOK * I) && st.applied == st.selected, "%s: selected %llu applied %llu", name,
          (unsigned long long)st.selected, (unsigned long long)st.applied);

    /* k_n = 0: the channel path with the MLP sets off, bit for bit; and
     * with no budget at all, the base */
    CHECK(spx_refine_set_mlp(m, SPX_REFINE_MLP_NEURON, 0, &e) == SPX_OK, "%s", e.msg);
    z = tl_decode_steps(m, ids, N_TOK);
    CHECK(spx_refine_set_mlp(m, SPX_REFINE_MLP_CHANNEL, 0, &e) == SPX_OK && spx_refine_set_budget(m, attn, &e) == SPX_OK,
          "%s", e.msg);
    ch = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(z, ch, nv * sizeof(float)) == 0, "%s: k_n = 0 differs from the MLP sets off: max %g", name,
          tl_max_diff(z, ch, nv));
    free(z);
    CHECK(spx_refine_set_budget(m, none, &e) == SPX_OK && spx_refine_set_mlp(m, SPX_REFINE_MLP_NEURON, 0, &e) == SPX_OK,
          "%s", e.msg);
    z = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(z, base, nv * sizeof(float)) == 0, "%s: k_n = 0 and budgets 0 differ from the base", name);

    /* 4-bit bundles, every neuron (the attention sets off): toward the dense layers */
    CHECK(spx_refine_build(m, dense, 0, &e) == SPX_OK && spx_refine_build_bundles(m, dense, &e) == SPX_OK, "%s: %s",
          name, e.msg);
    CHECK(spx_refine_set_mlp(m, SPX_REFINE_MLP_NEURON, SPX_REFINE_CHUNK, &e) == SPX_OK, "%s", e.msg);
    q4 = tl_decode_steps(m, ids, N_TOK);
    const int64_t mlp[SPX_RSET_COUNT] = {0, 0, SPX_REFINE_CHUNK, SPX_REFINE_CHUNK};
    CHECK(spx_refine_set_mlp(m, SPX_REFINE_MLP_CHANNEL, 0, &e) == SPX_OK && spx_refine_set_budget(m, mlp, &e) == SPX_OK,
          "%s", e.msg);
    float *cm = tl_decode_steps(m, ids, N_TOK);
    const double q4_err = tl_mean_diff(q4, ref, nv), base_err = tl_mean_diff(base, ref, nv), cm_err = tl_mean_diff(cm, ref, nv);
    free(cm);
    printf("%s: 4-bit bundles, every neuron: mean |dlogit| %.4f (base %.4f, channel-wise MLP every channel %.4f)\n", name,
           q4_err, base_err, cm_err);
    /* on these fixtures the MLP's share of the error is small; every neuron
     * is the channel-wise MLP with every channel up to second-order terms
     * (d_j's 4 bits on h' - h, c^d on h instead of h') */
    CHECK(fabs(q4_err - cm_err) <= 0.1 * cm_err && memcmp(q4, base, nv * sizeof(float)) != 0,
          "%s: 4-bit neuron refinement %g, channel-wise %g", name, q4_err, cm_err);
    CHECK(spx_refine_set_budget(m, none, &e) == SPX_OK, "%s", e.msg);

    /* the .refine's bundles: mapped, then from disk (wait) give those bits */
    spx_refine_detach(m);
    spx_refine_params rp = {.path = rpath, .k = {0, 0, 0, 0}, .mlp = SPX_REFINE_MLP_NEURON, .kn = SPX_REFINE_CHUNK};
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: refine file: %s", name, spx_model_error(m));
    fq = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(fq, q4, nv * sizeof(float)) == 0, "%s: the .refine's bundles (mapped) differ from the in-memory ones: "
          "max %g", name, tl_max_diff(fq, q4, nv));
    if (spx_refine_kernels_avx2()) { /* the other kernel table: the same bits */
        const spx_refine_kernels *k0 = m->refine->rt.kern;
        m->refine->rt.kern = k0 == spx_refine_kernels_scalar() ? spx_refine_kernels_avx2() : spx_refine_kernels_scalar();
        float *fk = tl_decode_steps(m, ids, N_TOK);
        CHECK(memcmp(fk, fq, nv * sizeof(float)) == 0, "%s: kernel tables %s and %s differ in neuron mode", name,
              k0->name, m->refine->rt.kern->name);
        free(fk);
        m->refine->rt.kern = k0;
    }
    rp.cache_mb = 64;
    rp.miss_wait = 1;
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: refine file on disk: %s", name, spx_model_error(m));
    fd = tl_decode_steps(m, ids, N_TOK);
    CHECK(memcmp(fd, q4, nv * sizeof(float)) == 0, "%s: the .refine's bundles (disk, wait) differ", name);
    spx_refine_info ri;
    spx_model_refine_info(m, &ri);
    CHECK(ri.on_disk && ri.mlp == SPX_REFINE_MLP_NEURON && ri.requests > 0 && ri.applied == ri.selected &&
              ri.bytes_per_token > 0,
          "%s: disk tier requests %llu", name, (unsigned long long)ri.requests);
    /* skip mode, cold cache: every bundle of the first step misses, so that
     * step is the base's (each missed neuron keeps the base value) */
    rp.miss_wait = 0;
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: refine file, skip: %s", name, spx_model_error(m));
    {
        float *l1 = tl_decode_steps(m, ids, 1);
        CHECK(memcmp(l1, base, (size_t)V * sizeof(float)) == 0, "%s: a step whose bundles all missed is not the base",
              name);
        spx_model_refine_info(m, &ri);
        CHECK(ri.hits == 0 && ri.applied == 0 && ri.requests > 0 && ri.selected > 0, "%s: cold skip: hits %llu applied %llu",
              name, (unsigned long long)ri.hits, (unsigned long long)ri.applied);
        free(l1);
    }
    /* neuron mode's defaults: kn = round(3 k / 4) of the gate/up k; the MLP sets 0 */
    rp = (spx_refine_params){.path = rpath, .k = {8, 8, 40, 8}, .mlp = SPX_REFINE_MLP_NEURON, .kn = -1};
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "%s: %s", name, spx_model_error(m));
    spx_model_refine_info(m, &ri);
    CHECK(ri.kn == 30 && ri.k[2] == 0 && ri.k[3] == 0 && ri.k[0] == 8, "%s: kn %lld k %lld,%lld", name,
          (long long)ri.kn, (long long)ri.k[2], (long long)ri.k[3]);
done:
    free(ref), free(base), free(ex), free(z), free(ch), free(q4), free(fq), free(fd);
    spx_model_free(mix);
    spx_model_free(m);
    spx_model_free(dense);
}

/* ReLU^2 MLPs: no bundles; the .refine the same bytes as without the flag;
 * neuron mode refused naming the file */
static void test_no_gated_mlp(void) {
    char out[600], r1[640], r0[640];
    snprintf(out, sizeof out, "%s/nh.trdc", tl_tmpdir());
    snprintf(r1, sizeof r1, "%s/nh1.refine", tl_tmpdir());
    snprintf(r0, sizeof r0, "%s/nh0.refine", tl_tmpdir());
    if (compress("tiny-nemotronh", out, r0, 0) != SPX_OK || compress("tiny-nemotronh", out, r1, 1) != SPX_OK) return;
    size_t n0 = 0, n1 = 0;
    char *b0 = tl_read(r0, &n0), *b1 = tl_read(r1, &n1);
    CHECK(b0 && b1 && n0 == n1 && !memcmp(b0, b1, n0), "a .refine without bundles differs with --refine-bundles");
    free(b0), free(b1);
    spx_model *m = open_model(out);
    if (!m) return;
    spx_refine_params rp = {.path = r1, .k = {-1, -1, -1, -1}, .mlp = SPX_REFINE_MLP_NEURON, .kn = -1};
    CHECK(spx_model_refine(m, &rp) == SPX_ERR_ARG && strstr(spx_model_error(m), r1) &&
              strstr(spx_model_error(m), "needs neuron bundles") && strstr(spx_model_error(m), "--refine-bundles"),
          "neuron mode without bundles: %s", spx_model_error(m));
    rp.mlp = 2;
    CHECK(spx_model_refine(m, &rp) == SPX_ERR_ARG && strstr(spx_model_error(m), "MLP mode"), "mode 2: %s",
          spx_model_error(m));
    rp.mlp = SPX_REFINE_MLP_CHANNEL;
    CHECK(spx_model_refine(m, &rp) == SPX_OK, "channel mode: %s", spx_model_error(m));
    spx_err e;
    spx_err_clear(&e);
    CHECK(spx_refine_set_mlp(m, SPX_REFINE_MLP_NEURON, 8, &e) == SPX_ERR_ARG && strstr(e.msg, "needs neuron bundles"),
          "set_mlp without bundles: %s", e.msg);
    spx_model_free(m);
}

int main(void) {
    test_pack();
    test_build();
    test_dot();
    run_fixture("tiny-llama3");
    run_fixture("tiny-granite4"); /* a fused gate_up */
    test_no_gated_mlp();
    return tl_finish("test_refine_bundle");
}
