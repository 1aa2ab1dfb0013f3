/* test_tuning.c: engine/tuning.h, the one record of the SPECTRA_* settings:
 * defaults, every variable's parse (valid and invalid values, as the
 * consumers read them before the record), the reload after setenv, the
 * JSON under the variables' names and the summary `spectra plan` prints. */
#include "testlib.h"

#include "cpu/qkernels.h"
#include "engine/tuning.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

static const char *const g_names[] = {
    "SPECTRA_KERNELS",          "SPECTRA_CUDA_CARVEOUT",       "SPECTRA_CUDA_RESIDENT_LAYERS",
    "SPECTRA_CUDA_PDL",         "SPECTRA_CUDA_KVQ4_FUSE",      "SPECTRA_CUDA_ATTN_SPLITS",
    "SPECTRA_CUDA_AHEAD",       "SPECTRA_CUDA_ATTN_SPLIT_KERNEL", "SPECTRA_CUDA_ATTN_ADAPT",
    "SPECTRA_CUBLAS",           "SPECTRA_CUBLAS_MIN_M",        "SPECTRA_GEMV_GROUPS",
    "SPECTRA_GEMV_FORMS",       "SPECTRA_GEMV_EARLY_STORE",    "SPECTRA_GEMV_EARLY_OIDX",
    "SPECTRA_GEMV_TILED_VARIANT", "SPECTRA_GEMV_PAIR",
};
#define N_NAMES ((int)(sizeof g_names / sizeof g_names[0]))

/* an environment as a NULL-terminated list of name, value pairs */
static const char *table_lookup(const char *name, void *ctx) {
    const char *const *kv = (const char *const *)ctx;
    for (int i = 0; kv[i]; i += 2)
        if (!strcmp(kv[i], name)) return kv[i + 1];
    return NULL;
}

static void parse(spx_tuning *t, const char *const *kv) { spx_tuning_parse(t, table_lookup, (void *)kv); }

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -12345;
}
static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : "(not a string)";
}

static void test_defaults(void) {
    static const char *const none[] = {NULL};
    spx_tuning t, d;
    parse(&t, none);
    spx_tuning_defaults(&d);
    CHECK(!memcmp(&t, &d, sizeof t), "nothing set parses as the defaults");
    CHECK(spx_tuning_is_default(&t), "defaults are default");
    char buf[256];
    CHECK(!strcmp(spx_tuning_summary(&t, buf, sizeof buf), "defaults"), "summary '%s'", buf);
    CHECK(t.kernels == SPX_TUNE_KERNELS_AUTO && t.cuda_carveout == 50 && t.cuda_resident_layers == -1 &&
              t.cuda_pdl == 1 && t.cuda_kvq4_fuse == 1 && t.cuda_attn_splits == 0 && t.cuda_ahead == 1 &&
              t.cuda_attn_split_kernel == 0 && t.cuda_attn_adapt == 1 && t.cublas == 1 && t.cublas_min_m == 64 &&
              t.gemv_groups == -1 &&
              t.gemv_forms_n == 0 && t.gemv_early_store == -1 && t.gemv_early_oidx == -1 &&
              t.gemv_tiled_variant == -1 && t.gemv_pair == -1,
          "documented defaults");
    cJSON *j = spx_tuning_json(&t);
    CHECK(j && cJSON_GetArraySize(j) == N_NAMES, "JSON has %d fields, want %d", j ? cJSON_GetArraySize(j) : -1,
          N_NAMES);
    for (int i = 0; j && i < N_NAMES; i++)
        CHECK(cJSON_GetObjectItemCaseSensitive(j, g_names[i]) != NULL, "JSON lacks %s", g_names[i]);
    CHECK(!strcmp(jstr(j, "SPECTRA_KERNELS"), "auto"), "kernels %s", jstr(j, "SPECTRA_KERNELS"));
    CHECK(jnum(j, "SPECTRA_CUDA_CARVEOUT") == 50, "carveout");
    CHECK(!strcmp(jstr(j, "SPECTRA_GEMV_FORMS"), ""), "forms '%s'", jstr(j, "SPECTRA_GEMV_FORMS"));
    cJSON_Delete(j);
}

static void test_valid(void) {
    static const char *const kv[] = {"SPECTRA_KERNELS", "scalar", "SPECTRA_CUDA_CARVEOUT", "-1",
                                     "SPECTRA_CUDA_RESIDENT_LAYERS", "3", "SPECTRA_CUDA_PDL", "0",
                                     "SPECTRA_CUDA_KVQ4_FUSE", "0", "SPECTRA_CUDA_ATTN_SPLITS", "12",
                                     "SPECTRA_CUDA_AHEAD", "0", "SPECTRA_CUDA_ATTN_SPLIT_KERNEL", "",
                                     "SPECTRA_CUDA_ATTN_ADAPT", "0", "SPECTRA_CUBLAS", "0",
                                     "SPECTRA_CUBLAS_MIN_M", "128",
                                     "SPECTRA_GEMV_GROUPS", "0", "SPECTRA_GEMV_FORMS", "01-2",
                                     "SPECTRA_GEMV_EARLY_STORE", "0", "SPECTRA_GEMV_EARLY_OIDX", "1",
                                     "SPECTRA_GEMV_TILED_VARIANT", "2", "SPECTRA_GEMV_PAIR", "1", NULL};
    spx_tuning t;
    parse(&t, kv);
    CHECK(t.kernels == SPX_TUNE_KERNELS_SCALAR && !strcmp(t.kernels_text, "scalar"), "kernels");
    /* every table's name */
    static const char *const knames[] = {"avx2", "avx512", "amx"};
    static const spx_tune_kernels kvals[] = {SPX_TUNE_KERNELS_AVX2, SPX_TUNE_KERNELS_AVX512, SPX_TUNE_KERNELS_AMX};
    for (int i = 0; i < 3; i++) {
        const char *kk[] = {"SPECTRA_KERNELS", knames[i], NULL};
        spx_tuning tk;
        parse(&tk, kk);
        CHECK(tk.kernels == kvals[i], "SPECTRA_KERNELS=%s parses as %d", knames[i], (int)tk.kernels);
    }
    CHECK(t.cuda_carveout == -1, "carveout %d", t.cuda_carveout);
    CHECK(t.cuda_resident_layers == 3, "resident %lld", t.cuda_resident_layers);
    CHECK(t.cuda_pdl == 0 && t.cuda_kvq4_fuse == 0 && t.cuda_ahead == 0 && t.cuda_attn_adapt == 0 && t.cublas == 0,
          "flags off");
    CHECK(t.cuda_attn_splits == 12, "splits %d", t.cuda_attn_splits);
    CHECK(t.cuda_attn_split_kernel == 1, "split kernel: set, even empty");
    CHECK(t.cublas_min_m == 128 && t.gemv_groups == 0, "gemv numbers");
    CHECK(t.gemv_forms_n == 4 && t.gemv_forms[0] == 0 && t.gemv_forms[1] == 1 && t.gemv_forms[2] == -1 &&
              t.gemv_forms[3] == 2 && t.gemv_forms[4] == -1,
          "forms n %d", t.gemv_forms_n);
    CHECK(t.gemv_early_store == 0 && t.gemv_early_oidx == 1 && t.gemv_tiled_variant == 2 && t.gemv_pair == 1,
          "gemv flags");
    CHECK(!spx_tuning_is_default(&t), "not default");
    cJSON *j = spx_tuning_json(&t);
    CHECK(j && cJSON_GetArraySize(j) == N_NAMES, "JSON fields");
    CHECK(!strcmp(jstr(j, "SPECTRA_KERNELS"), "scalar"), "JSON kernels");
    CHECK(jnum(j, "SPECTRA_CUDA_RESIDENT_LAYERS") == 3, "JSON resident");
    CHECK(jnum(j, "SPECTRA_CUDA_ATTN_SPLITS") == 12, "JSON splits");
    CHECK(jnum(j, "SPECTRA_GEMV_TILED_VARIANT") == 2, "JSON tiled variant");
    CHECK(jnum(j, "SPECTRA_GEMV_PAIR") == 1, "JSON pair");
    CHECK(!strcmp(jstr(j, "SPECTRA_GEMV_FORMS"), "01-2"), "JSON forms '%s'", jstr(j, "SPECTRA_GEMV_FORMS"));
    cJSON_Delete(j);
    char buf[2048];
    spx_tuning_summary(&t, buf, sizeof buf);
    CHECK(strstr(buf, "SPECTRA_KERNELS=scalar") && strstr(buf, "SPECTRA_GEMV_FORMS=01-2") &&
              strstr(buf, "SPECTRA_CUDA_RESIDENT_LAYERS=3") && strstr(buf, "SPECTRA_GEMV_PAIR=1") &&
              !strstr(buf, "defaults"),
          "summary '%s'", buf);
    char small[8];
    spx_tuning_summary(&t, small, sizeof small);
    CHECK(strlen(small) == sizeof small - 1, "summary truncated to its buffer");
}

/* Invalid values read as before the record: as unset, or (residency) an
 * error at the model open, or (kernels) a warning and scalar */
static void test_invalid(void) {
    static const char *const kv[] = {"SPECTRA_KERNELS", "sse9", "SPECTRA_CUDA_CARVEOUT", "lots",
                                     "SPECTRA_CUDA_RESIDENT_LAYERS", "-1", "SPECTRA_CUDA_PDL", "2",
                                     "SPECTRA_CUDA_KVQ4_FUSE", "yes", "SPECTRA_CUDA_ATTN_SPLITS", "-4",
                                     "SPECTRA_CUDA_AHEAD", "00", "SPECTRA_CUDA_ATTN_ADAPT", "",
                                     "SPECTRA_CUBLAS", "off", "SPECTRA_CUBLAS_MIN_M", "1",
                                     "SPECTRA_GEMV_GROUPS", "01", "SPECTRA_GEMV_FORMS", "9x012345",
                                     "SPECTRA_GEMV_EARLY_OIDX", " 1", "SPECTRA_GEMV_TILED_VARIANT", "3",
                                     "SPECTRA_GEMV_PAIR", "true", NULL};
    spx_tuning t;
    parse(&t, kv);
    CHECK(t.kernels == SPX_TUNE_KERNELS_UNKNOWN && !strcmp(t.kernels_text, "sse9"), "unknown kernels");
    CHECK(t.cuda_carveout == 0, "carveout atoi('lots') = %d", t.cuda_carveout);
    CHECK(t.cuda_resident_layers == -2 && !strcmp(t.cuda_resident_layers_text, "-1"), "resident -1 is invalid");
    CHECK(t.cuda_pdl == 1 && t.cuda_kvq4_fuse == 1 && t.cuda_attn_adapt == 1 && t.cublas == 1, "flags as unset");
    CHECK(t.cuda_attn_splits == 0 && t.cuda_ahead == 1 && t.cublas_min_m == 64 &&
              t.gemv_groups == -1 && t.gemv_early_oidx == -1 && t.gemv_tiled_variant == -1 &&
              t.gemv_pair == -1,
          "out of range: as unset");
    CHECK(t.gemv_forms_n == 5 && t.gemv_forms[0] == -1 && t.gemv_forms[1] == -1 && t.gemv_forms[2] == 0 &&
              t.gemv_forms[4] == 2,
          "forms: the first five characters, bad ones the default choice");
    cJSON *j = spx_tuning_json(&t);
    CHECK(!strcmp(jstr(j, "SPECTRA_KERNELS"), "sse9"), "JSON names the unknown kernels");
    CHECK(!strcmp(jstr(j, "SPECTRA_CUDA_RESIDENT_LAYERS"), "-1"), "JSON gives the invalid residency as text");
    cJSON_Delete(j);
    static const char *const kv2[] = {"SPECTRA_CUDA_RESIDENT_LAYERS", "4x", "SPECTRA_CUDA_CARVEOUT", "",
                                      "SPECTRA_KERNELS", "", NULL};
    parse(&t, kv2);
    CHECK(t.cuda_resident_layers == -2, "'4x' is invalid");
    CHECK(t.cuda_carveout == 50 && t.kernels == SPX_TUNE_KERNELS_AUTO, "empty: unset");
}

/* The process's record: parsed once, reloaded after setenv; old records stay valid */
static void test_env(void) {
    for (int i = 0; i < N_NAMES; i++) unsetenv(g_names[i]);
    const spx_tuning *a = spx_tuning_reload();
    CHECK(a == spx_tuning_get(), "get returns the reloaded record");
    CHECK(spx_tuning_is_default(a), "unset environment: defaults");
    setenv("SPECTRA_GEMV_PAIR", "1", 1);
    setenv("SPECTRA_CUDA_ATTN_SPLITS", "7", 1);
    setenv("SPECTRA_KERNELS", "bogus", 1);
    CHECK(spx_tuning_get() == a && a->gemv_pair == -1, "a setenv alone changes nothing (parsed once)");
    const spx_tuning *b = spx_tuning_reload();
    CHECK(b != a && spx_tuning_get() == b, "reload: a new record");
    CHECK(b->gemv_pair == 1 && b->cuda_attn_splits == 7 && b->kernels == SPX_TUNE_KERNELS_UNKNOWN, "reloaded fields");
    CHECK(a->gemv_pair == -1 && spx_tuning_is_default(a), "the old record is unchanged");
    /* the kernel table is chosen at the first spx_qkernels_best(): an unknown name warns and runs scalar */
    CHECK(!strcmp(spx_qkernels_best()->name, "scalar"), "SPECTRA_KERNELS=bogus gives %s", spx_qkernels_best()->name);
    unsetenv("SPECTRA_GEMV_PAIR");
    unsetenv("SPECTRA_CUDA_ATTN_SPLITS");
    unsetenv("SPECTRA_KERNELS");
    CHECK(spx_tuning_is_default(spx_tuning_reload()), "unset again: defaults");
    CHECK(!strcmp(spx_qkernels_best()->name, "scalar"), "the kernel table stays what it was");
}

int main(void) {
    test_defaults();
    test_valid();
    test_invalid();
    test_env();
    return tl_finish("test_tuning");
}
