/* ragged_attention's key-block kernel over simd.h for the variants without AVX-512 (AVX2 + FMA,
 * aarch64 NEON): one query row's G heads against one key block, for every pool format (float32,
 * bf16, int8 and fp8 e4m3 with or without per-row scales). Included by ragged_attention.c only,
 * after attention_kvq.h; the AVX-512 variants keep attention_block.h / attention_rows.h.
 *
 * Same contract as the block_* functions of ragged_attention.c (unnormalised output, running
 * max and sum), and the same float operations for a row whatever the batch (a prefill chunk's
 * rows run one by one here): q.k per key in one float32 accumulator over D, SIMD_W keys' sums
 * taken at once by vf_reduce_w, times the keys' scales; exp by vf_exp, SIMD_W keys at a
 * time (the block's tail padded with -inf); each weight times its value row's scale; the value
 * rows accumulated in key order.
 */
#ifndef RADIXGEN_ATTENTION_SIMD_H
#define RADIXGEN_ATTENTION_SIMD_H

#include "simd.h"

#if defined(SIMD_W) && !defined(__AVX512F__)
/* SIMD_W values of a stored row of `kind` from element `off`, as float (the scale not applied). */
static inline __attribute__((always_inline)) vf simd_kv_load(const int kind, const char* r,
                                                             int off) {
    switch (kind) {
        case KV_F32: return vf_load((const float*)r + off);
        case KV_BF16: return vf_load_bf16((const uint16_t*)r + off);
        case KV_INT8: return vf_load_i8((const int8_t*)r + off);
        default: return vf_load_fp8((const uint8_t*)r + off);
    }
}

/* One vector's scores over its n keys -> weights in place: p = exp(s - m) with m the largest
 * (from the running max mx), SIMD_W at a time (the tail padded with -inf), their sum in l; then
 * each weight times its value row's scale when vs is given. The one softmax of both the one-row
 * kernel below and attention_rows_simd.h's, so they agree bit for bit. */
static inline __attribute__((always_inline)) void simd_softmax_row(
    float* sc, int64_t n, vf mx, const float* vs, const int64_t* idx, int64_t Hkv, int h,
    float* m_out, float* l_out) {
    const float m = vf_hmax(mx);
    const vf mv = vf_set1(m);
    const int64_t body = n - n % SIMD_W;
    vf sum = vf_zero();
    for (int64_t j0 = 0; j0 < body; j0 += SIMD_W) {
        vf p = vf_exp(vf_sub(vf_load(sc + j0), mv));
        sum = vf_add(sum, p);
        vf_store(sc + j0, p);
    }
    if (body < n) { /* the tail, padded with -inf (exp: 0) */
        float t[SIMD_W];
        for (int i = 0; i < SIMD_W; ++i) t[i] = body + i < n ? sc[body + i] : -INFINITY;
        vf p = vf_exp(vf_sub(vf_load(t), mv));
        sum = vf_add(sum, p);
        vf_store(t, p);
        for (int64_t j = body; j < n; ++j) sc[j] = t[j - body];
    }
    *m_out = m;
    *l_out = vf_hsum(sum);
    if (vs)
        for (int64_t j = 0; j < n; ++j) sc[j] *= vs[idx[j] * Hkv + h];
}

/* Key or value j's pool row (base: k or v at head h of slot 0), with the row of j + 16 prefetched
 * (its first pf_bytes) while j is used: how every kernel here walks a block's scattered slots. */
static inline __attribute__((always_inline)) const char* simd_pool_row(
    const char* base, const int64_t* idx, int64_t j, int64_t n, int64_t row_bytes, int pf_bytes) {
    if (j + 16 < n) {
        const char* pf = base + idx[j + 16] * row_bytes;
        for (int b_ = 0; b_ < pf_bytes; b_ += 64) __builtin_prefetch(pf + b_);
    }
    return base + idx[j] * row_bytes;
}

/* k / v point at head h of slot 0; qf: [G][D] q * scale; ks / vs: scales or NULL. */
static inline __attribute__((always_inline)) void block_simd_body(
    const int kind, const int G, const int C, const float* qf, const char* k, const char* v,
    const float* ks, const float* vs, int64_t Hkv, int h, const int64_t* idx, int64_t n,
    int64_t row_bytes, int pf_bytes, float* acc, float* m_out, float* l_out, float* scores) {
    if (G < 1 || G > MAX_GROUP || C < 1 || C > MAX_DIM / SIMD_W) __builtin_unreachable();
    vf qv[MAX_GROUP * (MAX_DIM / SIMD_W)];
#pragma GCC unroll 64
    for (int i = 0; i < G * C; ++i) qv[i] = vf_load(qf + i * SIMD_W);
    vf mx[MAX_GROUP];
    for (int g = 0; g < G; ++g) mx[g] = vf_set1(-INFINITY);
    /* NOTE: zero-filled once (see value_pass in attention_block.h: -Wmaybe-uninitialized) */
    vf kv[MAX_DIM / SIMD_W] = {0};
    vf part[MAX_GROUP][SIMD_W];
    float sk[SIMD_W], sc[SIMD_W];
    for (int64_t j0 = 0; j0 < n; j0 += SIMD_W) {
        const int nj = n - j0 < SIMD_W ? (int)(n - j0) : SIMD_W;
        for (int jj = 0; jj < SIMD_W; ++jj) {
            if (jj >= nj) {
                sk[jj] = 0.f;
                for (int g = 0; g < G; ++g) part[g][jj] = vf_zero();
                continue;
            }
            const int64_t j = j0 + jj;
            const char* kr = simd_pool_row(k, idx, j, n, row_bytes, pf_bytes);
            sk[jj] = ks ? ks[idx[j] * Hkv + h] : 1.0f;
#pragma GCC unroll 16
            for (int c = 0; c < C; ++c) kv[c] = simd_kv_load(kind, kr, c * SIMD_W);
#pragma GCC unroll 16
            for (int g = 0; g < G; ++g) {
                vf s = vf_mul(qv[g * C], kv[0]);
#pragma GCC unroll 16
                for (int c = 1; c < C; ++c) s = vf_fma(qv[g * C + c], kv[c], s);
                part[g][jj] = s;
            }
        }
        const vf skv = vf_load(sk);
        for (int g = 0; g < G; ++g) {
            vf s = vf_mul(vf_reduce_w(part[g]), skv);
            if (nj == SIMD_W) {
                vf_store(scores + g * n + j0, s);
                mx[g] = vf_max(mx[g], s);
            } else { /* the block's tail: the lanes beyond it at -inf */
                vf_store(sc, s);
                for (int jj = nj; jj < SIMD_W; ++jj) sc[jj] = -INFINITY;
                for (int jj = 0; jj < nj; ++jj) scores[g * n + j0 + jj] = sc[jj];
                mx[g] = vf_max(mx[g], vf_load(sc));
            }
        }
    }
    for (int g = 0; g < G; ++g)
        simd_softmax_row(scores + g * n, n, mx[g], vs, idx, Hkv, h, m_out + g, l_out + g);
    vf av[MAX_GROUP * (MAX_DIM / SIMD_W)];
#pragma GCC unroll 64
    for (int i = 0; i < G * C; ++i) av[i] = vf_zero();
    vf pv[MAX_GROUP] = {0};
    for (int64_t j = 0; j < n; ++j) {
        const char* vr = simd_pool_row(v, idx, j, n, row_bytes, pf_bytes);
#pragma GCC unroll 16
        for (int g = 0; g < G; ++g) pv[g] = vf_bcast(scores + g * n + j);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            vf vv = simd_kv_load(kind, vr, c * SIMD_W);
#pragma GCC unroll 16
            for (int g = 0; g < G; ++g) av[g * C + c] = vf_fma(pv[g], vv, av[g * C + c]);
        }
    }
#pragma GCC unroll 64
    for (int i = 0; i < G * C; ++i) vf_store(acc + i * SIMD_W, av[i]);
}

#define SIMD_BLOCK_CASE(KIND_, G_, C_)                                                        \
    case (KIND_ * 32 + G_) * 64 + C_:                                                         \
        block_simd_body(KIND_, G_, C_, qf, k, v, ks, vs, Hkv, h, idx, n, row_bytes, pf_bytes,  \
                        acc, m, l, scores);                                                   \
        return;
#define SIMD_BLOCK_KIND(KIND_)                                                                \
    SIMD_BLOCK_CASE(KIND_, 1, 64 / SIMD_W) SIMD_BLOCK_CASE(KIND_, 2, 64 / SIMD_W)              \
    SIMD_BLOCK_CASE(KIND_, 3, 64 / SIMD_W) SIMD_BLOCK_CASE(KIND_, 4, 64 / SIMD_W)              \
    SIMD_BLOCK_CASE(KIND_, 1, 128 / SIMD_W) SIMD_BLOCK_CASE(KIND_, 2, 128 / SIMD_W)            \
    SIMD_BLOCK_CASE(KIND_, 4, 128 / SIMD_W)

/* One (row, kv head, key block) task; D a multiple of SIMD_W (the caller checks). k / v: the
 * pools (slot 0, head 0); q: G heads of q_dtype. Compiled with G and D constant for the common
 * shapes (D = 64, 128), at run time otherwise. */
static void block_simd(const void* q, int q_dtype, const void* k_pool, const void* v_pool,
                       int kind, const float* ks, const float* vs, int64_t Hkv, int h, int D,
                       const int64_t* idx, int64_t n, int G, float scale, float* acc, float* m,
                       float* l, float* scores) {
    float qf[MAX_GROUP * MAX_DIM];
    kvq_load_q(q, q_dtype, G, D, scale, qf);
    const int eb = kv_elem_bytes(kind);
    const int64_t row_bytes = Hkv * D * eb;
    const char* k = (const char*)k_pool + (int64_t)h * D * eb;
    const char* v = (const char*)v_pool + (int64_t)h * D * eb;
    const int pf_bytes = h == 0 ? (int)row_bytes : D * eb;
    const int C = D / SIMD_W;
    switch ((kind * 32 + G) * 64 + C) {
        SIMD_BLOCK_KIND(KV_F32) SIMD_BLOCK_KIND(KV_BF16) SIMD_BLOCK_KIND(KV_INT8)
        SIMD_BLOCK_KIND(KV_FP8_E4M3)
        default: break;
    }
    switch (kind) {
        case KV_F32:
            block_simd_body(KV_F32, G, C, qf, k, v, ks, vs, Hkv, h, idx, n, row_bytes, pf_bytes,
                            acc, m, l, scores);
            break;
        case KV_BF16:
            block_simd_body(KV_BF16, G, C, qf, k, v, ks, vs, Hkv, h, idx, n, row_bytes, pf_bytes,
                            acc, m, l, scores);
            break;
        case KV_INT8:
            block_simd_body(KV_INT8, G, C, qf, k, v, ks, vs, Hkv, h, idx, n, row_bytes, pf_bytes,
                            acc, m, l, scores);
            break;
        default:
            block_simd_body(KV_FP8_E4M3, G, C, qf, k, v, ks, vs, Hkv, h, idx, n, row_bytes,
                            pf_bytes, acc, m, l, scores);
    }
}
#undef SIMD_BLOCK_KIND
#undef SIMD_BLOCK_CASE
#endif

#endif /* RADIXGEN_ATTENTION_SIMD_H */
