/* Helpers shared by the CPU kernels: bf16 <-> float32 conversions (round to nearest even, as
 * torch rounds) and, with AVX-512, 16-lane loads/stores and a vectorised exp. */
#ifndef RADIXGEN_CPU_COMMON_H
#define RADIXGEN_CPU_COMMON_H

#include <stdint.h>
#include <string.h>

static inline float bf16f(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Round a float to the nearest bf16 value (as float): models torch's bf16 op outputs. */
static inline float rbf(float f) { return bf16f(f2bf(f)); }

#ifdef __AVX512F__
#include <immintrin.h>

static inline __m512 load16_bf16(const uint16_t* p) {
    __m256i raw = _mm256_loadu_si256((const __m256i*)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
static inline __m512 load16_f32(const float* p) { return _mm512_loadu_ps(p); }

/* 16 floats -> 16 bf16 bits, round to nearest even, NaN kept quiet (as f2bf). */
static inline __m256i to_bf16_16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
static inline void store16_bf16(uint16_t* p, __m512 x) {
    _mm256_storeu_si256((__m256i*)p, to_bf16_16(x));
}
/* Round 16 floats to bf16 precision, staying in float32 lanes. */
static inline __m512 round16_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16_16(x)), 16));
}

/* exp(x) within ~2 ulp over [-87, 88]: 2^n * 2^f with 2^f by a degree-6 series; below -87 it
 * returns ~0, above 88 it overflows to inf as expf does. */
static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    x = _mm512_min_ps(x, _mm512_set1_ps(89.0f));
    __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
#endif /* __AVX512F__ */

#endif /* RADIXGEN_CPU_COMMON_H */
