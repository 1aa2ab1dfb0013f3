/* cmd_compress.c: `spectra compress -m HF_DIR -o OUT.trdc`.
 *
 * With --refine and no --fit the .refine (calibration-free residuals) is
 * written in the same pass as the model. With --fit the model is written
 * first and the fitted .refine after it, from the model as written
 * (refine/fit_model.h): a fit that fails removes the model, so no model
 * is left without the .refine asked for. The text's presence and size are
 * checked before compressing; its token count only after (the model's
 * tokenizer is what counts). */
#include "cli.h"
#include "common.h"
#include "core/util.h"
#include "quant/compress.h"
#include "quant/g32.h"
#include "quant/saliency.h"
#include "refine/fit_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f, "usage: spectra compress -m HF_DIR -o OUT.trdc [options]\n"
               "  -m HF_DIR            Hugging Face folder (config.json, *.safetensors, tokenizer files)\n"
               "  -o OUT.trdc          output file (written to a temporary name, renamed when complete)\n"
               "  --bits B             code width (int: 2, 3 or 4; default 4)\n"
               "  --group G            group size along the input dimension (int: 32, 64 or 128; default 32)\n"
               "  --outliers MODE      fp16 outlier input channels: auto (kurtosis-adaptive 0.5-3%%),\n"
               "                       off, or a ratio in [0, 0.25] (default auto)\n"
               "  --method M           scale/zero choice per group: minmax (the paper's rule) or mse\n"
               "                       (least-squares clipping search; default mse)\n"
               "  --importance I       column weights of the mse search: none (default) or gamma (the\n"
               "                       feeding norm's gain squared)\n"
               "  --magnitude on|off   mse: weight each weight's error by (group rms + |w|) as llama.cpp's\n"
               "                       K-quants do (default off: it raised KL on docllama-58m)\n"
               "  --keep SUBSTR        keep tensors whose name contains SUBSTR at source precision\n"
               "                       (repeatable, up to 8; e.g. --keep lm_head)\n"
               "  --layout L           matrix storage: tiled (default: 4-bit G32 matrices whose width is a\n"
               "                       multiple of 128 in 16x128 tiles, read fastest by the CUDA GEMV;\n"
               "                       a version 2 .trdc) or rows (row-major only: a version 1 .trdc for 4-bit\n"
               "                       that older spectra builds read)\n"
               "  --refine OUT.refine  also write the weight refinement of this compression: every layer\n"
               "                       matrix's residual in 4 bits (run, bench, perplexity, kl --refine)\n"
               "  --fit TEXT           with --refine: fit the refinement values to the activations of the\n"
               "                       compressed model on calibration text TEXT (the paper's eqs. 3-4;\n"
               "                       default: none, the calibration-free residual)\n"
               "  --fit-k K            channels per 1024 the fit is made for: one number or four for\n"
               "                       q/k/v,o,gate/up,down (int 1..1024; default 32); run with the same --refine-k\n"
               "  --fit-ctx N          tokens per calibration window (int 2..65536, at most the model's context;\n"
               "                       default 512)\n"
               "  --fit-tokens N       calibration tokens in all, whole windows (int >= --fit-ctx; default 8192)\n"
               "  --refine-bundles     with --refine: also each gated MLP layer's neuron bundles (for\n"
               "                       --refine-mlp neuron; about doubles the .refine)\n"
               "  --threads N          worker threads (int, 1..1024; default: all CPUs)\n"
               "  -q, --quiet          no progress bar\n");
}

typedef struct { int tty; double t0; } prog;

static void on_progress(void *user, int64_t done, int64_t total, const char *name, uint64_t bd, uint64_t bt) {
    prog *p = user;
    if (!p->tty) return;
    double el = spx_now() - p->t0;
    int width = 30, fill = bt ? (int)((double)bd / (double)bt * width) : width;
    fprintf(stderr, "\r[%.*s%*s] %3.0f%% %lld/%lld tensors, %.1f s  %-40.40s", fill,
            "##############################", width - fill, "", bt ? 100.0 * (double)bd / (double)bt : 100.0,
            (long long)done, (long long)total, el, name);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

static void on_fit(void *user, const char *msg) {
    (void)user;
    fprintf(stderr, "\r%-78.78s", msg); /* a terminal's progress line (like the compression's bar) */
}

int cmd_compress(int argc, char **argv) {
    spx_compress_opts o = {0};
    o.bits = 4;
    o.group = 32;
    o.outlier_mode = SPX_OUTLIERS_AUTO;
    o.method = SPX_Q_MSE;
    o.magnitude = 0;
    int quiet = 0;
    /* refinement fitting (refine/fit_model.h) */
    const char *fit_text = NULL;
    int64_t fit_k[4] = {SPX_REFINE_K_DEFAULT, SPX_REFINE_K_DEFAULT, SPX_REFINE_K_DEFAULT, SPX_REFINE_K_DEFAULT};
    int64_t fit_ctx = 512, fit_tokens = 8192;
    int fit_opts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t iv;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--refine-bundles")) o.refine_bundles = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o.src_dir = v;
        else if (!strcmp(a, "-o")) o.out_path = v;
        else if (!strcmp(a, "--refine")) o.refine_path = v;
        else if (!strcmp(a, "--fit")) fit_text = v;
        else if (!strcmp(a, "--fit-k")) {
            if (!cli_refine_ks(a, v, fit_k)) return 2;
            for (int k = 0; k < 4; k++)
                if (fit_k[k] < 1 || fit_k[k] > 1024) { cli_error("--fit-k '%s': each k must be in 1..1024", v); return 2; }
            fit_opts = 1;
        } else if (!strcmp(a, "--fit-ctx")) {
            if (!cli_int(a, v, 2, 65536, &fit_ctx)) return 2;
            fit_opts = 1;
        } else if (!strcmp(a, "--fit-tokens")) {
            if (!cli_int(a, v, 2, (int64_t)1 << 40, &fit_tokens)) return 2;
            fit_opts = 1;
        }
        else if (!strcmp(a, "--bits")) {
            if (!cli_int(a, v, 2, 4, &iv)) return 2;
            o.bits = (int)iv;
        } else if (!strcmp(a, "--group")) {
            if (!cli_int(a, v, 32, 128, &iv) || !spx_q_group_stored_ok((int)iv)) {
                cli_error("--group: expected 32, 64 or 128, got '%s'", v);
                return 2;
            }
            o.group = (int)iv;
        } else if (!strcmp(a, "--outliers")) {
            if (!strcmp(v, "auto")) o.outlier_mode = SPX_OUTLIERS_AUTO;
            else if (!strcmp(v, "off")) o.outlier_mode = SPX_OUTLIERS_OFF;
            else {
                double r;
                if (!cli_float(a, v, 0, 0.25, &r)) return 2;
                o.outlier_mode = r > 0 ? SPX_OUTLIERS_FIXED : SPX_OUTLIERS_OFF;
                o.outlier_ratio = r;
            }
        } else if (!strcmp(a, "--method")) {
            if (!strcmp(v, "minmax")) o.method = SPX_Q_MINMAX;
            else if (!strcmp(v, "mse")) o.method = SPX_Q_MSE;
            else { cli_error("--method: expected minmax or mse, got '%s'", v); return 2; }
        } else if (!strcmp(a, "--keep")) {
            if (o.n_keep == 8) { cli_error("--keep: at most 8 patterns"); return 2; }
            o.keep[o.n_keep++] = v;
        } else if (!strcmp(a, "--magnitude")) {
            if (!strcmp(v, "on")) o.magnitude = 1;
            else if (!strcmp(v, "off")) o.magnitude = 0;
            else { cli_error("--magnitude: expected on or off, got '%s'", v); return 2; }
        } else if (!strcmp(a, "--importance")) {
            if (!strcmp(v, "gamma")) o.importance = SPX_IMP_GAMMA;
            else if (!strcmp(v, "none")) o.importance = SPX_IMP_NONE;
            else { cli_error("--importance: expected gamma or none, got '%s'", v); return 2; }
        } else if (!strcmp(a, "--layout")) {
            if (!cli_layout(v, &o.row_major)) return 2;
        } else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) {
            if (!cli_int(a, v, 1, 1024, &iv)) return 2;
            o.n_threads = (int)iv;
        } else { cli_error("compress: unknown option '%s'", a); usage(stderr); return 2; }
    }
    if (!o.src_dir || !o.out_path) { cli_error("compress: -m HF_DIR and -o OUT.trdc are required"); usage(stderr); return 2; }
    if (o.refine_bundles && !o.refine_path) { cli_error("compress: --refine-bundles needs --refine OUT.refine"); return 2; }
    if (!spx_is_dir(o.src_dir)) { cli_error("%s: not a folder (compress reads a Hugging Face model folder)", o.src_dir); return 1; }
    if (fit_text && !o.refine_path) { cli_error("compress: --fit %s needs --refine OUT.refine (it fits the refinement)", fit_text); return 2; }
    if (fit_opts && !fit_text) { cli_error("compress: --fit-k, --fit-ctx and --fit-tokens need --fit TEXT"); return 2; }
    if (fit_text && fit_tokens < fit_ctx) {
        cli_error("compress: --fit-tokens %lld is less than one window of --fit-ctx %lld", (long long)fit_tokens, (long long)fit_ctx);
        return 2;
    }
    if (fit_text) { /* before the compression: a missing or empty text fails at once */
        FILE *tf = fopen(fit_text, "rb");
        int empty = tf && fgetc(tf) == EOF;
        if (tf) fclose(tf);
        if (!tf || empty) { cli_error("%s: %s (--fit needs a calibration text)", fit_text, tf ? "empty file" : strerror(errno)); return 1; }
    }
    const char *refine_path = o.refine_path;
    if (fit_text) o.refine_path = NULL; /* the fitted .refine is written after the model, from it */
    prog p = {!quiet && isatty(2), spx_now()};
    o.progress = on_progress;
    o.user = &p;
    spx_compress_stats st;
    spx_err e;
    spx_err_clear(&e);
    if (spx_compress(&o, &st, &e) != SPX_OK) return cli_fail(&e);
    double bpw = st.params ? 8.0 * (double)st.out_bytes / (double)st.params : 0;
    fprintf(stderr, "%s: %lld tensors (%lld quantized, %lld outlier channels), %.2f MB -> %.2f MB (%.2fx), "
                    "%.3f bits/weight overall, %.1f s, peak RSS %.1f MiB\n",
            o.out_path, (long long)st.n_tensors, (long long)st.n_quant, (long long)st.n_outlier_cols,
            (double)st.source_bytes / 1e6, (double)st.out_bytes / 1e6,
            st.out_bytes ? (double)st.source_bytes / (double)st.out_bytes : 0, bpw, st.seconds,
            (double)spx_peak_rss() / (1 << 20));
    /* the quantized tensors alone, every stored byte counted */
    const double qp = st.params_quant ? (double)st.params_quant / 8.0 : 1.0;
    const uint64_t qb = st.quant_codes_bytes + st.quant_scales_bytes + st.quant_zeros_bytes + st.quant_outlier_bytes;
    fprintf(stderr, "  quantized tensors: %lld params at %.3f bits/weight (codes %.3f + scales %.3f + zero points %.3f + "
                    "outliers %.3f)\n",
            (long long)st.params_quant, (double)qb / qp, (double)st.quant_codes_bytes / qp,
            (double)st.quant_scales_bytes / qp, (double)st.quant_zeros_bytes / qp, (double)st.quant_outlier_bytes / qp);
    if (o.refine_path)
        fprintf(stderr, "%s: %lld residuals, %.2f MB (4-bit columns + float32 row scales)\n", o.refine_path,
                (long long)st.n_refine, (double)st.refine_bytes / 1e6);
    if (o.refine_bundles)
        fprintf(stderr, "%s: neuron bundles of %lld layers, %.2f MB\n", o.refine_path, (long long)st.n_bundle_layers,
                (double)st.bundle_bytes / 1e6);
    if (fit_text) {
        spx_refine_fit_opts fo = {o.src_dir, o.out_path, refine_path, fit_text, fit_ctx, fit_tokens,
                                  {fit_k[0], fit_k[1], fit_k[2], fit_k[3]}, o.n_threads, p.tty ? on_fit : NULL, NULL};
        spx_refine_fit_result fr;
        spx_err_clear(&e);
        const spx_status fs = spx_refine_fit_write(&fo, &fr, &e);
        if (p.tty) fputc('\n', stderr);
        if (fs != SPX_OK) {
            /* no model file without the .refine it was asked for */
            unlink(o.out_path);
            cli_fail(&e);
            cli_error("compress: removed %s (its fitted refinement could not be made)", o.out_path);
            return 1;
        }
        fprintf(stderr, "%s: %lld fitted residuals, %.2f MB; fit for k %lld,%lld,%lld,%lld on %lld tokens (%lld windows of "
                        "%lld) of %s (%lld tokens), %lld inputs' statistics %.1f MiB, %.1f s collecting, %.1f s solving\n",
                refine_path, (long long)fr.n_mats, (double)fr.refine_bytes / 1e6, (long long)fit_k[0], (long long)fit_k[1],
                (long long)fit_k[2], (long long)fit_k[3], (long long)fr.tokens, (long long)fr.windows, (long long)fit_ctx,
                fit_text, (long long)fr.text_tokens, (long long)fr.n_inputs, (double)fr.stats_bytes / 1048576.0, fr.collect_s, fr.solve_s);
    }
    return 0;
}
