/* probe.c: hardware probe (CPU, RAM, cgroup limits, NVIDIA GPUs through
 * NVML loaded with dlopen) and the telemetry sampler. See probe.h. */
#include "engine/probe.h"
#include "core/util.h"

#include <cjson/cJSON.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

/* ---- NVML, declared here (no nvml.h needed) ------------------------------
 * Signatures and enum values as documented in NVIDIA's nvml.h. Every call
 * returns nvmlReturn_t, NVML_SUCCESS == 0. Enums are passed as int, which
 * is how the C ABI passes them. */

typedef int nvml_ret;
typedef struct nvmlDevice_st *nvml_dev;
typedef struct nvml_memory {
    unsigned long long total, free, used;
} nvml_memory; /* nvmlMemory_t */
typedef struct nvml_util {
    unsigned int gpu, memory;
} nvml_util; /* nvmlUtilization_t */

enum {
    NVML_SUCCESS = 0,
    NVML_TEMPERATURE_GPU = 0, /* nvmlTemperatureSensors_t */
    NVML_CLOCK_SM = 1,        /* nvmlClockType_t */
    NVML_CLOCK_MEM = 2,
    NVML_NAME_BUF = 96,  /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */
    NVML_DRIVER_BUF = 80 /* NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE */
};

typedef struct nvml_lib {
    void *dl;
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    const char *(*error_string)(nvml_ret);
    nvml_ret (*count)(unsigned int *);
    nvml_ret (*handle)(unsigned int, nvml_dev *);
    nvml_ret (*name)(nvml_dev, char *, unsigned int);
    nvml_ret (*memory)(nvml_dev, nvml_memory *);
    nvml_ret (*cc)(nvml_dev, int *, int *);
    nvml_ret (*pcie_gen)(nvml_dev, unsigned int *);
    nvml_ret (*pcie_width)(nvml_dev, unsigned int *);
    nvml_ret (*pcie_gen_max)(nvml_dev, unsigned int *);
    nvml_ret (*pcie_width_max)(nvml_dev, unsigned int *);
    nvml_ret (*clock)(nvml_dev, int, unsigned int *);
    nvml_ret (*power)(nvml_dev, unsigned int *); /* milliwatts */
    nvml_ret (*temperature)(nvml_dev, int, unsigned int *);
    nvml_ret (*utilization)(nvml_dev, nvml_util *);
    nvml_ret (*driver_version)(char *, unsigned int);
} nvml_lib;

static void *sym(void *dl, const char *a, const char *b) {
    void *p = dlsym(dl, a);
    if (!p && b) p = dlsym(dl, b);
    return p;
}

/* Loads and initialises NVML. On failure writes why into note and returns
 * false (lib zeroed, nothing to close). */
static bool nvml_open(nvml_lib *lib, const char *path, char *note, size_t cap) {
    memset(lib, 0, sizeof *lib);
    void *dl = dlopen(path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        snprintf(note, cap, "no NVIDIA driver: %s not found", path ? path : "libnvidia-ml.so.1");
        return false;
    }
    lib->dl = dl;
#define LOAD(field, a, b)                                                                                              \
    do {                                                                                                               \
        void *p_ = sym(dl, a, b);                                                                                      \
        memcpy(&lib->field, &p_, sizeof p_);                                                                           \
    } while (0)
    LOAD(init, "nvmlInit_v2", "nvmlInit");
    LOAD(shutdown, "nvmlShutdown", NULL);
    LOAD(error_string, "nvmlErrorString", NULL);
    LOAD(count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    LOAD(handle, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    LOAD(name, "nvmlDeviceGetName", NULL);
    LOAD(memory, "nvmlDeviceGetMemoryInfo", NULL);
    LOAD(cc, "nvmlDeviceGetCudaComputeCapability", NULL);
    LOAD(pcie_gen, "nvmlDeviceGetCurrPcieLinkGeneration", NULL);
    LOAD(pcie_width, "nvmlDeviceGetCurrPcieLinkWidth", NULL);
    LOAD(pcie_gen_max, "nvmlDeviceGetMaxPcieLinkGeneration", NULL);
    LOAD(pcie_width_max, "nvmlDeviceGetMaxPcieLinkWidth", NULL);
    LOAD(clock, "nvmlDeviceGetClockInfo", NULL);
    LOAD(power, "nvmlDeviceGetPowerUsage", NULL);
    LOAD(temperature, "nvmlDeviceGetTemperature", NULL);
    LOAD(utilization, "nvmlDeviceGetUtilizationRates", NULL);
    LOAD(driver_version, "nvmlSystemGetDriverVersion", NULL);
#undef LOAD
    if (!lib->init || !lib->shutdown || !lib->count || !lib->handle || !lib->memory) {
        snprintf(note, cap, "%s lacks nvmlInit/nvmlDeviceGetCount/nvmlDeviceGetMemoryInfo",
                 path ? path : "libnvidia-ml.so.1");
        dlclose(dl);
        memset(lib, 0, sizeof *lib);
        return false;
    }
    nvml_ret r = lib->init();
    if (r != NVML_SUCCESS) {
        snprintf(note, cap, "nvmlInit failed: %s (code %d)", lib->error_string ? lib->error_string(r) : "error", r);
        dlclose(dl);
        memset(lib, 0, sizeof *lib);
        return false;
    }
    return true;
}

static void nvml_close(nvml_lib *lib) {
    if (!lib->dl) return;
    lib->shutdown();
    dlclose(lib->dl);
    memset(lib, 0, sizeof *lib);
}

static unsigned nvml_uint(nvml_ret (*f)(nvml_dev, unsigned int *), nvml_dev d) {
    unsigned v = 0;
    if (f && f(d, &v) == NVML_SUCCESS) return v;
    return 0;
}

static double nvml_power_w(const nvml_lib *lib, nvml_dev d) {
    unsigned mw = 0;
    if (lib->power && lib->power(d, &mw) == NVML_SUCCESS) return mw / 1000.0;
    return -1.0;
}

static int32_t nvml_temp(const nvml_lib *lib, nvml_dev d) {
    unsigned t = 0;
    if (lib->temperature && lib->temperature(d, NVML_TEMPERATURE_GPU, &t) == NVML_SUCCESS) return (int32_t)t;
    return -1;
}

static uint32_t nvml_clock(const nvml_lib *lib, nvml_dev d, int which) {
    unsigned mhz = 0;
    if (lib->clock && lib->clock(d, which, &mhz) == NVML_SUCCESS) return mhz;
    return 0;
}

/* ---- CPU and memory from /proc and /sys -------------------------------- */

/* Copies src into dst[cap], truncating. */
static void copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

/* Value after "key" and a ':' on the first matching line of a small
 * "key : value" file, trimmed. Returns false if absent. */
static bool kv_line(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[512];
    size_t kl = strlen(key);
    bool found = false;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) != 0) continue;
        const char *p = line + kl;
        while (*p == ' ' || *p == '\t') p++;
        if (*p != ':') continue;
        p++;
        while (*p == ' ' || *p == '\t') p++;
        snprintf(out, cap, "%s", p);
        size_t n = strlen(out);
        while (n && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = 0;
        found = true;
        break;
    }
    fclose(f);
    return found;
}

/* First integer in a one-line file (sysfs, cgroup); false if absent or
 * not a number (e.g. "max"). */
static bool read_u64(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return false;
    unsigned long long v;
    int ok = fscanf(f, "%llu", &v) == 1;
    fclose(f);
    if (ok) *out = v;
    return ok;
}

static void probe_cpu_name(spx_hw *hw) {
    char v[256];
    if (kv_line("/proc/cpuinfo", "model name", v, sizeof v) || kv_line("/proc/cpuinfo", "Hardware", v, sizeof v) ||
        kv_line("/proc/cpuinfo", "Processor", v, sizeof v)) {
        copy_str(hw->cpu_name, sizeof hw->cpu_name, v);
        return;
    }
    char impl[32], part[32];
    if (kv_line("/proc/cpuinfo", "CPU implementer", impl, sizeof impl) &&
        kv_line("/proc/cpuinfo", "CPU part", part, sizeof part)) {
        snprintf(hw->cpu_name, sizeof hw->cpu_name, "%s CPU (implementer %s, part %s)", hw->arch, impl, part);
        return;
    }
    snprintf(hw->cpu_name, sizeof hw->cpu_name, "%s CPU", hw->arch);
}

/* Logical CPUs in our affinity mask and distinct (package, core) pairs
 * among them. */
static void probe_cores(spx_hw *hw) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        hw->n_cpus = spx_num_cpus();
        return;
    }
    hw->n_cpus = CPU_COUNT(&set);
    if (hw->n_cpus < 1) hw->n_cpus = spx_num_cpus();
    uint64_t *pairs = malloc((size_t)CPU_SETSIZE * sizeof *pairs);
    if (!pairs) return;
    int n = 0;
    bool ok = true;
    for (int c = 0; c < CPU_SETSIZE && ok; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        char p[128];
        uint64_t core, pkg;
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
        ok = read_u64(p, &core);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        ok = ok && read_u64(p, &pkg);
        if (!ok) break;
        uint64_t key = pkg << 32 | (core & 0xffffffffu);
        int dup = 0;
        for (int i = 0; i < n && !dup; i++) dup = pairs[i] == key;
        if (!dup) pairs[n++] = key;
    }
    hw->n_cores = ok && n > 0 ? n : 0;
    free(pairs);
}

/* cgroup v2 cpu.max "QUOTA PERIOD" (or "max PERIOD"), else v1 cfs files. */
static void probe_cpu_quota(spx_hw *hw) {
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        char q[32] = {0};
        unsigned long long period = 0;
        if (fscanf(f, "%31s %llu", q, &period) == 2 && strcmp(q, "max") != 0 && period > 0)
            hw->cpu_quota = strtod(q, NULL) / (double)period;
        fclose(f);
        return;
    }
    uint64_t period;
    FILE *g = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r");
    long long quota = -1;
    if (g) {
        if (fscanf(g, "%lld", &quota) != 1) quota = -1;
        fclose(g);
    }
    if (quota > 0 && read_u64("/sys/fs/cgroup/cpu/cpu.cfs_period_us", &period) && period > 0)
        hw->cpu_quota = (double)quota / (double)period;
}

static void probe_features(spx_hw *hw) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    hw->avx2 = __builtin_cpu_supports("avx2");
    hw->fma = __builtin_cpu_supports("fma");
    /* F16C by cpuid (leaf 1, ECX bit 29): clang's __builtin_cpu_supports
     * does not know "f16c". Its VEX encoding needs the OS to save AVX
     * state, which __builtin_cpu_supports("avx") checks. */
    unsigned a, b, c, d;
    hw->f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1) && __builtin_cpu_supports("avx");
    hw->avx512f = __builtin_cpu_supports("avx512f");
    hw->avx512vnni = __builtin_cpu_supports("avx512vnni");
#elif defined(__aarch64__)
    hw->neon = true; /* Advanced SIMD is mandatory in AArch64 */
#endif
}

static void probe_memory(spx_hw *hw) {
    long ps = sysconf(_SC_PAGESIZE);
    hw->page_size = ps > 0 ? (uint64_t)ps : 4096;
    char v[64];
    if (kv_line("/proc/meminfo", "MemTotal", v, sizeof v)) hw->ram_total = strtoull(v, NULL, 10) * 1024;
    if (kv_line("/proc/meminfo", "MemAvailable", v, sizeof v))
        hw->ram_available = strtoull(v, NULL, 10) * 1024;
    else if (kv_line("/proc/meminfo", "MemFree", v, sizeof v))
        hw->ram_available = strtoull(v, NULL, 10) * 1024;
    if (!hw->ram_total) {
        long pages = sysconf(_SC_PHYS_PAGES);
        if (pages > 0) hw->ram_total = (uint64_t)pages * hw->page_size;
    }
    /* A container sees the host's /proc/meminfo: its own limit is in the
     * cgroup (v2 memory.max/current, else v1). "No limit" reads as "max"
     * (v2) or a number near 2^63 (v1); both fail the < ram_total test. */
    uint64_t lim = 0, cur = 0;
    bool have = read_u64("/sys/fs/cgroup/memory.max", &lim);
    if (have)
        read_u64("/sys/fs/cgroup/memory.current", &cur);
    else if ((have = read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes", &lim)))
        read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes", &cur);
    if (have && lim > 0 && (hw->ram_total == 0 || lim < hw->ram_total)) {
        hw->cgroup_mem_limit = lim;
        hw->ram_total = lim;
        uint64_t room = cur < lim ? lim - cur : 0;
        if (hw->ram_available == 0 || room < hw->ram_available) hw->ram_available = room;
    }
}

/* ---- GPUs --------------------------------------------------------------- */

static void probe_gpus(spx_hw *hw, const char *path) {
    nvml_lib lib;
    if (!nvml_open(&lib, path, hw->gpu_note, sizeof hw->gpu_note)) return;
    if (lib.driver_version && lib.driver_version(hw->driver_version, sizeof hw->driver_version) != NVML_SUCCESS)
        hw->driver_version[0] = 0;
    unsigned n = 0;
    nvml_ret r = lib.count(&n);
    if (r != NVML_SUCCESS) {
        snprintf(hw->gpu_note, sizeof hw->gpu_note, "nvmlDeviceGetCount failed (code %d)", r);
        nvml_close(&lib);
        return;
    }
    if (n == 0) snprintf(hw->gpu_note, sizeof hw->gpu_note, "NVIDIA driver %s present, no GPU", hw->driver_version);
    unsigned skipped = 0;
    for (unsigned i = 0; i < n; i++) {
        if (hw->n_gpus >= SPX_HW_MAX_GPUS) {
            skipped = n - i;
            break;
        }
        nvml_dev d;
        nvml_memory mem;
        /* a GPU we may not query (e.g. another container's) is skipped */
        if (lib.handle(i, &d) != NVML_SUCCESS || lib.memory(d, &mem) != NVML_SUCCESS) {
            skipped++;
            continue;
        }
        spx_gpu_info *g = &hw->gpus[hw->n_gpus++];
        memset(g, 0, sizeof *g);
        g->index = (int32_t)i;
        if (!lib.name || lib.name(d, g->name, sizeof g->name) != NVML_SUCCESS)
            snprintf(g->name, sizeof g->name, "NVIDIA GPU %u", i);
        g->name[sizeof g->name - 1] = 0;
        g->mem_total = mem.total;
        g->mem_free = mem.free;
        g->mem_used = mem.used;
        int maj = 0, min = 0;
        if (lib.cc && lib.cc(d, &maj, &min) == NVML_SUCCESS) {
            g->cc_major = maj;
            g->cc_minor = min;
        }
        g->pcie_gen = (int32_t)nvml_uint(lib.pcie_gen, d);
        g->pcie_width = (int32_t)nvml_uint(lib.pcie_width, d);
        g->pcie_gen_max = (int32_t)nvml_uint(lib.pcie_gen_max, d);
        g->pcie_width_max = (int32_t)nvml_uint(lib.pcie_width_max, d);
        g->sm_clock_mhz = nvml_clock(&lib, d, NVML_CLOCK_SM);
        g->mem_clock_mhz = nvml_clock(&lib, d, NVML_CLOCK_MEM);
        g->power_w = nvml_power_w(&lib, d);
        g->temp_c = nvml_temp(&lib, d);
    }
    if (skipped)
        snprintf(hw->gpu_note, sizeof hw->gpu_note, "%u of %u GPUs skipped (not queryable or over %d)", skipped, n,
                 SPX_HW_MAX_GPUS);
    nvml_close(&lib);
}

/* ---- probe -------------------------------------------------------------- */

spx_status spx_hw_probe_lib(spx_hw *out, const char *nvml_path, spx_err *e) {
    if (!out) return spx_fail(e, SPX_ERR_ARG, "spx_hw_probe: out is NULL");
    memset(out, 0, sizeof *out);
    struct utsname u;
    copy_str(out->arch, sizeof out->arch, uname(&u) == 0 ? u.machine : "unknown");
    probe_cpu_name(out);
    probe_cores(out);
    probe_cpu_quota(out);
    probe_features(out);
    probe_memory(out);
#ifdef SPX_HAVE_CUDA
    out->cuda_built = true;
#endif
    probe_gpus(out, nvml_path);
    return SPX_OK;
}

spx_status spx_hw_probe(spx_hw *out, spx_err *e) { return spx_hw_probe_lib(out, NULL, e); }

void spx_hw_cpu_name(char *buf, size_t cap) {
    spx_hw hw;
    memset(&hw, 0, sizeof hw);
    struct utsname u;
    copy_str(hw.arch, sizeof hw.arch, uname(&u) == 0 ? u.machine : "unknown");
    probe_cpu_name(&hw);
    copy_str(buf, cap, hw.cpu_name);
}

double spx_pcie_gbps(int32_t gen, int32_t width) {
    /* per lane, one direction, after line coding (GT/s * coding / 8) */
    static const double lane[] = {0, 0.25, 0.5, 0.985, 1.969, 3.938, 7.563};
    if (gen < 1 || width < 1) return 0;
    return (gen < (int32_t)(sizeof lane / sizeof lane[0]) ? lane[gen] : lane[6]) * width;
}

const char *spx_hw_cpu_features(const spx_hw *hw, char *buf, size_t cap) {
    if (!cap) return buf;
    buf[0] = 0;
    struct {
        bool on;
        const char *name;
    } f[] = {
        {hw->avx2, "AVX2"},
        {hw->fma, "FMA"},
        {hw->f16c, "F16C"},
        {hw->avx512f, "AVX-512F"},
        {hw->avx512vnni, "AVX512-VNNI"},
        {hw->neon, "NEON"},
    };
    size_t len = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!f[i].on) continue;
        int k = snprintf(buf + len, cap - len, "%s%s", len ? " " : "", f[i].name);
        if (k < 0 || (size_t)k >= cap - len) break;
        len += (size_t)k;
    }
    if (!len) snprintf(buf, cap, "none detected");
    return buf;
}

cJSON *spx_hw_json(const spx_hw *hw) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *cpu = cJSON_AddObjectToObject(o, "cpu");
    cJSON *mem = cJSON_AddObjectToObject(o, "memory");
    cJSON *gpus = cJSON_AddArrayToObject(o, "gpus");
    if (!cpu || !mem || !gpus) goto oom;
    char feats[128];
    cJSON_AddStringToObject(cpu, "name", hw->cpu_name);
    cJSON_AddStringToObject(cpu, "arch", hw->arch);
    cJSON_AddNumberToObject(cpu, "logical_cpus", hw->n_cpus);
    cJSON_AddNumberToObject(cpu, "physical_cores", hw->n_cores);
    cJSON_AddNumberToObject(cpu, "cgroup_cpu_quota", hw->cpu_quota);
    cJSON_AddStringToObject(cpu, "features", spx_hw_cpu_features(hw, feats, sizeof feats));
    cJSON_AddNumberToObject(mem, "total_bytes", (double)hw->ram_total);
    cJSON_AddNumberToObject(mem, "available_bytes", (double)hw->ram_available);
    cJSON_AddNumberToObject(mem, "cgroup_limit_bytes", (double)hw->cgroup_mem_limit);
    cJSON_AddNumberToObject(mem, "page_size", (double)hw->page_size);
    cJSON_AddBoolToObject(o, "cuda_built", hw->cuda_built);
    cJSON_AddStringToObject(o, "driver_version", hw->driver_version);
    cJSON_AddStringToObject(o, "gpu_note", hw->gpu_note);
    for (int32_t i = 0; i < hw->n_gpus; i++) {
        const spx_gpu_info *g = &hw->gpus[i];
        cJSON *j = cJSON_CreateObject();
        if (!j || !cJSON_AddItemToArray(gpus, j)) {
            cJSON_Delete(j);
            goto oom;
        }
        char cc[16];
        snprintf(cc, sizeof cc, "%d.%d", g->cc_major, g->cc_minor);
        cJSON_AddNumberToObject(j, "index", g->index);
        cJSON_AddStringToObject(j, "name", g->name);
        cJSON_AddNumberToObject(j, "mem_total_bytes", (double)g->mem_total);
        cJSON_AddNumberToObject(j, "mem_free_bytes", (double)g->mem_free);
        cJSON_AddNumberToObject(j, "mem_used_bytes", (double)g->mem_used);
        cJSON_AddStringToObject(j, "compute_capability", cc);
        cJSON_AddNumberToObject(j, "pcie_gen", g->pcie_gen);
        cJSON_AddNumberToObject(j, "pcie_width", g->pcie_width);
        cJSON_AddNumberToObject(j, "pcie_gen_max", g->pcie_gen_max);
        cJSON_AddNumberToObject(j, "pcie_width_max", g->pcie_width_max);
        cJSON_AddNumberToObject(j, "pcie_max_gbps", spx_pcie_gbps(g->pcie_gen_max, g->pcie_width_max));
        cJSON_AddNumberToObject(j, "sm_clock_mhz", g->sm_clock_mhz);
        cJSON_AddNumberToObject(j, "mem_clock_mhz", g->mem_clock_mhz);
        cJSON_AddNumberToObject(j, "power_w", g->power_w);
        cJSON_AddNumberToObject(j, "temp_c", g->temp_c);
    }
    return o;
oom:
    cJSON_Delete(o);
    return NULL;
}

/* ---- telemetry ----------------------------------------------------------- */

struct spx_telemetry {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    bool oom;
    int64_t interval_ns;
    double t0;
    nvml_lib nvml; /* dl == NULL: no GPU sampling */
    int32_t n_dev;
    nvml_dev dev[SPX_TELE_MAX_GPUS];
    spx_tele_sample *s; /* [n], capacity cap; only the thread writes until joined */
    size_t n, cap;
};

static uint64_t current_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size, res;
    int ok = fscanf(f, "%llu %llu", &size, &res) == 2;
    fclose(f);
    long ps = sysconf(_SC_PAGESIZE);
    return ok && ps > 0 ? (uint64_t)res * (uint64_t)ps : 0;
}

static void take_sample(spx_telemetry *t) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        spx_tele_sample *p = realloc(t->s, cap * sizeof *p);
        if (!p) {
            t->oom = true;
            return;
        }
        t->s = p;
        t->cap = cap;
    }
    spx_tele_sample *s = &t->s[t->n++];
    memset(s, 0, sizeof *s);
    s->t = spx_now() - t->t0;
    s->rss = current_rss();
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        s->cpu_user_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6;
        s->cpu_sys_s = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    }
    s->n_gpus = t->n_dev;
    for (int32_t i = 0; i < t->n_dev; i++) {
        spx_tele_gpu *g = &s->gpu[i];
        nvml_memory mem;
        if (t->nvml.memory(t->dev[i], &mem) == NVML_SUCCESS) g->mem_used = mem.used;
        g->sm_clock_mhz = nvml_clock(&t->nvml, t->dev[i], NVML_CLOCK_SM);
        g->mem_clock_mhz = nvml_clock(&t->nvml, t->dev[i], NVML_CLOCK_MEM);
        g->power_w = nvml_power_w(&t->nvml, t->dev[i]);
        g->temp_c = nvml_temp(&t->nvml, t->dev[i]);
        nvml_util u;
        if (t->nvml.utilization && t->nvml.utilization(t->dev[i], &u) == NVML_SUCCESS) {
            g->util_gpu = (int32_t)u.gpu;
            g->util_mem = (int32_t)u.memory;
        } else {
            g->util_gpu = g->util_mem = -1;
        }
    }
}

static void *sampler(void *arg) {
    spx_telemetry *t = arg;
    struct timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        pthread_mutex_unlock(&t->mu);
        take_sample(t);
        pthread_mutex_lock(&t->mu);
        /* absolute deadlines: the period does not drift by the sampling time */
        int64_t ns = next.tv_nsec + t->interval_ns;
        next.tv_sec += (time_t)(ns / 1000000000);
        next.tv_nsec = (long)(ns % 1000000000);
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec > next.tv_nsec))
            next = now; /* fell behind (slow sample, suspended): no burst of catch-up samples */
        while (!t->stop && pthread_cond_timedwait(&t->cv, &t->mu, &next) != ETIMEDOUT) {
        }
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

spx_status spx_telemetry_start(int64_t interval_ms, spx_telemetry **out, spx_err *e) {
    *out = NULL;
    if (interval_ms < 0 || interval_ms > 3600 * 1000)
        return spx_fail(e, SPX_ERR_ARG, "telemetry: interval %lld ms is not in [0, 3600000]", (long long)interval_ms);
    spx_telemetry *t = calloc(1, sizeof *t);
    if (!t) return spx_fail(e, SPX_ERR_NOMEM, "telemetry: out of memory");
    t->interval_ns = (interval_ms ? interval_ms : 100) * 1000000;
    t->t0 = spx_now();
    char note[160];
    if (nvml_open(&t->nvml, NULL, note, sizeof note)) {
        unsigned n = 0;
        if (t->nvml.count(&n) == NVML_SUCCESS)
            for (unsigned i = 0; i < n && t->n_dev < SPX_TELE_MAX_GPUS; i++)
                if (t->nvml.handle(i, &t->dev[t->n_dev]) == NVML_SUCCESS) t->n_dev++;
    }
    pthread_condattr_t ca;
    bool ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
    ok = ok && pthread_cond_init(&t->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        nvml_close(&t->nvml);
        free(t);
        return spx_fail(e, SPX_ERR_INTERNAL, "telemetry: pthread_cond_init failed");
    }
    pthread_mutex_init(&t->mu, NULL);
    int rc = pthread_create(&t->thread, NULL, sampler, t);
    if (rc != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        nvml_close(&t->nvml);
        free(t);
        return spx_fail(e, SPX_ERR_NOMEM, "telemetry: cannot start the sampling thread: %s", strerror(rc));
    }
    *out = t;
    return SPX_OK;
}

void spx_telemetry_stop(spx_telemetry *t, spx_tele_sample **samples, size_t *n) {
    *samples = NULL;
    *n = 0;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    take_sample(t); /* the state at the moment of stopping */
    if (t->oom) spx_log(SPX_LOG_WARN, "telemetry: out of memory after %zu samples; later ones were dropped", t->n);
    nvml_close(&t->nvml);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    *samples = t->s;
    *n = t->n;
    free(t);
}

char *spx_telemetry_json(const spx_tele_sample *s, size_t n) {
    cJSON *a = cJSON_CreateArray();
    if (!a) return NULL;
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(a, o)) {
            cJSON_Delete(o);
            goto oom;
        }
        cJSON_AddNumberToObject(o, "t", s[i].t);
        cJSON_AddNumberToObject(o, "rss_bytes", (double)s[i].rss);
        cJSON_AddNumberToObject(o, "cpu_user_s", s[i].cpu_user_s);
        cJSON_AddNumberToObject(o, "cpu_sys_s", s[i].cpu_sys_s);
        cJSON *gs = cJSON_AddArrayToObject(o, "gpus");
        if (!gs) goto oom;
        for (int32_t k = 0; k < s[i].n_gpus && k < SPX_TELE_MAX_GPUS; k++) {
            const spx_tele_gpu *g = &s[i].gpu[k];
            cJSON *j = cJSON_CreateObject();
            if (!j || !cJSON_AddItemToArray(gs, j)) {
                cJSON_Delete(j);
                goto oom;
            }
            cJSON_AddNumberToObject(j, "mem_used_bytes", (double)g->mem_used);
            cJSON_AddNumberToObject(j, "sm_clock_mhz", g->sm_clock_mhz);
            cJSON_AddNumberToObject(j, "mem_clock_mhz", g->mem_clock_mhz);
            cJSON_AddNumberToObject(j, "power_w", g->power_w);
            cJSON_AddNumberToObject(j, "temp_c", g->temp_c);
            cJSON_AddNumberToObject(j, "util_gpu", g->util_gpu);
            cJSON_AddNumberToObject(j, "util_mem", g->util_mem);
        }
    }
    char *txt = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return txt;
oom:
    cJSON_Delete(a);
    return NULL;
}
