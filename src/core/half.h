/* half.h: IEEE binary16 and bfloat16 conversions (scalar reference).
 *
 * fp16 <- f32 rounds to nearest even, handles subnormals, overflow to inf
 * and NaN. These are the definitions every SIMD/CUDA conversion is checked
 * against. */
#ifndef SPX_HALF_H
#define SPX_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t spx_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float spx_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float spx_bf16_to_f32(uint16_t h) { return spx_bits_f32((uint32_t)h << 16); }

static inline uint16_t spx_f32_to_bf16(float f) {
    uint32_t u = spx_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);  /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float spx_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0) return spx_bits_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31) return spx_bits_f32(sign | 0x7f800000u | (man << 13));
    return spx_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t spx_f32_to_f16(float f) {
    uint32_t u = spx_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                        /* below 2^-14: subnormal or zero */
        if (a < 0x33000000u) return sign;                         /* < 2^-25: rounds to 0 */
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;                                /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);                   /* round to nearest even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

#endif
