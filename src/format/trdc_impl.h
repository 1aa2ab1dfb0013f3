/* trdc_impl.h: what the TRDC reader (trdc.c) and writer (trdc_write.c)
 * share, private to src/format: the component names, the name index,
 * the byte-level manifest checks and the component sizes of a quantized
 * matrix, so the two can never disagree about what a valid file is. */
#ifndef SPX_TRDC_IMPL_H
#define SPX_TRDC_IMPL_H

#include "format/trdc.h"

#include <stddef.h>
#include <stdint.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "TRDC payloads are mapped as little-endian data: a little-endian host is required"
#endif

/* Offsets and sizes are JSON numbers (doubles): integers up to 2^53 are
 * exact, so that is the bound on any offset or size (8 PiB). */
#define TRDC_MAX_U53 ((uint64_t)1 << 53)
#define TRDC_CRC_CHUNK ((size_t)1 << 24) /* zlib takes uInt lengths */

extern const char *const trdc_comp_names[SPX_TRDC_C_COUNT];

static inline void trdc_wr_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Name set: open addressing over caller-owned strings, value = index. */
typedef struct trdc_nameset {
    const char **keys;
    size_t *vals;
    size_t cap, n; /* cap: power of two, 0 before first insert */
} trdc_nameset;

void trdc_nameset_free(trdc_nameset *s);
int trdc_nameset_find(const trdc_nameset *s, const char *key, size_t *val);
/* Inserts key -> val. Returns 1 if inserted, 0 if present (*old set),
 * -1 on out-of-memory. */
int trdc_nameset_put(trdc_nameset *s, const char *key, size_t val, size_t *old);

/* Strict UTF-8 (RFC 3629) without NUL: the offset of the first bad byte,
 * or len if valid. */
size_t trdc_utf8_bad_at(const uint8_t *s, size_t len);
/* Largest nesting of [ and { outside strings; stops early (a value >
 * limit, and *at) once limit is exceeded. */
int trdc_json_depth(const uint8_t *s, size_t len, int limit, size_t *at);
/* Checks that text is a JSON object of bounded depth (writer inputs that
 * are embedded verbatim into the manifest). */
spx_status trdc_check_json_object_text(const char *what, const char *path, const char *text, int max_depth,
                                       spx_err *e);

/* The component sizes of a quantized matrix (qtensor.h) in a file of
 * format `version` (bits 2 and 3 take the version 1-2 packing below
 * version 3, spx_q_legacy_codes_row_bytes). NULL if the parameters are
 * valid, else a static description. */
const char *trdc_quant_sizes(int64_t rows, int64_t cols, int64_t bits, int64_t group, int64_t n_out, int layout,
                             uint64_t version, uint64_t sizes[SPX_TRDC_C_COUNT]);

/* The manifest's root object (the reader's parse; borrowed). */
const struct cJSON *trdc_root(const spx_trdc *f);
/* Validates the manifest's optional "tuned" section (trdc_tuned.c) into a
 * new array (*out, freed by the caller; NULL and 0 when absent). */
spx_status trdc_tuned_parse(const char *label, const struct cJSON *root, spx_trdc_contents_kind contents,
                            spx_trdc_tuned **out, size_t *n_out, spx_err *e);

static inline int trdc_dense_dtype_ok(spx_dtype t) {
    return t == SPX_DT_F32 || t == SPX_DT_F16 || t == SPX_DT_BF16;
}

#endif
