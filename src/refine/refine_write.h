/* refine_write.h: writing a .refine during compression (compress --refine). */
#ifndef SPX_REFINE_WRITE_H
#define SPX_REFINE_WRITE_H

#include "core/pool.h"
#include "format/safetensors.h"
#include "refine/refine.h"

struct spx_trdc_writer;

/* The 4-bit residual of source tensor t (its float rows) against q (the
 * quantized matrix as the engine dequantizes it), built over the pool and
 * added to wr as a refine4 tensor named t->name with base_crc32 (the
 * checksum of the codes the model file holds for it); *bytes (may be
 * NULL) grows by what was written. keep: NULL, or where the residual
 * goes on success (the caller frees it with spx_refine_q4buf_free). */
spx_status spx_refine_write_tensor(struct spx_trdc_writer *wr, spx_pool *pool, const spx_st_tensor *t,
                                   const spx_qtensor *q, uint32_t base_crc32, uint64_t *bytes, spx_refine_q4buf *keep,
                                   spx_err *e);

#endif
