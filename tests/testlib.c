/* testlib.c: harness helpers (see testlib.h). */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"
#include "spectra.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

int tl_failures;
int tl_checks;
static char g_tmp[256];

const char *tl_shared(const char *rel) {
    static char bufs[8][1024];
    static int k;
    const char *root = getenv("SPECTRA_SHARED");
    if (!root || !*root) root = "../shared";
    char *b = bufs[k++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", root, rel);
    return b;
}

const char *tl_tmpdir(void) {
    if (!g_tmp[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(g_tmp, sizeof g_tmp, "%s/spxtest.XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(g_tmp)) {
            perror("mkdtemp");
            exit(2);
        }
    }
    return g_tmp;
}

char *tl_read(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

int tl_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

int tl_mkdir(const char *path) { return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1; }

int tl_dir_entries(const char *path) {
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

tl_cmp tl_compare(const float *got, const float *ref, size_t n, double atol, double rtol) {
    tl_cmp c = {0, 0, 0, 1};
    double worst_ratio = -1;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            if (!c.nan) c.worst = i;
            c.nan = 1;
            c.ok = 0;
            continue;
        }
        double d = fabs((double)got[i] - (double)ref[i]);
        if (d > c.max_abs) c.max_abs = d;
        double lim = atol + rtol * fabs((double)ref[i]);
        double ratio = d / lim;
        if (!c.nan && ratio > worst_ratio) {
            worst_ratio = ratio;
            c.worst = i;
        }
        if (d > lim) c.ok = 0;
    }
    return c;
}

uint64_t tl_rand_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float tl_rand_uniform(uint64_t *s) { return (float)(tl_rand_u64(s) >> 40) * (1.0f / 16777216.0f); }

float tl_rand_normal(uint64_t *s) {
    double u1 = ((double)(tl_rand_u64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(tl_rand_u64(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static void rm_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

int tl_finish(const char *name) {
    if (g_tmp[0]) rm_tree(g_tmp);
    printf("%s: %d checks, %d failures\n", name, tl_checks, tl_failures);
    return tl_failures ? 1 : 0;
}

float *tl_decode_steps(spx_model *m, const int32_t *ids, int n_tok) {
    const int64_t V = spx_model_vocab_size(m);
    float *lg = malloc((size_t)n_tok * (size_t)V * sizeof(float));
    spx_session *s = NULL;
    spx_session_params sp = {.kv = SPX_KV_F32};
    CHECK(lg != NULL, "out of memory for %d x %lld logits", n_tok, (long long)V);
    CHECK(spx_session_new(m, &sp, &s) == SPX_OK, "session: %s", spx_model_error(m));
    for (int t = 0; lg && s && t < n_tok; t++)
        CHECK(spx_session_eval(s, ids + t, 1, lg + (size_t)t * (size_t)V, 0) == SPX_OK, "eval %d: %s", t,
              spx_session_error(s));
    spx_session_free(s);
    return lg;
}

double tl_max_diff(const float *a, const float *b, size_t n) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs((double)a[i] - b[i]));
    return mx;
}

double tl_mean_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fabs((double)a[i] - b[i]);
    return n ? s / (double)n : 0.0;
}
