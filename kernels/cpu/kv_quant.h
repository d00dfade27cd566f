/* KV cache storage formats (--kv-cache-dtype, see kernels/kv_quant.py): the conversions the
 * attention kernel reads with and rope_store_kv writes with.
 *
 * kinds: KV_F32 / KV_BF16 (plain values), KV_INT8 (symmetric, x = q * scale with one float32
 * scale per token and kv head, scale = absmax / 127), KV_FP8_E4M3 (float8 e4m3fn, saturated to
 * +-448, round to nearest even; a scale pointer of NULL means the per-tensor scale 1.0).
 * This CPU family has no fp8 instructions: e4m3 is decoded by a 256-entry table (scalar code)
 * and by the same bit layout in AVX-512 lanes (exact for every code; tests check all 256).
 */
#ifndef RADIXGEN_KV_QUANT_H
#define RADIXGEN_KV_QUANT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

enum { KV_F32 = 0, KV_BF16 = 1, KV_INT8 = 2, KV_FP8_E4M3 = 3 };

#define FP8_E4M3_MAX 448.0f
#define INT8_QMAX 127.0f

/* e4m3fn code -> float: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (m * 2^-9); 0x7f / 0xff are NaN (never stored: stores saturate). */
static inline float fp8e4m3_decode(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    float mag = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m, -9);
    if ((b & 0x7f) == 0x7f) mag = NAN;
    return (b & 0x80) ? -mag : mag;
}

static float FP8_E4M3_TABLE[256];

__attribute__((constructor)) static void fp8_table_init(void) {
    for (int i = 0; i < 256; ++i) FP8_E4M3_TABLE[i] = fp8e4m3_decode((uint8_t)i);
}

/* float -> e4m3fn code: saturate to +-448, round to nearest even (as torch's cast after a clamp). */
static inline uint8_t fp8e4m3_encode(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 24) & 0x80u;
    float a = fabsf(x);
    if (!(a <= FP8_E4M3_MAX)) a = FP8_E4M3_MAX;
    uint32_t code;
    if (a < 0.015625f) { /* below 2^-6: multiples of 2^-9 (8 * 2^-9 is the smallest normal) */
        code = (uint32_t)nearbyintf(a * 512.0f);
    } else { /* round the float's mantissa to 3 bits, then rebias the exponent (127 -> 7) */
        uint32_t ua;
        memcpy(&ua, &a, 4);
        code = ((ua + 0x7ffffu + ((ua >> 20) & 1u)) >> 20) - (120u << 3);
    }
    return (uint8_t)(sign | code);
}

/* Element i of a stored row of `kind`, as float (the scale not applied). */
static inline float kv_load(const void* row, int64_t i, int kind) {
    switch (kind) {
        case KV_F32: return ((const float*)row)[i];
        case KV_BF16: return bf16f(((const uint16_t*)row)[i]);
        case KV_INT8: return (float)((const int8_t*)row)[i];
        default: return FP8_E4M3_TABLE[((const uint8_t*)row)[i]];
    }
}

static inline int kv_elem_bytes(int kind) { return kind == KV_F32 ? 4 : kind == KV_BF16 ? 2 : 1; }

/* Store one head's row x[0..D) at element offset `off` of `pool` in `kind`; scaled kinds write
 * the row's scale at scale[scale_off] (int8 always has one; fp8 only when scale is not NULL). */
static inline void kv_store_row(const float* x, int D, int kind, void* pool, int64_t off,
                                float* scale, int64_t scale_off) {
    if (kind == KV_F32) {
        memcpy((float*)pool + off, x, sizeof(float) * D);
        return;
    }
    if (kind == KV_BF16) {
        for (int d = 0; d < D; ++d) ((uint16_t*)pool + off)[d] = f2bf(x[d]);
        return;
    }
    float amax = 0.f;
    for (int d = 0; d < D; ++d) amax = fmaxf(amax, fabsf(x[d]));
    if (kind == KV_INT8) {
        float s = amax / INT8_QMAX;
        float safe = s > 0.f ? s : 1.f;
        int8_t* o = (int8_t*)pool + off;
        for (int d = 0; d < D; ++d) {
            float r = nearbyintf(x[d] / safe);
            o[d] = (int8_t)(r > INT8_QMAX ? INT8_QMAX : r < -INT8_QMAX ? -INT8_QMAX : r);
        }
        scale[scale_off] = s;
        return;
    }
    float s = 1.f;
    if (scale) {
        s = amax > 0.f ? amax / FP8_E4M3_MAX : 1.f;
        scale[scale_off] = s;
    }
    uint8_t* o = (uint8_t*)pool + off;
    for (int d = 0; d < D; ++d) o[d] = fp8e4m3_encode(scale ? x[d] / s : x[d]);
}

#ifdef __AVX512F__
static inline __m512 load16_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}

/* 16 e4m3fn codes -> floats: the 7 magnitude bits placed at the top of a float's exponent and
 * mantissa, rebiased (+120 in the exponent); subnormal codes (exponent 0) are m * 2^-9. */
static inline __m512 load16_fp8(const uint8_t* p) {
    __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
    __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7f));
    __m512i normal = _mm512_add_epi32(_mm512_slli_epi32(mag, 20), _mm512_set1_epi32(120 << 23));
    __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(mag), _mm512_set1_ps(1.0f / 512.0f));
    __mmask16 is_sub = _mm512_cmplt_epi32_mask(mag, _mm512_set1_epi32(8));
    __m512 f = _mm512_mask_mov_ps(_mm512_castsi512_ps(normal), is_sub, sub);
    __m512i sign = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0x80)), 24);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
}
#endif /* __AVX512F__ */

#endif /* RADIXGEN_KV_QUANT_H */
