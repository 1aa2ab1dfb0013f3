/* safetensors.h: memory-mapped safetensors checkpoints, single or sharded.
 *
 * File layout: u64 little-endian header length N, N bytes of UTF-8 JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {...}}, then the data section. Offsets are relative to
 * the data section.
 *
 * The reader trusts nothing: header length within the file and capped,
 * JSON valid and not too deep, every dtype known, every dimension >= 0 and
 * bounded, product of shape * element size == end - begin with overflow
 * checks, begin <= end <= data size, tensors non-overlapping, names unique
 * (across shards too). Tensor data are never copied: `data` points into
 * the map. */
#ifndef SPX_SAFETENSORS_H
#define SPX_SAFETENSORS_H

#include "core/dtype.h"
#include "core/err.h"
#include <stddef.h>
#include <stdint.h>

#define SPX_ST_MAX_DIMS 8
#define SPX_ST_MAX_HEADER (100u << 20) /* 100 MiB, as the reference impl */

typedef struct spx_st_tensor {
    const char *name;
    spx_dtype dtype;
    int ndim;
    int64_t shape[SPX_ST_MAX_DIMS];
    int64_t numel;
    const void *data;      /* into the mapped file; alignment not guaranteed */
    size_t nbytes;
    const char *file;      /* path of the file it lives in, for messages */
} spx_st_tensor;

typedef struct spx_st spx_st;

/* path: a directory (model.safetensors.index.json with its shards, else
 * model.safetensors, else the only *.safetensors in it), one .safetensors
 * file, or a *.safetensors.index.json file (shards beside it). */
spx_status spx_st_open(const char *path, spx_st **out, spx_err *e);
/* Parses a safetensors image already in memory (not copied; must outlive
 * the handle). label names it in messages. Used by tests and fuzzers. */
spx_status spx_st_open_buffer(const uint8_t *buf, size_t len, const char *label,
                              spx_st **out, spx_err *e);
void spx_st_free(spx_st *st);

size_t spx_st_count(const spx_st *st);
const spx_st_tensor *spx_st_at(const spx_st *st, size_t i);
const spx_st_tensor *spx_st_find(const spx_st *st, const char *name);

/* Converts element i of a F32/F16/BF16 tensor to float. */
float spx_st_get_f32(const spx_st_tensor *t, int64_t i);
/* Converts `n` elements starting at element `off` (F32/F16/BF16) to float. */
void spx_st_row_f32(const spx_st_tensor *t, int64_t off, int64_t n, float *out);

#endif
