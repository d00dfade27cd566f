/* ragged_attention's AVX-512 key-block kernel for several query vectors at once (the G heads of
 * every query row of a request that sees the block: speculative verify rows, prefill chunks):
 * included by ragged_attention.c only, after reduce16 and attention_kvq.h.
 *
 * Each key and value row of the block is read (and decoded) once for all the vectors, 16 rows
 * at a time, into float32 in L1 when it is stored in another format; every vector then runs
 * the same float operations as it would alone (the dot product order, one reduce16 per 16
 * keys, the masked max, exp512, the sum, the value accumulation in key order), so its result
 * does not depend on the other rows of the task. Same contract as the block_* functions:
 * unnormalised output, running max and sum per vector.
 */
#ifndef RADIXGEN_ATTENTION_ROWS_H
#define RADIXGEN_ATTENTION_ROWS_H

#ifdef __AVX512F__
/* How a block's stored rows are read: float32, bf16 (q.k on float32 rows, or by VDPBF16PS
 * straight from the bf16 rows), or another format than q with per-row scales (kvq). */
enum { RK_F32, RK_BF16, RK_DP, RK_KVQ_BF16, RK_KVQ_I8, RK_KVQ_FP8 };
#if defined(__AVX512BF16__)
#define RK_HAVE_DP 1
#else
#define RK_HAVE_DP 0
#endif

/* One task's query vectors (rows x heads, row-major) and a thread's scratch. */
typedef struct {
    int nq;                           /* query vectors */
    const uint16_t* qb[ROW_GROUP];    /* RK_DP: each vector's bf16 q (scaled after the sum) */
    float* qf;                        /* the others: [nq][D] q * scale in float32 */
    int64_t nk[ROW_GROUP];            /* keys each vector sees: a prefix of the block */
    float* scores;                    /* [nq][KEY_BLOCK] */
    float* vsc;                       /* [KEY_BLOCK] the value rows' scales (kvq kinds) */
    float* acc;                       /* out: [nq][D] unnormalised output */
    float m[ROW_GROUP], l[ROW_GROUP]; /* out: running max and sum */
} RowsWork;

static inline int rk_bytes(int kind) {
    return kind == RK_F32 ? 4 : kind == RK_KVQ_I8 || kind == RK_KVQ_FP8 ? 1 : 2;
}

/* Row `r` (D = 16 * C values of `kind`) -> float32 `o`. */
static inline void rk_decode(int kind, const void* r, int C, float* o) {
    for (int c = 0; c < C; ++c) {
        __m512 x;
        if (kind == RK_KVQ_I8) x = load16_i8((const int8_t*)r + c * 16);
        else if (kind == RK_KVQ_FP8) x = load16_fp8((const uint8_t*)r + c * 16);
        else x = load16_bf16((const uint16_t*)r + c * 16);
        _mm512_storeu_ps(o + c * 16, x);
    }
}

/* Prefetch `bytes` of row idx of `base` (its head's part, or the whole token row). */
static inline void rk_prefetch(const char* base, int64_t idx, int64_t row_bytes, int bytes) {
    const char* pf = base + idx * row_bytes;
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(pf + b);
}

/* acc[t, :] += sum over the chunk's keys jj < ni[t] of p[t, jj] v_jj, in key order, for T
 * vectors (T * C accumulators in registers with T and C constant after inlining). */
static inline __attribute__((always_inline)) void value_tile(
    const int T, const int C, const float* const* vr, int nj, const float* p, const int* ni,
    float* acc) {
    if (C < 1 || C > MAX_DIM / 16 || T < 1 || T > 8) __builtin_unreachable();
    const int D = C * 16;
    __m512 a[8 * 16];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) a[t * C + c] = _mm512_loadu_ps(acc + t * D + c * 16);
    int full = nj;
    for (int t = 0; t < T; ++t)
        if (ni[t] < full) full = ni[t];
    for (int jj = 0; jj < full; ++jj)
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
            __m512 vv = _mm512_loadu_ps(vr[jj] + c * 16);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t)
                a[t * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(p[t * KEY_BLOCK + jj]), vv,
                                               a[t * C + c]);
        }
    for (int jj = full; jj < nj; ++jj) /* the block's tail: some vectors see fewer keys */
        for (int c = 0; c < C; ++c) {
            __m512 vv = _mm512_loadu_ps(vr[jj] + c * 16);
            for (int t = 0; t < T; ++t)
                if (jj < ni[t])
                    a[t * C + c] = _mm512_fmadd_ps(_mm512_set1_ps(p[t * KEY_BLOCK + jj]), vv,
                                                   a[t * C + c]);
        }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc + t * D + c * 16, a[t * C + c]);
}

#define VALUE_TILE_CASE(T_)                                                                   \
    case T_:                                                                                  \
        value_tile(T_, C, vr, nj, p, ni, a);                                                  \
        break;

/* One 16-key chunk of the value pass for every vector, in tiles of up to 24 / C vectors. */
static inline __attribute__((always_inline)) void value_chunk(
    const int C, int nq, const float* const* vr, int nj, const float* scores, int64_t j0,
    const int64_t* nk, float* acc) {
    const int tile = 24 / C < 1 ? 1 : 24 / C > 8 ? 8 : 24 / C;
    for (int i0 = 0; i0 < nq; i0 += tile) {
        int T = nq - i0 < tile ? nq - i0 : tile, ni[8];
        for (int t = 0; t < T; ++t) {
            int64_t left = nk[i0 + t] - j0;
            ni[t] = left < 0 ? 0 : left > 16 ? 16 : (int)left;
        }
        const float* p = scores + (int64_t)i0 * KEY_BLOCK + j0;
        float* a = acc + (int64_t)i0 * C * 16;
        if (T > tile) __builtin_unreachable(); /* no tile wider than `tile` is compiled */
        switch (T) {
            VALUE_TILE_CASE(1) VALUE_TILE_CASE(2) VALUE_TILE_CASE(3) VALUE_TILE_CASE(4)
            VALUE_TILE_CASE(5) VALUE_TILE_CASE(6) VALUE_TILE_CASE(7) VALUE_TILE_CASE(8)
            default: break;
        }
    }
}
#undef VALUE_TILE_CASE

/* q.k of one vector against a chunk's 16 key rows kr (jj >= ni: zero, as beyond a row's keys),
 * summed per key by reduce16. */
static inline __attribute__((always_inline)) __m512 qk_chunk(
    const int kind, const int C, const float* qf, const uint16_t* qb, const void* const* kr,
    int ni) {
    if (C < 1 || C > MAX_DIM / 16) __builtin_unreachable(); /* run_rows checks C */
    __m512 part[16];
#if defined(__AVX512BF16__)
    if (kind == RK_DP) {
        __m512bh qv[MAX_DIM / 32] = {0};
#pragma GCC unroll 8
        for (int c = 0; c < C / 2; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(qb + c * 32);
        for (int jj = 0; jj < 16; ++jj) {
            if (jj >= ni) {
                part[jj] = _mm512_setzero_ps();
                continue;
            }
            const uint16_t* kv = (const uint16_t*)kr[jj];
            __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0],
                                        (__m512bh)_mm512_loadu_si512(kv));
#pragma GCC unroll 8
            for (int c = 1; c < C / 2; ++c)
                s = _mm512_dpbf16_ps(s, qv[c], (__m512bh)_mm512_loadu_si512(kv + c * 32));
            part[jj] = s;
        }
    } else
#endif
    {
        /* NOTE: zero-filled, so gcc sees every lane defined with a run-time C (else it warns,
         * -Wmaybe-uninitialized); with C constant the stores vanish */
        __m512 qv[MAX_DIM / 16] = {0};
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(qf + c * 16);
        for (int jj = 0; jj < 16; ++jj) {
            if (jj >= ni) {
                part[jj] = _mm512_setzero_ps();
                continue;
            }
            const float* kv = (const float*)kr[jj];
            __m512 s = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kv));
#pragma GCC unroll 16
            for (int c = 1; c < C; ++c) s = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kv + c * 16), s);
            part[jj] = s;
        }
    }
    (void)kind;
    (void)qf;
    (void)qb;
    return reduce16(part);
}

/* The block [idx, idx + max nk) for w's vectors; k / v point at head h of slot 0. */
static inline __attribute__((always_inline)) void rows_block(
    const int kind, const int C, RowsWork* w, const void* k, const void* v, const float* ks,
    const float* vs, int64_t Hkv, int h, const int64_t* idx, int64_t tok_stride, int pf_bytes,
    float scale) {
    const int D = C * 16, nq = w->nq, kvq = kind >= RK_KVQ_BF16;
    const int decode = kind != RK_F32 && kind != RK_DP;
    const int64_t row_bytes = tok_stride * rk_bytes(kind);
    int64_t n = 0;
    for (int i = 0; i < nq; ++i)
        if (w->nk[i] > n) n = w->nk[i];
    __m512 mx[ROW_GROUP];
    for (int i = 0; i < nq; ++i) mx[i] = _mm512_set1_ps(-INFINITY);
    float rows[16 * MAX_DIM]; /* a chunk's rows decoded to float32 */
    const void* kr[16] = {0};
    const float* vr[16] = {0};
    float sk[16];
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        int nj = n - j0 < 16 ? (int)(n - j0) : 16;
        for (int jj = 0; jj < 16; ++jj) {
            if (jj >= nj) {
                sk[jj] = 0.f;
                continue;
            }
            int64_t j = j0 + jj;
            const char* r = (const char*)k + idx[j] * row_bytes;
            if (j + 16 < n) rk_prefetch((const char*)k, idx[j + 16], row_bytes, pf_bytes);
            sk[jj] = kvq ? kvq_scale(ks, idx[j], Hkv, h) : 1.f;
            if (decode) {
                rk_decode(kind, r, C, rows + jj * D);
                kr[jj] = rows + jj * D;
            } else {
                kr[jj] = r;
            }
        }
        const __m512 skv = _mm512_loadu_ps(sk), sv = _mm512_set1_ps(scale);
        for (int i = 0; i < nq; ++i) {
            int64_t left = w->nk[i] - j0;
            if (left <= 0) continue;
            int ni = left > 16 ? 16 : (int)left;
            __m512 sc = qk_chunk(kind, C, w->qf + (int64_t)i * D, w->qb[i], kr, ni);
            if (kind == RK_DP) sc = _mm512_mul_ps(sc, sv);
            else if (kvq) sc = _mm512_mul_ps(sc, skv);
            __mmask16 valid = (__mmask16)((1u << ni) - 1u);
            _mm512_mask_storeu_ps(w->scores + (int64_t)i * KEY_BLOCK + j0, valid, sc);
            mx[i] = _mm512_mask_max_ps(mx[i], valid, mx[i], sc);
        }
    }
    if (kvq)
        for (int64_t j = 0; j < n; ++j) w->vsc[j] = kvq_scale(vs, idx[j], Hkv, h);
    for (int i = 0; i < nq; ++i) {
        float m = _mm512_reduce_max_ps(mx[i]);
        __m512 mv = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
        float* sc = w->scores + (int64_t)i * KEY_BLOCK;
        for (int64_t j0 = 0; j0 < w->nk[i]; j0 += 16) {
            int nj = w->nk[i] - j0 < 16 ? (int)(w->nk[i] - j0) : 16;
            __mmask16 valid = (__mmask16)((1u << nj) - 1u);
            __m512 s = _mm512_maskz_loadu_ps(valid, sc + j0);
            __m512 p = _mm512_maskz_mov_ps(valid, exp512(_mm512_sub_ps(s, mv)));
            sum = _mm512_add_ps(sum, p);
            /* the weight times its value row's scale (as the scalar kernel) */
            if (kvq) p = _mm512_mul_ps(p, _mm512_maskz_loadu_ps(valid, w->vsc + j0));
            _mm512_mask_storeu_ps(sc + j0, valid, p);
        }
        w->m[i] = m;
        w->l[i] = _mm512_reduce_add_ps(sum);
        memset(w->acc + (int64_t)i * D, 0, sizeof(float) * D);
    }
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        int nj = n - j0 < 16 ? (int)(n - j0) : 16;
        for (int jj = 0; jj < nj; ++jj) {
            int64_t j = j0 + jj;
            const char* r = (const char*)v + idx[j] * row_bytes;
            if (j + 16 < n) rk_prefetch((const char*)v, idx[j + 16], row_bytes, pf_bytes);
            if (kind == RK_F32) {
                vr[jj] = (const float*)r;
            } else {
                rk_decode(kind == RK_DP ? RK_BF16 : kind, r, C, rows + jj * D);
                vr[jj] = rows + jj * D;
            }
        }
        value_chunk(C, nq, vr, nj, w->scores, j0, w->nk, w->acc);
    }
}

#define ROWS_CASE(KIND_, C_)                                                                  \
    case KIND_ * 32 + C_:                                                                     \
        rows_block(KIND_, C_, w, k, v, ks, vs, Hkv, h, idx, tok_stride, pf_bytes, scale);     \
        return 0;

/* Runs w's block for storage `kind` with D = 16 * C (compiled with C constant for D = 32, 64,
 * 128); 0 on success, -1 for a head size it does not take (the caller runs the scalar ones). */
static int run_rows(int kind, int C, RowsWork* w, const void* k, const void* v, const float* ks,
                    const float* vs, int64_t Hkv, int h, const int64_t* idx, int64_t tok_stride,
                    int pf_bytes, float scale) {
    switch (kind * 32 + C) {
        ROWS_CASE(RK_F32, 2) ROWS_CASE(RK_F32, 4) ROWS_CASE(RK_F32, 8)
        ROWS_CASE(RK_BF16, 2) ROWS_CASE(RK_BF16, 4) ROWS_CASE(RK_BF16, 8)
#if defined(__AVX512BF16__)
        ROWS_CASE(RK_DP, 2) ROWS_CASE(RK_DP, 4) ROWS_CASE(RK_DP, 8)
#endif
        ROWS_CASE(RK_KVQ_BF16, 2) ROWS_CASE(RK_KVQ_BF16, 4) ROWS_CASE(RK_KVQ_BF16, 8)
        ROWS_CASE(RK_KVQ_I8, 2) ROWS_CASE(RK_KVQ_I8, 4) ROWS_CASE(RK_KVQ_I8, 8)
        ROWS_CASE(RK_KVQ_FP8, 2) ROWS_CASE(RK_KVQ_FP8, 4) ROWS_CASE(RK_KVQ_FP8, 8)
        default: /* other head sizes: C at run time */
            if (C > MAX_DIM / 16 || (kind == RK_DP && (C % 2 || !RK_HAVE_DP))) return -1;
            rows_block(kind, C, w, k, v, ks, vs, Hkv, h, idx, tok_stride, pf_bytes, scale);
            return 0;
    }
}
#undef ROWS_CASE
#endif /* __AVX512F__ */

#endif /* RADIXGEN_ATTENTION_ROWS_H */
