/* tuning.h: the one tuning record. Every environment setting that picks a
 * kernel or changes numbers is a field of spx_tuning, parsed from the
 * SPECTRA_* variables once (spx_tuning_get), printed by `spectra plan` and
 * recorded in `spectra bench --json` (spx_tuning_json: each field under its
 * variable's name). Nothing else in src/ reads these variables.
 *
 * The settings (all for measurements and tests; unset = the default
 * choice; a value none of the listed ones reads as unset unless said):
 *
 *   SPECTRA_KERNELS=scalar|avx2|avx512|amx
 *                                     CPU kernel table (cpu/qkernels.c;
 *                                     the CPU SSD kernels follow it; amx is
 *                                     avx512 with AMX tiles for products of
 *                                     many tokens). Unset or empty: the
 *                                     first of amx, avx512, avx2 the CPU
 *                                     (and OS) runs, else scalar. Unknown
 *                                     name, or a table this CPU lacks: a
 *                                     warning at the first
 *                                     spx_qkernels_best(), then scalar.
 *   SPECTRA_CUDA_CARVEOUT=n           shared-memory carveout (percent) set on
 *                                     every kernel (cuda/common.cuh); default
 *                                     50; read with atoi (non-numbers: 0);
 *                                     outside 0..100 (e.g. -1): the driver's.
 *   SPECTRA_CUDA_RESIDENT_LAYERS=k    ping-pong offload with the first k
 *                                     layers resident (cu_model.cu); k >= L:
 *                                     all. Not an integer >= 0: the model
 *                                     open fails (SPX_ERR_ARG). Empty: unset.
 *   SPECTRA_CUDA_PDL=0|1              programmatic dependent launch; 1.
 *   SPECTRA_CUDA_KVQ4_FUSE=0|1        --kv q4: the decode kernel stores the
 *                                     token's 4-bit row (1) or rope_store
 *                                     does (0); 1.
 *   SPECTRA_CUDA_ATTN_SPLITS=N        attention splits per launch, N > 0;
 *                                     other values: the computed count.
 *   SPECTRA_CUDA_AHEAD=0              never queue a decode step ahead; any
 *                                     other value: as unset (allowed).
 *   SPECTRA_CUDA_ATTN_SPLIT_KERNEL    set (to anything, even "" or "0"): the
 *                                     split attention kernel for decode too.
 *   SPECTRA_CUDA_ATTN_ADAPT=0|1       decode launches run only the splits
 *                                     the position needs (1) or all (0); 1.
 *   SPECTRA_CUBLAS=0|1                0: never load cuBLAS (the prompt GEMMs
 *                                     stay gemm_q4.cu's); 1.
 *   SPECTRA_CUBLAS_MIN_M=n            prompt rows from which cuBLAS runs,
 *                                     n >= 2 (atoi); else 64.
 *   SPECTRA_GEMV_GROUPS=0|1           0: spx_gemv_args.groups ignored; 1.
 *   SPECTRA_GEMV_FORMS=abcde          tiled form (0..2, anything else: the
 *                                     default choice) of the q/k/v, O,
 *                                     gate/up, down and LM-head launches, one
 *                                     character each (the first 5 count).
 *   SPECTRA_GEMV_EARLY_STORE=0|1      the tiled GEMV's early store; 1.
 *   SPECTRA_GEMV_EARLY_OIDX=0|1       the tiled GEMV's early outlier indices;
 *                                     1 (spx_gemv_q4_force_early_oidx(-1)
 *                                     returns to the value given here).
 *   SPECTRA_GEMV_TILED_VARIANT=v      tiled GEMV form, one digit 0..2, as
 *                                     spx_gemv_q4_force_tiled_variant(v);
 *                                     else the default choice.
 *   SPECTRA_GEMV_PAIR=0|1             gate/up: stored apart (0) or as one
 *                                     paired launch (1) in every model; else
 *                                     the model's choice (paired with the
 *                                     two-group GEMV form).
 *
 * Flags (0|1) take exactly "0" or "1"; anything else reads as unset. Each
 * consumer reads its field at the moment it read its variable before (the
 * kernel table and cuBLAS once per process, the GEMV and attention settings
 * at each spx_*_setup, i.e. at each CUDA model open, residency, PDL, the
 * KV fusion and the pairing at each model open, splits and ahead at each
 * session), so the functions that force a variant in tests
 * (spx_gemv_q4_force_tiled_variant, spx_gemv_q4_force_early_oidx,
 * spx_attention_force_adapt) still override the record as they overrode
 * the environment.
 *
 * The environment is read once, at the first spx_tuning_get(). A process
 * that changes a SPECTRA_ variable later (the tests do, with setenv) calls
 * spx_tuning_reload() right after: the consumers that read the environment
 * after that moment then see the new value, exactly as they did when each
 * read getenv itself, and those that had already read it (the kernel table)
 * keep what they read, as before. A per-model copy taken at spx_model_open
 * would not do: the kernel table, the carveout, cuBLAS and the GEMV and
 * attention setup are per process, and the tests set SPECTRA_KERNELS after
 * the CUDA setup calls but before the first CPU model. */
#ifndef SPX_ENGINE_TUNING_H
#define SPX_ENGINE_TUNING_H

#ifdef __cplusplus
extern "C" {
#endif

/* the CUDA kernels' ranges the parser validates against (gemv_q4.cu checks
 * them with static_assert) */
#define SPX_TUNING_TILED_FORMS 3    /* gemv_q4.cu N_TL */
#define SPX_TUNING_GEMV_LAUNCH_KINDS 5

typedef enum {
    SPX_TUNE_KERNELS_AUTO = 0, /* unset or empty: the best table the CPU runs */
    SPX_TUNE_KERNELS_SCALAR,
    SPX_TUNE_KERNELS_AVX2,
    SPX_TUNE_KERNELS_AVX512,
    SPX_TUNE_KERNELS_AMX, /* avx512, with AMX tiles for prompt products */
    SPX_TUNE_KERNELS_UNKNOWN, /* another name (kernels_text): warning, then scalar */
} spx_tune_kernels;

typedef struct spx_tuning {
    /* SPECTRA_KERNELS: the CPU kernel table; default AUTO */
    spx_tune_kernels kernels;
    char kernels_text[64]; /* the value as given (truncated), for the warning; "" when unset */

    /* SPECTRA_CUDA_CARVEOUT: percent of L1 as shared memory for every
     * kernel; default 50; outside 0..100: the driver's choice */
    int cuda_carveout;
    /* SPECTRA_CUDA_RESIDENT_LAYERS: -1 unset (the params' or the memory
     * model's residency), -2 invalid (the model open fails, naming
     * cuda_resident_layers_text), else the count of resident layers */
    long long cuda_resident_layers;
    char cuda_resident_layers_text[64];
    int cuda_pdl;             /* SPECTRA_CUDA_PDL: 1 (default) on, 0 off */
    int cuda_kvq4_fuse;       /* SPECTRA_CUDA_KVQ4_FUSE: 1 (default) fused 4-bit row store, 0 rope_store */
    int cuda_attn_splits;     /* SPECTRA_CUDA_ATTN_SPLITS: 0 (default) the computed count, N > 0 that count */
    int cuda_ahead;           /* SPECTRA_CUDA_AHEAD: 1 (default) steps may be queued ahead, 0 never */
    int cuda_attn_split_kernel; /* SPECTRA_CUDA_ATTN_SPLIT_KERNEL: 0 (default), 1 when set at all */
    int cuda_attn_adapt;      /* SPECTRA_CUDA_ATTN_ADAPT: 1 (default) adaptive split count, 0 all splits */
    int cublas;               /* SPECTRA_CUBLAS: 1 (default) load cuBLAS, 0 never */
    int cublas_min_m;         /* SPECTRA_CUBLAS_MIN_M: rows from which cuBLAS runs; 64 (default), >= 2 */
    int gemv_groups;          /* SPECTRA_GEMV_GROUPS: -1 (default: keep, i.e. on), 0 off, 1 on */
    /* SPECTRA_GEMV_FORMS: the tiled form per launch kind (q/k/v, O, gate/up,
     * down, LM head), -1 the default choice, 0..2 a form; only the first
     * gemv_forms_n kinds are set (0, the default: none) */
    int gemv_forms[SPX_TUNING_GEMV_LAUNCH_KINDS];
    int gemv_forms_n;
    int gemv_early_store;     /* SPECTRA_GEMV_EARLY_STORE: -1 (default: keep, i.e. on), 0 off, 1 on */
    int gemv_early_oidx;      /* SPECTRA_GEMV_EARLY_OIDX: -1 (default: keep, i.e. on), 0 off, 1 on */
    int gemv_tiled_variant;   /* SPECTRA_GEMV_TILED_VARIANT: -1 (default choice) or a form 0..2 */
    int gemv_pair;            /* SPECTRA_GEMV_PAIR: -1 (default: the model's choice), 0 apart, 1 paired */
} spx_tuning;

/* The record of the environment, parsed at the first call (thread-safe),
 * or at the last spx_tuning_reload(). The pointer stays valid for the
 * process's life (a reload makes a new record; old ones are kept). */
const spx_tuning *spx_tuning_get(void);
/* Parses the environment again (after a setenv/unsetenv of a SPECTRA_
 * variable; tests) and returns the new record. Not to be called while
 * another thread starts a model. */
const spx_tuning *spx_tuning_reload(void);
/* Parses an environment given as a lookup function (tests; NULL: getenv)
 * into *t. Never fails: a bad value reads as documented above. */
void spx_tuning_parse(spx_tuning *t, const char *(*lookup)(const char *name, void *ctx), void *ctx);
/* The record with nothing set. */
void spx_tuning_defaults(spx_tuning *t);

/* Every field under its variable's name ("SPECTRA_KERNELS": "auto", ...):
 * numbers, or strings for the kernel name and the forms; the caller frees
 * it with cJSON_Delete. NULL when out of memory. */
struct cJSON *spx_tuning_json(const spx_tuning *t);
/* 1 if every field has its default value. */
int spx_tuning_is_default(const spx_tuning *t);
/* The non-default settings as "NAME=value NAME=value", or "defaults";
 * returns buf (always terminated, truncated to cap). */
char *spx_tuning_summary(const spx_tuning *t, char *buf, unsigned long cap);

#ifdef __cplusplus
}
#endif

#endif
