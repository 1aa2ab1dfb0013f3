/* fuzz_safetensors.c: libFuzzer target for the safetensors reader.
 *
 * Parses the input as a safetensors image (spx_st_open_buffer). On success
 * every tensor must lie inside the input, have nbytes == numel * element
 * size, be found again by name, and have its first and last bytes
 * readable (ASan reports any read outside the input). On failure there
 * must be no handle and a message. Seeds: fuzz/seeds_safetensors.sh. */
#include "format/safetensors.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    spx_err e;
    spx_err_clear(&e);
    spx_st *st = NULL;
    if (spx_st_open_buffer(data, size, "fuzz", &st, &e) != SPX_OK) {
        if (st || e.code == SPX_OK || e.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    volatile uint8_t sink = 0;
    const uint8_t *end = data + size;
    for (size_t i = 0; i < spx_st_count(st); i++) {
        const spx_st_tensor *t = spx_st_at(st, i);
        const uint8_t *p = t->data;
        if (!t->name || !t->file || t->ndim < 0 || t->ndim > SPX_ST_MAX_DIMS) __builtin_trap();
        if (p < data || p > end || t->nbytes > (size_t)(end - p)) __builtin_trap();
        if ((size_t)t->numel * spx_dtype_size(t->dtype) != t->nbytes) __builtin_trap();
        if (spx_st_find(st, t->name) != t) __builtin_trap();
        if (t->nbytes) sink ^= (uint8_t)(p[0] ^ p[t->nbytes - 1]);
        if (t->numel > 0 &&
            (t->dtype == SPX_DT_F32 || t->dtype == SPX_DT_F16 || t->dtype == SPX_DT_BF16)) {
            float row[16];
            int64_t n = t->numel < 16 ? t->numel : 16;
            spx_st_row_f32(t, t->numel - n, n, row);
            float v = spx_st_get_f32(t, 0) + spx_st_get_f32(t, t->numel - 1) + row[0];
            uint32_t u;
            memcpy(&u, &v, 4);
            sink ^= (uint8_t)u;
        }
    }
    if (spx_st_find(st, "") && spx_st_count(st) == 0) __builtin_trap();
    spx_st_free(st);
    (void)sink;
    return 0;
}
