/* bundle_write.h: neuron bundles into a .refine during compression
 * (compress --refine OUT --refine-bundles; refine/bundle.h).
 *
 * The compressor streams tensors in the checkpoint's order, so a layer's
 * gate, up (or fused gate_up) and down matrices arrive one at a time,
 * possibly from different shards. The collector keeps each offered 4-bit
 * residual (the one just written as that matrix's refine4 tensor, so a
 * bundle's codes are the refine4 codes) until its layer's set is complete,
 * then builds the layer's bundles from them and the source's dense down
 * weights, writes one bundle4 tensor named "<down tensor>.bundles" and
 * frees the residuals. Layers without a gated MLP (ReLU^2, none) get no
 * bundles; a layer whose set never completes (a matrix kept dense) gets
 * none either. */
#ifndef SPX_REFINE_BUNDLE_WRITE_H
#define SPX_REFINE_BUNDLE_WRITE_H

#include "format/hf_config.h"
#include "format/safetensors.h"
#include "refine/refine.h"

struct spx_trdc_writer;
typedef struct spx_bundle_collect spx_bundle_collect;

spx_status spx_bundle_collect_new(const spx_config *cfg, spx_bundle_collect **out, spx_err *e);
/* Frees the collector and the residuals it still holds (NULL: no-op). */
void spx_bundle_collect_free(spx_bundle_collect *c);
/* 1 when tensor `name` is a gate/up/gate_up/down matrix of a gated layer. */
int spx_bundle_collect_wants(const spx_bundle_collect *c, const char *name);
/* Takes *res (the residual of tensor `name`; *res is zeroed, the collector
 * owns the arrays) and, when that completes its layer, writes the layer's
 * bundle4 to wr, reading the dense down weights from st; *bytes grows by
 * what was written. */
spx_status spx_bundle_collect_add(spx_bundle_collect *c, struct spx_trdc_writer *wr, const spx_st *st, const char *name,
                                  spx_refine_q4buf *res, uint64_t *bytes, spx_err *e);
/* Layers whose bundles were written. */
int64_t spx_bundle_collect_layers(const spx_bundle_collect *c);

#endif
