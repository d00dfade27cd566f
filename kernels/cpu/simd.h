/* A small width-generic float32 SIMD layer for the kernels' non-BF16 variants: one source
 * compiles to AVX-512F (16 lanes, -march=x86-64-v4), AVX2 + FMA (+ F16C) (8 lanes,
 * -march=x86-64-v3) or aarch64 NEON (4 lanes). SIMD_W is the lane count; `vf` holds SIMD_W
 * floats, `vi` SIMD_W int32.
 *
 * - vf_load / vf_store / vf_bcast (one float from memory to every lane) / vf_set1 / vf_zero;
 * - vf_fma(a, b, c) = a * b + c rounded once, vf_add, vf_mul (use vf_fma where a product is
 *   added: with -ffp-contract=fast the compiler may fuse a vf_mul + vf_add on one ISA and not
 *   another, so a kernel that must give the same bits on every path writes the fma itself);
 * - vf_load_bf16 (exact), vf_store_bf16 (round to nearest even, NaN kept quiet: bit for bit
 *   f2bf of cpu_common.h), vf_load_f16 (float16 bits, exact);
 * - vi_load (SIMD_W int32), vi_load_i16 (SIMD_W int16 sign-extended to int32), vi_set1,
 *   vi_and, vi_srli / vi_slli (constant counts), vi_to_f (int32 -> float, exact below 2^24);
 * - vf_hsum: the sum of the lanes in a fixed order (per ISA).
 */
#ifndef RADIXGEN_SIMD_H
#define RADIXGEN_SIMD_H

#include <stdint.h>
#include <string.h>

#include "cpu_common.h"

/* float16 bits -> float32, exact (the fallback where F16C is missing). */
static inline float simd_half_to_float(uint16_t h) {
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31u, f = h & 1023u, u;
    if (e == 0) {
        float v = (float)f * (1.0f / 16777216.0f);
        return s ? -v : v;
    }
    u = e == 31 ? (s | 0x7f800000u | (f << 13)) : (s | ((e + 112u) << 23) | (f << 13));
    float out;
    memcpy(&out, &u, 4);
    return out;
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define SIMD_W 16
typedef __m512 vf;
typedef __m512i vi;
static inline vf vf_load(const float* p) { return _mm512_loadu_ps(p); }
static inline void vf_store(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm512_set1_ps(x); }
static inline vf vf_bcast(const float* p) { return _mm512_set1_ps(*p); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vf_load_bf16(const uint16_t* p) { return load16_bf16(p); }
static inline void vf_store_bf16(uint16_t* p, vf v) { store16_bf16(p, v); }
static inline vf vf_load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}
static inline float vf_hsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline vi vi_load(const void* p) { return _mm512_loadu_si512(p); }
static inline vi vi_load_i16(const void* p) {
    return _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i*)p));
}
static inline vi vi_set1(int32_t x) { return _mm512_set1_epi32(x); }
static inline vi vi_and(vi a, vi b) { return _mm512_and_si512(a, b); }
#define vi_srli(v, n) _mm512_srli_epi32((v), (n))
#define vi_slli(v, n) _mm512_slli_epi32((v), (n))
static inline vf vi_to_f(vi v) { return _mm512_cvtepi32_ps(v); }

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SIMD_W 8
typedef __m256 vf;
typedef __m256i vi;
static inline vf vf_load(const float* p) { return _mm256_loadu_ps(p); }
static inline void vf_store(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vf_set1(float x) { return _mm256_set1_ps(x); }
static inline vf vf_bcast(const float* p) { return _mm256_broadcast_ss(p); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vf_load_bf16(const uint16_t* p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
static inline void vf_store_bf16(uint16_t* p, vf x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    _mm_storeu_si128((__m128i*)p,
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}
static inline vf vf_load_f16(const uint16_t* p) {
#ifdef __F16C__
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
#else
    float t[8];
    for (int i = 0; i < 8; ++i) t[i] = simd_half_to_float(p[i]);
    return _mm256_loadu_ps(t);
#endif
}
static inline float vf_hsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vi vi_load(const void* p) { return _mm256_loadu_si256((const __m256i*)p); }
static inline vi vi_load_i16(const void* p) {
    return _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i*)p));
}
static inline vi vi_set1(int32_t x) { return _mm256_set1_epi32(x); }
static inline vi vi_and(vi a, vi b) { return _mm256_and_si256(a, b); }
#define vi_srli(v, n) _mm256_srli_epi32((v), (n))
#define vi_slli(v, n) _mm256_slli_epi32((v), (n))
static inline vf vi_to_f(vi v) { return _mm256_cvtepi32_ps(v); }

#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define SIMD_W 4
typedef float32x4_t vf;
typedef int32x4_t vi;
static inline vf vf_load(const float* p) { return vld1q_f32(p); }
static inline void vf_store(float* p, vf v) { vst1q_f32(p, v); }
static inline vf vf_set1(float x) { return vdupq_n_f32(x); }
static inline vf vf_bcast(const float* p) { return vld1q_dup_f32(p); }
static inline vf vf_zero(void) { return vdupq_n_f32(0.0f); }
static inline vf vf_fma(vf a, vf b, vf c) { return vfmaq_f32(c, a, b); }
static inline vf vf_add(vf a, vf b) { return vaddq_f32(a, b); }
static inline vf vf_mul(vf a, vf b) { return vmulq_f32(a, b); }
static inline vf vf_load_bf16(const uint16_t* p) {
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16));
}
static inline void vf_store_bf16(uint16_t* p, vf x) {
    uint32x4_t u = vreinterpretq_u32_f32(x);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff)));
    r = vbslq_u32(vceqq_f32(x, x), r, vorrq_u32(u, vdupq_n_u32(0x400000)));
    vst1_u16(p, vshrn_n_u32(r, 16));
}
static inline vf vf_load_f16(const uint16_t* p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}
static inline float vf_hsum(vf v) { return vaddvq_f32(v); }
static inline vi vi_load(const void* p) {
    return vreinterpretq_s32_u8(vld1q_u8((const uint8_t*)p));
}
static inline vi vi_load_i16(const void* p) {
    return vmovl_s16(vreinterpret_s16_u8(vld1_u8((const uint8_t*)p)));
}
static inline vi vi_set1(int32_t x) { return vdupq_n_s32(x); }
static inline vi vi_and(vi a, vi b) { return vandq_s32(a, b); }
#define vi_srli(v, n) vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(v), (n)))
#define vi_slli(v, n) vshlq_n_s32((v), (n))
static inline vf vi_to_f(vi v) { return vcvtq_f32_s32(v); }

#endif

#endif /* RADIXGEN_SIMD_H */
