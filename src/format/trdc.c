/* trdc.c: TRDC4B01 container reader and CRC verifier. The streaming
 * writer is trdc_write.c; what both share, trdc_common.c (trdc_impl.h).
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
#include "format/trdc_impl.h"

#include "core/mapfile.h"
#include "core/util.h"
#include "quant/g32.h"
#include "refine/bundle.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static uint64_t rd_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
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
    spx_trdc_contents_kind contents;
    spx_trdc_tensor *tensors;
    size_t n;
    trdc_nameset names;
    uint8_t *repacked;      /* version 1-2 files: the 2-/3-bit codes in the current packing */
    spx_trdc_tuned *tuned;  /* the manifest's "tuned" entries (trdc_tuned.c) */
    size_t n_tuned;
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
    int put = trdc_nameset_put(&f->names, N, i, &prev);
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
    else if (!strcmp(jk->valuestring, "refine4")) t->kind = SPX_TRDC_REFINE;
    else if (!strcmp(jk->valuestring, "bundle4")) t->kind = SPX_TRDC_BUNDLE;
    else
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: tensor '%s': unknown kind '%.60s' (expected \"dense\", \"quant\", \"refine4\" or "
                        "\"bundle4\")",
                        L, N, jk->valuestring);
    if (t->kind == SPX_TRDC_BUNDLE && f->version < 5)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': kind bundle4 in a version %llu file (bundle4 came with "
                                           "version 5)", L, N, (unsigned long long)f->version);
    /* refine4 (version 4) and bundle4 (version 5) tensors are what a
     * .refine holds, and all it holds */
    const int refine_kind = t->kind == SPX_TRDC_REFINE || t->kind == SPX_TRDC_BUNDLE;
    if (refine_kind != (f->contents == SPX_TRDC_CONTENTS_REFINE))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s' of kind %s in a file whose contents are %s", L, N,
                        jk->valuestring, f->contents == SPX_TRDC_CONTENTS_REFINE ? "\"refine\"" : "a model");

    /* shape */
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(jt, "shape");
    if (!cJSON_IsArray(js))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'shape' is %s, expected an array", L,
                        N, jdesc(js, b1, sizeof b1));
    int nd = cJSON_GetArraySize(js);
    const int mat = t->kind != SPX_TRDC_DENSE;
    int lo = mat ? 2 : 1, hi = mat ? 2 : SPX_TRDC_MAX_DIMS;
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
        if (!trdc_dense_dtype_ok(dt))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': dtype '%.20s' is not allowed (expected F32, F16 or BF16)",
                            L, N, jd->valuestring);
        t->dtype = dt;
        if (__builtin_mul_overflow(numel, (uint64_t)spx_dtype_size(dt), &want[SPX_TRDC_C_DATA]))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': byte size overflows", L, N);
    } else if (t->kind == SPX_TRDC_REFINE) {
        t->dtype = SPX_DT_COUNT;
        const int64_t rows = t->shape[0], cols = t->shape[1], cb = (rows + 1) / 2;
        const cJSON *jcs = cJSON_GetObjectItemCaseSensitive(jt, "col_stride");
        const cJSON *jbc = cJSON_GetObjectItemCaseSensitive(jt, "base_crc32");
        int64_t cs, bc;
        if (!jint(jcs, cb, SPX_TRDC_MAX_DIM, &cs))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': 'col_stride' is %s, expected an integer >= (rows + 1) / 2 = %lld", L, N,
                            jdesc(jcs, b1, sizeof b1), (long long)cb);
        if (jbc && !jint(jbc, 0, 0xFFFFFFFFll, &bc))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': 'base_crc32' is %s, expected an integer in [0, 2^32-1]",
                            L, N, jdesc(jbc, b1, sizeof b1));
        if (__builtin_mul_overflow((uint64_t)cols, (uint64_t)cs, &want[SPX_TRDC_C_CODES]) ||
            want[SPX_TRDC_C_CODES] > TRDC_MAX_U53)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': byte size overflows", L, N);
        want[SPX_TRDC_C_SCALES] = (uint64_t)rows * 4;
        t->refine.col_stride = cs;
        t->refine.has_base_crc = jbc != NULL;
        t->refine.base_crc32 = jbc ? (uint32_t)bc : 0;
    } else if (t->kind == SPX_TRDC_BUNDLE) { /* [intermediate, hidden] */
        t->dtype = SPX_DT_COUNT;
        const int64_t n = t->shape[0], H = t->shape[1], bb = spx_bundle_bytes(H);
        const cJSON *jbs = cJSON_GetObjectItemCaseSensitive(jt, "bundle_stride");
        int64_t bs;
        if (!jint(jbs, bb, SPX_TRDC_MAX_DIM, &bs))
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: tensor '%s': 'bundle_stride' is %s, expected an integer >= %lld (one bundle of "
                            "hidden %lld, refine/bundle.h)",
                            L, N, jdesc(jbs, b1, sizeof b1), (long long)bb, (long long)H);
        if (__builtin_mul_overflow((uint64_t)n, (uint64_t)bs, &want[SPX_TRDC_C_CODES]) ||
            want[SPX_TRDC_C_CODES] > TRDC_MAX_U53)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '%s': byte size overflows", L, N);
        want[SPX_TRDC_C_SCALES] = (uint64_t)H * 8;
        t->refine.col_stride = bs;
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
        const char *why = trdc_quant_sizes(t->shape[0], t->shape[1], bits, group, nout, layout, f->version, want);
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
        while (c < SPX_TRDC_C_COUNT && strcmp(it->string, trdc_comp_names[c]) != 0) c++;
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
        const char *C = trdc_comp_names[c];
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
    if (t->kind == SPX_TRDC_REFINE || t->kind == SPX_TRDC_BUNDLE) { /* components start 4096-aligned: the floats are aligned */
        t->refine.codes = b + t->comp[SPX_TRDC_C_CODES].offset;
        t->refine.scales = (const float *)(b + t->comp[SPX_TRDC_C_SCALES].offset);
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

/* Version 1 and 2 files stored 2- and 3-bit codes in the 4-bit group
 * order (qpack.c, spx_q_repack_legacy_row). Their codes are repacked once,
 * here, into one block the handle owns, and the views point there, so
 * every consumer reads one packing; the file itself (and what verify
 * checks) is unchanged. The only copy the reader makes; a version-3 file
 * never takes it. */
static spx_status repack_legacy(spx_trdc *f, spx_err *e) {
    if (f->version >= 3) return SPX_OK;
    uint64_t total = 0;
    for (size_t i = 0; i < f->n; i++) {
        const spx_qtensor *q = &f->tensors[i].q;
        if (f->tensors[i].kind == SPX_TRDC_QUANT && q->bits != 4)
            total += (uint64_t)spx_q_codes_bytes(q->rows, q->cols, q->bits, q->layout);
    }
    if (total == 0) return SPX_OK;
    if (total > SIZE_MAX || !(f->repacked = malloc((size_t)total)))
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory repacking %llu bytes of version-%llu 2-/3-bit codes",
                        f->label, (unsigned long long)total, (unsigned long long)f->version);
    uint8_t *dst = f->repacked;
    for (size_t i = 0; i < f->n; i++) {
        spx_qtensor *q = &f->tensors[i].q;
        if (f->tensors[i].kind != SPX_TRDC_QUANT || q->bits == 4) continue;
        const int64_t orb = spx_q_legacy_codes_row_bytes(q->cols, q->bits), nrb = spx_q_codes_row_bytes(q->cols, q->bits);
        for (int64_t r = 0; r < q->rows; r++) spx_q_repack_legacy_row(q->codes + r * orb, q->cols, q->bits, q->group, dst + r * nrb);
        q->codes = dst;
        dst += q->rows * nrb;
    }
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
                          f->label, f->tensors[s[j - 1].tensor].name, trdc_comp_names[s[j - 1].comp],
                          (unsigned long long)s[j - 1].off,
                          (unsigned long long)(s[j - 1].off + s[j - 1].size),
                          f->tensors[s[j].tensor].name, trdc_comp_names[s[j].comp],
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

    size_t bad = trdc_utf8_bad_at(m, len);
    if (bad != len)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest is not valid UTF-8 (bad byte 0x%02x at manifest byte %zu)", L,
                        m[bad], bad);
    if (trdc_json_depth(m, len, SPX_TRDC_MAX_DEPTH, &at) > SPX_TRDC_MAX_DEPTH)
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
    const cJSON *jct = cJSON_GetObjectItemCaseSensitive(r, "contents");
    f->contents = SPX_TRDC_CONTENTS_MODEL;
    if (jct) {
        if (f->version < 4 || !cJSON_IsString(jct) ||
            (strcmp(jct->valuestring, "refine") != 0 && strcmp(jct->valuestring, "model") != 0))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'contents' is %s, expected \"model\" or \"refine\" (version 4)",
                            L, jdesc(jct, b1, sizeof b1));
        if (!strcmp(jct->valuestring, "refine")) f->contents = SPX_TRDC_CONTENTS_REFINE;
    }
    SPX_TRY(trdc_tuned_parse(L, r, f->contents, &f->tuned, &f->n_tuned, e));
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
    return repack_legacy(f, e);
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

spx_status spx_trdc_make_resident(spx_trdc *f, spx_err *e) {
    return f->map.data ? spx_map_make_resident(&f->map, e) : SPX_OK;
}

int spx_trdc_resident(const spx_trdc *f) { return !f->map.data || f->map.resident; }

void spx_trdc_close(spx_trdc *f) {
    if (!f) return;
    cJSON_Delete(f->root);
    free(f->tensors);
    free(f->repacked);
    free(f->tuned);
    trdc_nameset_free(&f->names);
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
const cJSON *trdc_root(const spx_trdc *f) { return f->root; }
size_t spx_trdc_tuned_count(const spx_trdc *f) { return f->n_tuned; }
const spx_trdc_tuned *spx_trdc_tuned_at(const spx_trdc *f, size_t i) { return i < f->n_tuned ? &f->tuned[i] : NULL; }

const spx_trdc_tensor *spx_trdc_at(const spx_trdc *f, size_t i) {
    return i < f->n ? &f->tensors[i] : NULL;
}

const spx_trdc_tensor *spx_trdc_find(const spx_trdc *f, const char *name) {
    size_t i;
    return name && trdc_nameset_find(&f->names, name, &i) ? &f->tensors[i] : NULL;
}

const struct cJSON *spx_trdc_config(const spx_trdc *f) { return f->config; }
const struct cJSON *spx_trdc_quant_settings(const spx_trdc *f) { return f->quant; }
const struct cJSON *spx_trdc_source(const spx_trdc *f) { return f->source; }
char *spx_trdc_config_json(const spx_trdc *f) { return cJSON_PrintUnformatted(f->config); }
const char *spx_trdc_tokenizer_json(const spx_trdc *f) { return f->tok_json; }
const char *spx_trdc_tokenizer_config_json(const spx_trdc *f) { return f->tok_cfg_json; }
const char *spx_trdc_generator(const spx_trdc *f) { return f->generator; }
spx_trdc_contents_kind spx_trdc_contents(const spx_trdc *f) { return f->contents; }

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
                        f->label, bad_t->name, trdc_comp_names[bad_c], bad_got, bad_want,
                        rep.n_mismatches, rep.n_components);
    return SPX_OK;
}
