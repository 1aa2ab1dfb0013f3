/* safetensors.c: reader for safetensors checkpoints (single file, one file
 * in a folder, or shards listed by model.safetensors.index.json).
 *
 * Every byte of the input is hostile. The order of checks:
 *   1. the 8-byte little-endian header length N: 8 + N <= file size and
 *      N <= SPX_ST_MAX_HEADER;
 *   2. the header bytes: valid UTF-8, no control bytes, no \u0000 escapes
 *      (names are C strings), nesting <= ST_MAX_DEPTH, a bounded number of
 *      JSON values (json_prescan, before cJSON sees anything);
 *   3. the JSON: an object whose members are tensors (dtype known, shape of
 *      <= SPX_ST_MAX_DIMS integers in [0, 2^53), element count and byte
 *      count overflow-checked, data_offsets two integers with
 *      begin <= end <= data size and end - begin == bytes of the shape)
 *      and an optional "__metadata__" object of strings;
 *   4. per file: no two non-empty tensors overlap (sorted by begin);
 *   5. over all files: names unique (sorted by name, which also serves
 *      spx_st_find with bsearch).
 * Gaps between tensors are allowed (the reference implementation demands
 * a packed data section; we only need each tensor to be well defined).
 *
 * Limits: JSON numbers go through cJSON's doubles, so offsets and
 * dimensions must be below 2^53 (9 PB); host byte order must be little
 * endian (the tensor data are used in place). */
#include "format/safetensors.h"

#include "core/half.h"
#include "core/mapfile.h"
#include "core/util.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data are little endian and used in place"
#endif

#define ST_MAX_DEPTH 64                 /* a real header nests 3 deep */
#define ST_MAX_JSON_VALUES (16u << 20)  /* ~1 GB of cJSON nodes at most */
#define ST_MAX_INDEX (64u << 20)        /* model.safetensors.index.json cap */
#define ST_MAX_INT 9007199254740992.0   /* 2^53: doubles are exact below */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"
#define ST_EXT ".safetensors"
/* Tensor names come from the file and can be megabytes long: messages
 * print at most this many bytes of one. */
#define NM "%.200s"

struct spx_st {
    spx_st_tensor *t;   /* sorted by name after st_finalize */
    size_t n, cap;
    spx_map *maps;      /* one per opened file; paths label their tensors */
    size_t n_maps;
    char *label;        /* spx_st_open_buffer's label (owned) */
};

/* ---------------------------------------------------------------- helpers */

static const char *json_kind(const cJSON *v) {
    if (cJSON_IsObject(v)) return "object";
    if (cJSON_IsArray(v)) return "array";
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsNumber(v)) return "number";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    return "value";
}

static void fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t k = 0;
    k += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* Index of the first byte that is not valid UTF-8 (overlong forms,
 * surrogates and code points above U+10FFFF are invalid), or n. */
static size_t utf8_invalid_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t need;
        uint8_t lo = 0x80, hi = 0xbf;   /* range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) need = 1;
        else if (c == 0xe0) { need = 2; lo = 0xa0; }
        else if (c == 0xed) { need = 2; hi = 0x9f; }
        else if (c >= 0xe1 && c <= 0xef) need = 2;
        else if (c == 0xf0) { need = 3; lo = 0x90; }
        else if (c == 0xf4) { need = 3; hi = 0x8f; }
        else if (c >= 0xf1 && c <= 0xf3) need = 3;
        else return i;
        if (n - i <= need) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80) return i;
        i += need + 1;
    }
    return n;
}

/* Checks JSON text before cJSON parses it: UTF-8, no raw control bytes
 * (JSON allows none inside strings and only whitespace outside), no
 * \u0000 escape (it would cut a name short and alias another), nesting
 * depth and the number of values bounded. `what` names the text in
 * messages ("header", "index"). */
static spx_status json_prescan(const char *text, size_t n, const char *label, const char *what,
                               spx_err *e) {
    const uint8_t *s = (const uint8_t *)text;
    size_t bad = utf8_invalid_at(s, n);
    if (bad < n)
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: %s is not valid UTF-8: byte 0x%02x at %s offset %zu", label, what,
                        s[bad], what, bad);
    int in_str = 0;
    size_t depth = 0, values = 1;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r')
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: %s has control byte 0x%02x at offset %zu, expected JSON text",
                            label, what, c, i);
        if (in_str) {
            if (c == '"') in_str = 0;
            else if (c == '\\' && i + 1 < n) {
                if (s[i + 1] == 'u' && n - i >= 6 && memcmp(s + i + 2, "0000", 4) == 0)
                    return spx_fail(e, SPX_ERR_FORMAT,
                                    "%s: %s has a \\u0000 escape at offset %zu; names must not "
                                    "contain NUL", label, what, i);
                i++;    /* skip the escaped character */
            }
            continue;
        }
        switch (c) {
        case '"': in_str = 1; break;
        case '[':
        case '{':
            if (++depth > ST_MAX_DEPTH)
                return spx_fail(e, SPX_ERR_FORMAT,
                                "%s: %s JSON nests deeper than %d levels at offset %zu "
                                "(a safetensors header needs 3)", label, what, ST_MAX_DEPTH, i);
            values++;
            break;
        case ']':
        case '}':
            if (depth > 0) depth--;
            break;
        case ',':
            if (++values > ST_MAX_JSON_VALUES)
                return spx_fail(e, SPX_ERR_FORMAT, "%s: %s has more than %u JSON values",
                                label, what, ST_MAX_JSON_VALUES);
            break;
        default: break;
        }
    }
    return SPX_OK;
}

/* Parses checked JSON text; trailing bytes may only be whitespace (the
 * format pads the header with spaces). */
static spx_status json_parse(const char *text, size_t n, const char *label, const char *what,
                             cJSON **out, spx_err *e) {
    *out = NULL;
    SPX_TRY(json_prescan(text, n, label, what, e));
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + n ? (size_t)(end - text) : 0;
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: %s is not valid JSON (error near offset %zu of %zu)",
                        label, what, at, n);
    }
    size_t at = end && end >= text && end <= text + n ? (size_t)(end - text) : n;
    for (size_t i = at; i < n; i++) {
        char c = text[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            cJSON_Delete(root);
            return spx_fail(e, SPX_ERR_FORMAT,
                            "%s: %s has bytes after its JSON value at offset %zu of %zu, expected "
                            "only space padding", label, what, i, n);
        }
    }
    if (!cJSON_IsObject(root)) {
        spx_fail(e, SPX_ERR_FORMAT, "%s: %s is a JSON %s, expected an object", label, what,
                 json_kind(root));
        cJSON_Delete(root);
        return SPX_ERR_FORMAT;
    }
    *out = root;
    return SPX_OK;
}

/* A JSON integer in [0, 2^53). Returns 0, or why not: 1 not a number,
 * 2 not an integer, 3 negative, 4 too large. */
static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return 1;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d)) return 2;
    if (d < 0) return 3;
    if (d >= ST_MAX_INT) return 4;
    *out = (uint64_t)d;
    return 0;
}

static const char *json_uint_why(int r) {
    switch (r) {
    case 1: return "not a number";
    case 2: return "not an integer";
    case 3: return "negative";
    default: return "2^53 or more";
    }
}

/* ------------------------------------------------------- one header entry */

/* Safetensors dtypes that are valid but that Spectra does not load. */
static int dtype_known_unsupported(const char *s) {
    static const char *names[] = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
                                  "U16", "U32", "U64", "C64"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i]) == 0) return 1;
    return 0;
}

static spx_status parse_entry(const cJSON *it, const char *label, const uint8_t *data,
                              size_t dsize, spx_st_tensor *t, spx_err *e) {
    const char *name = it->string;
    if (!cJSON_IsObject(it))
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: tensor '" NM "' is a JSON %s, expected an object with dtype, shape "
                        "and data_offsets", label, name, json_kind(it));
    const cJSON *dt = NULL, *sh = NULL, *off = NULL;
    for (const cJSON *f = it->child; f; f = f->next) {
        const cJSON **slot = NULL;
        if (strcmp(f->string, "dtype") == 0) slot = &dt;
        else if (strcmp(f->string, "shape") == 0) slot = &sh;
        else if (strcmp(f->string, "data_offsets") == 0) slot = &off;
        else continue;  /* unknown fields are ignored, as by the reference */
        if (*slot)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has field '%s' twice", label,
                            name, f->string);
        *slot = f;
    }
    const char *missing = !dt ? "dtype" : !sh ? "shape" : !off ? "data_offsets" : NULL;
    if (missing)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has no '%s'", label, name, missing);

    /* dtype */
    if (!cJSON_IsString(dt))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has dtype of JSON type %s, "
                        "expected a string", label, name, json_kind(dt));
    spx_dtype ty = spx_dtype_from_name(dt->valuestring);
    if (ty == SPX_DT_COUNT) {
        int unsup = dtype_known_unsupported(dt->valuestring);
        return spx_fail(e, unsup ? SPX_ERR_UNSUPPORTED : SPX_ERR_FORMAT,
                        "%s: tensor '" NM "' has %s dtype '%.40s', expected one of F32, F16, "
                        "BF16, F64, I64, I32, I16, I8, U8, BOOL", label, name,
                        unsup ? "unsupported" : "unknown", dt->valuestring);
    }

    /* shape */
    if (!cJSON_IsArray(sh))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has shape of JSON type %s, "
                        "expected an array", label, name, json_kind(sh));
    int ndim = 0;
    int64_t shape[SPX_ST_MAX_DIMS];
    for (const cJSON *d = sh->child; d; d = d->next) {
        if (ndim == SPX_ST_MAX_DIMS)
            return spx_fail(e, SPX_ERR_UNSUPPORTED, "%s: tensor '" NM "' has more than %d "
                            "dimensions (%d supported)", label, name, SPX_ST_MAX_DIMS,
                            SPX_ST_MAX_DIMS);
        uint64_t v = 0;
        int r = json_uint(d, &v);
        if (r == 3)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has negative dimension %d "
                            "= %.17g, expected >= 0", label, name, ndim, d->valuedouble);
        if (r)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has shape dimension %d "
                            "that is %s, expected an integer in [0, 2^53)", label, name, ndim,
                            json_uint_why(r));
        shape[ndim++] = (int64_t)v;
    }
    char shs[256];
    fmt_shape(shs, sizeof shs, shape, ndim);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has shape %s whose element "
                            "count overflows 64 bits", label, name, shs);
    size_t esize = spx_dtype_size(ty), nbytes;
    if ((uint64_t)numel > SIZE_MAX || !spx_mul_ok((size_t)numel, esize, &nbytes))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has shape %s of %s whose byte "
                        "count overflows", label, name, shs, spx_dtype_name(ty));

    /* data_offsets */
    if (!cJSON_IsArray(off))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has data_offsets of JSON type %s, "
                        "expected an array [begin, end]", label, name, json_kind(off));
    if (cJSON_GetArraySize(off) != 2)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has data_offsets of %d elements, "
                        "expected 2 ([begin, end])", label, name, cJSON_GetArraySize(off));
    uint64_t be[2];
    const cJSON *o = off->child;
    for (int i = 0; i < 2; i++, o = o->next) {
        int r = json_uint(o, &be[i]);
        if (r)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has data_offsets[%d] "
                            "that is %s, expected an integer in [0, 2^53)", label, name, i,
                            json_uint_why(r));
    }
    if (be[0] > be[1])
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has data_offsets [%llu, %llu]: "
                        "begin is after end", label, name, (unsigned long long)be[0],
                        (unsigned long long)be[1]);
    if (be[1] > dsize)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has data_offsets [%llu, %llu], "
                        "out of range: the data section has %zu bytes", label, name,
                        (unsigned long long)be[0], (unsigned long long)be[1], dsize);
    if (be[1] - be[0] != nbytes)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' has %llu bytes in data_offsets "
                        "[%llu, %llu], expected %zu for %s %s (size mismatch)", label, name,
                        (unsigned long long)(be[1] - be[0]), (unsigned long long)be[0],
                        (unsigned long long)be[1], nbytes, spx_dtype_name(ty), shs);

    memset(t, 0, sizeof *t);
    t->dtype = ty;
    t->ndim = ndim;
    memcpy(t->shape, shape, sizeof shape[0] * (size_t)ndim);
    t->numel = numel;
    t->data = data + be[0];
    t->nbytes = nbytes;
    t->file = label;
    return SPX_OK;
}

/* ------------------------------------------------------------ one image */

static spx_status st_push(spx_st *st, const spx_st_tensor *t, const char *label, spx_err *e) {
    if (st->n == st->cap) {
        size_t nc = st->cap ? st->cap * 2 : 64, bytes;
        if (!spx_mul_ok(nc, sizeof *st->t, &bytes))
            return spx_fail(e, SPX_ERR_NOMEM, "%s: too many tensors", label);
        spx_st_tensor *nt = realloc(st->t, bytes);
        if (!nt) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory for %zu tensors", label, nc);
        st->t = nt;
        st->cap = nc;
    }
    st->t[st->n++] = *t;
    return SPX_OK;
}

static int cmp_by_begin(const void *a, const void *b) {
    const spx_st_tensor *x = a, *y = b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py) return px < py ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Sorts t[0..n) (one file's tensors) by begin and rejects overlaps of
 * non-empty tensors. base: start of the data section, for messages. */
static spx_status check_overlap(spx_st_tensor *t, size_t n, const uint8_t *base,
                                const char *label, spx_err *e) {
    qsort(t, n, sizeof *t, cmp_by_begin);
    const spx_st_tensor *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        if (t[i].nbytes == 0) continue;
        if (prev) {
            size_t pb = (size_t)((const uint8_t *)prev->data - base), pe = pb + prev->nbytes;
            size_t b = (size_t)((const uint8_t *)t[i].data - base);
            if (b < pe)
                return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' at data_offsets [%zu, %zu] "
                                "overlaps tensor '" NM "' at [%zu, %zu]; expected begin >= %zu",
                                label, t[i].name, b, b + t[i].nbytes, prev->name, pb, pe, pe);
        }
        if (!prev || (const uint8_t *)t[i].data + t[i].nbytes >
                         (const uint8_t *)prev->data + prev->nbytes)
            prev = &t[i];
    }
    return SPX_OK;
}

static spx_status check_metadata(const cJSON *m, const char *label, spx_err *e) {
    if (!cJSON_IsObject(m))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: __metadata__ is a JSON %s, expected an object of "
                        "strings", label, json_kind(m));
    for (const cJSON *f = m->child; f; f = f->next)
        if (!cJSON_IsString(f))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: __metadata__ entry '" NM "' is a JSON %s, "
                            "expected a string", label, f->string, json_kind(f));
    return SPX_OK;
}

/* Parses one safetensors image and appends its tensors to st. label
 * must outlive st (it is stored as each tensor's `file`). */
static spx_status parse_image(spx_st *st, const uint8_t *buf, size_t len, const char *label,
                              spx_err *e) {
    if (len < 8)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: file is %zu bytes, expected at least 8 (the "
                        "header length); truncated?", label, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | buf[i];
    if (hlen > len - 8)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: header length %llu runs past the end of the file "
                        "(%zu bytes follow the length); truncated or not a safetensors file?",
                        label, (unsigned long long)hlen, len - 8);
    if (hlen > SPX_ST_MAX_HEADER)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: header length %llu exceeds the limit of %u bytes",
                        label, (unsigned long long)hlen, SPX_ST_MAX_HEADER);
    if (hlen == 0)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: header length is 0, expected a JSON object",
                        label);
    const char *hdr = (const char *)buf + 8;
    const uint8_t *data = buf + 8 + hlen;
    size_t dsize = len - 8 - (size_t)hlen;

    cJSON *root = NULL;
    SPX_TRY(json_parse(hdr, (size_t)hlen, label, "header", &root, e));
    spx_status s = SPX_OK;
    size_t first = st->n;
    int seen_meta = 0;
    for (const cJSON *it = root->child; it && s == SPX_OK; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            if (seen_meta++)
                s = spx_fail(e, SPX_ERR_FORMAT, "%s: __metadata__ appears twice", label);
            else
                s = check_metadata(it, label, e);
            continue;
        }
        spx_st_tensor t;
        s = parse_entry(it, label, data, dsize, &t, e);
        if (s != SPX_OK) break;
        t.name = spx_strdup(it->string);
        if (!t.name) {
            s = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
            break;
        }
        s = st_push(st, &t, label, e);
        if (s != SPX_OK) free((char *)t.name);
    }
    cJSON_Delete(root);
    if (s == SPX_OK && st->n > first)
        s = check_overlap(st->t + first, st->n - first, data, label, e);
    return s;
}

/* --------------------------------------------------------- whole handle */

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const spx_st_tensor *)a)->name, ((const spx_st_tensor *)b)->name);
}

/* Sorts by name (for bsearch) and rejects duplicates, within one file
 * (cJSON keeps repeated keys) or across shards. */
static spx_status st_finalize(spx_st *st, spx_err *e) {
    if (st->n) qsort(st->t, st->n, sizeof *st->t, cmp_by_name);
    for (size_t i = 1; i < st->n; i++)
        if (strcmp(st->t[i - 1].name, st->t[i].name) == 0) {
            const spx_st_tensor *a = &st->t[i - 1], *b = &st->t[i];
            if (a->file == b->file)
                return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' is a duplicate name: the "
                                "header lists it twice", b->file, b->name);
            return spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' is a duplicate name: it is "
                            "also in %s", b->file, b->name, a->file);
        }
    return SPX_OK;
}

void spx_st_free(spx_st *st) {
    if (!st) return;
    for (size_t i = 0; i < st->n; i++) free((char *)st->t[i].name);
    free(st->t);
    for (size_t i = 0; i < st->n_maps; i++) spx_map_close(&st->maps[i]);
    free(st->maps);
    free(st->label);
    free(st);
}

spx_status spx_st_open_buffer(const uint8_t *buf, size_t len, const char *label, spx_st **out,
                              spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_st_open_buffer: out is NULL");
    *out = NULL;
    if (!label) label = "<buffer>";
    if (!buf && len)
        return spx_fail(e, SPX_ERR_ARG, "%s: NULL buffer of %zu bytes", label, len);
    spx_st *st = calloc(1, sizeof *st);
    if (!st || !(st->label = spx_strdup(label))) {
        free(st);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", label);
    }
    spx_status s = parse_image(st, buf, len, st->label, e);
    if (s == SPX_OK) s = st_finalize(st, e);
    if (s != SPX_OK) {
        spx_st_free(st);
        return s;
    }
    *out = st;
    return SPX_OK;
}

/* Maps one file into st->maps[st->n_maps] (room already made) and parses
 * it. */
static spx_status open_file(spx_st *st, const char *path, spx_err *e) {
    spx_map *m = &st->maps[st->n_maps];
    SPX_TRY(spx_map_open(path, m, e));
    st->n_maps++;
    return parse_image(st, m->data, m->size, m->path, e);
}

static spx_status alloc_maps(spx_st *st, size_t n, const char *label, spx_err *e) {
    st->maps = calloc(n ? n : 1, sizeof *st->maps);
    if (!st->maps) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory for %zu files", label, n);
    return SPX_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from the index must name a file in the same folder. */
static int shard_name_ok(const char *s) {
    return *s && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

static spx_status open_index(spx_st *st, const char *dir, const char *ipath, spx_err *e) {
    char *text = NULL;
    size_t tlen = 0;
    SPX_TRY(spx_read_file(ipath, ST_MAX_INDEX, &text, &tlen, e));
    cJSON *root = NULL;
    const char **keys = NULL, **shards = NULL;
    size_t n = 0, n_shards = 0;
    spx_status s = json_parse(text, tlen, ipath, "index", &root, e);
    if (s != SPX_OK) goto done;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!wm) {
        s = spx_fail(e, SPX_ERR_FORMAT, "%s: no 'weight_map' object", ipath);
        goto done;
    }
    if (!cJSON_IsObject(wm)) {
        s = spx_fail(e, SPX_ERR_FORMAT, "%s: 'weight_map' is a JSON %s, expected an object",
                     ipath, json_kind(wm));
        goto done;
    }
    for (const cJSON *it = wm->child; it; it = it->next) {
        if (!cJSON_IsString(it)) {
            s = spx_fail(e, SPX_ERR_FORMAT, "%s: weight_map entry '" NM "' is a JSON %s, "
                         "expected a shard file name", ipath, it->string, json_kind(it));
            goto done;
        }
        if (!shard_name_ok(it->valuestring)) {
            s = spx_fail(e, SPX_ERR_FORMAT, "%s: weight_map entry '" NM "' names shard '%.200s'; "
                         "expected a file name in the same folder (no '/', '\\' or '..')",
                         ipath, it->string, it->valuestring);
            goto done;
        }
        n++;
    }
    if (n == 0) {
        s = spx_fail(e, SPX_ERR_FORMAT, "%s: 'weight_map' is empty", ipath);
        goto done;
    }
    keys = malloc(n * sizeof *keys);
    shards = malloc(n * sizeof *shards);
    if (!keys || !shards) {
        s = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", ipath);
        goto done;
    }
    size_t k = 0;
    for (const cJSON *it = wm->child; it; it = it->next, k++) {
        keys[k] = it->string;
        shards[k] = it->valuestring;
    }
    qsort(keys, n, sizeof *keys, cmp_str);
    for (size_t i = 1; i < n; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            s = spx_fail(e, SPX_ERR_FORMAT,
                         "%s: weight_map lists tensor '" NM "' twice (duplicate)",
                         ipath, keys[i]);
            goto done;
        }
    qsort(shards, n, sizeof *shards, cmp_str);
    for (size_t i = 0; i < n; i++)
        if (n_shards == 0 || strcmp(shards[n_shards - 1], shards[i]) != 0)
            shards[n_shards++] = shards[i];
    s = alloc_maps(st, n_shards, ipath, e);
    if (s != SPX_OK) goto done;
    /* maps[i] holds shards[i]: a tensor's file pointer tells its shard. */
    for (size_t i = 0; i < n_shards && s == SPX_OK; i++) {
        char *p = spx_path_join(dir, shards[i]);
        if (!p) {
            s = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", ipath);
            break;
        }
        if (!spx_file_exists(p))
            s = spx_fail(e, SPX_ERR_IO, "%s: shard '%s' is missing (%s not found)", ipath,
                         shards[i], p);
        else
            s = open_file(st, p, e);
        free(p);
    }
    if (s == SPX_OK) s = st_finalize(st, e);
    for (const cJSON *it = wm->child; it && s == SPX_OK; it = it->next) {
        const spx_st_tensor *t = spx_st_find(st, it->string);
        const char **sh = bsearch(&it->valuestring, shards, n_shards, sizeof *shards, cmp_str);
        const char *want = sh ? st->maps[sh - shards].path : "?";
        if (!t)
            s = spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' is listed in the index for shard "
                         "%s but not found there (missing)", ipath, it->string, want);
        else if (t->file != want)
            s = spx_fail(e, SPX_ERR_FORMAT, "%s: tensor '" NM "' is listed in the index for shard "
                         "%s but found in %s", ipath, it->string, want, t->file);
    }
done:
    free(keys);
    free(shards);
    cJSON_Delete(root);
    free(text);
    return s;
}

static int has_ext(const char *name) {
    size_t a = strlen(name), b = strlen(ST_EXT);
    return a > b && strcmp(name + a - b, ST_EXT) == 0;
}

/* The folder has no index and no model.safetensors: use its only
 * *.safetensors file. */
static spx_status open_only_file(spx_st *st, const char *dir, spx_err *e) {
    DIR *d = opendir(dir);
    if (!d) return spx_fail(e, SPX_ERR_IO, "%s: cannot list the folder", dir);
    char *found = NULL, *other = NULL;
    size_t count = 0;
    spx_status s = SPX_OK;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (!has_ext(de->d_name)) continue;
        char *p = spx_path_join(dir, de->d_name);
        if (!p) {
            s = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", dir);
            break;
        }
        if (!spx_file_exists(p)) {
            free(p);
            continue;
        }
        count++;
        if (!found) found = p;
        else if (!other) other = p;
        else free(p);
    }
    closedir(d);
    if (s == SPX_OK && count == 0)
        s = spx_fail(e, SPX_ERR_IO, "%s: no " ST_INDEX_NAME ", " ST_SINGLE_NAME " or other "
                     "*" ST_EXT " file in the folder", dir);
    else if (s == SPX_OK && count > 1)
        s = spx_fail(e, SPX_ERR_FORMAT, "%s: %zu *" ST_EXT " files (%s, %s, ...) and no "
                     ST_INDEX_NAME " saying how they fit together", dir, count, found, other);
    if (s == SPX_OK) s = alloc_maps(st, 1, dir, e);
    if (s == SPX_OK) s = open_file(st, found, e);
    if (s == SPX_OK) s = st_finalize(st, e);
    free(found);
    free(other);
    return s;
}

static int is_index_name(const char *path) {
    size_t a = strlen(path), b = strlen(".safetensors.index.json");
    return a >= b && strcmp(path + a - b, ".safetensors.index.json") == 0;
}

spx_status spx_st_open(const char *path, spx_st **out, spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_st_open: out is NULL");
    *out = NULL;
    if (!path) return spx_fail(e, SPX_ERR_ARG, "spx_st_open: path is NULL");
    spx_st *st = calloc(1, sizeof *st);
    if (!st) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    spx_status s = SPX_OK;
    if (spx_is_dir(path)) {
        char *ip = spx_path_join(path, ST_INDEX_NAME), *sp = spx_path_join(path, ST_SINGLE_NAME);
        if (!ip || !sp) s = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
        else if (spx_file_exists(ip)) s = open_index(st, path, ip, e);
        else if (spx_file_exists(sp)) {
            s = alloc_maps(st, 1, path, e);
            if (s == SPX_OK) s = open_file(st, sp, e);
            if (s == SPX_OK) s = st_finalize(st, e);
        } else
            s = open_only_file(st, path, e);
        free(ip);
        free(sp);
    } else if (is_index_name(path)) {
        /* the index itself: its shards are beside it */
        char *dir = spx_strdup(path);
        if (!dir) s = spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
        else {
            char *slash = strrchr(dir, '/');
            if (slash) slash[slash == dir ? 1 : 0] = '\0';
            else strcpy(dir, ".");
            s = open_index(st, dir, path, e);
        }
        free(dir);
    } else {
        s = alloc_maps(st, 1, path, e);
        if (s == SPX_OK) s = open_file(st, path, e);
        if (s == SPX_OK) s = st_finalize(st, e);
    }
    if (s != SPX_OK) {
        spx_st_free(st);
        return s;
    }
    *out = st;
    return SPX_OK;
}

/* ---------------------------------------------------------------- access */

size_t spx_st_count(const spx_st *st) { return st ? st->n : 0; }

const spx_st_tensor *spx_st_at(const spx_st *st, size_t i) {
    return st && i < st->n ? &st->t[i] : NULL;
}

static int cmp_key_tensor(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const spx_st_tensor *)elem)->name);
}

const spx_st_tensor *spx_st_find(const spx_st *st, const char *name) {
    if (!st || !name || st->n == 0) return NULL;
    return bsearch(name, st->t, st->n, sizeof *st->t, cmp_key_tensor);
}

float spx_st_get_f32(const spx_st_tensor *t, int64_t i) {
    assert(t && i >= 0 && i < t->numel);
    const uint8_t *p = t->data;
    uint16_t h;
    switch (t->dtype) {
    case SPX_DT_F32: {
        float v;
        memcpy(&v, p + (size_t)i * 4, 4);
        return v;
    }
    case SPX_DT_F16: memcpy(&h, p + (size_t)i * 2, 2); return spx_f16_to_f32(h);
    case SPX_DT_BF16: memcpy(&h, p + (size_t)i * 2, 2); return spx_bf16_to_f32(h);
    default: assert(0 && "spx_st_get_f32: dtype is not F32/F16/BF16"); return NAN;
    }
}

void spx_st_row_f32(const spx_st_tensor *t, int64_t off, int64_t n, float *out) {
    assert(t && off >= 0 && n >= 0 && off <= t->numel && n <= t->numel - off);
    const uint8_t *p = t->data;
    size_t cnt = (size_t)n;
    uint16_t h;
    switch (t->dtype) {
    case SPX_DT_F32:
        if (cnt) memcpy(out, p + (size_t)off * 4, cnt * 4);
        break;
    case SPX_DT_F16:
        p += (size_t)off * 2;
        for (size_t i = 0; i < cnt; i++) {
            memcpy(&h, p + 2 * i, 2);
            out[i] = spx_f16_to_f32(h);
        }
        break;
    case SPX_DT_BF16:
        p += (size_t)off * 2;
        for (size_t i = 0; i < cnt; i++) {
            memcpy(&h, p + 2 * i, 2);
            out[i] = spx_bf16_to_f32(h);
        }
        break;
    default:
        assert(0 && "spx_st_row_f32: dtype is not F32/F16/BF16");
        for (size_t i = 0; i < cnt; i++) out[i] = NAN;
    }
}
