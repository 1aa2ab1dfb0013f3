/* trdc.c: TRDC4B01 container reader, CRC verifier and streaming writer.
 * Normative spec: docs/trdc.md. Public interface and guarantees: trdc.h.
 *
 * The reader treats the file as hostile. Order of checks: header (size,
 * magic, version, manifest length: non-zero, capped, within the file),
 * manifest bytes (no NUL, strict UTF-8, nesting depth) before cJSON sees
 * them, JSON syntax (no trailing bytes), then every field by type and range
 * (unknown keys ignored, duplicate keys rejected in the objects we read),
 * then each tensor: shape bounded and overflow-checked, component set and
 * sizes exactly those implied by qtensor.h, offsets aligned and within
 * [4096, manifest offset), then no two components overlap anywhere, then
 * outlier indices. Only then is a pointer into the file formed. */
#define _POSIX_C_SOURCE 200809L
#include "format/trdc.h"

#include "core/mapfile.h"
#include "core/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "TRDC payloads are mapped as little-endian data: a little-endian host is required"
#endif

/* Offsets and sizes are JSON numbers (doubles): integers up to 2^53 are
 * exact, so that is the bound on any offset or size (8 PiB). */
#define TRDC_MAX_U53 ((uint64_t)1 << 53)
#define TRDC_CRC_CHUNK ((size_t)1 << 24) /* zlib takes uInt lengths */

static const char *const k_comp_names[SPX_TRDC_C_COUNT] = {
    "data", "codes", "scales", "zeros", "outlier_idx", "outlier_val"};

const char *spx_trdc_comp_name(spx_trdc_comp c) {
    return (unsigned)c < SPX_TRDC_C_COUNT ? k_comp_names[c] : "?";
}

const char *spx_trdc_kind_name(spx_trdc_kind k) {
    return k == SPX_TRDC_DENSE ? "dense" : k == SPX_TRDC_QUANT ? "quant" : "?";
}

static uint64_t rd_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void wr_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t crc_of(const uint8_t *p, uint64_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        size_t k = n < TRDC_CRC_CHUNK ? (size_t)n : TRDC_CRC_CHUNK;
        c = crc32(c, p, (uInt)k);
        p += k;
        n -= k;
    }
    return (uint32_t)c;
}

/* ======================================================================
 * Name set: open addressing over caller-owned strings, value = index.
 * ====================================================================== */

typedef struct nameset {
    const char **keys;
    size_t *vals;
    size_t cap, n; /* cap: power of two, 0 before first insert */
} nameset;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void nameset_free(nameset *s) {
    free(s->keys);
    free(s->vals);
    memset(s, 0, sizeof *s);
}

/* Returns the slot of key or of the empty slot where it would go. */
static size_t nameset_slot(const nameset *s, const char *key) {
    size_t m = s->cap - 1, i = (size_t)fnv1a(key) & m;
    while (s->keys[i] && strcmp(s->keys[i], key) != 0) i = (i + 1) & m;
    return i;
}

static int nameset_find(const nameset *s, const char *key, size_t *val) {
    if (s->cap == 0) return 0;
    size_t i = nameset_slot(s, key);
    if (!s->keys[i]) return 0;
    *val = s->vals[i];
    return 1;
}

/* Inserts key -> val. Returns 1 if inserted, 0 if present (*old set),
 * -1 on out-of-memory. */
static int nameset_put(nameset *s, const char *key, size_t val, size_t *old) {
    if ((s->n + 1) * 2 > s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        nameset t = {calloc(nc, sizeof *t.keys), calloc(nc, sizeof *t.vals), nc, 0};
        if (!t.keys || !t.vals) {
            nameset_free(&t);
            return -1;
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->keys[i]) {
                size_t j = nameset_slot(&t, s->keys[i]);
                t.keys[j] = s->keys[i];
                t.vals[j] = s->vals[i];
                t.n++;
            }
        nameset_free(s);
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
static size_t utf8_bad_at(const uint8_t *s, size_t len) {
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
static int json_depth(const uint8_t *s, size_t len, int limit, size_t *at) {
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
static spx_status check_json_object_text(const char *what, const char *path, const char *text,
                                         int max_depth, spx_err *e) {
    size_t len = strlen(text), at = 0;
    size_t bad = utf8_bad_at((const uint8_t *)text, len);
    if (bad != len)
        return spx_fail(e, SPX_ERR_ARG, "%s: %s is not valid UTF-8 (byte %zu)", path, what, bad);
    if (json_depth((const uint8_t *)text, len, max_depth, &at) > max_depth)
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
 * JSON field access with messages
 * ====================================================================== */

/* Short description of a JSON value for messages. */
static const char *jdesc(const cJSON *v, char *buf, size_t n) {
    if (!v) return "missing";
    if (cJSON_IsNumber(v)) {
        snprintf(buf, n, "%.17g", v->valuedouble);
        return buf;
    }
    if (cJSON_IsString(v)) {
        snprintf(buf, n, "the string \"%.40s\"", v->valuestring);
        return buf;
    }
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "an unknown value";
}

/* An integer JSON number in [lo, hi] (hi <= 2^53). */
static int jint(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) return 0;
    *out = (int64_t)d;
    return 1;
}

/* Rejects objects with the same key twice: cJSON would silently use the
 * first, another reader perhaps the last. */
static int dup_key(const cJSON *obj, const char **which) {
    for (const cJSON *a = obj ? obj->child : NULL; a; a = a->next)
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && strcmp(a->string, b->string) == 0) {
                *which = a->string;
                return 1;
            }
    return 0;
}

/* ======================================================================
 * Reader
 * ====================================================================== */

struct spx_trdc {
    spx_map map;            /* for spx_trdc_open; zeroed for buffers */
    const uint8_t *base;
    uint64_t size;
    char *label;
    uint64_t version, man_off, man_len;
    cJSON *root;
    const cJSON *config, *quant, *source;
    const char *tok_json, *tok_cfg_json, *generator;
    spx_trdc_tensor *tensors;
    size_t n;
    nameset names;
};

typedef struct span {
    uint64_t off, size;
    size_t tensor;
    int comp;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off ? 1 : 0;
}

/* Shape and parameters of a quantized matrix and the exact component
 * sizes implied by qtensor.h. Shared by reader and writer so that they can
 * never disagree. Returns NULL if fine, else a static description. */
static const char *quant_sizes(int64_t rows, int64_t cols, int64_t bits, int64_t group,
                               int64_t n_out, int layout, uint64_t sizes[SPX_TRDC_C_COUNT]) {
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
    sizes[SPX_TRDC_C_CODES] = (uint64_t)spx_q_codes_bytes(rows, cols, (int)bits, layout);
    sizes[SPX_TRDC_C_SCALES] = (uint64_t)spx_q_scales_bytes(rows, cols, (int)group, layout);
    sizes[SPX_TRDC_C_ZEROS] = (uint64_t)spx_q_zeros_bytes(rows, cols, (int)group, layout);
    sizes[SPX_TRDC_C_OUTLIER_IDX] = n * 4;
    sizes[SPX_TRDC_C_OUTLIER_VAL] = r * n * 2;
    return NULL;
}

static int dense_dtype_ok(spx_dtype t) {
    return t == SPX_DT_F32 || t == SPX_DT_F16 || t == SPX_DT_BF16;
}

static void shape_str(const spx_trdc_tensor *t, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %lld" : "%lld", (long long)t->shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Parses and checks tensor #i (everything that concerns it alone). */
static spx_status parse_tensor(spx_trdc *f, const cJSON *jt, size_t i, spx_err *e) {
    const char *L = f->label, *dk;
    char b1[96];
    spx_trdc_tensor *t = &f->tensors[i];
    memset(t, 0, sizeof *t);
    t->kappa = t->r = NAN;
    t->dtype = SPX_DT_COUNT;
    if (!cJSON_IsObject(jt))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tensors[%zu] is %s, expected an object", L,
                        i, jdesc(jt, b1, sizeof b1));
    if (dup_key(jt, &dk))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tensors[%zu] has the key '%s' twice", L, i,
                        dk);
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(jt, "name");
    if (!cJSON_IsString(jn))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tensors[%zu]: 'name' is %s, expected a string",
                        L, i, jdesc(jn, b1, sizeof b1));
    size_t nl = strlen(jn->valuestring);
    if (nl == 0 || nl > SPX_TRDC_MAX_NAME)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest tensors[%zu]: name is %zu bytes, expected 1..%d", L, i, nl,
                        SPX_TRDC_MAX_NAME);
    const char *N = jn->valuestring;
    t->name = N;
    size_t prev = 0;
    int put = nameset_put(&f->names, N, i, &prev);
    if (put < 0) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory indexing tensor names", L);
    if (put == 0)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: duplicate tensor name '%s' (tensors[%zu] and tensors[%zu])", L, N,
                        prev, i);

    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(jt, "kind");
    if (!cJSON_IsString(jk))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'kind' is %s, expected a string", L,
                        N, jdesc(jk, b1, sizeof b1));
    if (!strcmp(jk->valuestring, "dense")) t->kind = SPX_TRDC_DENSE;
    else if (!strcmp(jk->valuestring, "quant")) t->kind = SPX_TRDC_QUANT;
    else
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: tensor '%s': unknown kind '%.60s' (expected \"dense\" or \"quant\")",
                        L, N, jk->valuestring);

    /* shape */
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(jt, "shape");
    if (!cJSON_IsArray(js))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'shape' is %s, expected an array", L,
                        N, jdesc(js, b1, sizeof b1));
    int nd = cJSON_GetArraySize(js);
    int lo = t->kind == SPX_TRDC_QUANT ? 2 : 1, hi = t->kind == SPX_TRDC_QUANT ? 2 : SPX_TRDC_MAX_DIMS;
    if (nd < lo || nd > hi)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': shape has %d dims, expected %d..%d for kind %s",
                        L, N, nd, lo, hi, spx_trdc_kind_name(t->kind));
    t->ndim = nd;
    uint64_t numel = 1;
    int d = 0;
    for (const cJSON *jd = js->child; jd; jd = jd->next, d++) {
        int64_t v;
        if (!jint(jd, 1, SPX_TRDC_MAX_DIM, &v))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': shape[%d] is %s, expected an integer in [1, %lld]", L,
                            N, d, jdesc(jd, b1, sizeof b1), (long long)SPX_TRDC_MAX_DIM);
        t->shape[d] = v;
        if (__builtin_mul_overflow(numel, (uint64_t)v, &numel) || numel > (uint64_t)INT64_MAX)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': shape product overflows 63 bits",
                            L, N);
    }
    t->numel = (int64_t)numel;

    /* kind-specific fields and expected component sizes */
    uint64_t want[SPX_TRDC_C_COUNT] = {0};
    if (t->kind == SPX_TRDC_DENSE) {
        const cJSON *jd = cJSON_GetObjectItemCaseSensitive(jt, "dtype");
        if (!cJSON_IsString(jd))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'dtype' is %s, expected a string",
                            L, N, jdesc(jd, b1, sizeof b1));
        spx_dtype dt = spx_dtype_from_name(jd->valuestring);
        if (!dense_dtype_ok(dt))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': dtype '%.20s' is not allowed (expected F32, F16 or BF16)",
                            L, N, jd->valuestring);
        t->dtype = dt;
        if (__builtin_mul_overflow(numel, (uint64_t)spx_dtype_size(dt), &want[SPX_TRDC_C_DATA]))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': byte size overflows", L, N);
    } else {
        int64_t bits, group, nout;
        const cJSON *jb = cJSON_GetObjectItemCaseSensitive(jt, "bits");
        const cJSON *jg = cJSON_GetObjectItemCaseSensitive(jt, "group");
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(jt, "n_outliers");
        if (!jint(jb, 2, 4, &bits))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'bits' is %s, expected 2, 3 or 4",
                            L, N, jdesc(jb, b1, sizeof b1));
        if (!jint(jg, 32, 128, &group) || (group != 32 && group != 64 && group != 128))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': 'group' is %s, expected 32, 64 or 128", L, N,
                            jdesc(jg, b1, sizeof b1));
        if (t->shape[1] % group != 0)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': cols %lld is not a multiple of group %lld", L, N,
                            (long long)t->shape[1], (long long)group);
        if (!jint(jo, 0, t->shape[1], &nout))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': 'n_outliers' is %s, expected an integer in [0, cols=%lld]",
                            L, N, jdesc(jo, b1, sizeof b1), (long long)t->shape[1]);
        /* 'layout' (version 2): absent or "rows" = row-major, "tile16x128" = SPX_Q_TILED */
        int layout = SPX_Q_ROWS;
        const cJSON *jl = cJSON_GetObjectItemCaseSensitive(jt, "layout");
        if (jl) {
            if (f->version < 2)
                return spx_fail(e, SPX_ERR_FORMAT,
                                "%s: tensor '%s': 'layout' appears in a version 1 file (layouts came with "
                                "version 2)", L, N);
            if (cJSON_IsString(jl) && strcmp(jl->valuestring, "tile16x128") == 0) layout = SPX_Q_TILED;
            else if (!cJSON_IsString(jl) || strcmp(jl->valuestring, "rows") != 0)
                return spx_fail(e, SPX_ERR_FORMAT,
                                "%s: tensor '%s': 'layout' is %s, expected \"rows\" or \"tile16x128\"", L, N,
                                jdesc(jl, b1, sizeof b1));
        }
        const char *why = quant_sizes(t->shape[0], t->shape[1], bits, group, nout, layout, want);
        if (why) return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': %s", L, N, why);
        t->q.layout = layout;
        const char *keys[2] = {"kappa", "r"};
        double *dst[2] = {&t->kappa, &t->r};
        for (int k = 0; k < 2; k++) {
            const cJSON *jv = cJSON_GetObjectItemCaseSensitive(jt, keys[k]);
            if (!jv || cJSON_IsNull(jv)) continue;
            if (!cJSON_IsNumber(jv) || !isfinite(jv->valuedouble))
                return spx_fail(e, SPX_ERR_FORMAT,
                                "%s: tensor '%s': '%s' is %s, expected a number or null", L, N,
                                keys[k], jdesc(jv, b1, sizeof b1));
            *dst[k] = jv->valuedouble;
        }
        t->q.rows = t->shape[0];
        t->q.cols = t->shape[1];
        t->q.bits = (int32_t)bits;
        t->q.group = (int32_t)group;
        t->q.n_outliers = nout;
    }

    /* components: exactly the set the kind requires */
    const cJSON *jc = cJSON_GetObjectItemCaseSensitive(jt, "components");
    if (!cJSON_IsObject(jc))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'components' is %s, expected an object",
                        L, N, jdesc(jc, b1, sizeof b1));
    if (dup_key(jc, &dk))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': component '%s' appears twice", L, N, dk);
    for (const cJSON *it = jc->child; it; it = it->next) {
        int c = 0;
        while (c < SPX_TRDC_C_COUNT && strcmp(it->string, k_comp_names[c]) != 0) c++;
        if (c == SPX_TRDC_C_COUNT || want[c] == 0)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': unexpected component '%.40s' for kind %s%s", L, N,
                            it->string, spx_trdc_kind_name(t->kind),
                            c == SPX_TRDC_C_OUTLIER_IDX || c == SPX_TRDC_C_OUTLIER_VAL
                                ? " with n_outliers 0" : "");
    }
    uint64_t total = 0;
    for (int c = 0; c < SPX_TRDC_C_COUNT; c++) {
        if (want[c] == 0) continue;
        const char *C = k_comp_names[c];
        const cJSON *jo = cJSON_GetObjectItemCaseSensitive(jc, C);
        if (!cJSON_IsObject(jo))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s' is %s, expected an object with offset, size, crc32",
                            L, N, C, jdesc(jo, b1, sizeof b1));
        if (dup_key(jo, &dk))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': component '%s' has the key '%s' twice",
                            L, N, C, dk);
        const cJSON *jof = cJSON_GetObjectItemCaseSensitive(jo, "offset");
        const cJSON *jsz = cJSON_GetObjectItemCaseSensitive(jo, "size");
        const cJSON *jcr = cJSON_GetObjectItemCaseSensitive(jo, "crc32");
        int64_t off, sz, crc;
        if (!jint(jof, 0, (int64_t)TRDC_MAX_U53, &off))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s': offset is %s, expected an integer in [0, 2^53]",
                            L, N, C, jdesc(jof, b1, sizeof b1));
        if (!jint(jsz, 0, (int64_t)TRDC_MAX_U53, &sz))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s': size is %s, expected an integer in [0, 2^53]",
                            L, N, C, jdesc(jsz, b1, sizeof b1));
        if (!jint(jcr, 0, 0xFFFFFFFFll, &crc))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s': crc32 is %s, expected an integer in [0, 2^32-1]",
                            L, N, C, jdesc(jcr, b1, sizeof b1));
        if ((uint64_t)sz != want[c]) {
            char shp[160];
            shape_str(t, shp, sizeof shp);
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s' has size %lld, expected %llu for shape "
                            "%s (%s)",
                            L, N, C, (long long)sz, (unsigned long long)want[c], shp,
                            t->kind == SPX_TRDC_DENSE ? "numel x dtype size" : "as qtensor.h implies");
        }
        if ((uint64_t)off % SPX_TRDC_ALIGN != 0)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s' offset %lld is not a multiple of %u", L,
                            N, C, (long long)off, SPX_TRDC_ALIGN);
        if ((uint64_t)off < SPX_TRDC_HEADER_SIZE)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s' offset %lld overlaps the %u-byte header",
                            L, N, C, (long long)off, SPX_TRDC_HEADER_SIZE);
        uint64_t end = (uint64_t)off + (uint64_t)sz; /* both <= 2^53: no overflow */
        if (end > f->man_off)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': component '%s' [%lld, %llu) extends past the payload end "
                            "%llu (where the manifest starts; truncated file?)",
                            L, N, C, (long long)off, (unsigned long long)end,
                            (unsigned long long)f->man_off);
        t->comp[c].present = 1;
        t->comp[c].offset = (uint64_t)off;
        t->comp[c].size = (uint64_t)sz;
        t->comp[c].crc32 = (uint32_t)crc;
        total += (uint64_t)sz;
    }
    t->nbytes = (size_t)total;
    return SPX_OK;
}

/* Points views into the file and checks the outlier indices (after all
 * bounds and overlap checks, so these reads are in range). */
static spx_status bind_tensor(spx_trdc *f, spx_trdc_tensor *t, spx_err *e) {
    const uint8_t *b = f->base;
    if (t->kind == SPX_TRDC_DENSE) {
        t->data = b + t->comp[SPX_TRDC_C_DATA].offset;
        return SPX_OK;
    }
    t->q.codes = b + t->comp[SPX_TRDC_C_CODES].offset;
    t->q.scales = (const uint16_t *)(b + t->comp[SPX_TRDC_C_SCALES].offset);
    t->q.zeros = b + t->comp[SPX_TRDC_C_ZEROS].offset;
    if (t->q.n_outliers == 0) return SPX_OK;
    const uint8_t *ip = b + t->comp[SPX_TRDC_C_OUTLIER_IDX].offset;
    int64_t last = -1;
    for (int64_t j = 0; j < t->q.n_outliers; j++) {
        int32_t v;
        memcpy(&v, ip + 4 * j, 4);
        if (v < 0 || v >= t->q.cols || v <= last)
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': outlier_idx[%lld] = %d, expected strictly increasing "
                            "indices in [0, cols=%lld) (previous %lld)",
                            f->label, t->name, (long long)j, v, (long long)t->q.cols,
                            (long long)last);
        last = v;
    }
    t->q.outlier_idx = (const int32_t *)ip;
    t->q.outlier_val = (const uint16_t *)(b + t->comp[SPX_TRDC_C_OUTLIER_VAL].offset);
    return SPX_OK;
}

static spx_status check_overlaps(spx_trdc *f, spx_err *e) {
    size_t ns = 0;
    for (size_t i = 0; i < f->n; i++)
        for (int c = 0; c < SPX_TRDC_C_COUNT; c++) ns += f->tensors[i].comp[c].present ? 1 : 0;
    if (ns == 0) return SPX_OK;
    span *s = malloc(ns * sizeof *s);
    if (!s) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", f->label);
    size_t k = 0;
    for (size_t i = 0; i < f->n; i++)
        for (int c = 0; c < SPX_TRDC_C_COUNT; c++)
            if (f->tensors[i].comp[c].present)
                s[k++] = (span){f->tensors[i].comp[c].offset, f->tensors[i].comp[c].size, i, c};
    qsort(s, ns, sizeof *s, span_cmp);
    spx_status st = SPX_OK;
    for (size_t j = 1; j < ns; j++)
        if (s[j].off < s[j - 1].off + s[j - 1].size) {
            st = spx_fail(e, SPX_ERR_FORMAT,
                          "%s: components overlap: tensor '%s' '%s' [%llu, %llu) and tensor '%s' "
                          "'%s' at offset %llu",
                          f->label, f->tensors[s[j - 1].tensor].name, k_comp_names[s[j - 1].comp],
                          (unsigned long long)s[j - 1].off,
                          (unsigned long long)(s[j - 1].off + s[j - 1].size),
                          f->tensors[s[j].tensor].name, k_comp_names[s[j].comp],
                          (unsigned long long)s[j].off);
            break;
        }
    free(s);
    return st;
}

static spx_status parse_manifest(spx_trdc *f, spx_err *e) {
    const char *L = f->label, *dk;
    char b1[96];
    const uint8_t *m = f->base + f->man_off;
    size_t len = (size_t)f->man_len, at = 0;

    size_t bad = utf8_bad_at(m, len);
    if (bad != len)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest is not valid UTF-8 (bad byte 0x%02x at manifest byte %zu)", L,
                        m[bad], bad);
    if (json_depth(m, len, SPX_TRDC_MAX_DEPTH, &at) > SPX_TRDC_MAX_DEPTH)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest JSON nests deeper than %d levels (at manifest byte %zu)", L,
                        SPX_TRDC_MAX_DEPTH, at);
    /* cJSON gets its own NUL-terminated copy: no parser reads the map. */
    char *txt = malloc(len + 1);
    if (!txt) return spx_fail(e, SPX_ERR_NOMEM, "%s: cannot allocate %zu bytes for the manifest", L, len + 1);
    memcpy(txt, m, len);
    txt[len] = 0;
    const char *end = NULL;
    f->root = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    size_t end_at = end && end >= txt && end <= txt + len ? (size_t)(end - txt) : 0;
    if (f->root)
        while (end_at < len && strchr(" \t\r\n", txt[end_at])) end_at++;
    char near[24];
    snprintf(near, sizeof near, "%.16s", txt + (end_at < len ? end_at : len));
    for (char *p = near; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == '"') *p = ' ';
    free(txt);
    if (!f->root)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest is not valid JSON (error at manifest byte %zu, near \"%s\")",
                        L, end_at, near);
    if (end_at != len)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest has trailing bytes after the JSON value (manifest byte %zu)", L,
                        end_at);
    const cJSON *r = f->root;
    if (!cJSON_IsObject(r))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest is %s, expected a JSON object", L,
                        jdesc(r, b1, sizeof b1));
    if (dup_key(r, &dk))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest has the key '%s' twice", L, dk);

    const cJSON *jf = cJSON_GetObjectItemCaseSensitive(r, "format");
    if (!cJSON_IsString(jf) || strcmp(jf->valuestring, SPX_TRDC_MAGIC) != 0)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'format' is %s, expected \"%s\"", L,
                        jdesc(jf, b1, sizeof b1), SPX_TRDC_MAGIC);
    const cJSON *jv = cJSON_GetObjectItemCaseSensitive(r, "version");
    int64_t ver;
    if (!jint(jv, 0, (int64_t)TRDC_MAX_U53, &ver) || (uint64_t)ver != f->version)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest 'version' is %s, expected %llu (the header's version)", L,
                        jdesc(jv, b1, sizeof b1), (unsigned long long)f->version);
    const cJSON *jg = cJSON_GetObjectItemCaseSensitive(r, "generator");
    if (jg && !cJSON_IsString(jg))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'generator' is %s, expected a string", L,
                        jdesc(jg, b1, sizeof b1));
    f->generator = jg ? jg->valuestring : "";
    f->config = cJSON_GetObjectItemCaseSensitive(r, "config");
    if (!cJSON_IsObject(f->config))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'config' is %s, expected an object", L,
                        jdesc(f->config, b1, sizeof b1));
    f->quant = cJSON_GetObjectItemCaseSensitive(r, "quantization");
    if (!cJSON_IsObject(f->quant))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'quantization' is %s, expected an object",
                        L, jdesc(f->quant, b1, sizeof b1));
    f->source = cJSON_GetObjectItemCaseSensitive(r, "source");
    if (f->source && !cJSON_IsObject(f->source))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'source' is %s, expected an object", L,
                        jdesc(f->source, b1, sizeof b1));
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(r, "tokenizer");
    if (jt) {
        if (!cJSON_IsObject(jt))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tokenizer' is %s, expected an object",
                            L, jdesc(jt, b1, sizeof b1));
        if (dup_key(jt, &dk))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tokenizer' has the key '%s' twice", L, dk);
        const char *keys[2] = {"tokenizer.json", "tokenizer_config.json"};
        const char **dst[2] = {&f->tok_json, &f->tok_cfg_json};
        for (int k = 0; k < 2; k++) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(jt, keys[k]);
            if (!js) continue;
            if (!cJSON_IsString(js))
                return spx_fail(e, SPX_ERR_FORMAT,
                                "%s: manifest tokenizer['%s'] is %s, expected the file as a string",
                                L, keys[k], jdesc(js, b1, sizeof b1));
            *dst[k] = js->valuestring;
        }
    }

    const cJSON *jts = cJSON_GetObjectItemCaseSensitive(r, "tensors");
    if (!cJSON_IsArray(jts))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tensors' is %s, expected an array", L,
                        jdesc(jts, b1, sizeof b1));
    size_t n = 0;
    for (const cJSON *it = jts->child; it; it = it->next)
        if (++n > SPX_TRDC_MAX_TENSORS)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest lists more than %u tensors", L,
                            SPX_TRDC_MAX_TENSORS);
    if (n > 0) {
        f->tensors = calloc(n, sizeof *f->tensors);
        if (!f->tensors) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory for %zu tensors", L, n);
    }
    size_t i = 0;
    for (const cJSON *it = jts->child; it; it = it->next, i++) SPX_TRY(parse_tensor(f, it, i, e));
    f->n = n;
    SPX_TRY(check_overlaps(f, e));
    for (i = 0; i < n; i++) SPX_TRY(bind_tensor(f, &f->tensors[i], e));
    return SPX_OK;
}

static spx_status trdc_validate(spx_trdc *f, spx_err *e) {
    const char *L = f->label;
    const uint8_t *b = f->base;
    if (f->size < SPX_TRDC_HEADER_SIZE)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: file is %llu bytes, smaller than the %u-byte TRDC header (truncated, or "
                        "not a .trdc file?)",
                        L, (unsigned long long)f->size, SPX_TRDC_HEADER_SIZE);
    if (memcmp(b, SPX_TRDC_MAGIC, 8) != 0) {
        char got[40];
        int k = 0;
        for (int i = 0; i < 8; i++)
            k += snprintf(got + k, sizeof got - (size_t)k, b[i] >= 0x20 && b[i] < 0x7f ? "%c" : "\\x%02x", b[i]);
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: bad magic \"%s\", expected \"%s\" (not a .trdc file?)", L, got,
                        SPX_TRDC_MAGIC);
    }
    f->version = rd_le64(b + 8);
    if (f->version < SPX_TRDC_VERSION_MIN || f->version > SPX_TRDC_VERSION)
        return spx_fail(e, SPX_ERR_UNSUPPORTED,
                        "%s: TRDC format version %llu is not supported (this build reads versions %u to %u; "
                        "a newer spectra may read it)",
                        L, (unsigned long long)f->version, SPX_TRDC_VERSION_MIN, SPX_TRDC_VERSION);
    f->man_len = rd_le64(b + 16);
    if (f->man_len == 0)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest length is 0 (an unfinished file: the writer sets it last)", L);
    if (f->man_len > SPX_TRDC_MAX_MANIFEST)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest length %llu exceeds the %llu-byte limit", L,
                        (unsigned long long)f->man_len, (unsigned long long)SPX_TRDC_MAX_MANIFEST);
    if (f->man_len > f->size - SPX_TRDC_HEADER_SIZE)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest length %llu exceeds the %llu bytes after the header (truncated "
                        "file?)",
                        L, (unsigned long long)f->man_len,
                        (unsigned long long)(f->size - SPX_TRDC_HEADER_SIZE));
    f->man_off = f->size - f->man_len;
    return parse_manifest(f, e);
}

static spx_status trdc_new(const char *label, spx_trdc **out, spx_err *e) {
    *out = calloc(1, sizeof **out);
    if (!*out || !((*out)->label = spx_strdup(label ? label : "<buffer>"))) {
        free(*out);
        *out = NULL;
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label ? label : "<buffer>");
    }
    return SPX_OK;
}

spx_status spx_trdc_open_buffer(const uint8_t *buf, size_t len, const char *label,
                                spx_trdc **out, spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_open_buffer: out is NULL");
    *out = NULL;
    if (!buf && len) return spx_fail(e, SPX_ERR_ARG, "%s: buffer is NULL", label ? label : "<buffer>");
    if ((uintptr_t)buf % 8 != 0)
        return spx_fail(e, SPX_ERR_ARG, "%s: buffer must be 8-byte aligned", label ? label : "<buffer>");
    spx_trdc *f;
    SPX_TRY(trdc_new(label, &f, e));
    f->base = buf;
    f->size = len;
    spx_status st = trdc_validate(f, e);
    if (st != SPX_OK) {
        spx_trdc_close(f);
        return st;
    }
    *out = f;
    return SPX_OK;
}

spx_status spx_trdc_open(const char *path, spx_trdc **out, spx_err *e) {
    if (!out || !path) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_open: NULL argument");
    *out = NULL;
    spx_trdc *f;
    SPX_TRY(trdc_new(path, &f, e));
    spx_status st = spx_map_open(path, &f->map, e);
    if (st == SPX_OK) {
        f->base = f->map.data;
        f->size = f->map.size;
        st = trdc_validate(f, e);
    }
    if (st != SPX_OK) {
        spx_trdc_close(f);
        return st;
    }
    *out = f;
    return SPX_OK;
}

void spx_trdc_close(spx_trdc *f) {
    if (!f) return;
    cJSON_Delete(f->root);
    free(f->tensors);
    nameset_free(&f->names);
    spx_map_close(&f->map);
    free(f->label);
    free(f);
}

const char *spx_trdc_path(const spx_trdc *f) { return f->label; }
uint64_t spx_trdc_version(const spx_trdc *f) { return f->version; }
uint64_t spx_trdc_file_size(const spx_trdc *f) { return f->size; }
uint64_t spx_trdc_manifest_offset(const spx_trdc *f) { return f->man_off; }
uint64_t spx_trdc_manifest_size(const spx_trdc *f) { return f->man_len; }
size_t spx_trdc_count(const spx_trdc *f) { return f->n; }

const spx_trdc_tensor *spx_trdc_at(const spx_trdc *f, size_t i) {
    return i < f->n ? &f->tensors[i] : NULL;
}

const spx_trdc_tensor *spx_trdc_find(const spx_trdc *f, const char *name) {
    size_t i;
    return name && nameset_find(&f->names, name, &i) ? &f->tensors[i] : NULL;
}

const struct cJSON *spx_trdc_config(const spx_trdc *f) { return f->config; }
const struct cJSON *spx_trdc_quant_settings(const spx_trdc *f) { return f->quant; }
const struct cJSON *spx_trdc_source(const spx_trdc *f) { return f->source; }
char *spx_trdc_config_json(const spx_trdc *f) { return cJSON_PrintUnformatted(f->config); }
const char *spx_trdc_tokenizer_json(const spx_trdc *f) { return f->tok_json; }
const char *spx_trdc_tokenizer_config_json(const spx_trdc *f) { return f->tok_cfg_json; }
const char *spx_trdc_generator(const spx_trdc *f) { return f->generator; }

int64_t spx_trdc_source_bytes(const spx_trdc *f) {
    int64_t v;
    const cJSON *j = f->source ? cJSON_GetObjectItemCaseSensitive(f->source, "bytes") : NULL;
    return jint(j, 0, (int64_t)TRDC_MAX_U53, &v) ? v : -1;
}

/* ======================================================================
 * Verification
 * ====================================================================== */

spx_status spx_trdc_verify(const spx_trdc *f, spx_trdc_progress_fn progress,
                           spx_trdc_mismatch_fn on_mismatch, void *user,
                           spx_trdc_verify_report *report, spx_err *e) {
    spx_trdc_verify_report rep = {f->n, 0, 0, 0};
    uint64_t total = 0;
    for (size_t i = 0; i < f->n; i++)
        for (int c = 0; c < SPX_TRDC_C_COUNT; c++)
            if (f->tensors[i].comp[c].present) total += f->tensors[i].comp[c].size;
    const spx_trdc_tensor *bad_t = NULL;
    int bad_c = 0;
    uint32_t bad_want = 0, bad_got = 0;
    for (size_t i = 0; i < f->n; i++) {
        const spx_trdc_tensor *t = &f->tensors[i];
        for (int c = 0; c < SPX_TRDC_C_COUNT; c++) {
            const spx_trdc_component *k = &t->comp[c];
            if (!k->present) continue;
            uint32_t got = crc_of(f->base + k->offset, k->size);
            rep.n_components++;
            rep.bytes_checked += k->size;
            if (got != k->crc32) {
                if (rep.n_mismatches++ == 0) {
                    bad_t = t;
                    bad_c = c;
                    bad_want = k->crc32;
                    bad_got = got;
                }
                if (on_mismatch) on_mismatch(user, t, (spx_trdc_comp)c, k->crc32, got);
            }
            if (progress) progress(user, rep.bytes_checked, total);
        }
    }
    if (report) *report = rep;
    if (rep.n_mismatches)
        return spx_fail(e, SPX_ERR_CRC,
                        "%s: tensor '%s' component '%s': crc32 is 0x%08x, expected 0x%08x "
                        "(%zu of %zu components mismatch; the file is corrupt)",
                        f->label, bad_t->name, k_comp_names[bad_c], bad_got, bad_want,
                        rep.n_mismatches, rep.n_components);
    return SPX_OK;
}

/* ======================================================================
 * Writer
 * ====================================================================== */

struct spx_trdc_writer {
    char *path, *tmp;
    int fd;              /* -1 once closed */
    int dead;            /* an error happened: temp removed, only abort/finish */
    uint64_t pos;        /* bytes written so far */
    cJSON *tensors;      /* manifest "tensors" array, built as we go */
    nameset names;       /* keys: name strings inside `tensors` */
    int any_tiled;       /* a tiled matrix was added: the file is version 2, else 1 */
};

/* The version a file gets: 1 (readable by every reader) unless a matrix
 * uses a layout that came with version 2. */
static unsigned writer_version(const spx_trdc_writer *w) { return w->any_tiled ? 2u : 1u; }

static const uint8_t k_zeros[SPX_TRDC_ALIGN];

/* Marks the writer dead: closes and deletes the temp file. */
static void writer_kill(spx_trdc_writer *w) {
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    if (w->tmp) unlink(w->tmp);
    w->dead = 1;
}

static spx_status writer_io_fail(spx_trdc_writer *w, const char *what, int err, spx_err *e) {
    char at[48] = "";
    if (!strcmp(what, "writing")) snprintf(at, sizeof at, " at byte %llu", (unsigned long long)w->pos);
    spx_fail(e, SPX_ERR_IO, "%s: %s temp file %s%s failed: %s%s", w->path, what, w->tmp, at,
             strerror(err),
             err == ENOSPC || err == EDQUOT ? " (the disk is full; the partial file was removed)"
                                            : " (the partial file was removed)");
    writer_kill(w);
    return SPX_ERR_IO;
}

static spx_status writer_arg_fail(spx_trdc_writer *w, spx_err *e, const char *fmt, ...)
    SPX_PRINTF(3, 4);
static spx_status writer_arg_fail(spx_trdc_writer *w, spx_err *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    spx_vfail(e, SPX_ERR_ARG, fmt, ap);
    va_end(ap);
    writer_kill(w);
    return SPX_ERR_ARG;
}

static spx_status writer_write(spx_trdc_writer *w, const void *data, size_t n, uLong *crc,
                               spx_err *e) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t k = n < TRDC_CRC_CHUNK ? n : TRDC_CRC_CHUNK;
        if (crc) *crc = crc32(*crc, p, (uInt)k);
        size_t done = 0;
        while (done < k) {
            ssize_t r = write(w->fd, p + done, k - done);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return writer_io_fail(w, "writing", r < 0 ? errno : EIO, e);
            done += (size_t)r;
            w->pos += (uint64_t)r;
        }
        p += k;
        n -= k;
    }
    return SPX_OK;
}

spx_status spx_trdc_writer_open(const char *path, spx_trdc_writer **out, spx_err *e) {
    if (!out || !path || !*path) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_open: no path");
    *out = NULL;
    spx_trdc_writer *w = calloc(1, sizeof *w);
    size_t tl = strlen(path) + 32;
    if (!w || !(w->path = spx_strdup(path)) || !(w->tmp = malloc(tl)) ||
        !(w->tensors = cJSON_CreateArray())) {
        if (w) {
            free(w->path);
            free(w->tmp);
            free(w);
        }
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    }
    w->fd = -1;
    snprintf(w->tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        spx_fail(e, SPX_ERR_IO, "%s: cannot create temp file %s: %s", path, w->tmp, strerror(errno));
        cJSON_Delete(w->tensors);
        free(w->path);
        free(w->tmp);
        free(w);
        return SPX_ERR_IO;
    }
    uint8_t h[SPX_TRDC_HEADER_SIZE];
    memcpy(h, SPX_TRDC_MAGIC, 8);
    wr_le64(h + 8, SPX_TRDC_VERSION);
    wr_le64(h + 16, 0); /* placeholder: rewritten by finish */
    spx_status st = writer_write(w, h, sizeof h, NULL, e);
    if (st != SPX_OK) {
        spx_trdc_writer_abort(w);
        return st;
    }
    *out = w;
    return SPX_OK;
}

uint64_t spx_trdc_writer_bytes(const spx_trdc_writer *w) { return w->pos; }

/* Starts a manifest entry: checks the name and creates the object. */
static spx_status writer_begin(spx_trdc_writer *w, const char *name, const char *kind,
                               cJSON **jt, spx_err *e) {
    if (w->dead)
        return spx_fail(e, SPX_ERR_ARG, "%s: the writer failed earlier and cannot be used", w->path);
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl > SPX_TRDC_MAX_NAME)
        return writer_arg_fail(w, e, "%s: tensor name must be 1..%d bytes (got %zu)", w->path,
                               SPX_TRDC_MAX_NAME, nl);
    if (utf8_bad_at((const uint8_t *)name, nl) != nl)
        return writer_arg_fail(w, e, "%s: tensor name '%s' is not valid UTF-8", w->path, name);
    size_t dummy;
    if (nameset_find(&w->names, name, &dummy))
        return writer_arg_fail(w, e, "%s: tensor '%s' added twice", w->path, name);
    if (w->names.n >= SPX_TRDC_MAX_TENSORS)
        return writer_arg_fail(w, e, "%s: more than %u tensors", w->path, SPX_TRDC_MAX_TENSORS);
    cJSON *o = cJSON_CreateObject();
    cJSON *jn = o ? cJSON_AddStringToObject(o, "name", name) : NULL;
    if (!jn || !cJSON_AddStringToObject(o, "kind", kind)) {
        cJSON_Delete(o);
        writer_kill(w);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    *jt = o;
    return SPX_OK;
}

/* Writes one component at the next aligned offset and records it. */
static spx_status writer_component(spx_trdc_writer *w, cJSON *jcomps, spx_trdc_comp c,
                                   const void *data, uint64_t size, spx_err *e) {
    uint64_t pad = (SPX_TRDC_ALIGN - w->pos % SPX_TRDC_ALIGN) % SPX_TRDC_ALIGN;
    if (w->pos + pad + size > TRDC_MAX_U53)
        return writer_arg_fail(w, e, "%s: file would exceed 2^53 bytes", w->path);
    SPX_TRY(writer_write(w, k_zeros, (size_t)pad, NULL, e));
    uint64_t off = w->pos;
    uLong crc = crc32(0L, Z_NULL, 0);
    SPX_TRY(writer_write(w, data, (size_t)size, &crc, e));
    cJSON *o = cJSON_AddObjectToObject(jcomps, k_comp_names[c]);
    if (!o || !cJSON_AddNumberToObject(o, "offset", (double)off) ||
        !cJSON_AddNumberToObject(o, "size", (double)size) ||
        !cJSON_AddNumberToObject(o, "crc32", (double)(uint32_t)crc)) {
        writer_kill(w);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    return SPX_OK;
}

/* Adds the finished entry to the manifest and indexes its name. */
static spx_status writer_commit(spx_trdc_writer *w, cJSON *jt, spx_err *e) {
    cJSON_AddItemToArray(w->tensors, jt);
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(jt, "name");
    if (nameset_put(&w->names, jn->valuestring, w->names.n, NULL) < 0) {
        writer_kill(w);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    return SPX_OK;
}

static cJSON *shape_json(int ndim, const int64_t *shape) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < ndim; i++) {
        cJSON *v = cJSON_CreateNumber((double)shape[i]);
        if (!v) {
            cJSON_Delete(a);
            return NULL;
        }
        cJSON_AddItemToArray(a, v);
    }
    return a;
}

spx_status spx_trdc_writer_add_dense(spx_trdc_writer *w, const char *name, spx_dtype dtype,
                                     int ndim, const int64_t *shape, const void *data,
                                     size_t nbytes, spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_add_dense: writer is NULL");
    cJSON *jt;
    SPX_TRY(writer_begin(w, name, "dense", &jt, e));
    spx_status st = SPX_OK;
    uint64_t numel = 1, want = 0;
    if (!dense_dtype_ok(dtype)) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': dtype %s not allowed (F32, F16 or BF16)",
                             w->path, name, spx_dtype_name(dtype));
        goto out;
    }
    if (ndim < 1 || ndim > SPX_TRDC_MAX_DIMS || !shape) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': ndim %d, expected 1..%d", w->path, name, ndim,
                             SPX_TRDC_MAX_DIMS);
        goto out;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 1 || shape[i] > SPX_TRDC_MAX_DIM ||
            __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > (uint64_t)INT64_MAX) {
            st = writer_arg_fail(w, e, "%s: tensor '%s': shape[%d] = %lld out of range or overflowing",
                                 w->path, name, i, (long long)shape[i]);
            goto out;
        }
    if (__builtin_mul_overflow(numel, (uint64_t)spx_dtype_size(dtype), &want) || want != nbytes ||
        !data) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': %zu bytes given, expected %llu for its shape and %s",
                             w->path, name, nbytes, (unsigned long long)want, spx_dtype_name(dtype));
        goto out;
    }
    cJSON *js = shape_json(ndim, shape), *jc = NULL;
    if (!js || !cJSON_AddStringToObject(jt, "dtype", spx_dtype_name(dtype)) ||
        !cJSON_AddItemToObject(jt, "shape", js) || !(jc = cJSON_AddObjectToObject(jt, "components"))) {
        if (js && !cJSON_GetObjectItemCaseSensitive(jt, "shape")) cJSON_Delete(js);
        writer_kill(w);
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    st = writer_component(w, jc, SPX_TRDC_C_DATA, data, nbytes, e);
    if (st == SPX_OK) return writer_commit(w, jt, e);
out:
    cJSON_Delete(jt);
    return st;
}

spx_status spx_trdc_writer_add_quant(spx_trdc_writer *w, const char *name, const spx_qtensor *q,
                                     double kappa, double r, spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_add_quant: writer is NULL");
    cJSON *jt;
    SPX_TRY(writer_begin(w, name, "quant", &jt, e));
    spx_status st = SPX_OK;
    uint64_t sz[SPX_TRDC_C_COUNT];
    const char *why = q ? quant_sizes(q->rows, q->cols, q->bits, q->group, q->n_outliers, q->layout, sz)
                        : "no tensor given";
    if (why) {
        st = writer_arg_fail(w, e, "%s: tensor '%s': %s", w->path, name, why);
        goto out;
    }
    const void *buf[SPX_TRDC_C_COUNT] = {NULL, q->codes, q->scales, q->zeros, q->outlier_idx,
                                         q->outlier_val};
    for (int c = 1; c < SPX_TRDC_C_COUNT; c++)
        if (sz[c] && !buf[c]) {
            st = writer_arg_fail(w, e, "%s: tensor '%s': component %s is NULL", w->path, name,
                                 k_comp_names[c]);
            goto out;
        }
    for (int64_t j = 0; j < q->n_outliers; j++)
        if (q->outlier_idx[j] < 0 || q->outlier_idx[j] >= q->cols ||
            (j > 0 && q->outlier_idx[j] <= q->outlier_idx[j - 1])) {
            st = writer_arg_fail(w, e,
                                 "%s: tensor '%s': outlier_idx[%lld] = %d: indices must be strictly "
                                 "increasing and < cols %lld",
                                 w->path, name, (long long)j, q->outlier_idx[j], (long long)q->cols);
            goto out;
        }
    int64_t shp[2] = {q->rows, q->cols};
    cJSON *js = shape_json(2, shp), *jc = NULL;
    int ok = js && cJSON_AddItemToObject(jt, "shape", js);
    if (!ok) cJSON_Delete(js);
    ok = ok && (q->layout != SPX_Q_TILED || cJSON_AddStringToObject(jt, "layout", "tile16x128")) &&
         cJSON_AddNumberToObject(jt, "bits", q->bits) &&
         cJSON_AddNumberToObject(jt, "group", q->group) &&
         cJSON_AddNumberToObject(jt, "n_outliers", (double)q->n_outliers) &&
         (isfinite(kappa) ? cJSON_AddNumberToObject(jt, "kappa", kappa) != NULL
                          : cJSON_AddNullToObject(jt, "kappa") != NULL) &&
         (isfinite(r) ? cJSON_AddNumberToObject(jt, "r", r) != NULL
                      : cJSON_AddNullToObject(jt, "r") != NULL) &&
         (jc = cJSON_AddObjectToObject(jt, "components")) != NULL;
    if (!ok) {
        writer_kill(w);
        st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        goto out;
    }
    for (int c = 1; c < SPX_TRDC_C_COUNT && st == SPX_OK; c++)
        if (sz[c]) st = writer_component(w, jc, (spx_trdc_comp)c, buf[c], sz[c], e);
    if (st == SPX_OK) {
        if (q->layout == SPX_Q_TILED) w->any_tiled = 1;
        return writer_commit(w, jt, e);
    }
out:
    cJSON_Delete(jt);
    return st;
}

static void writer_free(spx_trdc_writer *w) {
    cJSON_Delete(w->tensors);
    nameset_free(&w->names);
    free(w->path);
    free(w->tmp);
    free(w);
}

void spx_trdc_writer_abort(spx_trdc_writer *w) {
    if (!w) return;
    writer_kill(w);
    writer_free(w);
}

/* fsync of the directory holding path, so the rename itself is durable.
 * Best effort: some filesystems refuse fsync on directories. */
static void fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, (size_t)(slash - path) + (slash == path)) : spx_strdup(".");
    if (!dir) return;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

/* Adds verbatim JSON object text (checked) under key. */
static spx_status add_raw_object(spx_trdc_writer *w, cJSON *root, const char *key,
                                 const char *text, spx_err *e) {
    char what[64];
    snprintf(what, sizeof what, "the %s JSON", key);
    /* A byte order mark would be skipped by a parser at the start of a
     * document but is invalid inside the manifest: drop it. */
    if (!strncmp(text, "\xEF\xBB\xBF", 3)) text += 3;
    /* -2: the manifest root and this key's object add levels around it */
    SPX_TRY(check_json_object_text(what, w->path, text, SPX_TRDC_MAX_DEPTH - 2, e));
    if (!cJSON_AddItemToObject(root, key, cJSON_CreateRaw(text)))
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    return SPX_OK;
}

static spx_status writer_build_manifest(spx_trdc_writer *w, const char *config_json,
                                        const char *tok_json, const char *tok_cfg_json,
                                        const char *quant_json, const char *source_json,
                                        char **out, spx_err *e) {
    *out = NULL;
    if (!config_json)
        return spx_fail(e, SPX_ERR_ARG, "%s: no config JSON given (it is required)", w->path);
    cJSON *root = cJSON_CreateObject();
    if (!root || !cJSON_AddStringToObject(root, "format", SPX_TRDC_MAGIC) ||
        !cJSON_AddNumberToObject(root, "version", writer_version(w)) ||
        !cJSON_AddStringToObject(root, "generator", "spectra")) {
        cJSON_Delete(root);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
    }
    spx_status st = add_raw_object(w, root, "config", config_json, e);
    if (st == SPX_OK && (tok_json || tok_cfg_json)) {
        cJSON *jt = cJSON_AddObjectToObject(root, "tokenizer");
        const char *keys[2] = {"tokenizer.json", "tokenizer_config.json"};
        const char *vals[2] = {tok_json, tok_cfg_json};
        if (!jt) st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        for (int k = 0; k < 2 && st == SPX_OK; k++) {
            if (!vals[k]) continue;
            size_t n = strlen(vals[k]), bad = utf8_bad_at((const uint8_t *)vals[k], n);
            if (bad != n)
                st = spx_fail(e, SPX_ERR_ARG, "%s: %s is not valid UTF-8 (byte %zu)", w->path,
                              keys[k], bad);
            else if (!cJSON_AddStringToObject(jt, keys[k], vals[k]))
                st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", w->path);
        }
    }
    if (st == SPX_OK) st = add_raw_object(w, root, "quantization", quant_json ? quant_json : "{}", e);
    if (st == SPX_OK && source_json) st = add_raw_object(w, root, "source", source_json, e);
    if (st == SPX_OK) {
        cJSON_AddItemToObject(root, "tensors", w->tensors);
        w->tensors = NULL; /* owned by root now */
        *out = cJSON_PrintUnformatted(root);
        if (!*out) st = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory printing the manifest", w->path);
    }
    cJSON_Delete(root);
    return st;
}

spx_status spx_trdc_writer_finish(spx_trdc_writer *w, const char *config_json,
                                  const char *tokenizer_json, const char *tokenizer_config_json,
                                  const char *quant_settings_json, const char *source_info_json,
                                  spx_err *e) {
    if (!w) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_writer_finish: writer is NULL");
    if (w->dead) {
        spx_status st = spx_fail(e, SPX_ERR_ARG, "%s: the writer failed earlier; nothing was written",
                                 w->path);
        spx_trdc_writer_abort(w);
        return st;
    }
    char *man = NULL;
    spx_status st = writer_build_manifest(w, config_json, tokenizer_json, tokenizer_config_json,
                                          quant_settings_json, source_info_json, &man, e);
    size_t mlen = man ? strlen(man) : 0;
    if (st == SPX_OK && mlen > SPX_TRDC_MAX_MANIFEST)
        st = spx_fail(e, SPX_ERR_RANGE, "%s: manifest is %zu bytes, above the %llu-byte limit",
                      w->path, mlen, (unsigned long long)SPX_TRDC_MAX_MANIFEST);
    if (st == SPX_OK) st = writer_write(w, man, mlen, NULL, e);
    free(man);
    if (st == SPX_OK) {
        uint8_t h[SPX_TRDC_HEADER_SIZE];
        memcpy(h, SPX_TRDC_MAGIC, 8);
        wr_le64(h + 8, writer_version(w));
        wr_le64(h + 16, (uint64_t)mlen);
        ssize_t r;
        do r = pwrite(w->fd, h, sizeof h, 0);
        while (r < 0 && errno == EINTR);
        if (r != (ssize_t)sizeof h) st = writer_io_fail(w, "rewriting the header of", r < 0 ? errno : EIO, e);
    }
    if (st == SPX_OK && fsync(w->fd) != 0) st = writer_io_fail(w, "flushing", errno, e);
    if (st == SPX_OK) {
        int rc = close(w->fd);
        w->fd = -1;
        if (rc != 0) st = writer_io_fail(w, "closing", errno, e);
    }
    if (st == SPX_OK && rename(w->tmp, w->path) != 0)
        st = writer_io_fail(w, "renaming", errno, e);
    if (st == SPX_OK) fsync_parent(w->path);
    if (st == SPX_OK) writer_free(w);
    else spx_trdc_writer_abort(w);
    return st;
}
