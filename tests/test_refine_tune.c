/* test_refine_tune.c: the tuner (refine/tune.h) and its record in the
 * .refine manifest (docs/trdc.md 2.6).
 *   - the search against synthetic cost and quality models whose answer is
 *     known: the largest feasible common k, greedy raises where they fit
 *     and help, none where they do not help, the base when nothing fits,
 *     noisy measurements, argument and callback errors;
 *   - the "tuned" section: written twice (ascending, replacing one budget),
 *     read back, the payload's checksums unchanged, the nearest entry not
 *     above a level picked; hand-corrupted sections refused with messages;
 *     a model file and a missing file refused, no temp file left behind. */
#define _POSIX_C_SOURCE 200809L
#include "testlib.h"
#include "format/trdc.h"
#include "refine/tune.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- synthetic measurements ------------------------------------------- */

/* slowdown = sum_s cost[s] * k[s] (+ noise); KL = sum_s gain[s] / (1 + k[s]) */
typedef struct model {
    double cost[4], gain[4];
    double noise;      /* amplitude of a deterministic +- jitter */
    uint64_t rng;
    int n_sd, n_kl;
    int fail_after;    /* the slowdown callback fails at this call (0: never) */
} model;

static spx_status sd_fn(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    model *m = u;
    if (m->fail_after && ++m->n_sd >= m->fail_after) return spx_fail(e, SPX_ERR_IO, "synthetic failure");
    if (!m->fail_after) m->n_sd++;
    double s = 0;
    for (int i = 0; i < 4; i++) s += m->cost[i] * (double)c->k[i];
    if (m->noise > 0) s += m->noise * (2 * tl_rand_uniform(&m->rng) - 1);
    *out = s;
    return SPX_OK;
}

static spx_status kl_fn(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    model *m = u;
    m->n_kl++;
    double s = 0;
    for (int i = 0; i < 4; i++) s += m->gain[i] / (1.0 + (double)c->k[i]);
    *out = s;
    return SPX_OK;
}

/* optimistic first measurements: a configuration's first slowdown reads
 * at a tenth of its cost (with uniform_exact, only when its budgets
 * differ), every later one at its cost */
typedef struct optimist {
    model m;
    int uniform_exact;
    spx_refine_config seen[256];
    int n_seen;
} optimist;

static spx_status opt_sd(void *u, const spx_refine_config *c, double *out, spx_err *e) {
    optimist *o = u;
    double s = 0;
    for (int i = 0; i < 4; i++) s += o->m.cost[i] * (double)c->k[i];
    int again = 0;
    for (int i = 0; i < o->n_seen; i++) again |= !memcmp(&o->seen[i], c, sizeof *c);
    if (!again && o->n_seen < 256) o->seen[o->n_seen++] = *c;
    const int uniform = c->k[0] == c->k[1] && c->k[1] == c->k[2] && c->k[2] == c->k[3];
    *out = again || (o->uniform_exact && uniform) ? s : s / 10;
    return SPX_OK;
}

static double slow_of(const model *m, const spx_refine_config *c) {
    double s = 0;
    for (int i = 0; i < 4; i++) s += m->cost[i] * (double)c->k[i];
    return s;
}

static spx_status run(model *m, double budget, spx_tune_result *r, spx_err *e) {
    spx_tune_params p = {.budget = budget};
    spx_tune_ops ops = {.user = m, .slowdown = sd_fn, .kl = kl_fn};
    spx_err_clear(e);
    return spx_refine_tune(&p, &ops, r, e);
}

static int same_k(const spx_refine_config *c, int64_t a, int64_t b, int64_t cc, int64_t d) {
    return c->k[0] == a && c->k[1] == b && c->k[2] == cc && c->k[3] == d;
}

static void test_search(void) {
    spx_err e;
    spx_tune_result r;
    size_t nl;
    const int64_t *lad = spx_tune_default_ladder(&nl);

    /* 1. down is ten times cheaper: common k 16 (16 * 0.0031 = 0.0496 <= 0.06
     * < 32 * 0.0031), then down alone climbs the ladder while it fits
     * (96: 0.0576; 128: 0.0608 is over), every other raise is over */
    model m = {.cost = {0.001, 0.001, 0.001, 0.0001}, .gain = {1, 1, 1, 1}};
    CHECK(run(&m, 0.06, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(same_k(&r.best, 16, 16, 16, 96), "cheap down: got k %lld,%lld,%lld,%lld, expected 16,16,16,96",
          (long long)r.best.k[0], (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);
    CHECK(fabs(r.slowdown - 0.0576) < 1e-12 && fabs(r.kl - (3.0 / 17 + 1.0 / 97)) < 1e-12 &&
              fabs(r.kl_base - 4) < 1e-12,
          "cheap down: slowdown %g kl %g base %g", r.slowdown, r.kl, r.kl_base);
    CHECK(r.n_kl == m.n_kl && r.n_slowdown == m.n_sd, "counts %d/%d vs %d/%d", r.n_kl, r.n_slowdown, m.n_kl, m.n_sd);

    /* 2. the largest feasible common k over the ladder, for many budgets:
     * uniform costs leave the greedy phase nothing that fits */
    for (double b = 0.003; b < 0.9; b *= 1.7) {
        model u = {.cost = {0.0005, 0.0005, 0.0005, 0.0005}, .gain = {1, 2, 3, 4}};
        CHECK(run(&u, b, &r, &e) == SPX_OK, "%s", e.msg);
        int64_t want = 0;
        for (size_t i = 0; i < nl; i++)
            if (0.002 * (double)lad[i] <= b) want = lad[i];
        int64_t lo = r.best.k[0];
        for (int s = 0; s < 4; s++) lo = r.best.k[s] < lo ? r.best.k[s] : lo;
        CHECK(lo == want, "budget %g: common k %lld, expected %lld", b, (long long)lo, (long long)want);
        CHECK(slow_of(&u, &r.best) <= b + 1e-12, "budget %g: result over the budget", b);
        /* no single raise of the result both fits and lowers KL (the stopping rule) */
        for (int s = 0; s < 4; s++) {
            spx_refine_config c = r.best;
            size_t i = 0;
            while (i + 1 < nl && lad[i] <= c.k[s]) i++;
            if (lad[i] <= c.k[s]) continue;
            c.k[s] = lad[i];
            CHECK(slow_of(&u, &c) > b, "budget %g: raising set %d still fits", b, s);
        }
    }

    /* 3. a set whose refinement does not help (gain 0) is not raised even
     * though it is cheap; the one that helps is */
    model f = {.cost = {0.001, 0.001, 0.00001, 0.0001}, .gain = {1, 1, 0, 1}};
    CHECK(run(&f, 0.06, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(r.best.k[2] == 16 && r.best.k[3] > 16, "flat gate/up: got %lld,%lld,%lld,%lld", (long long)r.best.k[0],
          (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);

    /* 4. nothing fits at a common k of 1: the base, then single sets */
    model h = {.cost = {0.5, 0.5, 0.5, 0.004}, .gain = {1, 1, 1, 1}};
    CHECK(run(&h, 0.02, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(same_k(&r.best, 0, 0, 0, 4), "expensive: got %lld,%lld,%lld,%lld, expected 0,0,0,4", (long long)r.best.k[0],
          (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3]);

    /* 5. noise: whatever is measured, the result was measured within the budget */
    for (uint64_t seed = 1; seed <= 20; seed++) {
        model n = {.cost = {0.001, 0.002, 0.0005, 0.0001}, .gain = {1, 2, 1, 3}, .noise = 0.01, .rng = seed};
        CHECK(run(&n, 0.05, &r, &e) == SPX_OK, "%s", e.msg);
        CHECK(r.slowdown <= 0.05 && r.kl <= r.kl_base, "noisy seed %llu: slowdown %g kl %g base %g",
              (unsigned long long)seed, r.slowdown, r.kl, r.kl_base);
        CHECK(r.n_slowdown <= 5 + SPX_TUNE_DEFAULT_TRIALS, "noisy: %d slowdown measurements", r.n_slowdown);
    }

    /* 6. a search misled by optimistic first measurements: the
     * confirmation falls back along the kept configurations to one whose
     * second measurement fits (with these costs, the base itself) */
    optimist op = {.m = {.cost = {0.01, 0.01, 0.01, 0.01}, .gain = {1, 1, 1, 1}}};
    spx_tune_params po = {.budget = 0.05};
    spx_tune_ops oo = {.user = &op, .slowdown = opt_sd, .kl = kl_fn};
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&po, &oo, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(slow_of(&op.m, &r.best) <= 0.05 && r.slowdown <= 0.05, "optimist: k %lld,%lld,%lld,%lld costs %g",
          (long long)r.best.k[0], (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3],
          slow_of(&op.m, &r.best));
    /* the chain was base, common 8 (0.32 truly), raises above it: only the base confirms */
    CHECK(same_k(&r.best, 0, 0, 0, 0) && r.kl == r.kl_base && r.slowdown == 0, "optimist: expected the base, got %lld",
          (long long)r.best.k[0]);
    /* exact common-k measurements, optimistic raises: every raise above the
     * common 16 was kept on its first reading and is over on its second,
     * so the confirmation walks back to the common k */
    optimist op2 = {.m = {.cost = {0.001, 0.001, 0.001, 0.0001}, .gain = {1, 1, 1, 1}}, .uniform_exact = 1};
    oo.user = &op2;
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&po, &oo, &r, &e) == SPX_OK, "%s", e.msg);
    CHECK(same_k(&r.best, 16, 16, 16, 16) && fabs(r.slowdown - 0.0496) < 1e-12,
          "optimist 2: k %lld,%lld,%lld,%lld slowdown %g (expected the common 16 at 0.0496: every raise is over)",
          (long long)r.best.k[0], (long long)r.best.k[1], (long long)r.best.k[2], (long long)r.best.k[3], r.slowdown);

    /* 7. refusals and errors */
    model z = {.cost = {0.001, 0.001, 0.001, 0.001}, .gain = {1, 1, 1, 1}};
    CHECK(run(&z, 0, &r, &e) == SPX_ERR_ARG, "budget 0 accepted");
    CHECK(run(&z, 1, &r, &e) == SPX_ERR_ARG, "budget 1 accepted");
    const int64_t bad1[] = {1, 2, 4}, bad2[] = {0, 4, 4};
    spx_tune_ops ops = {.user = &z, .slowdown = sd_fn, .kl = kl_fn};
    spx_tune_params p = {.budget = 0.05, .ladder = bad1, .n_ladder = 3};
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&p, &ops, &r, &e) == SPX_ERR_ARG && strstr(e.msg, "start at 0"), "ladder from 1: %s", e.msg);
    p.ladder = bad2;
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&p, &ops, &r, &e) == SPX_ERR_ARG && strstr(e.msg, "ascending"), "flat ladder: %s", e.msg);
    model x = {.cost = {0.001, 0.001, 0.001, 0.001}, .gain = {1, 1, 1, 1}, .fail_after = 2};
    CHECK(run(&x, 0.05, &r, &e) == SPX_ERR_IO && strstr(e.msg, "synthetic"), "callback error: %d %s", (int)e.code,
          e.msg);
    /* a custom ladder and the trial cap */
    const int64_t lad2[] = {0, 10, 20};
    model c2 = {.cost = {0.001, 0.001, 0.001, 0.0001}, .gain = {1, 1, 1, 1}};
    p = (spx_tune_params){.budget = 0.05, .ladder = lad2, .n_ladder = 3, .max_trials = 1};
    ops.user = &c2;
    spx_err_clear(&e);
    CHECK(spx_refine_tune(&p, &ops, &r, &e) == SPX_OK, "%s", e.msg);
    /* common 10 (0.031; 20 is over), then one raise: q/k/v to 20 (0.041) fits and helps; its confirmation */
    CHECK(same_k(&r.best, 20, 10, 10, 10) && c2.n_sd == 2 + 1 + 1, "custom ladder: k %lld,%lld, %d slowdowns",
          (long long)r.best.k[0], (long long)r.best.k[1], c2.n_sd);
}

/* ---- the manifest record ---------------------------------------------- */

static void write_refine(const char *path) {
    spx_err e;
    spx_err_clear(&e);
    spx_trdc_writer *w = NULL;
    uint8_t codes[4 * 2];
    float sc[3] = {0.5f, 1, 2};
    for (size_t i = 0; i < sizeof codes; i++) codes[i] = (uint8_t)(0x88 + i);
    CHECK(spx_trdc_writer_open(path, &w, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_add_refine(w, "a.weight", 3, 4, 2, codes, sc, 1, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_writer_finish(w, "{\"architectures\": [\"LlamaForCausalLM\"]}", NULL, NULL, "{}", NULL, &e) ==
              SPX_OK,
          "%s", e.msg);
}

static spx_trdc_tuned entry(const char *plat, double budget, int64_t k0) {
    spx_trdc_tuned t;
    memset(&t, 0, sizeof t);
    snprintf(t.platform, sizeof t.platform, "%s", plat);
    t.budget = budget;
    for (int i = 0; i < 4; i++) t.k[i] = k0 + i;
    t.slowdown = budget / 2;
    t.kl = 0.01 * (double)k0;
    t.kl_base = 1;
    snprintf(t.date, sizeof t.date, "2026-12-02T00:00:00Z");
    snprintf(t.windows, sizeof t.windows, "eval.txt: 2 windows of 512 from window 8");
    return t;
}

static int temp_left(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) n += strstr(de->d_name, ".tmp.") != NULL;
    if (d) closedir(d);
    return n;
}

/* the file with `from` replaced by `to` (same length) written to out */
static void patch(const char *in, const char *out, const char *from, const char *to) {
    size_t n;
    char *b = tl_read(in, &n);
    char *at = b ? memmem(b, n, from, strlen(from)) : NULL;
    CHECK(at && strlen(from) == strlen(to), "patch '%s' not found", from);
    if (at) memcpy(at, to, strlen(to));
    CHECK(tl_write(out, b, n) == 0, "write %s", out);
    free(b);
}

static void test_manifest(void) {
    char dir[600], path[700], bad[700];
    snprintf(dir, sizeof dir, "%s/tuned", tl_tmpdir());
    snprintf(path, sizeof path, "%s/m.refine", dir);
    snprintf(bad, sizeof bad, "%s/bad.refine", dir);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    write_refine(path);
    spx_err e;
    spx_err_clear(&e);
    spx_trdc *f = NULL;
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "%s", e.msg);
    const uint64_t off0 = f ? spx_trdc_manifest_offset(f) : 0;
    const uint32_t crc0 = f ? spx_trdc_find(f, "a.weight")->comp[SPX_TRDC_C_CODES].crc32 : 0;
    CHECK(f && spx_trdc_tuned_count(f) == 0, "fresh file has tuned entries");
    spx_trdc_close(f);

    CHECK(spx_trdc_writable_dir(path, &e) == SPX_OK, "%s", e.msg);
    spx_trdc_tuned t10 = entry("cpu/avx2/2t/ram/X", 0.10, 20), t5 = entry("cpu/avx2/2t/ram/X", 0.05, 8);
    spx_trdc_tuned t5b = entry("cpu/avx2/2t/ram/X", 0.05, 12), o5 = entry("cpu/avx2/2t/disk-8MiB-skip-2l/X", 0.05, 4);
    CHECK(spx_trdc_set_tuned(path, &t10, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_set_tuned(path, &t5, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_set_tuned(path, &o5, &e) == SPX_OK, "%s", e.msg);
    CHECK(spx_trdc_set_tuned(path, &t5b, &e) == SPX_OK, "%s", e.msg); /* replaces t5 */
    CHECK(temp_left(dir) == 0, "a temp file was left in %s", dir);
    f = NULL;
    CHECK(spx_trdc_open(path, &f, &e) == SPX_OK, "reopen: %s", e.msg);
    if (f) {
        CHECK(spx_trdc_tuned_count(f) == 3, "%zu entries, expected 3", spx_trdc_tuned_count(f));
        const spx_trdc_tuned *a = spx_trdc_tuned_at(f, 0), *b = spx_trdc_tuned_at(f, 1), *c = spx_trdc_tuned_at(f, 2);
        CHECK(a && b && c && !strcmp(a->platform, t10.platform) && a->budget == 0.05 && a->k[0] == 12 &&
                  a->k[3] == 15 && b->budget == 0.10 && b->k[0] == 20 && !strcmp(c->platform, o5.platform),
              "entries out of order or not replaced");
        CHECK(a && fabs(a->kl - 0.12) < 1e-15 && a->kl_base == 1 && a->slowdown == 0.025 &&
                  !strcmp(a->date, t5b.date) && !strcmp(a->windows, t5b.windows),
              "entry fields");
        /* the nearest budget not above a level */
        CHECK(spx_trdc_tuned_pick(f, t10.platform, 0.07) == a && spx_trdc_tuned_pick(f, t10.platform, 0.10) == b &&
                  spx_trdc_tuned_pick(f, t10.platform, 0.5) == b && !spx_trdc_tuned_pick(f, t10.platform, 0.04) &&
                  !spx_trdc_tuned_pick(f, "cpu/scalar/2t/ram/X", 0.5),
              "pick");
        /* the payload did not move and still verifies */
        CHECK(spx_trdc_manifest_offset(f) == off0 &&
                  spx_trdc_find(f, "a.weight")->comp[SPX_TRDC_C_CODES].crc32 == crc0,
              "payload moved");
        CHECK(spx_trdc_verify(f, NULL, NULL, NULL, NULL, &e) == SPX_OK, "verify: %s", e.msg);
        spx_trdc_close(f);
    }
    /* hand-corrupted sections: each refused, naming the file and the field */
    struct { const char *from, *to, *msg; } cases[] = {
        {"\"budget\":0.05", "\"budget\":1.05", "'budget'"},
        {"\"kl_base\":", "\"kl_bas_\":", "'kl_base'"},
        {"\"date\":\"", "\"date\":1", "not valid JSON"},
        {"\"k\":[12,", "\"k\":[-1,", "k[0]"},
        {"\"budget\":0.1,", "\"budget\":.01,", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        patch(path, bad, cases[i].from, cases[i].to);
        f = NULL;
        spx_err_clear(&e);
        CHECK(spx_trdc_open(bad, &f, &e) == SPX_ERR_FORMAT && strstr(e.msg, "bad.refine") &&
                  strstr(e.msg, cases[i].msg),
              "corrupt tuned %zu (%s): %s", i, cases[i].to, e.msg);
        spx_trdc_close(f);
    }
    /* budgets out of order */
    patch(path, bad, "\"budget\":0.1,", "\"budget\":0.0,");
    f = NULL;
    spx_err_clear(&e);
    CHECK(spx_trdc_open(bad, &f, &e) == SPX_ERR_FORMAT && strstr(e.msg, "budget"), "budget 0 read: %s", e.msg);
    spx_trdc_close(f);
    /* refusals of the writer: a missing file, a bad entry; nothing left behind */
    char missing[720];
    snprintf(missing, sizeof missing, "%s/none.refine", dir);
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(missing, &t10, &e) == SPX_ERR_IO && strstr(e.msg, "none.refine"), "missing: %s", e.msg);
    spx_trdc_tuned wrong = t10;
    wrong.budget = 1;
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(path, &wrong, &e) == SPX_ERR_ARG, "budget 1 written");
    wrong = t10;
    wrong.k[2] = -3;
    spx_err_clear(&e);
    CHECK(spx_trdc_set_tuned(path, &wrong, &e) == SPX_ERR_ARG, "k -3 written");
    CHECK(temp_left(dir) == 0, "a temp file was left in %s after a refusal", dir);
    /* a read-only directory (only meaningful when not root: root writes anyway) */
    if (geteuid() != 0) {
        snprintf(cmd, sizeof cmd, "chmod 555 %s", dir);
        CHECK(system(cmd) == 0, "%s", cmd);
        spx_err_clear(&e);
        CHECK(spx_trdc_writable_dir(path, &e) == SPX_ERR_IO && strstr(e.msg, "m.refine"), "read-only dir: %s", e.msg);
        spx_err_clear(&e);
        CHECK(spx_trdc_set_tuned(path, &t10, &e) == SPX_ERR_IO && strstr(e.msg, "writable"), "read-only: %s", e.msg);
        snprintf(cmd, sizeof cmd, "chmod 755 %s", dir);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
}

int main(void) {
    test_search();
    test_manifest();
    return tl_finish("test_refine_tune");
}
