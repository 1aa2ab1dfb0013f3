/* attach.h: a model's weight refinement (refine/rmat.h): which matrices
 * have a residual, where it lives, the budgets. Built in memory from the
 * source checkpoint (tests, references, and compress's writer), or read
 * from a .refine file. */
#ifndef SPX_REFINE_ATTACH_H
#define SPX_REFINE_ATTACH_H

#include "model/model.h"
#include "format/trdc.h"
#include "refine/bundle.h"
#include "refine/rmat.h"

typedef struct spx_refine_model {
    spx_refine_rt rt;
    spx_wmat_refine *mats; /* [n_mats], in layer then slot order */
    int64_t n_mats;
    spx_refine_f32 *f32s;  /* owned residuals of spx_refine_build (exact) */
    spx_refine_q4buf *q4s; /* owned residuals of spx_refine_build (4-bit) */
    struct spx_trdc *file; /* the .refine file (spx_model_refine), mapped */
    uint64_t residual_bytes; /* of the file's columns */
    int64_t fit_k[4];        /* the k a fitted .refine was made for (quantization.refine.fit.k), 0: not fitted */
    char platform[256];      /* spx_refine_platform of the binding (a .refine file's) */
    const spx_trdc_tuned *tuned; /* the tuned entry whose budgets are in use (in file), or NULL */
    /* neuron bundles (refine/bundle.h): per layer (rt.bundles points here),
     * owned by spx_refine_build_bundles or viewing the file */
    spx_bundle_layer *bundles;  /* [n_layers] or NULL */
    spx_bundle_buf *bq4s;       /* [n_layers] (built, 4-bit) or NULL */
    spx_bundle_f32 *bf32s;      /* [n_layers] (built, exact) or NULL */
    int64_t n_bundle_layers;
} spx_refine_model;

/* The model's runtime (for the CPU matmul), or NULL without refinement. */
spx_refine_rt *spx_refine_runtime(spx_model *m);
/* Builds the residual of every quantized layer matrix of m (a compressed
 * model) against the same matrix of src (the source checkpoint it was
 * compressed from: same config, dense weights), in memory: exact float32
 * (exact != 0) or the 4-bit columns, and attaches them with every budget
 * 0 (off). SPX_ERR_ARG when the two models' shapes differ. */
spx_status spx_refine_build(spx_model *m, const spx_model *src, int exact, spx_err *e);
/* Channels per chunk of SPX_REFINE_CHUNK for each SPX_RSET_* (0: off;
 * >= the chunk: every channel). */
spx_status spx_refine_set_budget(spx_model *m, const int64_t k[SPX_RSET_COUNT], spx_err *e);
/* SPX_ERR_UNSUPPORTED when m runs on a device backend without refinement
 * (backend.h refine_attach). */
/* The neuron bundles of every gated MLP layer of m (refine/bundle.h),
 * built from the residuals spx_refine_build attached (exact or 4-bit, as
 * it was called) and the source's dense down weights. Leaves the mode
 * channel-wise. SPX_ERR_ARG without refinement or without a gated MLP. */
spx_status spx_refine_build_bundles(spx_model *m, const spx_model *src, spx_err *e);
/* The MLP's mode (SPX_REFINE_MLP_*) and, neuron-wise, kn neurons per
 * chunk of SPX_REFINE_CHUNK; SPX_ERR_ARG for neuron mode without bundles. */
spx_status spx_refine_set_mlp(spx_model *m, int mlp, int64_t kn, spx_err *e);
/* The GPU schedule (spx_refine_rt.cuda_blocks, cuda_lag, cuda_lead; the
 * CPU ignores it). A change of the lead, or of the MLP mode above, on a
 * device backend attaches again (the backend checks them there: e.g.
 * SPX_ERR_UNSUPPORTED for what it has not built); on a refusal the
 * previous values are restored and attached, the error returned. */
spx_status spx_refine_set_schedule(spx_model *m, int32_t blocks, int32_t lag, int32_t lead, spx_err *e);
spx_status spx_refine_host_check(const spx_model *m, spx_err *e);
/* After m->refine is bound: counts the change (model.h refine_epoch) and
 * hands the refinement to a device backend (its refine_attach), which
 * fails with a message for what it cannot run. */
spx_status spx_refine_device_attach(spx_model *m, spx_err *e);
/* The platform key of tuned budgets (docs/trdc.md 2.6) for m with the
 * tier placement of p: "BACKEND/KERNELS/Nt/TIER/CPU", TIER "ram" or
 * "disk-<MiB>MiB-<skip|wait>-<loaders>l", e.g.
 * "cpu/avx2/2t/disk-32MiB-skip-2l/AMD EPYC 7B13 64-Core Processor":
 * everything that changes what a refinement budget costs here. */
void spx_refine_platform(const spx_model *m, const spx_refine_params *p, char *buf, size_t cap);
/* Drops the model's refinement (the matrices lose their residuals). */
void spx_refine_detach(spx_model *m);

#endif
