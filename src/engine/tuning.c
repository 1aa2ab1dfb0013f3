/* tuning.c: see tuning.h. */
#include "engine/tuning.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void spx_tuning_defaults(spx_tuning *t) {
    memset(t, 0, sizeof *t);
    t->kernels = SPX_TUNE_KERNELS_AUTO;
    t->cuda_carveout = 50;
    t->cuda_resident_layers = -1;
    t->cuda_pdl = 1;
    t->cuda_kvq4_fuse = 1;
    t->cuda_attn_splits = 0;
    t->cuda_ahead = 1;
    t->cuda_attn_split_kernel = 0;
    t->cuda_attn_adapt = 1;
    t->cublas = 1;
    t->cublas_min_m = 64;
    t->gemv_groups = -1;
    for (int i = 0; i < SPX_TUNING_GEMV_LAUNCH_KINDS; i++) t->gemv_forms[i] = -1;
    t->gemv_forms_n = 0;
    t->gemv_early_store = -1;
    t->gemv_early_oidx = -1;
    t->gemv_tiled_variant = -1;
    t->gemv_pair = -1;
}

static const char *env_lookup(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

/* 0 or 1 when v is exactly "0" or "1", else dflt (cuda/common.cuh's old spx_env_flag) */
static int flag(const char *v, int dflt) { return v && !strcmp(v, "0") ? 0 : v && !strcmp(v, "1") ? 1 : dflt; }

/* one digit '0'..'0'+n-1 and nothing else, else -1 */
static int digit(const char *v, int n) { return v && *v >= '0' && *v < '0' + n && !v[1] ? *v - '0' : -1; }

static void copy_text(char *dst, size_t cap, const char *v) {
    snprintf(dst, cap, "%s", v ? v : "");
}

void spx_tuning_parse(spx_tuning *t, const char *(*lookup)(const char *name, void *ctx), void *ctx) {
    if (!lookup) lookup = env_lookup;
    spx_tuning_defaults(t);
    const char *v;

    v = lookup("SPECTRA_KERNELS", ctx);
    if (v && *v) {
        copy_text(t->kernels_text, sizeof t->kernels_text, v);
        t->kernels = !strcmp(v, "scalar") ? SPX_TUNE_KERNELS_SCALAR
                     : !strcmp(v, "avx2") ? SPX_TUNE_KERNELS_AVX2
                     : !strcmp(v, "avx512") ? SPX_TUNE_KERNELS_AVX512
                     : !strcmp(v, "amx") ? SPX_TUNE_KERNELS_AMX
                                         : SPX_TUNE_KERNELS_UNKNOWN;
    }

    v = lookup("SPECTRA_CUDA_CARVEOUT", ctx);
    if (v && *v) t->cuda_carveout = atoi(v);

    v = lookup("SPECTRA_CUDA_RESIDENT_LAYERS", ctx);
    if (v && *v) {
        char *end = NULL;
        long long k = strtoll(v, &end, 10);
        copy_text(t->cuda_resident_layers_text, sizeof t->cuda_resident_layers_text, v);
        t->cuda_resident_layers = *end || k < 0 ? -2 : k;
    }

    t->cuda_pdl = flag(lookup("SPECTRA_CUDA_PDL", ctx), 1);
    t->cuda_kvq4_fuse = flag(lookup("SPECTRA_CUDA_KVQ4_FUSE", ctx), 1);

    v = lookup("SPECTRA_CUDA_ATTN_SPLITS", ctx);
    if (v && atoi(v) > 0) t->cuda_attn_splits = atoi(v);

    v = lookup("SPECTRA_CUDA_AHEAD", ctx);
    t->cuda_ahead = !(v && strcmp(v, "0") == 0);

    t->cuda_attn_split_kernel = lookup("SPECTRA_CUDA_ATTN_SPLIT_KERNEL", ctx) != NULL;
    t->cuda_attn_adapt = flag(lookup("SPECTRA_CUDA_ATTN_ADAPT", ctx), 1);
    t->cublas = flag(lookup("SPECTRA_CUBLAS", ctx), 1);

    v = lookup("SPECTRA_CUBLAS_MIN_M", ctx);
    {
        int n = v ? atoi(v) : 0;
        t->cublas_min_m = n >= 2 ? n : 64;
    }

    t->gemv_groups = flag(lookup("SPECTRA_GEMV_GROUPS", ctx), -1);

    v = lookup("SPECTRA_GEMV_FORMS", ctx);
    for (int i = 0; v && i < SPX_TUNING_GEMV_LAUNCH_KINDS && v[i]; i++) {
        t->gemv_forms[i] = v[i] >= '0' && v[i] < '0' + SPX_TUNING_TILED_FORMS ? v[i] - '0' : -1;
        t->gemv_forms_n = i + 1;
    }

    t->gemv_early_store = flag(lookup("SPECTRA_GEMV_EARLY_STORE", ctx), -1);
    t->gemv_early_oidx = flag(lookup("SPECTRA_GEMV_EARLY_OIDX", ctx), -1);
    t->gemv_tiled_variant = digit(lookup("SPECTRA_GEMV_TILED_VARIANT", ctx), SPX_TUNING_TILED_FORMS);
    t->gemv_pair = flag(lookup("SPECTRA_GEMV_PAIR", ctx), -1);
}

/* Every record made stays reachable (a reader may hold an old pointer):
 * a list, newest first; g_cur is the one spx_tuning_get returns. */
typedef struct tuning_node {
    spx_tuning t;
    struct tuning_node *next;
} tuning_node;

static tuning_node g_first; /* the first parse: no allocation */
static tuning_node *g_older;
static _Atomic(const spx_tuning *) g_cur;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void first_parse(void) {
    spx_tuning_parse(&g_first.t, NULL, NULL);
    atomic_store(&g_cur, &g_first.t);
}

const spx_tuning *spx_tuning_get(void) {
    pthread_once(&g_once, first_parse);
    return atomic_load(&g_cur);
}

const spx_tuning *spx_tuning_reload(void) {
    pthread_once(&g_once, first_parse);
    tuning_node *n = (tuning_node *)malloc(sizeof *n);
    if (!n) return atomic_load(&g_cur); /* out of memory: the old record stays */
    spx_tuning_parse(&n->t, NULL, NULL);
    pthread_mutex_lock(&g_mu);
    n->next = g_older;
    g_older = n;
    atomic_store(&g_cur, &n->t);
    pthread_mutex_unlock(&g_mu);
    return &n->t;
}

static const char *kernels_name(const spx_tuning *t) {
    switch (t->kernels) {
    case SPX_TUNE_KERNELS_AUTO: return "auto";
    case SPX_TUNE_KERNELS_SCALAR: return "scalar";
    case SPX_TUNE_KERNELS_AVX2: return "avx2";
    case SPX_TUNE_KERNELS_AVX512: return "avx512";
    case SPX_TUNE_KERNELS_AMX: return "amx";
    default: return t->kernels_text;
    }
}

/* SPECTRA_GEMV_FORMS as a string: a digit per kind given, '-' for the default choice */
static void forms_text(const spx_tuning *t, char out[SPX_TUNING_GEMV_LAUNCH_KINDS + 1]) {
    int n = t->gemv_forms_n;
    for (int i = 0; i < n; i++) out[i] = t->gemv_forms[i] >= 0 ? (char)('0' + t->gemv_forms[i]) : '-';
    out[n] = 0;
}

/* The fields in one table: name, offset of an int field and its default
 * (the others, kernels, resident layers and forms, are handled apart). */
#define INT_FIELD(env, f) {env, offsetof(spx_tuning, f)}
static const struct {
    const char *env;
    size_t off;
} g_ints[] = {
    INT_FIELD("SPECTRA_CUDA_CARVEOUT", cuda_carveout),
    INT_FIELD("SPECTRA_CUDA_PDL", cuda_pdl),
    INT_FIELD("SPECTRA_CUDA_KVQ4_FUSE", cuda_kvq4_fuse),
    INT_FIELD("SPECTRA_CUDA_ATTN_SPLITS", cuda_attn_splits),
    INT_FIELD("SPECTRA_CUDA_AHEAD", cuda_ahead),
    INT_FIELD("SPECTRA_CUDA_ATTN_SPLIT_KERNEL", cuda_attn_split_kernel),
    INT_FIELD("SPECTRA_CUDA_ATTN_ADAPT", cuda_attn_adapt),
    INT_FIELD("SPECTRA_CUBLAS", cublas),
    INT_FIELD("SPECTRA_CUBLAS_MIN_M", cublas_min_m),
    INT_FIELD("SPECTRA_GEMV_GROUPS", gemv_groups),
    INT_FIELD("SPECTRA_GEMV_EARLY_STORE", gemv_early_store),
    INT_FIELD("SPECTRA_GEMV_EARLY_OIDX", gemv_early_oidx),
    INT_FIELD("SPECTRA_GEMV_TILED_VARIANT", gemv_tiled_variant),
    INT_FIELD("SPECTRA_GEMV_PAIR", gemv_pair),
};
#define N_INTS (sizeof g_ints / sizeof g_ints[0])

static int int_at(const spx_tuning *t, size_t i) { return *(const int *)((const char *)t + g_ints[i].off); }

cJSON *spx_tuning_json(const spx_tuning *t) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = cJSON_AddStringToObject(o, "SPECTRA_KERNELS", kernels_name(t)) != NULL;
    if (t->cuda_resident_layers == -2)
        ok &= cJSON_AddStringToObject(o, "SPECTRA_CUDA_RESIDENT_LAYERS", t->cuda_resident_layers_text) != NULL;
    else ok &= cJSON_AddNumberToObject(o, "SPECTRA_CUDA_RESIDENT_LAYERS", (double)t->cuda_resident_layers) != NULL;
    for (size_t i = 0; i < N_INTS; i++) ok &= cJSON_AddNumberToObject(o, g_ints[i].env, int_at(t, i)) != NULL;
    char fs[SPX_TUNING_GEMV_LAUNCH_KINDS + 1];
    forms_text(t, fs);
    ok &= cJSON_AddStringToObject(o, "SPECTRA_GEMV_FORMS", fs) != NULL;
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

int spx_tuning_is_default(const spx_tuning *t) {
    spx_tuning d;
    spx_tuning_defaults(&d);
    if (t->kernels != d.kernels || t->cuda_resident_layers != d.cuda_resident_layers || t->gemv_forms_n) return 0;
    for (size_t i = 0; i < N_INTS; i++)
        if (int_at(t, i) != int_at(&d, i)) return 0;
    return 1;
}

char *spx_tuning_summary(const spx_tuning *t, char *buf, unsigned long cap) {
    if (!buf || !cap) return buf;
    buf[0] = 0;
    if (spx_tuning_is_default(t)) {
        snprintf(buf, cap, "defaults");
        return buf;
    }
    spx_tuning d;
    spx_tuning_defaults(&d);
    size_t n = 0;
#define ADD(...)                                                                 \
    do {                                                                         \
        if (n < cap) {                                                           \
            int w_ = snprintf(buf + n, cap - n, "%s", n ? " " : "");             \
            n += w_ > 0 ? (size_t)w_ : 0;                                        \
        }                                                                        \
        if (n < cap) {                                                           \
            int w_ = snprintf(buf + n, cap - n, __VA_ARGS__);                    \
            n += w_ > 0 ? (size_t)w_ : 0;                                        \
        }                                                                        \
    } while (0)
    if (t->kernels != d.kernels) ADD("SPECTRA_KERNELS=%s", kernels_name(t));
    if (t->cuda_resident_layers == -2) ADD("SPECTRA_CUDA_RESIDENT_LAYERS=%s (invalid)", t->cuda_resident_layers_text);
    else if (t->cuda_resident_layers != d.cuda_resident_layers)
        ADD("SPECTRA_CUDA_RESIDENT_LAYERS=%lld", t->cuda_resident_layers);
    for (size_t i = 0; i < N_INTS; i++)
        if (int_at(t, i) != int_at(&d, i)) ADD("%s=%d", g_ints[i].env, int_at(t, i));
    if (t->gemv_forms_n) {
        char fs[SPX_TUNING_GEMV_LAUNCH_KINDS + 1];
        forms_text(t, fs);
        ADD("SPECTRA_GEMV_FORMS=%s", fs);
    }
#undef ADD
    return buf;
}
