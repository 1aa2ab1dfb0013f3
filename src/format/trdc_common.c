/* trdc_common.c: the parts of the TRDC container that the reader and the
 * writer share (trdc_impl.h): component and kind names, the name index,
 * the byte-level manifest checks and the sizes of a quantized matrix. */
#include "format/trdc_impl.h"
#include "quant/g32.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

const char *const trdc_comp_names[SPX_TRDC_C_COUNT] = {
    "data", "codes", "scales", "zeros", "outlier_idx", "outlier_val"};

const char *spx_trdc_comp_name(spx_trdc_comp c) {
    return (unsigned)c < SPX_TRDC_C_COUNT ? trdc_comp_names[c] : "?";
}

const char *spx_trdc_kind_name(spx_trdc_kind k) {
    return k == SPX_TRDC_DENSE ? "dense" : k == SPX_TRDC_QUANT ? "quant" : k == SPX_TRDC_REFINE ? "refine4" : k == SPX_TRDC_BUNDLE ? "bundle4" : "?";
}

/* ======================================================================
 * Name set: open addressing over caller-owned strings, value = index.
 * ====================================================================== */

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

void trdc_nameset_free(trdc_nameset *s) {
    free(s->keys);
    free(s->vals);
    memset(s, 0, sizeof *s);
}

/* Returns the slot of key or of the empty slot where it would go. */
static size_t nameset_slot(const trdc_nameset *s, const char *key) {
    size_t m = s->cap - 1, i = (size_t)fnv1a(key) & m;
    while (s->keys[i] && strcmp(s->keys[i], key) != 0) i = (i + 1) & m;
    return i;
}

int trdc_nameset_find(const trdc_nameset *s, const char *key, size_t *val) {
    if (s->cap == 0) return 0;
    size_t i = nameset_slot(s, key);
    if (!s->keys[i]) return 0;
    *val = s->vals[i];
    return 1;
}

int trdc_nameset_put(trdc_nameset *s, const char *key, size_t val, size_t *old) {
    if ((s->n + 1) * 2 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        trdc_nameset t = {calloc(nc, sizeof *t.keys), calloc(nc, sizeof *t.vals), nc, 0};
        if (!t.keys || !t.vals) {
            trdc_nameset_free(&t);
            return -1;
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->keys[i]) {
                size_t j = nameset_slot(&t, s->keys[i]);
                t.keys[j] = s->keys[i];
                t.vals[j] = s->vals[i];
                t.n++;
            }
        trdc_nameset_free(s);
        *s = t;
    }
    size_t i = nameset_slot(s, key);
    if (s->keys[i]) {
        if (old) *old = s->vals[i];
        return 0;
    }
    s->keys[i] = key;
    s->vals[i] = val;
    s->n++;
    return 1;
}

/* ======================================================================
 * Byte-level manifest checks (before any JSON parser runs)
 * ====================================================================== */

/* Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, <= U+10FFFF,
 * and no NUL byte (never valid in JSON text, and it would truncate C
 * strings). Returns the offset of the first bad byte, or len if valid. */
size_t trdc_utf8_bad_at(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c == 0) return i;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return i;
        }
        if (len - i <= n) return i;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += n + 1;
    }
    return len;
}

/* Largest nesting of [ and { outside strings, lexed as JSON does. Stops
 * early (returning a value > limit and *at) once limit is exceeded, so a
 * hostile manifest cannot drive cJSON's recursion deep. */
int trdc_json_depth(const uint8_t *s, size_t len, int limit, size_t *at) {
    int d = 0, maxd = 0, in_str = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '[' || c == '{') {
            if (++d > maxd) maxd = d;
            if (d > limit) {
                *at = i;
                return d;
            }
        } else if (c == ']' || c == '}') {
            if (d > 0) d--;
        }
    }
    return maxd;
}

/* Checks that text is a JSON object of bounded depth (for writer inputs
 * that will be embedded verbatim into the manifest). */
spx_status trdc_check_json_object_text(const char *what, const char *path, const char *text,
                                         int max_depth, spx_err *e) {
    size_t len = strlen(text), at = 0;
    size_t bad = trdc_utf8_bad_at((const uint8_t *)text, len);
    if (bad != len)
        return spx_fail(e, SPX_ERR_ARG, "%s: %s is not valid UTF-8 (byte %zu)", path, what, bad);
    if (trdc_json_depth((const uint8_t *)text, len, max_depth, &at) > max_depth)
        return spx_fail(e, SPX_ERR_ARG, "%s: %s nests deeper than %d levels (byte %zu)", path,
                        what, max_depth, at);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j)
        return spx_fail(e, SPX_ERR_ARG, "%s: %s is not valid JSON (near byte %zu)", path, what,
                        end && end >= text ? (size_t)(end - text) : (size_t)0);
    int is_obj = cJSON_IsObject(j);
    cJSON_Delete(j);
    while (end && *end && strchr(" \t\r\n", *end)) end++;
    if (end && *end)
        return spx_fail(e, SPX_ERR_ARG, "%s: %s has trailing bytes after the JSON value (byte %zu)",
                        path, what, (size_t)(end - text));
    if (!is_obj) return spx_fail(e, SPX_ERR_ARG, "%s: %s must be a JSON object", path, what);
    return SPX_OK;
}

/* ======================================================================
 * Component sizes
 * ====================================================================== */

/* Shape and parameters of a quantized matrix and the exact component
 * sizes implied by qtensor.h. Shared by reader and writer so that they can
 * never disagree. Returns NULL if fine, else a static description. */
const char *trdc_quant_sizes(int64_t rows, int64_t cols, int64_t bits, int64_t group, int64_t n_out, int layout,
                             uint64_t version, uint64_t sizes[SPX_TRDC_C_COUNT]) {
    if (rows < 1 || rows > SPX_TRDC_MAX_DIM || cols < 1 || cols > SPX_TRDC_MAX_DIM)
        return "dimensions must be in [1, 2^31-1]";
    if (bits != 2 && bits != 3 && bits != 4) return "bits must be 2, 3 or 4";
    if (group != 32 && group != 64 && group != 128) return "group must be 32, 64 or 128";
    if (cols % group != 0) return "cols must be a multiple of group";
    if (n_out < 0 || n_out > cols) return "n_outliers must be in [0, cols]";
    if (layout != SPX_Q_ROWS && layout != SPX_Q_TILED) return "unknown layout";
    if (layout == SPX_Q_TILED && !spx_q_tiled_ok((int)bits, (int)group, cols))
        return "layout \"tile16x128\" needs bits 4, group 32 and cols a multiple of 128";
    uint64_t r = (uint64_t)rows, n = (uint64_t)n_out;
    memset(sizes, 0, SPX_TRDC_C_COUNT * sizeof sizes[0]);
    /* rows, cols < 2^31 (stored rows < 2^31 + 16): none of these products can overflow 64 bits. */
    if (bits != 4 && version < 3) /* versions 1-2: 4 or 2 codes per byte in group order */
        sizes[SPX_TRDC_C_CODES] = r * (uint64_t)spx_q_legacy_codes_row_bytes(cols, (int)bits);
    else
        sizes[SPX_TRDC_C_CODES] = (uint64_t)spx_q_codes_bytes(rows, cols, (int)bits, layout);
    sizes[SPX_TRDC_C_SCALES] = (uint64_t)spx_q_scales_bytes(rows, cols, (int)group, layout);
    sizes[SPX_TRDC_C_ZEROS] = (uint64_t)spx_q_zeros_bytes(rows, cols, (int)group, layout);
    sizes[SPX_TRDC_C_OUTLIER_IDX] = n * 4;
    sizes[SPX_TRDC_C_OUTLIER_VAL] = r * n * 2;
    return NULL;
}
