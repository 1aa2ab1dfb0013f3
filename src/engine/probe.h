/* probe.h: what this machine offers (CPU, RAM, NVIDIA GPUs), and a
 * telemetry sampler that records memory, clocks, power and temperature
 * while something runs.
 *
 * GPUs are found through NVML, loaded at run time with dlopen: Spectra has
 * no link or header dependency on the NVIDIA driver, and a machine without
 * libnvidia-ml.so.1 (or without a GPU) is a normal result, 0 GPUs, with the
 * reason in spx_hw.gpu_note. Only the CPU, memory and cgroup fields come
 * from /proc and /sys (Linux); elsewhere they are left 0 / "unknown".
 *
 * Limits: NVML numbers GPUs in PCI bus order; CUDA's default order
 * (CUDA_DEVICE_ORDER=FASTEST_FIRST) and CUDA_VISIBLE_DEVICES may differ, so
 * a GPU index here is the NVML index. Memory "free" is what the driver
 * reports before this process creates a CUDA context. */
#ifndef SPX_PROBE_H
#define SPX_PROBE_H

#include "core/err.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPX_HW_MAX_GPUS 16

typedef struct spx_gpu_info {
    int32_t index;               /* NVML index */
    char name[96];
    uint64_t mem_total, mem_free, mem_used; /* bytes */
    int32_t cc_major, cc_minor;  /* CUDA compute capability; 0.0: unknown */
    int32_t pcie_gen, pcie_width;         /* current link; 0: unknown (idle links train down) */
    int32_t pcie_gen_max, pcie_width_max; /* what the link can do; 0: unknown */
    uint32_t sm_clock_mhz, mem_clock_mhz; /* current; 0: unknown */
    double power_w;              /* current draw; < 0: unknown */
    int32_t temp_c;              /* core temperature; < 0: unknown */
} spx_gpu_info;

typedef struct spx_hw {
    /* CPU */
    char cpu_name[128];
    char arch[16];               /* "x86_64", "aarch64", ... */
    int32_t n_cpus;              /* logical CPUs this process may run on (affinity) */
    int32_t n_cores;             /* physical cores among them; 0: unknown */
    double cpu_quota;            /* cgroup CPU limit in CPUs; 0: none */
    bool avx2, fma, f16c, avx512f, avx512vnni; /* x86 */
    bool neon;                   /* aarch64 (always present there) */
    /* memory */
    uint64_t ram_total;          /* bytes (MemTotal, or the cgroup limit if lower) */
    uint64_t ram_available;      /* bytes (MemAvailable, or the cgroup headroom if lower) */
    uint64_t cgroup_mem_limit;   /* bytes; 0: none */
    uint64_t page_size;
    /* GPUs */
    bool cuda_built;             /* this build has the CUDA backend (SPX_HAVE_CUDA) */
    int32_t n_gpus;
    spx_gpu_info gpus[SPX_HW_MAX_GPUS];
    char driver_version[80];     /* "" when no driver */
    char gpu_note[160];          /* why n_gpus == 0 (or how many were skipped) */
} spx_hw;

/* Fills *out. Never fails for lack of a GPU or of NVML; fails only on
 * bad arguments. */
spx_status spx_hw_probe(spx_hw *out, spx_err *e);
/* The same with the NVML library name or path given (NULL: the driver's
 * "libnvidia-ml.so.1"); tests pass a missing name to exercise absence. */
spx_status spx_hw_probe_lib(spx_hw *out, const char *nvml_path, spx_err *e);

/* The CPU's name alone (spx_hw.cpu_name, without the rest of the probe:
 * no NVML), into buf[cap]. */
void spx_hw_cpu_name(char *buf, size_t cap);

/* Theoretical one-direction PCIe bandwidth in GB/s (1e9 bytes/s) of a link
 * (after line coding: Gen1-2 8b/10b, Gen3+ 128b/130b); 0 when unknown. */
double spx_pcie_gbps(int32_t gen, int32_t width);
/* "AVX2 FMA F16C AVX-512F" etc. into buf; returns buf. */
const char *spx_hw_cpu_features(const spx_hw *hw, char *buf, size_t cap);

struct cJSON;
/* The probe as a new JSON object (NULL on out of memory); caller frees
 * with cJSON_Delete. Sizes in bytes. */
struct cJSON *spx_hw_json(const spx_hw *hw);

/* ---- telemetry --------------------------------------------------------- */

#define SPX_TELE_MAX_GPUS 8

typedef struct spx_tele_gpu {
    uint64_t mem_used;           /* bytes */
    uint32_t sm_clock_mhz, mem_clock_mhz;
    double power_w;              /* < 0: unknown */
    int32_t temp_c;              /* < 0: unknown */
    int32_t util_gpu, util_mem;  /* percent over the last sample period; < 0: unknown */
} spx_tele_gpu;

typedef struct spx_tele_sample {
    double t;                    /* seconds since spx_telemetry_start */
    uint64_t rss;                /* resident set size of this process, bytes */
    double cpu_user_s, cpu_sys_s;/* CPU time of this process so far */
    int32_t n_gpus;
    spx_tele_gpu gpu[SPX_TELE_MAX_GPUS];
} spx_tele_sample;

typedef struct spx_telemetry spx_telemetry;

/* Starts a thread that takes one sample at once and then every
 * interval_ms (0: 100 ms; at least 1 ms) until stopped. GPUs are sampled
 * when NVML is present; otherwise only the CPU fields are filled. */
spx_status spx_telemetry_start(int64_t interval_ms, spx_telemetry **out, spx_err *e);
/* Takes a last sample, stops the thread, frees t and hands over the
 * samples (malloc'd, the caller frees; *samples may be NULL when *n == 0).
 * If memory ran out while sampling, the samples taken so far are kept and
 * a warning is logged. */
void spx_telemetry_stop(spx_telemetry *t, spx_tele_sample **samples, size_t *n);
/* The samples as a JSON array text (malloc'd; NULL on out of memory). */
char *spx_telemetry_json(const spx_tele_sample *s, size_t n);

#endif
