/* ragged_attention's key-block kernel over simd.h for several query vectors at once (the G
 * heads of every query row of a request that sees the block: a prefill chunk's rows, speculative
 * verify rows), for the variants without AVX-512 (AVX2 + FMA, aarch64 NEON). Included by
 * ragged_attention.c only, after attention_simd.h, KEY_BLOCK and ROW_GROUP.
 *
 * Each key and value row of the block is read and decoded to float32 once for all the vectors
 * (block_simd decodes it again for every row); every vector then runs block_simd_body's float
 * operations in the same order for its own prefix of the block (q.k per key in one accumulator
 * over D, SIMD_W keys' sums by vf_reduce_w, times the keys' scales; the max, vf_exp, the sum;
 * each weight times its value row's scale; the value rows accumulated in key order), so a row's
 * result is bit for bit the one it gets alone: the batch does not change it.
 */
#ifndef RADIXGEN_ATTENTION_ROWS_SIMD_H
#define RADIXGEN_ATTENTION_ROWS_SIMD_H

#if defined(SIMD_W) && !defined(__AVX512F__)
/* keys decoded per step of the value pass (an L1-sized float32 buffer of RS_CHUNK x D) */
#define RS_CHUNK 32

/* One task's query vectors: qf [nq][D] (q * scale), nk [nq] keys each sees (a prefix of the
 * block); out: acc [nq][D] unnormalised, m / l [nq]; scores [nq][KEY_BLOCK] and rows
 * [RS_CHUNK][D] are scratch. k / v point at head h of slot 0. */
static inline __attribute__((always_inline)) void rows_simd_body(
    const int kind, const int C, int nq, const float* qf, const int64_t* nk, const char* k,
    const char* v, const float* ks, const float* vs, int64_t Hkv, int h, const int64_t* idx,
    int64_t row_bytes, int pf_bytes, float* scores, float* acc, float* m_out, float* l_out,
    float* rows) {
    if (C < 1 || C > MAX_DIM / SIMD_W || nq < 1 || nq > ROW_GROUP) __builtin_unreachable();
    const int D = C * SIMD_W;
    int64_t n = 0;
    for (int i = 0; i < nq; ++i)
        if (nk[i] > n) n = nk[i];
    vf mx[ROW_GROUP];
    for (int i = 0; i < nq; ++i) mx[i] = vf_set1(-INFINITY);
    vf part[SIMD_W];
    float sk[SIMD_W], sc[SIMD_W];
    for (int64_t j0 = 0; j0 < n; j0 += SIMD_W) {
        const int nj = n - j0 < SIMD_W ? (int)(n - j0) : SIMD_W;
        for (int jj = 0; jj < SIMD_W; ++jj) {
            if (jj >= nj) {
                sk[jj] = 0.f;
                continue;
            }
            const int64_t j = j0 + jj;
            const char* kr = simd_pool_row(k, idx, j, n, row_bytes, pf_bytes);
            sk[jj] = ks ? ks[idx[j] * Hkv + h] : 1.0f;
#pragma GCC unroll 32
            for (int c = 0; c < C; ++c) vf_store(rows + jj * D + c * SIMD_W, simd_kv_load(kind, kr, c * SIMD_W));
        }
        for (int jj = nj; jj < SIMD_W; ++jj) /* beyond the block: zeros (their sums are unused) */
            memset(rows + jj * D, 0, sizeof(float) * (size_t)D);
        const vf skv = vf_load(sk);
        for (int i = 0; i < nq; ++i) {
            const int64_t left = nk[i] - j0;
            if (left <= 0) continue;
            const int ni = left < SIMD_W ? (int)left : SIMD_W;
            const float* q = qf + (int64_t)i * D;
            /* the SIMD_W keys' sums side by side (independent FMA chains), each in c order */
            const vf q0 = vf_load(q);
#pragma GCC unroll 16
            for (int jj = 0; jj < SIMD_W; ++jj) part[jj] = vf_mul(q0, vf_load(rows + jj * D));
#pragma GCC unroll 32
            for (int c = 1; c < C; ++c) {
                const vf qc = vf_load(q + c * SIMD_W);
#pragma GCC unroll 16
                for (int jj = 0; jj < SIMD_W; ++jj)
                    part[jj] = vf_fma(qc, vf_load(rows + jj * D + c * SIMD_W), part[jj]);
            }
            for (int jj = ni; jj < SIMD_W; ++jj) part[jj] = vf_zero(); /* beyond its keys */
            vf s = vf_mul(vf_reduce_w(part), skv);
            float* out = scores + (int64_t)i * KEY_BLOCK;
            if (ni == SIMD_W) {
                vf_store(out + j0, s);
                mx[i] = vf_max(mx[i], s);
            } else { /* the vector's last keys: the lanes beyond them at -inf */
                vf_store(sc, s);
                for (int jj = ni; jj < SIMD_W; ++jj) sc[jj] = -INFINITY;
                for (int jj = 0; jj < ni; ++jj) out[j0 + jj] = sc[jj];
                mx[i] = vf_max(mx[i], vf_load(sc));
            }
        }
    }
    for (int i = 0; i < nq; ++i)
        simd_softmax_row(scores + (int64_t)i * KEY_BLOCK, nk[i], mx[i], vs, idx, Hkv, h,
                         m_out + i, l_out + i);
    memset(acc, 0, sizeof(float) * (size_t)nq * (size_t)D);
    vf av[MAX_DIM / SIMD_W];
    for (int64_t j0 = 0; j0 < n; j0 += RS_CHUNK) {
        const int nj = n - j0 < RS_CHUNK ? (int)(n - j0) : RS_CHUNK;
        for (int jj = 0; jj < nj; ++jj) {
            const int64_t j = j0 + jj;
            const char* vr = simd_pool_row(v, idx, j, n, row_bytes, pf_bytes);
#pragma GCC unroll 32
            for (int c = 0; c < C; ++c) vf_store(rows + jj * D + c * SIMD_W, simd_kv_load(kind, vr, c * SIMD_W));
        }
        for (int i = 0; i < nq; ++i) {
            const int64_t left = nk[i] - j0;
            if (left <= 0) continue;
            const int ni = left < nj ? (int)left : nj;
            float* a = acc + (int64_t)i * D;
            const float* p = scores + (int64_t)i * KEY_BLOCK + j0;
#pragma GCC unroll 32
            for (int c = 0; c < C; ++c) av[c] = vf_load(a + c * SIMD_W);
            for (int jj = 0; jj < ni; ++jj) {
                const vf pv = vf_bcast(p + jj);
                const float* vr = rows + jj * D;
#pragma GCC unroll 32
                for (int c = 0; c < C; ++c) av[c] = vf_fma(pv, vf_load(vr + c * SIMD_W), av[c]);
            }
#pragma GCC unroll 32
            for (int c = 0; c < C; ++c) vf_store(a + c * SIMD_W, av[c]);
        }
    }
}

#define ROWS_SIMD_CASE(KIND_, C_)                                                             \
    case KIND_ * 64 + C_:                                                                     \
        rows_simd_body(KIND_, C_, nq, qf, nk, k, v, ks, vs, Hkv, h, idx, row_bytes, pf_bytes,  \
                       scores, acc, m, l, rows);                                              \
        return;
#define ROWS_SIMD_KIND(KIND_) ROWS_SIMD_CASE(KIND_, 64 / SIMD_W) ROWS_SIMD_CASE(KIND_, 128 / SIMD_W)

/* nq query vectors of one task (rows x G heads) against their key block, for a pool of `kind`
 * (float32, bf16, int8 or fp8 e4m3; ks / vs: per-row scales or NULL); the pools at slot 0,
 * head 0. D a multiple of SIMD_W (the caller checks); compiled with D constant for 64 and 128. */
static void rows_simd(int kind, int nq, const float* qf, const int64_t* nk, const void* k_pool,
                      const void* v_pool, const float* ks, const float* vs, int64_t Hkv, int h,
                      int D, const int64_t* idx, float* scores, float* acc, float* m, float* l) {
    float rows[RS_CHUNK * MAX_DIM];
    const int eb = kv_elem_bytes(kind);
    const int64_t row_bytes = Hkv * D * eb;
    const char* k = (const char*)k_pool + (int64_t)h * D * eb;
    const char* v = (const char*)v_pool + (int64_t)h * D * eb;
    const int pf_bytes = h == 0 ? (int)row_bytes : D * eb;
    const int C = D / SIMD_W;
    switch (kind * 64 + C) {
        ROWS_SIMD_KIND(KV_F32) ROWS_SIMD_KIND(KV_BF16) ROWS_SIMD_KIND(KV_INT8)
        ROWS_SIMD_KIND(KV_FP8_E4M3)
        default: break;
    }
    switch (kind) {
        case KV_F32:
            rows_simd_body(KV_F32, C, nq, qf, nk, k, v, ks, vs, Hkv, h, idx, row_bytes, pf_bytes,
                           scores, acc, m, l, rows);
            break;
        case KV_BF16:
            rows_simd_body(KV_BF16, C, nq, qf, nk, k, v, ks, vs, Hkv, h, idx, row_bytes,
                           pf_bytes, scores, acc, m, l, rows);
            break;
        case KV_INT8:
            rows_simd_body(KV_INT8, C, nq, qf, nk, k, v, ks, vs, Hkv, h, idx, row_bytes,
                           pf_bytes, scores, acc, m, l, rows);
            break;
        default:
            rows_simd_body(KV_FP8_E4M3, C, nq, qf, nk, k, v, ks, vs, Hkv, h, idx, row_bytes,
                           pf_bytes, scores, acc, m, l, rows);
    }
}
#undef ROWS_SIMD_KIND
#undef ROWS_SIMD_CASE
#endif

#endif /* RADIXGEN_ATTENTION_ROWS_SIMD_H */
