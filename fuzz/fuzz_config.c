/* fuzz_config.c: libFuzzer target for config.json parsing (the Llama
 * family, the hybrids and MoE: layer lists, patterns, bare Infinity rewriting).
 *
 * On success the parsed config must be one the rest of the engine can
 * trust: a layer count in 1..SPX_MAX_LAYERS, every layer's kinds known,
 * n_attn_layers equal to the attention layers counted, and every tensor
 * slot's shape (model/arch.c) positive in each dimension with an element
 * count that does not overflow. On failure: a message. Seeds:
 * fuzz/seeds_config.sh (every fixture's config.json). */
#include "format/hf_config.h"
#include "model/arch.h"

#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    spx_err e;
    spx_err_clear(&e);
    spx_config c;
    if (spx_config_parse((const char *)data, size, "fuzz", &c, &e) != SPX_OK) {
        if (e.code == SPX_OK || e.msg[0] == '\0') __builtin_trap();
        return 0;
    }
    if (c.n_layers < 1 || c.n_layers > SPX_MAX_LAYERS) __builtin_trap();
    int64_t attn = 0;
    for (int64_t l = 0; l < c.n_layers; l++) {
        if (c.mixer[l] > SPX_MIX_MAMBA2 || c.ffn[l] > SPX_FFN_MOE) __builtin_trap();
        attn += c.mixer[l] == SPX_MIX_ATTN;
        for (int s = 0; s < SPX_SL_COUNT; s++) {
            int64_t d[3];
            int nd = spx_slot_shape(&c, l, (spx_slot)s, d);
            int64_t n = 1;
            for (int i = 0; i < nd; i++) {
                if (d[i] <= 0 || d[i] > ((int64_t)1 << 40) / n) __builtin_trap();
                n *= d[i];
            }
        }
    }
    if (attn != c.n_attn_layers) __builtin_trap();
    char buf[1200];
    spx_arch_layers_summary(&c, buf, sizeof buf);
    if (!memchr(buf, 0, sizeof buf)) __builtin_trap();
    return 0;
}
