/* dtype.h: element types of stored tensors (safetensors names). */
#ifndef SPX_DTYPE_H
#define SPX_DTYPE_H

#include <stddef.h>
#include <string.h>

typedef enum spx_dtype {
    SPX_DT_F32 = 0,
    SPX_DT_F16 = 1,
    SPX_DT_BF16 = 2,
    SPX_DT_F64 = 3,
    SPX_DT_I64 = 4,
    SPX_DT_I32 = 5,
    SPX_DT_I16 = 6,
    SPX_DT_I8 = 7,
    SPX_DT_U8 = 8,
    SPX_DT_BOOL = 9,
    SPX_DT_COUNT
} spx_dtype;

static inline size_t spx_dtype_size(spx_dtype t) {
    static const size_t sz[SPX_DT_COUNT] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};
    return (unsigned)t < SPX_DT_COUNT ? sz[t] : 0;
}

static inline const char *spx_dtype_name(spx_dtype t) {
    static const char *nm[SPX_DT_COUNT] = {"F32", "F16", "BF16", "F64", "I64",
                                           "I32", "I16", "I8",  "U8",  "BOOL"};
    return (unsigned)t < SPX_DT_COUNT ? nm[t] : "?";
}

/* Returns SPX_DT_COUNT for an unknown name. */
static inline spx_dtype spx_dtype_from_name(const char *s) {
    for (int i = 0; i < SPX_DT_COUNT; i++)
        if (strcmp(s, spx_dtype_name((spx_dtype)i)) == 0) return (spx_dtype)i;
    return SPX_DT_COUNT;
}

#endif
