/* cmd_bench.c: `spectra bench -m MODEL [-p 512] [-n 128] [-r 5]`: prompt
 * (prefill) and generation tokens/s, median with min..max over r runs,
 * weight bytes read per generated token and the achieved GB/s. Random
 * token ids (seeded), so any model works, with or without a tokenizer.
 * The model runs as the execution plan says (engine/plan.h); with ping-pong
 * offload the backend's transfer measurements follow the runs (copies
 * alone, compute alone, the share of the copy time hidden under compute:
 * docs/design.md). --telemetry samples memory, clocks, power and
 * temperature every 100 ms into the JSON. */
#include "bench_parallel.h"
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/backend.h"
#include "engine/plan.h"
#include "engine/probe.h"
#include "engine/tuning.h"
#include "engine/session.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra bench -m MODEL [options]\n"
               "  -m MODEL        Hugging Face folder or .trdc file\n"
               "  -p N            prompt tokens per run (int >= 0; default 512; 0 skips the prompt test)\n"
               "  -n N            generated tokens per run (int >= 0; default 128)\n"
               "  -r N            runs (int 1..100; default 5)\n"
               "  -f FILE         prompt text from FILE (tokenized with the model's tokenizer; replaces -p's random\n"
               "                  ids and sets -p to its length); generation then continues the prompt\n"
               "  -d N            depth: generation starts after N tokens of context (int >= 0; default 0, as\n"
               "                  llama-bench -d): they are prefilled once, untimed, and each run decodes from\n"
               "                  there (truncated back to N between runs); with -p N too, each run's prompt\n"
               "                  test is that context\n"
               "  --seek          with -d: reach depth N without computing it (spx_session_seek: the cache\n"
               "                  keeps what it holds there, zeros in a new session), so attention at depth\n"
               "                  is timed without the prefill; each run's prompt and generation start at N\n"
               "  --kv TYPE       KV cache storage: f32, f16 or q4 (default f16, q4 if f16 does not fit)\n"
               "                  or the low-bit k2v2, k3v2, k3v3, k4v4 (docs/kv.md)\n" CLI_KV_USAGE
               "  --ctx N         context length (int; default: p + n + 1)\n"
               "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
               "  --backend B     cpu, cuda or auto (default auto: the plan's choice, as `spectra plan` prints\n"
               "                  it: cuda for a .trdc when built in and a GPU is present, else cpu)\n"
               CLI_MMAP_USAGE
               "  --vram-budget MiB  device memory the model may use (int >= 1; default: free - 512 MiB);\n"
               "                  layers that do not fit stream from pinned host memory (ping-pong), and the\n"
               "                  copy and compute times are measured after the runs\n"
               "  --telemetry     sample RSS, CPU time, GPU memory, clocks, power and temperature every\n"
               "                  100 ms during the benchmark (a \"telemetry\" array in the JSON)\n"
               "  --parallel B    B sessions (int 2..256) decoding at once through spx_batch_step, each after its\n"
               "                  own -p random prompt (untimed): total tokens/s, beside one session decoding\n"
               "                  alone in the same runs (not with -f, -d, --seek or --spec)\n"
               "  --json          print one JSON object (on one line)\n" CLI_SPEC_USAGE
               "                  (with --spec or -f, generation continues the prompt, greedy, through the\n"
               "                  speculation loop, off or lookup; otherwise it starts from a reset session)\n"
               CLI_REFINE_USAGE);
}

/* Greedy generation of n tokens continuing the prompt already in s (its
 * last logits in `logits`), through spx_spec_step (kind off: a plain step
 * each time, the same loop); *tps = (n - 1) / seconds (the first token
 * comes from the prompt's logits); the counts add to *acc. */
static int spec_decode_tps(spx_session *s, const spx_spec_params *p, const int32_t *prompt, size_t np, const float *logits,
                           int64_t n, double *tps, spx_spec_stats *acc) {
    spx_spec *sx = NULL;
    if (spx_spec_new(s, p, &sx) != SPX_OK || spx_spec_history(sx, prompt, np) != SPX_OK) {
        cli_error("%s", spx_session_error(s));
        spx_spec_free(sx);
        return 0;
    }
    int32_t id = spx_sample(logits, spx_model_vocab_size(s->m), NULL, NULL), out[SPX_SPEC_DRAFT_LIMIT + 1];
    int64_t done = 1;
    double t0 = spx_now();
    while (done < n) {
        size_t got = 0, room = (size_t)(n - done);
        if (spx_spec_step(sx, id, NULL, NULL, out, room < sizeof out / sizeof *out ? room : sizeof out / sizeof *out, &got) !=
            SPX_OK) {
            cli_error("%s", spx_session_error(s));
            spx_spec_free(sx);
            return 0;
        }
        done += (int64_t)got;
        id = out[got - 1];
    }
    *tps = n > 1 ? (double)(n - 1) / (spx_now() - t0) : 0;
    spx_spec_stats st;
    spx_spec_get_stats(sx, &st);
    acc->passes += st.passes;
    acc->verify += st.verify;
    acc->refeeds += st.refeeds;
    acc->drafted += st.drafted;
    acc->accepted += st.accepted;
    acc->tokens += st.tokens;
    spx_spec_free(sx);
    return 1;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* JSON number, or null when not measured */
static void jnum(const char *key, double v, int ok) {
    if (ok) printf(", \"%s\": %.6g", key, v);
    else printf(", \"%s\": null", key);
}

static void print_telemetry_summary(const spx_tele_sample *t, size_t n) {
    if (!n) return;
    uint64_t rss = 0;
    for (size_t i = 0; i < n; i++) rss = t[i].rss > rss ? t[i].rss : rss;
    printf("  telemetry: %zu samples over %.1f s, peak RSS %.1f MiB\n", n, t[n - 1].t, (double)rss / (1 << 20));
    for (int32_t g = 0; g < t[0].n_gpus && g < SPX_TELE_MAX_GPUS; g++) {
        uint64_t mem = 0;
        double pw = -1;
        int32_t temp = -1;
        uint32_t smin = UINT32_MAX, smax = 0;
        for (size_t i = 0; i < n; i++) {
            const spx_tele_gpu *q = &t[i].gpu[g];
            if (g >= t[i].n_gpus) continue;
            mem = q->mem_used > mem ? q->mem_used : mem;
            pw = q->power_w > pw ? q->power_w : pw;
            temp = q->temp_c > temp ? q->temp_c : temp;
            smin = q->sm_clock_mhz < smin ? q->sm_clock_mhz : smin;
            smax = q->sm_clock_mhz > smax ? q->sm_clock_mhz : smax;
        }
        printf("  gpu %d: peak memory %.1f MiB, SM clock %u..%u MHz", (int)g, (double)mem / (1 << 20), smin, smax);
        if (pw >= 0) printf(", peak power %.0f W", pw);
        if (temp >= 0) printf(", peak %d C", (int)temp);
        printf("\n");
    }
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    int64_t np = 512, ng = 128, reps = 5, threads = 0, n_ctx = 0, vram = 0, depth = 0, par = 0;
    const char *backend = NULL;
    spx_kv_type kv = SPX_KV_DEFAULT;
    cli_kv_extra kvx = {0};
    int json = 0, telemetry = 0, seek = 0, spec_given = 0, use_mmap = 0;
    const char *pfile = NULL;
    spx_refine_params rp;
    cli_refine_defaults(&rp);
    spx_spec_params spp;
    cli_spec_defaults(&spp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int rr = 0;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((rr = cli_refine_opt(argc, argv, &i, &rp)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_kv_opt(argc, argv, &i, &kvx)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_spec_opt(argc, argv, &i, &spp, &spec_given)) != 0) { if (rr < 0) return 2; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--telemetry")) telemetry = 1;
        else if (!strcmp(a, "--seek")) seek = 1;
        else if (!strcmp(a, "--mmap")) use_mmap = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-f")) pfile = v;
        else if (!strcmp(a, "-p")) { if (!cli_int(a, v, 0, 1 << 20, &np)) return 2; }
        else if (!strcmp(a, "-n")) { if (!cli_int(a, v, 0, 1 << 20, &ng)) return 2; }
        else if (!strcmp(a, "-r")) { if (!cli_int(a, v, 1, 100, &reps)) return 2; }
        else if (!strcmp(a, "-d")) { if (!cli_int(a, v, 0, 1 << 24, &depth)) return 2; }
        else if (!strcmp(a, "--parallel")) { if (!cli_int(a, v, 2, 256, &par)) return 2; }
        else if (!strcmp(a, "--kv")) { if (!cli_kv(v, &kv)) return 2; }
        else if (!strcmp(a, "--ctx")) { if (!cli_int(a, v, 1, 1 << 24, &n_ctx)) return 2; }
        else if (!strcmp(a, "--backend")) { if (!cli_backend(v)) return 2; backend = v; }
        else if (!strcmp(a, "--vram-budget")) { if (!cli_int(a, v, 1, (int64_t)1 << 40, &vram)) return 2; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &threads)) return 2; }
        else { cli_error("bench: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!cli_kv_check(kv, &kvx) || !cli_spec_check(&spp)) return 2;
    const int cont = spec_given || pfile; /* generation continues the prompt */
    char *ptext = NULL;
    size_t ptext_len = 0;
    if (pfile && !(ptext = cli_read_text(pfile, &ptext_len))) return 1;
    if (cont && np == 0 && !pfile) { cli_error("bench: --spec continues the prompt: give -p N >= 1 or -f FILE"); free(ptext); return 2; }
    if (np + ng == 0) { cli_error("bench: nothing to do (-p 0 -n 0)"); return 2; }
    if (par && (pfile || depth || seek || spec_given)) {
        cli_error("bench: --parallel does not combine with -f, -d, --seek or --spec");
        free(ptext);
        return 2;
    }
    if (par && ng == 0) { cli_error("bench: --parallel times generation: give -n N >= 1"); return 2; }
    if (depth && !ng) { cli_error("bench: -d %lld without generation (-n 0)", (long long)depth); return 2; }
    if (seek && !depth) { cli_error("bench: --seek needs -d N"); return 2; }
    const int64_t need = seek ? depth + np + ng + 1 : (np > depth ? np : depth) + ng + 1;
    if (cont && (depth || seek)) {
        cli_error("bench: -d and --seek do not combine with --spec or -f (generation continues the prompt)");
        free(ptext);
        return 2;
    }
    if (!pfile && n_ctx > 0 && n_ctx < need) {
        cli_error("bench: --ctx %lld is shorter than %s", (long long)n_ctx,
                  seek ? "-d + -p + -n + 1" : "max(-p, -d) + -n + 1");
        return 2;
    }
    if (rp.path && !backend) backend = "cpu"; /* refinement runs on the CPU backend */
    if (kvx.tier_dir && (!backend || !strcmp(backend, "auto"))) backend = "cpu"; /* the KV file tier: CPU only (docs/kv.md) */
    cli_plan_opts po = {.backend = backend, .threads = threads, .n_ctx = n_ctx > 0 ? n_ctx : need,
                        .vram_budget_mb = vram, .kv = kv, .quiet = json, .mmap = use_mmap};
    spx_plan plan;
    int32_t *file_ids = NULL;
    size_t n_file = 0;
    spx_model *m = NULL;
    if (pfile) {
        /* the file's tokens fix -p; the plan needs the context first, so
         * the model is opened once for its tokenizer */
        spx_model *tm = cli_open_model(model, 1);
        if (!tm) { free(ptext); return 1; }
        size_t cap = ptext_len + 16;
        file_ids = malloc(cap * sizeof *file_ids);
        n_file = cap;
        int ok = file_ids && spx_model_has_tokenizer(tm) && spx_tokenize(tm, ptext, ptext_len, 1, file_ids, &n_file) == SPX_OK;
        if (!ok) cli_error("bench: %s: %s", pfile, spx_model_has_tokenizer(tm) ? spx_model_error(tm) : "the model has no tokenizer");
        spx_model_free(tm);
        free(ptext);
        ptext = NULL;
        if (!ok || n_file == 0) { if (ok) cli_error("bench: %s encodes to no tokens", pfile); free(file_ids); return 1; }
        np = (int64_t)n_file;
        if (n_ctx > 0 && n_ctx < np + ng + 1) { cli_error("bench: --ctx %lld is shorter than the file's %lld tokens + -n %lld + 1", (long long)n_ctx, (long long)np, (long long)ng); free(file_ids); return 2; }
        po.n_ctx = n_ctx > 0 ? n_ctx : np + ng + 1;
    }
    m = cli_open_planned(model, &po, &plan);
    if (!m) { free(file_ids); return 1; }
    if (!cli_apply_refine(m, &rp)) { spx_model_free(m); free(file_ids); return 1; }
    int rc = 1;
    int64_t V = spx_model_vocab_size(m);
    spx_spec_stats sst = {0};
    spx_session *s = NULL;
    spx_session_params sp = {.n_ctx = plan.n_ctx, .kv = plan.kv};
    cli_kv_apply(&kvx, &sp);
    if (par) {
        rc = cli_bench_parallel(m, &sp, par, np, ng, reps, json, model);
        spx_model_free(m);
        return rc;
    }
    float *logits = malloc((size_t)V * sizeof(float));
    const int64_t nid = (np > depth ? np : depth) + 1;
    int32_t *ids = malloc((size_t)nid * sizeof *ids);
    double depth_s = 0;
    int at_depth = 0; /* the session holds the depth's context (and nothing after it, once truncated) */
    double *pp = calloc((size_t)reps, sizeof *pp), *tg = calloc((size_t)reps, sizeof *tg);
    spx_telemetry *tele = NULL;
    spx_tele_sample *samples = NULL;
    size_t n_samples = 0;
    char *tele_json = NULL, *plan_json = NULL, *tune_json = NULL;
    spx_offload_stats off;
    memset(&off, 0, sizeof off);
    spx_err e;
    spx_err_clear(&e);
    if (!logits || !ids || !pp || !tg) { cli_error("out of memory"); goto done; }
    if (spx_session_new(m, &sp, &s) != SPX_OK) { cli_error("%s", spx_model_error(m)); goto done; }
    if (telemetry && spx_telemetry_start(100, &tele, &e) != SPX_OK) { cli_fail(&e); goto done; }
    uint64_t rng = 1234;
    /* warm-up: fault in every weight page once, outside the timings */
    int32_t w0 = 1 % (int32_t)V;
    if (spx_session_eval(s, &w0, 1, logits, 0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
    if (ng > 0 && spx_session_step_greedy(s, w0, &w0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
    for (int64_t r = 0; r < reps; r++) {
        for (int64_t i = 0; i < nid; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = file_ids ? file_ids[i < np ? i : 0] : (int32_t)((rng >> 33) % (uint64_t)V);
        }
        if (np > 0) { /* the prompt test from an empty cache (so the depth's context goes), or at the seek's depth */
            spx_session_reset(s);
            at_depth = 0;
            if (seek && spx_session_seek(s, depth) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
            double t0 = spx_now();
            if (spx_session_eval(s, ids, (size_t)np, logits, 0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
            pp[r] = (double)np / (spx_now() - t0);
            at_depth = np == depth; /* -p N -d N: the prompt test's context is the depth's */
        }
        if (ng > 0 && cont) {
            if (!spec_decode_tps(s, &spp, ids, (size_t)np, logits, ng, &tg[r], &sst)) goto done;
        } else if (ng > 0 && seek) {
            spx_session_reset(s);
            if (spx_session_seek(s, depth) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
            if (!cli_decode_tps_here(s, ids[depth], ng, &tg[r])) goto done;
        } else if (ng > 0 && depth > 0) {
            if (!at_depth) { /* after the prompt test, or the first run: the depth's context once */
                double t0 = spx_now();
                spx_session_reset(s);
                if (spx_session_eval(s, ids, (size_t)depth, logits, 0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
                depth_s += spx_now() - t0;
                at_depth = np == 0; /* with a prompt test it is prefilled again next run */
            } else if (spx_session_truncate(s, depth) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
            if (!cli_decode_tps_here(s, ids[depth], ng, &tg[r])) goto done;
        } else if (ng > 0 && !cli_decode_tps(s, ids[np], ng, &tg[r])) goto done;
        if (!json) fprintf(stderr, "\rrun %lld/%lld", (long long)(r + 1), (long long)reps);
    }
    if (!json) fputc('\n', stderr);
    /* the offload state; with streamed layers, its transfer measurements
     * (decode steps: they overwrite the cache, which the runs are done with) */
    if (spx_session_offload_stats(s, 0, &off, &e) != SPX_OK) { cli_fail(&e); goto done; }
    if (off.pingpong && ng > 0 && spx_session_offload_stats(s, ng < 32 ? (int32_t)ng : 32, &off, &e) != SPX_OK) {
        cli_fail(&e);
        goto done;
    }
    if (tele) {
        spx_telemetry_stop(tele, &samples, &n_samples);
        tele = NULL;
        if (json && !(tele_json = spx_telemetry_json(samples, n_samples))) { cli_error("out of memory"); goto done; }
    }
    qsort(pp, (size_t)reps, sizeof *pp, cmp);
    qsort(tg, (size_t)reps, sizeof *tg, cmp);
    double ppm = pp[reps / 2], tgm = tg[reps / 2];
    uint64_t bpt = spx_model_bytes_per_token(m);
    double gbs = (double)bpt * tgm / 1e9;
    const char *kvn = spx_kv_type_name(s->kv.type);
    /* residency as run: the backend's offload state on cuda, the plan's on the cpu (mmap-stream) */
    spx_residency res = off.pingpong ? SPX_RES_PINGPONG : plan.residency == SPX_RES_MMAP_STREAM ? plan.residency
                                                                                                : SPX_RES_RESIDENT;
    uint64_t sbpt = off.pingpong ? off.stream_bytes_per_token : res == SPX_RES_MMAP_STREAM ? plan.stream_bytes_per_token : 0;
    double bound = off.measured && sbpt ? off.h2d_gbps * 1e9 / (double)sbpt : 0; /* tokens/s the copies allow */
    /* overlap achieved of the most possible: the time copies and compute
     * ran side by side, over the shorter of the two (1: the step costs
     * max(copy, compute)) */
    double lo = off.t_copy_s < off.t_compute_s ? off.t_copy_s : off.t_compute_s;
    double ovl = off.measured && off.uniform && lo > 0 ? (off.t_copy_s + off.t_compute_s - off.t_step_s) / lo : 0;
    ovl = ovl < 0 ? 0 : ovl > 1 ? 1 : ovl;
    if (json) {
        cJSON *pj = spx_plan_json(&plan);
        plan_json = pj ? cJSON_PrintUnformatted(pj) : NULL;
        cJSON_Delete(pj);
        if (!plan_json) { cli_error("out of memory"); goto done; }
        cJSON *tj = spx_tuning_json(spx_tuning_get()); /* the SPECTRA_* settings the run had */
        tune_json = tj ? cJSON_PrintUnformatted(tj) : NULL;
        cJSON_Delete(tj);
        if (!tune_json) { cli_error("out of memory"); goto done; }
        printf("{\"model\": \"%s\", \"backend\": \"%s\", \"cpu_kernels\": \"%s\", \"weights_memory\": \"%s\", \"threads\": %d, \"kv\": \"%s\", \"n_prompt\": %lld, \"n_gen\": %lld, \"depth\": %lld, \"runs\": %lld, "
               "\"pp_tps_median\": %.3f, \"pp_tps_min\": %.3f, \"pp_tps_max\": %.3f, "
               "\"tg_tps_median\": %.3f, \"tg_tps_min\": %.3f, \"tg_tps_max\": %.3f, "
               "\"weight_bytes_per_token\": %llu, \"tg_gbps\": %.3f, \"kv_bytes_per_token\": %.1f, \"depth_seek\": %s, "
               "\"depth_prefill_s\": %.3f",
               model, spx_model_backend(m), spx_model_cpu_kernels(m), spx_model_weights_private(m) == 2   ? "private-rows"
                                                                    : spx_model_weights_private(m) ? "private" : "mapped",
               spx_pool_size(m->pool), kvn, (long long)np, (long long)ng, (long long)depth,
               (long long)reps, ppm, pp[0], pp[reps - 1], tgm, tg[0], tg[reps - 1], (unsigned long long)bpt, gbs,
               spx_kv_cache_bytes_per_token(&s->kv), seek ? "true" : "false", depth_s);
        printf(", \"n_ctx\": %lld, \"residency\": \"%s\", \"n_layers\": %lld, \"n_layers_resident\": %lld, "
               "\"stream_bytes_per_token\": %llu, \"pinned_bytes\": %llu, \"slot_bytes\": %llu",
               (long long)s->n_ctx, spx_residency_name(res), (long long)off.n_layers, (long long)off.n_layers_resident,
               (unsigned long long)sbpt, (unsigned long long)off.pinned_bytes, (unsigned long long)off.slot_bytes);
        printf(", \"offload_steps\": %d", off.measured ? (int)off.n_steps : 0);
        jnum("t_step_ms", off.t_step_s * 1e3, off.measured);
        jnum("t_compute_ms", off.t_compute_s * 1e3, off.measured && off.uniform);
        jnum("t_copy_ms", off.t_copy_s * 1e3, off.measured);
        jnum("h2d_gbps", off.h2d_gbps, off.measured);
        jnum("transfer_hidden_share", off.hidden_share, off.measured && off.uniform);
        jnum("overlap_of_possible", ovl, off.measured && off.uniform);
        jnum("pcie_bound_tps", bound, bound > 0);
        jnum("tg_of_pcie_bound", bound > 0 ? tgm / bound : 0, bound > 0 && ng > 0);
        spx_refine_info ri;
        spx_model_refine_info(m, &ri);
        if (ri.active)
            printf(", \"refine\": {\"mlp\": \"%s\", \"kn\": %lld, \"bundle_layers\": %lld, \"bytes_per_token\": %llu, "
                   "\"k\": [%lld, %lld, %lld, %lld], \"matrices\": %lld, \"residual_bytes\": %llu, "
                   "\"on_disk\": %s, \"direct\": %s, \"cache_bytes\": %llu, \"launches\": %llu, \"selected\": %llu, "
                   "\"applied\": %llu, \"requests\": %llu, \"hits\": %llu, \"bytes_read\": %llu, \"waits\": %llu, "
                   "\"wait_s\": %.6f}",
                   ri.mlp == SPX_REFINE_MLP_NEURON ? "neuron" : "channel", (long long)ri.kn, (long long)ri.n_bundle_layers,
                   (unsigned long long)ri.bytes_per_token, (long long)ri.k[0], (long long)ri.k[1], (long long)ri.k[2],
                   (long long)ri.k[3], (long long)ri.n_mats, (unsigned long long)ri.residual_bytes, ri.on_disk ? "true" : "false", ri.direct ? "true" : "false",
                   (unsigned long long)ri.cache_bytes, (unsigned long long)ri.launches, (unsigned long long)ri.selected,
                   (unsigned long long)ri.applied, (unsigned long long)ri.requests, (unsigned long long)ri.hits,
                   (unsigned long long)ri.bytes_read, (unsigned long long)ri.waits, ri.wait_s);
        if (ri.active) { /* the platform key, and the tuned entry whose budgets ran (docs/trdc.md 2.6) */
            cJSON *pk = cJSON_CreateString(ri.platform);
            char *pks = pk ? cJSON_PrintUnformatted(pk) : NULL;
            cJSON_Delete(pk);
            printf(", \"refine_platform\": %s", pks ? pks : "null");
            free(pks);
            if (ri.tuned) printf(", \"refine_tuned\": {\"budget\": %.6g, \"slowdown\": %.6f, \"kl\": %.6f}", ri.tuned_budget,
                                 ri.tuned_slowdown, ri.tuned_kl);
            else printf(", \"refine_tuned\": null");
        }
        if (cont)
            printf(", \"tg_context\": \"prompt\", \"prompt_file\": %s%s%s, \"spec\": {\"kind\": \"%s\", \"draft_max\": %d, "
                   "\"draft_min\": %d, \"ngram_min\": %d, \"ngram_max\": %d, \"min_count\": [%d, %d, %d, %d], "
                   "\"min_percent\": [%d, %d, %d, %d], \"stop_below\": %.4g, \"pause\": %d, \"passes\": %lld, "
                   "\"verifications\": %lld, \"refeeds\": %lld, \"drafted\": %lld, \"accepted\": %lld, \"tokens\": %lld, "
                   "\"acceptance\": %.4f, \"tokens_per_pass\": %.4f}",
                   pfile ? "\"" : "", pfile ? pfile : "null", pfile ? "\"" : "", spx_spec_kind_name(spp.kind), spp.draft_max,
                   spp.draft_min, spp.ngram_min, spp.ngram_max, spp.min_count[0], spp.min_count[1], spp.min_count[2],
                   spp.min_count[3], spp.min_percent[0], spp.min_percent[1], spp.min_percent[2], spp.min_percent[3],
                   (double)spp.stop_below, spp.pause, (long long)sst.passes, (long long)sst.verify, (long long)sst.refeeds,
                   (long long)sst.drafted, (long long)sst.accepted, (long long)sst.tokens,
                   sst.drafted ? (double)sst.accepted / (double)sst.drafted : 0.0,
                   sst.passes ? (double)sst.tokens / (double)sst.passes : 0.0);
        else printf(", \"tg_context\": \"reset\"");
        printf(", \"plan\": %s", plan_json);
        printf(", \"tuning\": %s", tune_json);
        if (telemetry) printf(", \"telemetry\": %s", tele_json ? tele_json : "[]");
        printf("}\n");
    } else {
        printf("model %s, backend %s, cpu kernels %s, weights %s, %d threads, kv %s, %lld runs\n", model,
               spx_model_backend(m), spx_model_cpu_kernels(m), spx_model_weights_private(m) == 2   ? "in private RAM (row-major)"
                                                : spx_model_weights_private(m) ? "in private RAM" : "mapped",
               spx_pool_size(m->pool), kvn, (long long)reps);
        cli_kv_summary(stdout, s);
        if (np) printf("  pp%-6lld %9.2f tokens/s  (min %.2f, max %.2f)\n", (long long)np, ppm, pp[0], pp[reps - 1]);
        char depth_txt[96] = "";
        if (depth)
        {
            if (seek) snprintf(depth_txt, sizeof depth_txt, " at depth %lld (seek: not computed)", (long long)depth);
            else snprintf(depth_txt, sizeof depth_txt, " at depth %lld (prefilled in %.1f s)", (long long)depth, depth_s);
        }
        if (ng)
            printf("  tg%-6lld %9.2f tokens/s  (min %.2f, max %.2f)%s\n  weights read per token: %.1f MB -> %.2f GB/s\n",
                   (long long)ng, tgm, tg[0], tg[reps - 1], depth_txt, (double)bpt / 1e6, gbs);
        if (off.pingpong) {
            printf("  ping-pong: %lld of %lld layers resident, %.1f MB streamed per token (pinned %.1f MiB, slots 2 x "
                   "%.1f MiB)\n",
                   (long long)off.n_layers_resident, (long long)off.n_layers, (double)sbpt / 1e6,
                   (double)off.pinned_bytes / (1 << 20), (double)off.slot_bytes / (1 << 20));
            if (off.measured)
                printf("  per step (%d steps): copies alone %.2f ms (%.1f GB/s host to device), compute alone %.2f ms, "
                       "ping-pong %.2f ms: %.0f%% of the transfer hidden (%.0f%% of the overlap possible); PCIe bound "
                       "%.2f tokens/s (tg %.0f%% of it)\n",
                       (int)off.n_steps, off.t_copy_s * 1e3, off.h2d_gbps, off.t_compute_s * 1e3, off.t_step_s * 1e3,
                       100 * off.hidden_share, 100 * ovl, bound, bound > 0 ? 100 * tgm / bound : 0);
        }
        if (cont) {
            printf("  generation continues the prompt (%s%s), greedy; ", pfile ? "-f " : "random ids", pfile ? pfile : "");
            cli_spec_summary(stdout, &spp, &sst);
        }
        if (telemetry) print_telemetry_summary(samples, n_samples);
        cli_refine_summary(stdout, m);
    }
    rc = 0;
done:
    if (tele) spx_telemetry_stop(tele, &samples, &n_samples);
    free(samples); free(tele_json); free(plan_json); free(tune_json);
    free(logits); free(ids); free(pp); free(tg); free(file_ids);
    spx_session_free(s);
    spx_model_free(m);
    return rc;
}
