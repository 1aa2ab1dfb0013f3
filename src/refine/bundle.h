/* bundle.h: neuron bundles, the neuron-wise MLP refinement of StrataFlux-W
 * (issue 20; ../shared/spec/strataflux-paper.txt section 3.2, "Neuron-wise
 * alternative", equations 5-6).
 *
 * Meaning. A gated MLP computes g = W^gate x, u = W^up x, h = phi(g) * u,
 * y_q = W^down h with the quantized (resident) matrices W^ and phi = SiLU
 * (the CPU blocks' only gated activation, SPX_BLK_SWIGLU; a GeGLU model
 * would need its phi here). For the set N of selected neurons (the k_n
 * largest |h_j| per chunk of SPX_REFINE_CHUNK, spx_refine_topk on h, no
 * skip flags),
 *     h'_j = phi(g_j + c^g_j . x) * (u_j + c^u_j . x)
 *     y'   = y_q + sum_{j in N} [ d_j (h'_j - h_j) + c^d_j h_j ]      (eq. 6)
 * where c^g_j, c^u_j are row j of the gate and up residuals R = W - W^
 * (refine.h), c^d_j column j of the down residual and d_j a 4-bit copy of
 * the dense down column W_down[:, j]. With every neuron selected, exact
 * residuals and an exact d_j this is the dense MLP in real arithmetic:
 * W^d h + W_d (h' - h) + (W_d - W^d) h = W_d h'.
 *
 * A bundle is everything neuron j needs, in one contiguous byte range, so
 * the tier fetches one range per selected neuron. With H = hidden (the
 * MLP's input and output width) and P = ceil(H / 2) rounded up to 16:
 *     [0, P)       gate residual row j: H codes, channel c at byte c / 2,
 *                  low nibble for even c (refine.h's nibbles: q + 8)
 *     [P, 2P)      up residual row j, the same way
 *     [2P, 3P)     down residual column j: H codes, output row r at byte
 *                  r / 2; the same bytes as column j of the down matrix's
 *                  refine4 residual (its first col_bytes bytes)
 *     [3P, 4P)     d_j: H codes of the dense down column, row r at byte r / 2
 *     [4P, 4P + 8) float32 gate scale, float32 up scale: the gate and up
 *                  residuals' own row-j scales (refine.h's per-row scale)
 *     [4P + 8, stride)  zero bytes
 * bundle_bytes = 4P + 8 is what a fetch reads; stride (bundle j starts at
 * j * stride) is bundle_bytes rounded up to 64, so every bundle, and in it
 * every part (P is a multiple of 16), starts 16-aligned when the array is.
 * Code bytes past ceil(H / 2) in a part, and an odd H's last high nibble,
 * hold 0x88 / 8 (code 0). Scales shared by every neuron are stored once
 * per layer, beside the bundles: the down residual's per-row scales
 * (cd_scales[H], the refine4 down tensor's values) and d's (d_scales[H]).
 *
 * d's quantizer: symmetric 4-bit codes in [-7, 7] with one float32 scale
 * per down output row r, chosen by refine.h's MSE search
 * (spx_refine_q4_row_scale) over that row's dense weights W_down[r, :];
 * q = clamp(roundf(w / s), -7, 7). Why: it multiplies (h'_j - h_j), a
 * small correction, so its error is second order and a dense copy at 4
 * bits suffices (the paper's choice); one scale per output row is the
 * layout the apply kernel already uses (y[r] += scale[r] * sum), shared by
 * all neurons, so a bundle carries no scale of its own for it; symmetric
 * because a down row's weights are centred on zero, and the same search as
 * the residuals keeps one quantizer in the code.
 *
 * Applying (engine/ffn_neuron.c): per selected neuron the two row dots
 * acc = fmaf(x[c], code, acc) over c = 0..H-1 (acc from +0) times the row's
 * scale; then the down update through refine.h's apply kernel, twice: with
 * d_scales over x = delta (h' - h) and the d parts as columns, then with
 * cd_scales over x = h and the down-residual parts. A missing bundle
 * (tier miss) is skipped in both: that neuron keeps the base value.
 *
 * The exact variant (spx_bundle_f32: float32 residual rows/columns and the
 * dense d_j) is the reference for tests; its sums run in double.
 *
 * Limits: hidden, n >= 1 and <= INT32_MAX; a layer with separate gate/up
 * matrices or one fused gate_up ([2I, H]: gate rows first). */
#ifndef SPX_REFINE_BUNDLE_H
#define SPX_REFINE_BUNDLE_H

#include "refine/refine.h"

#define SPX_BUNDLE_PART_ALIGN 16  /* each part of a bundle starts at a multiple of this */
#define SPX_BUNDLE_STRIDE_ALIGN 64 /* bundles start at multiples of this */

/* The parts, in their order in a bundle. */
enum { SPX_BUNDLE_GATE = 0, SPX_BUNDLE_UP = 1, SPX_BUNDLE_CD = 2, SPX_BUNDLE_D = 3 };

/* P: bytes of one part for hidden size H. */
static inline int64_t spx_bundle_part_bytes(int64_t H) {
    return ((H + 1) / 2 + SPX_BUNDLE_PART_ALIGN - 1) / SPX_BUNDLE_PART_ALIGN * SPX_BUNDLE_PART_ALIGN;
}
/* bytes a fetch reads: 4 parts and two float32 scales */
static inline int64_t spx_bundle_bytes(int64_t H) { return 4 * spx_bundle_part_bytes(H) + 8; }
/* the default stride: bundle_bytes rounded up to SPX_BUNDLE_STRIDE_ALIGN */
static inline int64_t spx_bundle_stride(int64_t H) {
    return (spx_bundle_bytes(H) + SPX_BUNDLE_STRIDE_ALIGN - 1) / SPX_BUNDLE_STRIDE_ALIGN * SPX_BUNDLE_STRIDE_ALIGN;
}
static inline const uint8_t *spx_bundle_part(const uint8_t *b, int64_t H, int part) {
    return b + part * spx_bundle_part_bytes(H);
}
/* the gate (k = 0) or up (k = 1) residual row scale of a bundle */
float spx_bundle_row_scale(const uint8_t *b, int64_t H, int k);

/* A layer's bundles (a view). */
typedef struct spx_bundle_q4 {
    int64_t n;               /* neurons (intermediate size) */
    int64_t hidden;          /* H */
    int64_t stride;          /* bytes from bundle j to j + 1, >= spx_bundle_bytes(H) */
    const uint8_t *data;     /* [n][stride]; NULL when the bundles come from the tier */
    const float *d_scales;   /* [H]: d's per-row scales */
    const float *cd_scales;  /* [H]: the down residual's per-row scales */
    uint64_t file_off;       /* tier: bundle j at file_off + j * stride */
} spx_bundle_q4;

/* The exact variant: every array [n][H], neuron j's at + j * H. */
typedef struct spx_bundle_f32 {
    int64_t n, hidden;
    float *gate, *up; /* residual rows R_gate[j, :], R_up[j, :] */
    float *cd;        /* down residual column R_down[:, j] */
    float *d;         /* dense down column W_down[:, j] */
} spx_bundle_f32;

/* One layer's bundles as the engine sees them: q4 (n > 0) or f32. */
typedef struct spx_bundle_layer {
    spx_bundle_q4 q4;
    const spx_bundle_f32 *f32;
} spx_bundle_layer;

/* Owned 4-bit bundles. */
typedef struct spx_bundle_buf {
    spx_bundle_q4 v;  /* view of the arrays below */
    uint8_t *data;    /* [n][stride] */
    float *scales;    /* [2][H]: d_scales, then cd_scales (the file's order) */
} spx_bundle_buf;

/* Packs one bundle: codes in [-8, 7] (gate[H], up[H], cd[H], d[H]) and the
 * two row scales into out[stride] (the padding written too). */
void spx_bundle_pack(int64_t H, int64_t stride, const int8_t *gate, const int8_t *up, const int8_t *cd,
                     const int8_t *d, float gate_scale, float up_scale, uint8_t *out);

/* The bundles of one layer from its 4-bit residuals and the dense down
 * weights: gate rows [gate_row0, gate_row0 + I) of *gate, up rows
 * [up_row0, up_row0 + I) of *up (a fused gate_up: the same residual twice
 * with row offsets 0 and I), the down residual *down [H, I] and
 * wdown[H * I] (row-major, the source's W_down). stride 0: the default.
 * SPX_ERR_ARG on mismatched shapes or a non-finite weight, SPX_ERR_NOMEM. */
spx_status spx_bundle_build(spx_bundle_buf *b, const spx_refine_q4 *gate, int64_t gate_row0, const spx_refine_q4 *up,
                            int64_t up_row0, const spx_refine_q4 *down, const float *wdown, int64_t stride, spx_err *e);
void spx_bundle_buf_free(spx_bundle_buf *b);

/* The exact bundles from exact residuals (refine.h spx_refine_f32) and the
 * dense down weights, with the same row offsets as spx_bundle_build. */
spx_status spx_bundle_f32_build(spx_bundle_f32 *b, const spx_refine_f32 *gate, int64_t gate_row0,
                                const spx_refine_f32 *up, int64_t up_row0, const spx_refine_f32 *down,
                                const float *wdown, spx_err *e);
void spx_bundle_f32_free(spx_bundle_f32 *b);

#endif
