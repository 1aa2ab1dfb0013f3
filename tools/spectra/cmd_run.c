/* cmd_run.c: `spectra run -m MODEL -p TEXT`: generate text, streaming it
 * to stdout, with timing on stderr (prefill and decode tokens/s). */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "engine/plan.h"
#include "engine/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: spectra run -m MODEL (-p TEXT | -f FILE | --ids LIST) [options]\n"
            "  -m MODEL        Hugging Face folder or .trdc file\n"
            "  -p TEXT         prompt (the tokenizer's BOS rule applies); -p - reads standard input\n"
            "  -f FILE         read the prompt from a file (- : standard input)\n"
            "  --ids LIST      prompt as token ids (comma/space separated; prints ids)\n"
            "  -n N            tokens to generate (int >= 0; default 128)\n"
            "  --temp T        temperature (float >= 0; 0 = greedy; default 0.8)\n"
            "  --top-k K       keep the K most likely tokens (int >= 0, 0 = off; default 40)\n"
            "  --top-p P       nucleus threshold (float in (0, 1], 1 = off; default 0.95)\n"
            "  --seed S        random seed (uint64; default: from the clock, printed)\n"
            "  --ignore-eos    keep generating past the end-of-sequence token\n"
            "  --ctx N         context length (int; default: min(model max, 4096), shrunk if it does not fit)\n"
            "  --kv TYPE       KV cache storage: f32, f16 or q4 (Group-32 4-bit; default f16, q4 if f16\n"
            "                  does not fit)\n"
            "                  or the low-bit k2v2, k3v2, k3v3, k4v4 (docs/kv.md)\n" CLI_KV_USAGE
            "  --threads N     worker threads (int, 1..1024; default: all CPUs)\n"
            "  --backend B     cpu, cuda or auto (default auto: the plan's choice, as `spectra plan` prints\n"
            "                  it: cuda for a .trdc when built in and a GPU is present, else cpu)\n"
            "  --vram-budget MiB  device memory the model may use (int >= 1; default: free - 512 MiB);\n"
            "                  layers that do not fit stream from pinned host memory (ping-pong)\n" CLI_MMAP_USAGE
            "  -q, --quiet     no prompt echo, no plan and no statistics\n" CLI_SPEC_USAGE CLI_REFINE_USAGE
            "                  (--refine picks the cpu backend unless --backend says otherwise)\n");
}

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *file = NULL, *ids_s = NULL;
    int64_t n_gen = 128;
    cli_plan_opts po = {.kv = SPX_KV_DEFAULT};
    cli_sample_opts so;
    cli_sample_defaults(&so);
    cli_kv_extra kvx = {0};
    int ignore_eos = 0, quiet = 0, rr = 0;
    spx_refine_params rp;
    cli_refine_defaults(&rp);
    spx_spec_params spp;
    int spec_given = 0;
    cli_spec_defaults(&spp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if ((rr = cli_spec_opt(argc, argv, &i, &spp, &spec_given)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_refine_opt(argc, argv, &i, &rp)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_kv_opt(argc, argv, &i, &kvx)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_plan_opt(argc, argv, &i, &po)) != 0) { if (rr < 0) return 2; }
        else if ((rr = cli_sample_opt(argc, argv, &i, &so)) != 0) { if (rr < 0) return 2; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { if (!(model = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { if (!(prompt = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "-f")) { if (!(file = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ids")) { if (!(ids_s = cli_value(argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-n")) { if (!cli_int(a, v, 0, 1 << 24, &n_gen)) return 2; }
        else { cli_error("run: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!cli_kv_check(po.kv, &kvx) || !cli_spec_check(&spp)) return 2;
    if (!!prompt + !!file + !!ids_s != 1) {
        cli_error("run: give exactly one of -p TEXT, -f FILE, --ids LIST");
        usage(stderr);
        return 2;
    }
    if (rp.path && !po.backend) po.backend = "cpu"; /* refinement runs on the CPU backend */
    if (kvx.tier_dir && (!po.backend || !strcmp(po.backend, "auto")))
        po.backend = "cpu"; /* the KV file tier: CPU only (docs/kv.md) */
    po.quiet = quiet;
    spx_plan plan;
    spx_model *m = cli_open_planned(model, &po, &plan);
    if (!m) return 1;
    if (!cli_apply_refine(m, &rp)) { spx_model_free(m); return 1; }
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    char *text = NULL;
    size_t text_len = 0;
    spx_session *s = NULL;
    spx_tok_stream *ts = NULL;
    spx_spec *spec = NULL;
    float *logits = NULL;
    spx_err e;
    spx_err_clear(&e);

    if (ids_s) {
        if (!(ids = cli_parse_ids(ids_s, "--ids", 0, &n_prompt))) goto done;
    } else {
        if (!m->tok) { cli_error("%s: the model has no tokenizer; use --ids", model); goto done; }
        if (!file && !strcmp(prompt, "-")) file = "-"; /* -p -: standard input, as -f - */
        if (file) { if (!(text = cli_read_text(file, &text_len))) goto done; }
        else { text = spx_strdup(prompt); text_len = strlen(prompt); }
        if (!text || spx_tok_encode(m->tok, text, text_len, 1, &ids, &n_prompt, &e) != SPX_OK) { cli_fail(&e); goto done; }
        if (n_prompt == 0) { cli_error("run: the prompt encodes to no tokens"); goto done; }
    }
    spx_session_params sp = {.n_ctx = plan.n_ctx, .kv = plan.kv};
    cli_kv_apply(&kvx, &sp);
    if (spx_session_new(m, &sp, &s) != SPX_OK) { cli_error("%s", spx_model_error(m)); goto done; }
    if ((int64_t)n_prompt >= s->n_ctx) { cli_error("run: prompt of %zu tokens does not fit the %lld-token context (--ctx)", n_prompt, (long long)s->n_ctx); goto done; }
    int64_t V = spx_model_vocab_size(m);
    if (!(logits = malloc((size_t)V * sizeof(float)))) { cli_error("out of memory"); goto done; }
    uint64_t rng = so.seed >= 0 ? (uint64_t)so.seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    if (!quiet && so.seed < 0 && so.temp > 0) fprintf(stderr, "seed: %llu\n", (unsigned long long)rng);
    spx_sampler_params smp = {(float)so.temp, (int32_t)so.top_k, (float)so.top_p, rng};

    if (m->tok && !ids_s) {
        if (spx_tok_stream_new(m->tok, 1, &ts, &e) != SPX_OK) { cli_fail(&e); goto done; }
        /* the stream sees the prompt first, so the continuation decodes as
         * it would inside the whole text (no leading-space strip) */
        for (size_t i = 0; i < n_prompt; i++) {
            const char *piece;
            size_t plen;
            if (spx_tok_stream_push(ts, ids[i], &piece, &plen, &e) != SPX_OK) { cli_fail(&e); goto done; }
        }
        if (!quiet) { fwrite(text, 1, text_len, stdout); fflush(stdout); }
    }
    if (spp.kind == SPX_SPEC_LOOKUP && (spx_spec_new(s, &spp, &spec) != SPX_OK ||
                                        spx_spec_history(spec, ids, n_prompt) != SPX_OK)) {
        cli_error("%s", spx_session_error(s));
        goto done;
    }
    double t0 = spx_now();
    if (spx_session_eval(s, ids, n_prompt, logits, 0) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
    double t1 = spx_now();
    int64_t n_done = 0;
    int32_t eos = spx_model_eos_id(m);
    int32_t next = -1; /* after the first token: the one step_greedy / step_sample chose */
    /* speculation: the tokens of the last pass, pend[ip..np_) still to
     * print; all but the last are already fed */
    int32_t pend[SPX_SPEC_DRAFT_LIMIT + 1];
    size_t ip = 0, npd = 0;
    for (; n_done < n_gen; n_done++) {
        int32_t id = next >= 0 ? next : spx_sample(logits, V, &smp, &rng);
        int is_eos = id == eos;
        for (int k = 0; k < m->cfg.n_eos; k++) is_eos |= id == m->cfg.eos_ids[k];
        if (is_eos && !ignore_eos) break;
        if (ts) {
            const char *piece;
            size_t plen;
            if (spx_tok_stream_push(ts, id, &piece, &plen, &e) != SPX_OK) { cli_fail(&e); goto done; }
            fwrite(piece, 1, plen, stdout);
        } else {
            printf("%s%d", n_done ? " " : "", id);
        }
        fflush(stdout);
        if (n_done + 1 == n_gen) { n_done++; break; }
        if (spx_session_pos(s) >= s->n_ctx) { fprintf(stderr, "\n[context full]\n"); n_done++; break; }
        /* the next token is chosen where the logits are (on a GPU: only the id comes back) */
        /* ahead: the step after this one will follow unless its token ends the text (the GPU then queues it) */
        const int ahead = n_done + 2 < n_gen;
        if (spec) {
            if (ip == npd) { /* id is not fed yet: a pass from it */
                size_t room = (size_t)(n_gen - n_done - 1);
                if (spx_spec_step(spec, id, &smp, &rng, pend, room < sizeof pend / sizeof *pend ? room : sizeof pend / sizeof *pend,
                                  &npd) != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
                ip = 0;
            }
            next = pend[ip++];
            continue;
        }
        spx_status st = so.temp <= 0 ? spx_session_step_greedy_ahead(s, id, &next, ahead)
                                  : spx_session_step_sample_ahead(s, id, &smp, &rng, &next, ahead);
        if (st != SPX_OK) { cli_error("%s", spx_session_error(s)); goto done; }
    }
    if (ts) {
        const char *piece;
        size_t plen;
        if (spx_tok_stream_flush(ts, &piece, &plen, &e) == SPX_OK) fwrite(piece, 1, plen, stdout);
    }
    printf("\n");
    fflush(stdout);
    double t2 = spx_now();
    if (!quiet) {
        int64_t decoded = n_done > 0 ? n_done - 1 : 0; /* the first token came from the prefill */
        fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tokens/s)\n", n_prompt, t1 - t0, (double)n_prompt / (t1 - t0));
        fprintf(stderr, "generate: %lld tokens in %.3f s (%.1f tokens/s), %d threads, peak RSS %.1f MiB\n",
                (long long)n_done, t2 - t1, decoded > 0 ? (double)decoded / (t2 - t1) : 0.0, spx_pool_size(m->pool),
                (double)spx_peak_rss() / (1 << 20));
        cli_refine_summary(stderr, m);
        if (spec) {
            spx_spec_stats sst;
            spx_spec_get_stats(spec, &sst);
            cli_spec_summary(stderr, &spp, &sst);
        }
    }
    rc = 0;
done:
    spx_spec_free(spec);
    spx_tok_stream_free(ts);
    free(logits);
    free(ids);
    free(text);
    spx_session_free(s);
    spx_model_free(m);
    return rc;
}
