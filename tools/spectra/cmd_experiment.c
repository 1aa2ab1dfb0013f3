/* cmd_experiment.c: `spectra experiment gaussian|heavy-channel`: runs
 * Experiments A and B of SPECTRA section 5.7 on seeded synthetic matrices
 * (src/quant/experiment.c) and prints the measured numbers next to the
 * predictions, as a table or JSON. */
#include "cli.h"
#include "quant/experiment.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: spectra experiment gaussian|heavy-channel [options]\n"
            "  gaussian        Experiment A: 2048x2048 N(0,1), Group-32 4-bit, vs Proposition 3\n"
            "  heavy-channel   Experiment B: 1536x1536 N(0,1), 1%% of input channels x m,\n"
            "                  m in {1,4,8,16,32,64}: per-row vs Group-32 vs Group-32 + outliers\n"
            "options:\n"
            "  --seed N        integer >= 0, RNG seed (default 1)\n"
            "  --threads N     integer in [0, 1024], worker threads, 0 = all CPUs (default 0)\n"
            "  --json          print one JSON object instead of a table\n");
}

static void print_gaussian(const spx_exp_gauss_result *r, int json) {
    const spx_range_moments *g = &r->range;
    if (json) {
        printf("{\"experiment\":\"gaussian\",\"seed\":%" PRIu64 ",\"rows\":%lld,\"cols\":%lld,"
               "\"bits\":%d,\"group\":%d,"
               "\"range\":{\"n\":%d,\"e_d\":%.6f,\"e_d2\":%.6f,\"mc_e_d\":%.6f,\"mc_e_d2\":%.6f,"
               "\"mc_groups\":%lld},"
               "\"predicted\":{\"rel_err\":%.6f,\"rel_err_paper_formula\":%.6f,\"snr_db\":%.4f,"
               "\"cosine\":%.6f},"
               "\"minmax\":{\"rel_err\":%.6f,\"snr_db\":%.4f,\"cosine\":%.6f,"
               "\"max_err_over_s\":%.6f,\"max_prop2_excess\":%.3g,\"groups_spanning_zero\":%lld,"
               "\"groups\":%lld},"
               "\"mse\":{\"rel_err\":%.6f,\"snr_db\":%.4f,\"cosine\":%.6f}}\n",
               r->seed, (long long)r->rows, (long long)r->cols, r->bits, r->group, g->n, g->e_d,
               g->e_d2, g->mc_e_d, g->mc_e_d2, (long long)g->mc_groups, r->pred_rel,
               r->pred_rel_paper, r->pred_snr_db, r->pred_cosine, r->minmax.rel_err,
               r->minmax.snr_db, r->minmax.cosine, r->minmax.max_err_over_s,
               r->minmax.max_prop2_excess, (long long)r->minmax.n_groups_span,
               (long long)r->minmax.n_groups, r->mse.rel_err, r->mse.snr_db, r->mse.cosine);
        return;
    }
    printf("Experiment A: %lld x %lld N(0,1), Group-%d %d-bit, seed %" PRIu64 "\n\n",
           (long long)r->rows, (long long)r->cols, r->group, r->bits, r->seed);
    printf("range d of %d N(0,1): E[d] = %.5f, E[d^2] = %.5f (quadrature); "
           "Monte Carlo (%lld groups): %.5f, %.5f\n\n",
           g->n, g->e_d, g->e_d2, (long long)g->mc_groups, g->mc_e_d, g->mc_e_d2);
    printf("%-36s %10s %10s %10s\n", "", "rel err %", "SNR dB", "cosine");
    printf("%-36s %10.3f %10.3f %10.5f\n", "predicted, sqrt(E[d^2])/(n sqrt 12)",
           100 * r->pred_rel, r->pred_snr_db, r->pred_cosine);
    printf("%-36s %10.3f %10.3f %10.5f\n", "paper's formula, E[d]/(n sqrt 12)",
           100 * r->pred_rel_paper, -20 * log10(r->pred_rel_paper),
           1 / sqrt(1 + r->pred_rel_paper * r->pred_rel_paper));
    printf("%-36s %10.3f %10.3f %10.5f\n", "measured, min-max (paper's rule)",
           100 * r->minmax.rel_err, r->minmax.snr_db, r->minmax.cosine);
    printf("%-36s %10.3f %10.3f %10.5f\n", "measured, MSE search", 100 * r->mse.rel_err,
           r->mse.snr_db, r->mse.cosine);
    printf("\nProposition 2: max |w - w^|/s = %.6f over %lld of %lld groups spanning zero "
           "(excess over the exact bound 1/2 + slack: %.3g, <= 0 holds)\n",
           r->minmax.max_err_over_s, (long long)r->minmax.n_groups_span,
           (long long)r->minmax.n_groups, r->minmax.max_prop2_excess);
}

static void print_heavy(const spx_exp_heavy_result *r, int json) {
    if (json) {
        printf("{\"experiment\":\"heavy-channel\",\"seed\":%" PRIu64
               ",\"rows\":%lld,\"cols\":%lld,\"n_heavy\":%lld,\"by_m\":[",
               r->seed, (long long)r->rows, (long long)r->cols, (long long)r->n_heavy);
        for (int i = 0; i < SPX_EXP_HEAVY_NM; i++)
            printf("%s{\"m\":%g,\"per_row\":%.6f,\"g32\":%.6f,\"g32_outliers\":%.6f,"
                   "\"g32_outliers_mse\":%.6f,\"light_per_row\":%.6f,\"light_g32\":%.6f,"
                   "\"light_g32_outliers\":%.6f,\"light_g32_outliers_mse\":%.6f,"
                   "\"kappa\":%.4f,\"ratio\":%.6f,\"n_outliers\":%lld,\"heavy_caught\":%lld}",
                   i ? "," : "", r->m[i], r->rel_row[i], r->rel_g32[i], r->rel_g32_out[i],
                   r->rel_g32_out_mse[i], r->light_row[i], r->light_g32[i], r->light_g32_out[i],
                   r->light_g32_out_mse[i], r->kappa[i], r->ratio[i], (long long)r->n_out[i],
                   (long long)r->heavy_caught[i]);
        printf("]}\n");
        return;
    }
    printf("Experiment B: %lld x %lld N(0,1), %lld input channels scaled by m, 4-bit, seed %" PRIu64
           "\n\n",
           (long long)r->rows, (long long)r->cols, (long long)r->n_heavy, r->seed);
    const char *title[2] = {"relative Frobenius error %, whole matrix (||W|| grows with m)",
                            "relative Frobenius error %, non-heavy columns only"};
    for (int t = 0; t < 2; t++) {
        const double *a = t ? r->light_row : r->rel_row, *b = t ? r->light_g32 : r->rel_g32;
        const double *c = t ? r->light_g32_out : r->rel_g32_out;
        const double *d = t ? r->light_g32_out_mse : r->rel_g32_out_mse;
        printf("%s\n%5s %10s %10s %12s %12s\n%5s %10s %10s %12s %12s\n", title[t], "m", "per-row",
               "G32", "G32+outl", "G32+outl", "", "min-max", "min-max", "min-max", "MSE");
        for (int i = 0; i < SPX_EXP_HEAVY_NM; i++)
            printf("%5g %10.3f %10.3f %12.3f %12.3f\n", r->m[i], 100 * a[i], 100 * b[i],
                   100 * c[i], 100 * d[i]);
        printf("\n");
    }
    printf("adaptive outlier channels (saliency gamma = 1)\n%5s %10s %8s %10s %8s\n", "m", "kappa",
           "r %", "outliers", "heavy");
    for (int i = 0; i < SPX_EXP_HEAVY_NM; i++)
        printf("%5g %10.2f %8.3f %10lld %5lld/%lld\n", r->m[i], r->kappa[i], 100 * r->ratio[i],
               (long long)r->n_out[i], (long long)r->heavy_caught[i], (long long)r->n_heavy);
}

int cmd_experiment(int argc, char **argv) {
    const char *which = NULL;
    int64_t seed = 1, threads = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--seed")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 0, INT64_MAX, &seed)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (!(v = cli_value(argc, argv, &i)) || !cli_int(a, v, 0, 1024, &threads)) return 2;
        } else if (a[0] == '-') {
            cli_error("experiment: unknown option '%s'", a);
            usage(stderr);
            return 2;
        } else if (!which) {
            which = a;
        } else {
            cli_error("experiment: unexpected argument '%s'", a);
            return 2;
        }
    }
    if (!which) {
        usage(stderr);
        return 2;
    }
    spx_err e;
    spx_err_clear(&e);
    if (!strcmp(which, "gaussian")) {
        spx_exp_gauss_result r;
        if (spx_exp_gaussian((uint64_t)seed, (int)threads, &r, &e) != SPX_OK) return cli_fail(&e);
        print_gaussian(&r, json);
    } else if (!strcmp(which, "heavy-channel")) {
        spx_exp_heavy_result r;
        if (spx_exp_heavy_channel((uint64_t)seed, (int)threads, &r, &e) != SPX_OK) return cli_fail(&e);
        print_heavy(&r, json);
    } else {
        cli_error("experiment: '%s': expected gaussian or heavy-channel", which);
        return 2;
    }
    return 0;
}
