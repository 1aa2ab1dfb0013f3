/* trdc_tuned.c: the "tuned" section of a .refine manifest (docs/trdc.md
 * §2.6): the refinement budgets `spectra tune` measured per platform and
 * slowdown budget (with the MLP mode and GPU schedule, optional keys), read (validated at open, like every other field) and
 * rewritten.
 *
 * Rewriting never touches the payload: the new file is the old one's bytes
 * [0, manifest offset) followed by the new manifest, so every component
 * keeps its offset and CRC32. It is written to "<path>.tmp.<pid>" in the
 * same directory (so the rename is atomic and cannot cross filesystems),
 * fsynced, opened and validated by the reader, and only then renamed over
 * the original (the directory fsynced after): a failure at any step leaves the original untouched and
 * removes the temp file. A process that has the old file mapped keeps
 * reading the old inode. */
#define _POSIX_C_SOURCE 200809L
#include "format/trdc_impl.h"

#include "core/util.h"
#include "spectra.h" /* SPX_REFINE_MLP_* */

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- reading ------------------------------------------------------------ */

static int num_in(const cJSON *v, double lo, double hi, double *out) {
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi) return 0;
    *out = v->valuedouble;
    return 1;
}

static int str_into(const cJSON *v, char *dst, size_t cap) {
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap) return 0;
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return 1;
}

static spx_status parse_entry(const char *L, const cJSON *o, const char *plat, size_t i, spx_trdc_tuned *t,
                              spx_err *e) {
    memset(t, 0, sizeof *t);
    if (!cJSON_IsObject(o))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu] is not an object", L, plat, i);
    memcpy(t->platform, plat, strlen(plat) + 1);
    const cJSON *jk = cJSON_GetObjectItemCaseSensitive(o, "k");
    int ok = num_in(cJSON_GetObjectItemCaseSensitive(o, "budget"), 0, 1, &t->budget) && t->budget > 0 && t->budget < 1;
    if (!ok)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: 'budget' must be a number in (0, 1)", L,
                        plat, i);
    if (!cJSON_IsArray(jk) || cJSON_GetArraySize(jk) != SPX_TRDC_TUNED_SETS)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: 'k' must be an array of %d integers", L,
                        plat, i, SPX_TRDC_TUNED_SETS);
    int s = 0;
    for (const cJSON *x = jk->child; x; x = x->next, s++) {
        double d;
        if (!num_in(x, 0, SPX_TRDC_TUNED_KMAX, &d) || d != floor(d))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: k[%d] must be an integer in [0, %d]", L,
                            plat, i, s, SPX_TRDC_TUNED_KMAX);
        t->k[s] = (int64_t)d;
    }
    if (!num_in(cJSON_GetObjectItemCaseSensitive(o, "slowdown"), -1, 1e6, &t->slowdown) ||
        !num_in(cJSON_GetObjectItemCaseSensitive(o, "kl"), 0, 1e9, &t->kl) ||
        !num_in(cJSON_GetObjectItemCaseSensitive(o, "kl_base"), 0, 1e9, &t->kl_base))
        return spx_fail(e, SPX_ERR_FORMAT,
                        "%s: manifest tuned['%s'][%zu]: 'slowdown' (>= -1), 'kl' and 'kl_base' (>= 0) must be finite "
                        "numbers", L, plat, i);
    if (!str_into(cJSON_GetObjectItemCaseSensitive(o, "date"), t->date, sizeof t->date))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: 'date' must be a string under %zu bytes", L,
                        plat, i, sizeof t->date);
    /* the optional mode and schedule (entries written before them have none) */
    const cJSON *jm = cJSON_GetObjectItemCaseSensitive(o, "mlp");
    if (jm && !(cJSON_IsString(jm) && (!strcmp(jm->valuestring, "channel") || !strcmp(jm->valuestring, "neuron"))))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: 'mlp' must be \"channel\" or \"neuron\"", L,
                        plat, i);
    t->mlp = jm && !strcmp(jm->valuestring, "neuron") ? SPX_REFINE_MLP_NEURON : SPX_REFINE_MLP_CHANNEL;
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(o, "kn");
    double d;
    if (t->mlp == SPX_REFINE_MLP_NEURON) {
        if (!num_in(jn, 0, SPX_TRDC_TUNED_KMAX, &d) || d != floor(d))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: a neuron entry needs 'kn', an integer in "
                            "[0, %d]", L, plat, i, SPX_TRDC_TUNED_KMAX);
        t->kn = (int64_t)d;
    } else if (jn)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: 'kn' belongs to a neuron entry ('mlp' is "
                        "channel)", L, plat, i);
    static const struct { const char *key; double hi; } sched[] = {{"cuda_blocks", 4096}, {"cuda_lag", 4}, {"cuda_lead", 4}};
    int32_t *dst[] = {&t->cuda_blocks, &t->cuda_lag, &t->cuda_lead};
    for (int j = 0; j < 3; j++) {
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(o, sched[j].key);
        if (!js) continue;
        if (!num_in(js, 0, sched[j].hi, &d) || d != floor(d))
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: '%s' must be an integer in [0, %g]", L,
                            plat, i, sched[j].key, sched[j].hi);
        *dst[j] = (int32_t)d;
    }
    const cJSON *jw = cJSON_GetObjectItemCaseSensitive(o, "windows");
    if (jw && !str_into(jw, t->windows, sizeof t->windows))
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'][%zu]: 'windows' must be a string under %zu bytes",
                        L, plat, i, sizeof t->windows);
    return SPX_OK;
}

spx_status trdc_tuned_parse(const char *L, const cJSON *root, spx_trdc_contents_kind contents, spx_trdc_tuned **out,
                            size_t *n_out, spx_err *e) {
    *out = NULL;
    *n_out = 0;
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(root, "tuned");
    if (!jt) return SPX_OK;
    if (contents != SPX_TRDC_CONTENTS_REFINE)
        return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest has 'tuned' (refinement budgets), which only a .refine holds", L);
    if (!cJSON_IsObject(jt)) return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tuned' is not an object", L);
    size_t n = 0, np = 0;
    for (const cJSON *p = jt->child; p; p = p->next) {
        for (const cJSON *q = p->next; q; q = q->next)
            if (!strcmp(p->string, q->string))
                return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tuned' has the platform '%s' twice", L, p->string);
        size_t pl = strlen(p->string);
        if (pl == 0 || pl >= SPX_TRDC_TUNED_NAME || trdc_utf8_bad_at((const uint8_t *)p->string, pl) != pl)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tuned': a platform name must be 1..%d bytes of UTF-8", L,
                            SPX_TRDC_TUNED_NAME - 1);
        int c = cJSON_IsArray(p) ? cJSON_GetArraySize(p) : -1;
        if (c < 1 || c > SPX_TRDC_TUNED_MAX_LEVELS)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s'] must be an array of 1..%d entries", L, p->string,
                            SPX_TRDC_TUNED_MAX_LEVELS);
        if (++np > SPX_TRDC_TUNED_MAX_PLATFORMS)
            return spx_fail(e, SPX_ERR_FORMAT, "%s: manifest 'tuned' has more than %d platforms", L,
                            SPX_TRDC_TUNED_MAX_PLATFORMS);
        n += (size_t)c;
    }
    spx_trdc_tuned *t = calloc(n ? n : 1, sizeof *t);
    if (!t) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory for the tuned entries", L);
    size_t k = 0;
    for (const cJSON *p = jt->child; p; p = p->next) {
        size_t first = k, i = 0;
        for (const cJSON *x = p->child; x; x = x->next, i++, k++) {
            spx_status st = parse_entry(L, x, p->string, i, &t[k], e);
            if (st == SPX_OK && k > first && !(t[k].budget > t[k - 1].budget))
                st = spx_fail(e, SPX_ERR_FORMAT, "%s: manifest tuned['%s']: budgets must be strictly ascending", L,
                              p->string);
            if (st != SPX_OK) {
                free(t);
                return st;
            }
        }
    }
    *out = t;
    *n_out = n;
    return SPX_OK;
}

const spx_trdc_tuned *spx_trdc_tuned_pick(const spx_trdc *f, const char *platform, double level) {
    const spx_trdc_tuned *best = NULL;
    for (size_t i = 0; i < spx_trdc_tuned_count(f); i++) {
        const spx_trdc_tuned *t = spx_trdc_tuned_at(f, i);
        if (strcmp(t->platform, platform) != 0) continue;
        if (t->budget <= level * (1 + 1e-9) && (!best || t->budget > best->budget)) best = t;
    }
    return best;
}

/* ---- writing ------------------------------------------------------------ */

static cJSON *entry_json(const spx_trdc_tuned *t) {
    cJSON *o = cJSON_CreateObject(), *k = cJSON_CreateArray();
    if (!o || !k) {
        cJSON_Delete(o);
        cJSON_Delete(k);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "budget", t->budget);
    for (int s = 0; s < SPX_TRDC_TUNED_SETS; s++) cJSON_AddItemToArray(k, cJSON_CreateNumber((double)t->k[s]));
    cJSON_AddItemToObject(o, "k", k);
    cJSON_AddNumberToObject(o, "slowdown", t->slowdown);
    cJSON_AddNumberToObject(o, "kl", t->kl);
    cJSON_AddNumberToObject(o, "kl_base", t->kl_base);
    cJSON_AddStringToObject(o, "date", t->date);
    cJSON_AddStringToObject(o, "mlp", t->mlp == SPX_REFINE_MLP_NEURON ? "neuron" : "channel");
    if (t->mlp == SPX_REFINE_MLP_NEURON) cJSON_AddNumberToObject(o, "kn", (double)t->kn);
    if (t->cuda_blocks || t->cuda_lag || t->cuda_lead) { /* a GPU's entry; a CPU's has no schedule */
        cJSON_AddNumberToObject(o, "cuda_blocks", t->cuda_blocks);
        cJSON_AddNumberToObject(o, "cuda_lag", t->cuda_lag);
        cJSON_AddNumberToObject(o, "cuda_lead", t->cuda_lead);
    }
    if (t->windows[0]) cJSON_AddStringToObject(o, "windows", t->windows);
    return o;
}

/* root's "tuned" with t added to its platform's list (replacing the entry
 * of the same budget), the list kept in ascending budget order. */
static int put_entry(cJSON *root, const spx_trdc_tuned *t) {
    cJSON *jt = cJSON_GetObjectItemCaseSensitive(root, "tuned");
    if (!jt && !(jt = cJSON_AddObjectToObject(root, "tuned"))) return 0;
    cJSON *list = cJSON_GetObjectItemCaseSensitive(jt, t->platform);
    if (!list && !(list = cJSON_AddArrayToObject(jt, t->platform))) return 0;
    cJSON *o = entry_json(t);
    if (!o) return 0;
    int at = 0;
    for (cJSON *x = list->child; x; x = x->next, at++) {
        double b = cJSON_GetObjectItemCaseSensitive(x, "budget")->valuedouble; /* validated at open */
        if (fabs(b - t->budget) <= 1e-12) return cJSON_ReplaceItemInArray(list, at, o) ? 1 : (cJSON_Delete(o), 0);
        if (b > t->budget) return cJSON_InsertItemInArray(list, at, o) ? 1 : (cJSON_Delete(o), 0);
    }
    return cJSON_AddItemToArray(list, o) ? 1 : (cJSON_Delete(o), 0);
}

static spx_status io_fail(const char *path, const char *tmp, const char *what, int err, spx_err *e) {
    return spx_fail(e, SPX_ERR_IO,
                    "%s: %s %s failed: %s (the tuned budgets are written into the .refine by writing a new copy "
                    "beside it and renaming it over the file: its directory must be writable%s)",
                    path, what, tmp, strerror(err), err == ENOSPC ? ", and have room for a copy" : "");
}

static int write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t r = write(fd, b, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        b += r;
        n -= (size_t)r;
    }
    return 1;
}

/* bytes [0, n) of src into dst (at dst's position): copy_file_range where
 * the kernel has it (a reflink on filesystems that share extents), else
 * read and write. */
static int copy_prefix(int src, int dst, uint64_t n) {
    uint64_t done = 0;
#ifdef __linux__
    loff_t off_in = 0;
    while (done < n) {
        ssize_t r = copy_file_range(src, &off_in, dst, NULL, (size_t)(n - done), 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += (uint64_t)r;
    }
    if (done == n) return 1;
#endif
    const size_t cap = (size_t)1 << 20;
    uint8_t *buf = malloc(cap);
    if (!buf) return 0;
    while (done < n) {
        size_t want = n - done < cap ? (size_t)(n - done) : cap;
        ssize_t r = pread(src, buf, want, (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || !write_all(dst, buf, (size_t)r)) break;
        done += (uint64_t)r;
    }
    free(buf);
    return done == n;
}

/* fsync of the directory holding path, so the rename is durable; best
 * effort (some file systems refuse fsync on a directory). */
static void fsync_dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash == path ? 1 : slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

spx_status spx_trdc_writable_dir(const char *path, spx_err *e) {
    size_t tl = strlen(path) + 40;
    char *tmp = malloc(tl);
    if (!tmp) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, tl, "%s.tmp.%ld.probe", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0600);
    spx_status st = SPX_OK;
    if (fd < 0) st = io_fail(path, tmp, "creating", errno, e);
    else {
        close(fd);
        unlink(tmp);
    }
    free(tmp);
    return st;
}

spx_status spx_trdc_set_tuned(const char *path, const spx_trdc_tuned *t, spx_err *e) {
    if (!path || !t) return spx_fail(e, SPX_ERR_ARG, "spx_trdc_set_tuned: NULL argument");
    if (!(t->budget > 0 && t->budget < 1) || !isfinite(t->slowdown) || !isfinite(t->kl) || t->kl < 0 ||
        !isfinite(t->kl_base) || t->kl_base < 0 || !t->platform[0] || !memchr(t->platform, 0, sizeof t->platform))
        return spx_fail(e, SPX_ERR_ARG, "%s: tuned entry out of range (budget %g, kl %g)", path, t->budget, t->kl);
    for (int s = 0; s < SPX_TRDC_TUNED_SETS; s++)
        if (t->k[s] < 0 || t->k[s] > SPX_TRDC_TUNED_KMAX)
            return spx_fail(e, SPX_ERR_ARG, "%s: tuned k[%d] = %lld out of range", path, s, (long long)t->k[s]);
    if ((t->mlp != SPX_REFINE_MLP_CHANNEL && t->mlp != SPX_REFINE_MLP_NEURON) || t->kn < 0 ||
        t->kn > SPX_TRDC_TUNED_KMAX || (t->mlp == SPX_REFINE_MLP_CHANNEL && t->kn != 0) || t->cuda_blocks < 0 ||
        t->cuda_blocks > 4096 || t->cuda_lag < 0 || t->cuda_lag > 4 || t->cuda_lead < 0 || t->cuda_lead > 4)
        return spx_fail(e, SPX_ERR_ARG, "%s: tuned mode out of range (mlp %d, kn %lld, blocks %d, lag %d, lead %d)", path,
                        (int)t->mlp, (long long)t->kn, (int)t->cuda_blocks, (int)t->cuda_lag, (int)t->cuda_lead);
    spx_trdc *f = NULL;
    SPX_TRY(spx_trdc_open(path, &f, e));
    if (spx_trdc_contents(f) != SPX_TRDC_CONTENTS_REFINE) {
        spx_trdc_close(f);
        return spx_fail(e, SPX_ERR_ARG, "%s: not a .refine file: only a .refine holds tuned budgets", path);
    }
    cJSON *root = cJSON_Duplicate(trdc_root(f), 1);
    char *man = root && put_entry(root, t) ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    const uint64_t off = spx_trdc_manifest_offset(f);
    const uint64_t version = spx_trdc_version(f);
    spx_trdc_close(f);
    if (!man) return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory building the manifest", path);
    const size_t mlen = strlen(man);
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) {
        free(man);
        return spx_fail(e, SPX_ERR_NOMEM, "%s: out of memory", path);
    }
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    spx_status st = SPX_OK;
    struct stat sb;
    int src = open(path, O_RDONLY);
    int dst = -1;
    if (src < 0 || fstat(src, &sb) != 0) st = io_fail(path, path, "reading", errno, e);
    else if ((dst = open(tmp, O_WRONLY | O_CREAT | O_EXCL, sb.st_mode & 0777)) < 0)
        st = io_fail(path, tmp, "creating", errno, e);
    else if (mlen > SPX_TRDC_MAX_MANIFEST)
        st = spx_fail(e, SPX_ERR_RANGE, "%s: the new manifest is %zu bytes, above the limit", path, mlen);
    else if (!copy_prefix(src, dst, off) || !write_all(dst, man, mlen)) st = io_fail(path, tmp, "writing", errno, e);
    if (st == SPX_OK) {
        uint8_t h[SPX_TRDC_HEADER_SIZE];
        memcpy(h, SPX_TRDC_MAGIC, 8);
        trdc_wr_le64(h + 8, version);
        trdc_wr_le64(h + 16, (uint64_t)mlen);
        if (pwrite(dst, h, sizeof h, 0) != (ssize_t)sizeof h) st = io_fail(path, tmp, "writing the header of", errno, e);
        else if (fsync(dst) != 0) st = io_fail(path, tmp, "flushing", errno, e);
    }
    if (dst >= 0 && close(dst) != 0 && st == SPX_OK) st = io_fail(path, tmp, "closing", errno, e);
    if (src >= 0) close(src);
    free(man);
    if (st == SPX_OK) { /* the reader must accept the new file before it replaces the old one */
        spx_trdc *g = NULL;
        spx_err e2;
        spx_err_clear(&e2);
        if (spx_trdc_open(tmp, &g, &e2) != SPX_OK)
            st = spx_fail(e, SPX_ERR_INTERNAL, "%s: the rewritten file does not read back (%s); the original is kept",
                          path, e2.msg);
        spx_trdc_close(g);
    }
    if (st == SPX_OK && rename(tmp, path) != 0) st = io_fail(path, tmp, "renaming", errno, e);
    if (st == SPX_OK) fsync_dir_of(path);
    if (st != SPX_OK) unlink(tmp);
    free(tmp);
    return st;
}
