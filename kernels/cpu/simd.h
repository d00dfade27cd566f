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
 * - vf_hsum: the sum of the lanes in a fixed order (per ISA); vf_hmax: the largest lane;
 *   vf_reduce_w(v): SIMD_W vectors -> lane j = the sum of v[j]'s lanes (a transposing add tree,
 *   fixed order per ISA);
 * - vf_sub, vf_div, vf_max (max(a, b) returns b when either is NaN, as maxps), vf_min,
 *   vf_round (to nearest even), vf_round_bf16 (to bf16 precision, staying in float32 lanes,
 *   bit for bit rbf), vf_exp (exp512's series over any width: within ~2 ulp over [-87, 88]);
 * - vf_load_i8 (SIMD_W int8 -> float, exact), vf_load_fp8 (SIMD_W e4m3fn codes -> float, exact);
 * - masks `vm` (one per lane): vf_gt / vf_ge (ordered), vf_isnan, vm_and, vm_bits (lane i ->
 *   bit i), vm_from_bits (bit i -> lane i), vf_select / vi_select (mask ? a : b); vi_add,
 *   vi_sub, vi_or, vi_srai1 (arithmetic shift by 1), vi_lt, vf_to_i (round to nearest),
 *   vi_as_f / vf_as_i (the bits as the other type), vi_load_u8, vi_iota (0, 1, .., SIMD_W - 1);
 * - vd (SIMD_W / 2 doubles): vd_zero, vd_sqacc (adds the squares of a vf's lower and upper
 *   halves in float64 to two accumulators), vd_hsum2 (the sum of both, in a fixed order).
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
static inline vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vf_round(vf a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline float vf_hmax(vf v) { return _mm512_reduce_max_ps(v); }
static inline vf vf_round_bf16(vf v) { return round16_bf16(v); }
static inline vf vf_load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
static inline vi vi_load_u8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));
}
typedef __mmask16 vm;
static inline vm vf_gt(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
static inline vm vf_ge(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
static inline vm vf_isnan(vf a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
static inline vm vm_and(vm a, vm b) { return (vm)(a & b); }
static inline uint32_t vm_bits(vm m) { return (uint32_t)m; }
static inline vm vm_from_bits(uint32_t b) { return (vm)b; }
static inline vm vi_lt(vi a, vi b) { return _mm512_cmplt_epi32_mask(a, b); }
static inline vf vf_select(vm m, vf a, vf b) { return _mm512_mask_blend_ps(m, b, a); }
static inline vi vi_select(vm m, vi a, vi b) { return _mm512_mask_blend_epi32(m, b, a); }
static inline vi vi_add(vi a, vi b) { return _mm512_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm512_sub_epi32(a, b); }
static inline vi vi_srai1(vi a) { return _mm512_srai_epi32(a, 1); }
static inline vi vf_to_i(vf a) { return _mm512_cvtps_epi32(a); }
static inline vi vi_or(vi a, vi b) { return _mm512_or_si512(a, b); }
static inline vf vi_as_f(vi v) { return _mm512_castsi512_ps(v); }
static inline vi vf_as_i(vf v) { return _mm512_castps_si512(v); }
static inline vi vi_iota(void) {
    return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
static inline vf vf_reduce_w(const vf* v) {
    vf t[8], u[4], w[2];
    for (int i = 0; i < 8; ++i)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; ++i) {
        __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
        u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    for (int i = 0; i < 2; ++i)
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                         _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
}
typedef __m512d vd;
static inline vd vd_zero(void) { return _mm512_setzero_pd(); }
static inline void vd_sqacc(vf v, vd* lo, vd* hi) {
    vd a = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    vd b = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    *lo = _mm512_fmadd_pd(a, a, *lo);
    *hi = _mm512_fmadd_pd(b, b, *hi);
}
static inline double vd_hsum2(vd lo, vd hi) { return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi)); }

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
static inline vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vf_min(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vf_round(vf a) {
    return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
static inline float vf_hmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vf_round_bf16(vf x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline vf vf_load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
static inline vi vi_load_u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
}
typedef __m256 vm;
static inline vm vf_gt(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
static inline vm vf_ge(vf a, vf b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
static inline vm vf_isnan(vf a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
static inline vm vm_and(vm a, vm b) { return _mm256_and_ps(a, b); }
static inline uint32_t vm_bits(vm m) { return (uint32_t)_mm256_movemask_ps(m); }
static inline vm vm_from_bits(uint32_t b) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i x = _mm256_and_si256(_mm256_set1_epi32((int)b), bit);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(x, bit));
}
static inline vm vi_lt(vi a, vi b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(b, a)); }
static inline vf vf_select(vm m, vf a, vf b) { return _mm256_blendv_ps(b, a, m); }
static inline vi vi_select(vm m, vi a, vi b) {
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(b), _mm256_castsi256_ps(a), m));
}
static inline vi vi_add(vi a, vi b) { return _mm256_add_epi32(a, b); }
static inline vi vi_sub(vi a, vi b) { return _mm256_sub_epi32(a, b); }
static inline vi vi_srai1(vi a) { return _mm256_srai_epi32(a, 1); }
static inline vi vf_to_i(vf a) { return _mm256_cvtps_epi32(a); }
static inline vi vi_or(vi a, vi b) { return _mm256_or_si256(a, b); }
static inline vf vi_as_f(vi v) { return _mm256_castsi256_ps(v); }
static inline vi vf_as_i(vf v) { return _mm256_castps_si256(v); }
static inline vi vi_iota(void) { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
static inline vf vf_reduce_w(const vf* v) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                         _mm256_permute2f128_ps(u0, u1, 0x31));
}
#ifdef __F16C__
/* e4m3fn codes as float16 bits (sign to bit 15, the 7 magnitude bits to bits 7..13: the same
 * value times 2^-8, subnormals included), converted by F16C and scaled back: exact. */
#define SIMD_FP8_VIA_F16 1
static inline vf vf_load_fp8(const uint8_t* p) {
    __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)p));
    __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}
#endif
typedef __m256d vd;
static inline vd vd_zero(void) { return _mm256_setzero_pd(); }
static inline void vd_sqacc(vf v, vd* lo, vd* hi) {
    vd a = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    vd b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    *lo = _mm256_fmadd_pd(a, a, *lo);
    *hi = _mm256_fmadd_pd(b, b, *hi);
}
static inline double vd_hsum2(vd lo, vd hi) {
    __m256d s = _mm256_add_pd(lo, hi);
    __m128d t = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
}

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
static inline vf vf_sub(vf a, vf b) { return vsubq_f32(a, b); }
static inline vf vf_div(vf a, vf b) { return vdivq_f32(a, b); }
typedef uint32x4_t vm;
/* as maxps: b when either is NaN (vmaxq_f32 would return the NaN) */
static inline vf vf_max(vf a, vf b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }
static inline vf vf_min(vf a, vf b) { return vbslq_f32(vcltq_f32(a, b), a, b); }
static inline vf vf_round(vf a) { return vrndnq_f32(a); }
static inline float vf_hmax(vf v) { return vmaxvq_f32(v); }
static inline vf vf_round_bf16(vf x) {
    uint32x4_t u = vreinterpretq_u32_f32(x);
    uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
    uint32x4_t r = vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7fff)));
    r = vbslq_u32(vceqq_f32(x, x), r, vorrq_u32(u, vdupq_n_u32(0x400000)));
    return vreinterpretq_f32_u32(vandq_u32(r, vdupq_n_u32(0xffff0000u)));
}
static inline vf vf_load_i8(const int8_t* p) {
    int32_t w;
    memcpy(&w, p, 4);
    int8x8_t b = vreinterpret_s8_s32(vdup_n_s32(w));
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(b))));
}
static inline vi vi_load_u8(const uint8_t* p) {
    uint32_t w;
    memcpy(&w, p, 4);
    uint8x8_t b = vreinterpret_u8_u32(vdup_n_u32(w));
    return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))));
}
static inline vm vf_gt(vf a, vf b) { return vcgtq_f32(a, b); }
static inline vm vf_ge(vf a, vf b) { return vcgeq_f32(a, b); }
static inline vm vf_isnan(vf a) { return vmvnq_u32(vceqq_f32(a, a)); }
static inline vm vm_and(vm a, vm b) { return vandq_u32(a, b); }
static inline uint32_t vm_bits(vm m) {
    const uint32x4_t bit = {1, 2, 4, 8};
    return vaddvq_u32(vandq_u32(m, bit));
}
static inline vm vm_from_bits(uint32_t b) {
    const uint32x4_t bit = {1, 2, 4, 8};
    return vtstq_u32(vdupq_n_u32(b), bit);
}
static inline vm vi_lt(vi a, vi b) { return vcltq_s32(a, b); }
static inline vf vf_select(vm m, vf a, vf b) { return vbslq_f32(m, a, b); }
static inline vi vi_select(vm m, vi a, vi b) { return vbslq_s32(m, a, b); }
static inline vi vi_add(vi a, vi b) { return vaddq_s32(a, b); }
static inline vi vi_sub(vi a, vi b) { return vsubq_s32(a, b); }
static inline vi vi_srai1(vi a) { return vshrq_n_s32(a, 1); }
static inline vi vf_to_i(vf a) { return vcvtnq_s32_f32(a); }
static inline vi vi_or(vi a, vi b) { return vorrq_s32(a, b); }
static inline vf vi_as_f(vi v) { return vreinterpretq_f32_s32(v); }
static inline vi vf_as_i(vf v) { return vreinterpretq_s32_f32(v); }
static inline vi vi_iota(void) {
    const int32x4_t i = {0, 1, 2, 3};
    return i;
}
static inline vf vf_reduce_w(const vf* v) {
    return vpaddq_f32(vpaddq_f32(v[0], v[1]), vpaddq_f32(v[2], v[3]));
}
#define SIMD_FP8_VIA_F16 1 /* as the AVX2 one: e4m3fn codes as float16 bits, times 2^8 */
static inline vf vf_load_fp8(const uint8_t* p) {
    uint32_t b4;
    memcpy(&b4, p, 4);
    uint16x4_t w = vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(b4))));
    uint16x4_t h = vorr_u16(vshl_n_u16(vand_u16(w, vdup_n_u16(0x80)), 8),
                            vshl_n_u16(vand_u16(w, vdup_n_u16(0x7f)), 7));
    return vmulq_f32(vcvt_f32_f16(vreinterpret_f16_u16(h)), vdupq_n_f32(256.0f));
}
typedef float64x2_t vd;
static inline vd vd_zero(void) { return vdupq_n_f64(0.0); }
static inline void vd_sqacc(vf v, vd* lo, vd* hi) {
    vd a = vcvt_f64_f32(vget_low_f32(v)), b = vcvt_high_f64_f32(v);
    *lo = vfmaq_f64(*lo, a, a);
    *hi = vfmaq_f64(*hi, b, b);
}
static inline double vd_hsum2(vd lo, vd hi) { return vaddvq_f64(vaddq_f64(lo, hi)); }

#endif

#ifdef SIMD_W
/* exp(x) as exp512 (cpu_common.h) over any width: 2^n * 2^f with 2^f by a degree-6 series,
 * x clamped to [-87, 89]; 2^n is applied in two exact steps so that n = 128 still gives the
 * finite results below FLT_MAX (as scalef). */
static inline vf vf_exp(vf x) {
    x = vf_max(x, vf_set1(-87.0f));
    x = vf_min(x, vf_set1(89.0f));
    vf t = vf_mul(x, vf_set1(1.44269504088896341f));
    vf n = vf_round(t);
    vf f = vf_sub(t, n);
    vf p = vf_set1(1.5403530393381606e-4f);
    p = vf_fma(p, f, vf_set1(1.3333558146428443e-3f));
    p = vf_fma(p, f, vf_set1(9.6181291076284772e-3f));
    p = vf_fma(p, f, vf_set1(5.5504108664821580e-2f));
    p = vf_fma(p, f, vf_set1(2.4022650695910071e-1f));
    p = vf_fma(p, f, vf_set1(6.9314718055994531e-1f));
    p = vf_fma(p, f, vf_set1(1.0f));
    /* n in [-126, 129]: 2^n = 2^(n >> 1) * 2^(n - (n >> 1)), each a normal float */
    vi ni = vf_to_i(n);
    vi n1 = vi_srai1(ni), n2 = vi_sub(ni, n1);
    vf s1 = vi_as_f(vi_slli(vi_add(n1, vi_set1(127)), 23));
    vf s2 = vi_as_f(vi_slli(vi_add(n2, vi_set1(127)), 23));
    return vf_mul(vf_mul(p, s1), s2);
}

#ifndef SIMD_FP8_VIA_F16
/* SIMD_W e4m3fn codes -> floats (as load16_fp8 of kv_quant.h): the 7 magnitude bits at the top
 * of a float's exponent and mantissa, rebiased (+120); subnormal codes are m * 2^-9. */
static inline vf vf_load_fp8(const uint8_t* p) {
    vi b = vi_load_u8(p);
    vi mag = vi_and(b, vi_set1(0x7f));
    vf normal = vi_as_f(vi_add(vi_slli(mag, 20), vi_set1(120 << 23)));
    vf sub = vf_mul(vi_to_f(mag), vf_set1(1.0f / 512.0f));
    vf f = vf_select(vi_lt(mag, vi_set1(8)), sub, normal);
    vi sign = vi_slli(vi_and(b, vi_set1(0x80)), 24);
    return vi_as_f(vi_or(vf_as_i(f), sign));
}
#endif
#endif

#endif /* RADIXGEN_SIMD_H */
