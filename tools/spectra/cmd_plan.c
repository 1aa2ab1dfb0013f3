/* cmd_plan.c: `spectra probe [--json] [--sample SECONDS]` (the hardware
 * alone) and `spectra plan -m MODEL [...]` (the hardware, then the
 * execution plan for that model with a one-line reason per decision).
 * Both only read: nothing is allocated on a GPU. */
#include "cli.h"
#include "common.h"
#include "engine/plan.h"
#include "engine/probe.h"
#include "engine/tuning.h"
#include "model/model.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }
static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

static void print_hw(const spx_hw *hw) {
    char feats[128];
    printf("cpu       %s (%s), %d logical CPUs", hw->cpu_name, hw->arch, (int)hw->n_cpus);
    if (hw->n_cores) printf(", %d physical cores", (int)hw->n_cores);
    if (hw->cpu_quota > 0) printf(", cgroup quota %.2f CPUs", hw->cpu_quota);
    printf("\n          features: %s\n", spx_hw_cpu_features(hw, feats, sizeof feats));
    printf("memory    %.1f GiB total, %.1f GiB available%s, page %llu B\n", gib(hw->ram_total), gib(hw->ram_available),
           hw->cgroup_mem_limit ? " (cgroup limit)" : "", (unsigned long long)hw->page_size);
    printf("build     cpu%s\n", hw->cuda_built ? " + cuda" : " only (no CUDA)");
    if (hw->n_gpus == 0) printf("gpus      none: %s\n", hw->gpu_note[0] ? hw->gpu_note : "not found");
    else printf("gpus      %d (NVIDIA driver %s)%s%s\n", (int)hw->n_gpus, hw->driver_version,
                hw->gpu_note[0] ? "; " : "", hw->gpu_note);
    for (int32_t i = 0; i < hw->n_gpus; i++) {
        const spx_gpu_info *g = &hw->gpus[i];
        printf("  gpu %-3d %s, %.1f GiB (%.1f GiB free), compute %d.%d\n", g->index, g->name, gib(g->mem_total),
               gib(g->mem_free), g->cc_major, g->cc_minor);
        printf("          PCIe Gen%d x%d now, Gen%d x%d max (%.1f GB/s per direction)", g->pcie_gen, g->pcie_width,
               g->pcie_gen_max, g->pcie_width_max, spx_pcie_gbps(g->pcie_gen_max, g->pcie_width_max));
        printf(", SM %u MHz, memory %u MHz", g->sm_clock_mhz, g->mem_clock_mhz);
        if (g->power_w >= 0) printf(", %.0f W", g->power_w);
        if (g->temp_c >= 0) printf(", %d C", (int)g->temp_c);
        printf("\n");
    }
}

static int print_json(cJSON *o) {
    char *txt = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!txt) return cli_error("out of memory");
    printf("%s\n", txt);
    free(txt);
    return 0;
}

/* ---- spectra probe -------------------------------------------------------- */

static void probe_usage(FILE *f) {
    fprintf(f, "usage: spectra probe [--json] [--sample SECONDS]\n"
               "  --json            print one JSON object\n"
               "  --sample SECONDS  then record telemetry (RSS, CPU time; GPU memory, clocks, power,\n"
               "                    temperature) every 100 ms for SECONDS (number, 0.1..3600) and print\n"
               "                    the samples as a JSON array\n"
               "  -h, --help        this help\n");
}

int cmd_probe(int argc, char **argv) {
    int json = 0;
    double sample_s = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { probe_usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "--sample")) { if (!cli_float(a, v, 0.1, 3600, &sample_s)) return 2; }
        else { cli_error("probe: unknown option '%s'", a); probe_usage(stderr); return 2; }
    }
    spx_err e;
    spx_err_clear(&e);
    spx_hw hw;
    if (spx_hw_probe(&hw, &e) != SPX_OK) return cli_fail(&e);
    if (json) {
        if (print_json(spx_hw_json(&hw))) return 1;
    } else {
        print_hw(&hw);
    }
    if (sample_s > 0) {
        spx_telemetry *t;
        if (spx_telemetry_start(100, &t, &e) != SPX_OK) return cli_fail(&e);
        struct timespec ts = {(time_t)sample_s, (long)((sample_s - (double)(time_t)sample_s) * 1e9)};
        while (nanosleep(&ts, &ts) != 0) {
        }
        spx_tele_sample *s;
        size_t n;
        spx_telemetry_stop(t, &s, &n);
        char *txt = spx_telemetry_json(s, n);
        free(s);
        if (!txt) return cli_error("out of memory");
        printf("%s\n", txt);
        free(txt);
    }
    return 0;
}

/* ---- spectra plan --------------------------------------------------------- */

/* Quantized matrices stored tiled (docs/trdc.md 2.4) and those that could
 * be (4-bit G32, width a multiple of 128) but are row-major. */
static void count_layout(const spx_wmat *w, int64_t *tiled, int64_t *could) {
    if (w->kind != SPX_WM_QUANT) return;
    if (w->q.layout == SPX_Q_TILED) ++*tiled;
    else if (spx_q_tiled_ok(w->q.bits, w->q.group, w->q.cols)) ++*could;
}

static void count_layouts(const spx_model *m, int64_t *tiled, int64_t *could) {
    *tiled = *could = 0;
    count_layout(&m->embed, tiled, could);
    if (!(m->lm_head.kind == SPX_WM_QUANT && m->lm_head.q.codes == m->embed.q.codes)) /* not tied */
        count_layout(&m->lm_head, tiled, could);
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const spx_layer *L = &m->layers[l];
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            if (spx_slots[s].mat == 1 && L->w[s].rows) count_layout(&L->w[s], tiled, could);
            for (int64_t x = 0; L->xw[s] && x < L->n_xw; x++) count_layout(&L->xw[s][x], tiled, could); /* experts */
        }
    }
}

static void plan_usage(FILE *f) {
    fprintf(f, "usage: spectra plan -m MODEL [options]\n"
               "  -m MODEL            Hugging Face folder or .trdc file\n"
               "  --ctx N             context tokens (int 1..16777216; default: model maximum capped at 4096,\n"
               "                      shrunk if it does not fit)\n"
               "  --vram-budget MiB   device memory the model may use (int >= 1; default: free - 512 MiB)\n"
               "  --ram-budget MiB    RAM the model may use (int >= 1; default: available - max(1 GiB, 10%%))\n"
               "  --kv TYPE           KV cache f32, f16, q4 or k2v2, k3v2, k3v3, k4v4 (default: f16, q4 if f16 does not fit)\n"
               "  --backend NAME      cpu, cuda or auto (default auto)\n"
               "  --gpu N             GPU index, as NVML numbers them (int >= 0; default 0)\n"
               "  --threads N         worker threads (int 1..1024; default: one per physical core)\n"
               "  --json              print one JSON object {\"hw\", \"model\", \"plan\", \"tuning\"}\n" CLI_REFINE_USAGE
               "  -h, --help          this help\n");
}

int cmd_plan(int argc, char **argv) {
    const char *model = NULL;
    spx_plan_request req = {0};
    int64_t v64;
    int json = 0, rr = 0;
    spx_refine_params rp;
    cli_refine_defaults(&rp);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { plan_usage(stdout); return 0; }
        else if ((rr = cli_refine_opt(argc, argv, &i, &rp)) != 0) { if (rr < 0) return 2; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!(v = cli_value(argc, argv, &i))) return 2;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--ctx")) { if (!cli_int(a, v, 1, SPX_PLAN_MAX_CTX, &req.n_ctx)) return 2; }
        else if (!strcmp(a, "--vram-budget")) { if (!cli_int(a, v, 1, (int64_t)1 << 40, &req.vram_budget_mb)) return 2; }
        else if (!strcmp(a, "--ram-budget")) { if (!cli_int(a, v, 1, (int64_t)1 << 40, &req.ram_budget_mb)) return 2; }
        else if (!strcmp(a, "--kv")) { if (!cli_kv(v, &req.kv)) return 2; }
        else if (!strcmp(a, "--backend")) req.backend = v;
        else if (!strcmp(a, "--gpu")) { if (!cli_int(a, v, 0, SPX_HW_MAX_GPUS - 1, &v64)) return 2; req.gpu = (int32_t)v64; }
        else if (!strcmp(a, "--threads") || !strcmp(a, "-t")) { if (!cli_int(a, v, 1, 1024, &v64)) return 2; req.n_threads = (int32_t)v64; }
        else { cli_error("plan: unknown option '%s'", a); plan_usage(stderr); return 2; }
    }
    spx_err e;
    spx_err_clear(&e);
    spx_hw hw;
    if (spx_hw_probe(&hw, &e) != SPX_OK) return cli_fail(&e);
    spx_model *m = cli_open_model(model, 1);
    if (!m) return 1;
    if (!cli_apply_refine(m, &rp)) { spx_model_free(m); return 1; }
    spx_refine_info ri;
    spx_model_refine_info(m, &ri);
    spx_plan p;
    spx_status st = spx_plan_make(&hw, m, &req, &p, &e);
    const spx_config *c = &m->cfg;
    int quant = spx_plan_model_quantized(m);
    int64_t n_tiled, n_could;
    count_layouts(m, &n_tiled, &n_could);
    int rc = 0;
    if (json) {
        cJSON *o = cJSON_CreateObject(), *mo = NULL;
        if (o) {
            cJSON_AddItemToObject(o, "hw", spx_hw_json(&hw));
            mo = cJSON_AddObjectToObject(o, "model");
        }
        if (mo) {
            cJSON_AddStringToObject(mo, "path", model);
            cJSON_AddStringToObject(mo, "arch", c->arch_name);
            cJSON_AddNumberToObject(mo, "n_layers", (double)c->n_layers);
            cJSON *kinds = cJSON_AddArrayToObject(mo, "layers");
            for (int64_t l = 0; kinds && l < c->n_layers; l++) {
                char k[32];
                cJSON_AddItemToArray(kinds, cJSON_CreateString(spx_layer_kind_name(c, l, k, sizeof k)));
            }
            cJSON_AddNumberToObject(mo, "kv_layers", (double)c->n_attn_layers);
            cJSON_AddNumberToObject(mo, "state_bytes", (double)m->state_floats * 4.0);
            cJSON_AddNumberToObject(mo, "max_context", (double)c->max_pos);
            cJSON_AddBoolToObject(mo, "quantized", quant);
            cJSON_AddNumberToObject(mo, "tiled_matrices", (double)n_tiled);
            cJSON_AddNumberToObject(mo, "row_major_tileable_matrices", (double)n_could);
        }
        if (o && ri.active) {
            cJSON *ro = cJSON_AddObjectToObject(o, "refine");
            if (ro) {
                cJSON_AddStringToObject(ro, "path", rp.path);
                cJSON_AddStringToObject(ro, "tier", ri.on_disk ? "disk" : "ram");
                cJSON_AddNumberToObject(ro, "cache_bytes", (double)ri.cache_bytes);
                cJSON_AddStringToObject(ro, "miss", rp.miss_wait ? "wait" : "skip");
                cJSON_AddNumberToObject(ro, "matrices", (double)ri.n_mats);
                cJSON_AddNumberToObject(ro, "residual_bytes", (double)ri.residual_bytes);
                cJSON_AddNumberToObject(ro, "bytes_per_token", (double)ri.bytes_per_token);
                cJSON_AddStringToObject(ro, "mlp", ri.mlp == SPX_REFINE_MLP_NEURON ? "neuron" : "channel");
                cJSON_AddNumberToObject(ro, "kn", (double)ri.kn);
                cJSON_AddNumberToObject(ro, "bundle_layers", (double)ri.n_bundle_layers);
                cJSON *k = cJSON_AddArrayToObject(ro, "k");
                for (int i = 0; k && i < 4; i++) cJSON_AddItemToArray(k, cJSON_CreateNumber((double)ri.k[i]));
            }
        }
        if (o && st == SPX_OK) cJSON_AddItemToObject(o, "plan", spx_plan_json(&p));
        else if (o) cJSON_AddStringToObject(o, "error", e.msg);
        if (o) cJSON_AddItemToObject(o, "tuning", spx_tuning_json(spx_tuning_get())); /* the SPECTRA_* settings */
        rc = print_json(o);
    } else {
        print_hw(&hw);
        printf("\nmodel     %s: %s, %lld layers, %s, trained context %lld\n", model, c->arch_name,
               (long long)c->n_layers, quant ? "4-bit matrices" : "dense matrices", (long long)c->max_pos);
        char lay[512];
        spx_arch_layers_summary(c, lay, sizeof lay);
        printf("          %s; KV cache in %lld; recurrent state %.1f KiB per sequence\n", lay,
               (long long)c->n_attn_layers, (double)m->state_floats * 4.0 / 1024.0);
        if (n_tiled || n_could)
            printf("          layout: %lld of %lld tileable matrices tiled%s\n", (long long)n_tiled,
                   (long long)(n_tiled + n_could),
                   n_could ? " (`spectra convert` tiles the rest: the CUDA decode GEMV reads tiles 1.2-1.5x faster)" : "");
        if (st == SPX_OK) {
            printf("          weights %.1f MiB (embedding + head %.1f MiB, largest layer %.1f MiB); %.1f MiB read per token\n",
                   mib(p.weight_bytes), mib(p.global_bytes), mib(p.layer_bytes_max), mib(p.read_bytes_per_token));
            printf("\nplan\n");
            printf("  backend    %-12s %s\n", p.backend, p.why_backend);
            printf("  residency  %-12s %s\n", spx_residency_name(p.residency), p.why_residency);
            printf("  kv cache   %-12s %s\n", spx_kv_type_name(p.kv), p.why_kv);
            printf("  context    %-12lld %s\n", (long long)p.n_ctx, p.why_ctx);
            printf("  threads    %-12d %s\n", (int)p.n_threads, p.why_threads);
            printf("  memory     %.1f MiB planned of a %.1f MiB budget (KV %.1f, scratch %.1f)\n", mib(p.planned_bytes),
                   mib(p.budget), mib(p.kv_bytes), mib(p.scratch_bytes));
            if (ri.active) {
                printf("  refinement %-12s %lld matrices, %.1f MiB of residual columns in %s; k per 1024 %lld,%lld,%lld,%lld: "
                       "%.2f MiB per token (%.1f%% beside the weights' %.1f MiB)\n",
                       ri.on_disk ? "disk" : "ram", (long long)ri.n_mats, mib(ri.residual_bytes), rp.path,
                       (long long)ri.k[0], (long long)ri.k[1], (long long)ri.k[2], (long long)ri.k[3],
                       mib(ri.bytes_per_token), 100.0 * (double)ri.bytes_per_token / (double)p.read_bytes_per_token,
                       mib(p.read_bytes_per_token));
                if (ri.mlp == SPX_REFINE_MLP_NEURON)
                    printf("             MLP neuron-wise: %lld neurons per 1024 of the bundles in %lld layers "
                           "(included above)\n", (long long)ri.kn, (long long)ri.n_bundle_layers);
                if (ri.on_disk)
                    printf("             read from disk into a %.0f MiB LRU cache, a miss %s\n", mib(ri.cache_bytes),
                           rp.miss_wait ? "waited for" : "skipped (loaded in the background)");
                if (strcmp(p.backend, "cpu"))
                    printf("             (refinement runs on the cpu backend: run and bench pick it with --refine)\n");
            }
        }
        char tune[1024]; /* the SPECTRA_* settings that are not at their defaults (engine/tuning.h) */
        printf("\ntuning    %s\n", spx_tuning_summary(spx_tuning_get(), tune, sizeof tune));
    }
    if (st != SPX_OK) rc = cli_fail(&e);
    spx_model_free(m);
    return rc;
}
