/* bench_parallel.h: `spectra bench --parallel B` (bench_parallel.c). */
#ifndef SPX_CLI_BENCH_PARALLEL_H
#define SPX_CLI_BENCH_PARALLEL_H

#include "spectra.h"
#include <stdint.h>

/* B >= 2 sessions with parameters sp, -p np, -n ng, reps runs; prints the
 * table (or one JSON object); 0 on success, 1 after a message. */
int cli_bench_parallel(spx_model *m, const spx_session_params *sp, int64_t B, int64_t np, int64_t ng, int64_t reps,
                       int json, const char *model);

#endif
