/* Attention over a paged KV pool for CPUs (compiled at first use by kernels/cpu/build.py).
 *
 * One code path serves every query row, decode or prefill: each row attends to the pool slots
 * of its own request's visible keys, read in place (no gather copy). Work is split over
 * (row, kv head, fixed-size key block) tasks; partial results merge by log-sum-exp in block
 * order, so a row's output is bitwise the same however the batch was formed. Requests whose
 * whole key block holds the same pool slots (a prefix shared through the radix cache) read it
 * once for all their rows (cascade attention), with the same per-row arithmetic.
 * Accumulation is float32 whatever the storage dtype: float32 or bfloat16 like q, or another
 * KV cache format (int8 with per-token, per-head scales, fp8 e4m3; attention_kvq.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

#include "cpu_common.h"
#include "radixgen_kernels.h"

#define MAX_GROUP 16
#define MAX_DIM 256

/* One (request, kv head, key block): writes unnormalised output, running max and sum. */
#define DEFINE_BLOCK(NAME, T, LOAD)                                                           \
static void NAME(const T* q, int64_t q_head_stride, const T* k, const T* v,                    \
                 const int64_t* idx, int64_t n, int64_t tok_stride, int G, int D, float scale, \
                 float* acc, float* m_out, float* l_out, float* scores) {                     \
    float qf[MAX_GROUP][MAX_DIM];                                                             \
    for (int g = 0; g < G; ++g)                                                               \
        for (int d = 0; d < D; ++d) qf[g][d] = LOAD(q[g * q_head_stride + d]) * scale;        \
    float m[MAX_GROUP];                                                                       \
    for (int g = 0; g < G; ++g) m[g] = -INFINITY;                                             \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* kr = k + idx[j] * tok_stride;                                                \
        if (j + 8 < n) __builtin_prefetch(k + idx[j + 8] * tok_stride);                        \
        for (int g = 0; g < G; ++g) {                                                         \
            float s = 0.f;                                                                    \
            _Pragma("omp simd reduction(+:s)")                                                \
            for (int d = 0; d < D; ++d) s += qf[g][d] * LOAD(kr[d]);                          \
            scores[g * n + j] = s;                                                            \
            if (s > m[g]) m[g] = s;                                                           \
        }                                                                                     \
    }                                                                                         \
    float l[MAX_GROUP];                                                                       \
    for (int g = 0; g < G; ++g) {                                                             \
        float sum = 0.f;                                                                      \
        for (int64_t j = 0; j < n; ++j) {                                                     \
            float p = expf(scores[g * n + j] - m[g]);                                         \
            scores[g * n + j] = p;                                                            \
            sum += p;                                                                         \
        }                                                                                     \
        l[g] = sum;                                                                           \
        for (int d = 0; d < D; ++d) acc[g * D + d] = 0.f;                                     \
    }                                                                                         \
    for (int64_t j = 0; j < n; ++j) {                                                         \
        const T* vr = v + idx[j] * tok_stride;                                                \
        if (j + 8 < n) __builtin_prefetch(v + idx[j + 8] * tok_stride);                        \
        for (int g = 0; g < G; ++g) {                                                         \
            float p = scores[g * n + j];                                                      \
            float* a = acc + g * D;                                                           \
            _Pragma("omp simd")                                                               \
            for (int d = 0; d < D; ++d) a[d] += p * LOAD(vr[d]);                              \
        }                                                                                     \
    }                                                                                         \
    for (int g = 0; g < G; ++g) { m_out[g] = m[g]; l_out[g] = l[g]; }                         \
}

#define LOAD_F32(x) (x)
#define LOAD_BF16(x) bf16f(x)
DEFINE_BLOCK(block_f32, float, LOAD_F32)
DEFINE_BLOCK(block_bf16, uint16_t, LOAD_BF16)

#include "attention_block.h"

/* Keys are processed in blocks of this many tokens, counted from the first visible key, whatever
 * the batch: a query row's result then depends only on its own keys (never on batch size, chunk
 * boundaries or what was cached), which seeded sampling relies on; blocks also keep every core
 * busy for a single long request. */
#define KEY_BLOCK 256
/* Most query vectors (rows x G heads) one task runs over its key block: the rows of a request
 * that see the same block share one read of it (a speculative verify step's rows, a prefill
 * chunk's); bounds the per-thread scratch. */
#define ROW_GROUP 48
/* Fewer query vectors than this run row by row in attention_block.h's kernels, which are
 * faster for a few (a decode row's G heads) */
#define ROWS_MIN_VECTORS 8

#include "attention_kvq.h"
#include "attention_rows.h"
#include "attention_rows_simd.h"

typedef struct {
    int64_t row;   /* first query row in q/out */
    int64_t first; /* offset of the block's first key in `indices` */
    int64_t n;     /* keys of the block the first row sees; row `row + r` sees min(n + r, KEY_BLOCK) */
    int nrows;     /* consecutive rows of one request sharing the block */
    int block;     /* the block's number among each of those rows' blocks */
} Task;

static void write_out(void* out, int dtype, int64_t off, const float* o, float inv, int D) {
    if (dtype == 0) {
        float* op = (float*)out + off;
        for (int d = 0; d < D; ++d) op[d] = o[d] * inv;
    } else {
        uint16_t* op = (uint16_t*)out + off;
        for (int d = 0; d < D; ++d) op[d] = f2bf(o[d] * inv);
    }
}

static void run_block(const void* q, int64_t qoff, const void* k, const void* v, int h, int D,
                      const int64_t* idx, int64_t n, int64_t tok_stride, int G, float scale,
                      int dtype, float* acc, float* m, float* l, float* scores) {
#ifdef __AVX512F__
#if defined(__AVX512BF16__)
    if (dtype == 1 && D % 32 == 0) {
        int pf_bytes = h == 0 ? (int)(tok_stride * 2) : D * 2;
        block_bf16_dp((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                      (const uint16_t*)v + h * D, idx, n, tok_stride, pf_bytes, G, D, scale, acc,
                      m, l, scores);
        return;
    }
#endif
    if (D % 16 == 0) {
        if (dtype == 0)
            block_f32_avx512((const float*)q + qoff, D, (const float*)k + h * D,
                             (const float*)v + h * D, idx, n, tok_stride, G, D, scale, acc, m, l,
                             scores);
        else
            block_bf16_avx512((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                              (const uint16_t*)v + h * D, idx, n, tok_stride, G, D, scale, acc, m,
                              l, scores);
        return;
    }
#elif defined(SIMD_W)
    if (D % SIMD_W == 0) {
        block_simd((const char*)q + qoff * (dtype ? 2 : 4), dtype, k, v, dtype, NULL, NULL,
                   tok_stride / D, h, D, idx, n, G, scale, acc, m, l, scores);
        return;
    }
#endif
    if (dtype == 0)
        block_f32((const float*)q + qoff, D, (const float*)k + h * D, (const float*)v + h * D, idx,
                  n, tok_stride, G, D, scale, acc, m, l, scores);
    else
        block_bf16((const uint16_t*)q + qoff, D, (const uint16_t*)k + h * D,
                   (const uint16_t*)v + h * D, idx, n, tok_stride, G, D, scale, acc, m, l, scores);
}

/* Every row's blocks for request r (rows q0 .. q1 - 1, the first at position pos0): the rows
 * whose keys start at 0 share each block, ROWS at a time; a sliding window's rows whose keys
 * start later get theirs alone. Blocks below `skip` were planned across requests
 * (plan_shared_blocks). Appends to tasks[*t]. */
static void plan_request(Task* tasks, int64_t* t, int64_t kv0, int64_t q0, int64_t q1,
                         int64_t pos0, int64_t window, int rows, int64_t skip) {
    int64_t shared = q1 - q0; /* rows that see keys from position 0 */
    if (window > 0) shared = window - pos0 < 0 ? 0 : window - pos0 < shared ? window - pos0 : shared;
    if (shared > 0) {
        int64_t last = pos0 + shared - 1; /* the last shared row's position */
        for (int64_t b = skip; b * KEY_BLOCK <= last; ++b) {
            int64_t start = b * KEY_BLOCK;
            int64_t i = q0 + (start > pos0 ? start - pos0 : 0);
            for (; i < q0 + shared; i += rows) {
                int64_t p = pos0 + (i - q0), n = p + 1 - start;
                int64_t nr = q0 + shared - i < rows ? q0 + shared - i : rows;
                tasks[*t] = (Task){i, kv0 + start, n < KEY_BLOCK ? n : KEY_BLOCK, (int)nr, (int)b};
                ++*t;
            }
        }
    }
    for (int64_t i = q0 + shared; i < q1; ++i) {
        int64_t p = pos0 + (i - q0), lo = p + 1 - window;
        for (int64_t b = 0; lo + b * KEY_BLOCK <= p; ++b) {
            int64_t n = p + 1 - (lo + b * KEY_BLOCK);
            tasks[*t] = (Task){i, kv0 + lo + b * KEY_BLOCK, n < KEY_BLOCK ? n : KEY_BLOCK, 1, (int)b};
            ++*t;
        }
    }
}

/* How many leading key blocks request r shares with request r - 1: blocks that every row of
 * both sees whole (the first row's position is past the block) and whose pool slots are the
 * same, as a prefix cached in the radix tree gives. */
static int64_t blocks_shared_with_previous(const int64_t* indices, const int64_t* kv_indptr,
                                           const int64_t* q_pos0, int r) {
    int64_t whole_a = (q_pos0[r - 1] + 1) / KEY_BLOCK, whole_b = (q_pos0[r] + 1) / KEY_BLOCK;
    int64_t most = whole_a < whole_b ? whole_a : whole_b, b = 0;
    const int64_t* a = indices + kv_indptr[r - 1];
    const int64_t* c = indices + kv_indptr[r];
    for (; b < most; ++b) {
        const int64_t* x = a + b * KEY_BLOCK;
        const int64_t* y = c + b * KEY_BLOCK;
        if (x[KEY_BLOCK - 1] != y[KEY_BLOCK - 1] || x[0] != y[0] ||
            memcmp(x, y, sizeof(int64_t) * KEY_BLOCK) != 0)
            break;
    }
    return b;
}

/* Cascade attention: for each key block b, every run of consecutive requests that share it
 * (shared[r] > b links request r to r - 1) gets tasks over all the run's rows, each row seeing the
 * whole block (n = KEY_BLOCK), so the block is read and decoded once for the run instead of once
 * per request: the decode rows of requests on one cached prefix run as a prefill chunk's rows do.
 * Tasks take up to `rows` rows, fewer when that would leave under two per thread (`jobs_per_row`
 * = kv heads, `min_rows` still fills the rows kernel). cover[r] = the leading blocks of r planned
 * here (plan_request skips them). A row's arithmetic per block is unchanged (the rows kernels
 * equal the one-row kernels bit for bit), so its output still does not depend on the requests
 * batched with it. */
static void plan_shared_blocks(Task* tasks, int64_t* t, const int64_t* shared, int64_t* cover,
                               const int64_t* kv_indptr, const int64_t* q_indptr, int R, int rows,
                               int min_rows, int jobs_per_row, int threads) {
    int64_t top = 0, row_blocks = 0;
    for (int r = 0; r < R; ++r) {
        cover[r] = 0;
        if (shared[r] > top) top = shared[r];
    }
    for (int pass = 0; pass < 2; ++pass) {
        int64_t take = rows;
        if (pass == 1) {
            int64_t spread = row_blocks * jobs_per_row / (2 * (int64_t)threads);
            take = spread < min_rows ? min_rows : spread < rows ? spread : rows;
        }
        for (int64_t b = 0; b < top; ++b)
            for (int r0 = 0; r0 < R;) {
                int r1 = r0 + 1;
                while (r1 < R && shared[r1] > b) ++r1;
                if (r1 - r0 >= 2 && pass == 0) {
                    row_blocks += q_indptr[r1] - q_indptr[r0];
                    for (int r = r0; r < r1; ++r) cover[r] = b + 1;
                } else if (r1 - r0 >= 2) {
                    for (int64_t i = q_indptr[r0]; i < q_indptr[r1]; i += take) {
                        int64_t nr = q_indptr[r1] - i < take ? q_indptr[r1] - i : take;
                        tasks[*t] = (Task){i, kv_indptr[r0] + b * KEY_BLOCK, KEY_BLOCK, (int)nr, (int)b};
                        ++*t;
                    }
                }
                r0 = r1;
            }
    }
}

/* Causal attention for a ragged batch over the paged KV pool.
 *
 * Request r owns query rows [q_indptr[r], q_indptr[r+1]) of q/out, the first at position
 * q_pos0[r]; its keys' pool slots are indices[kv_indptr[r] + k] for positions k. The query at
 * position p sees keys (p - window, p] (window <= 0: all of [0, p]). Decode is a request with one
 * query row at position seq_len - 1. q: [N, H, D] with row stride q_row_stride; k/v: [S, Hkv, D];
 * out: [N, H, D] contiguous; dtype 0 = float32, 1 = bfloat16 (q and out). kv_dtype: the pool's
 * format (kv_quant.h: the same code as dtype for plain pools, 2 = int8, 3 = fp8 e4m3);
 * k_scale / v_scale: float32 [S, Hkv] per-token, per-head scales, or NULL (scale 1; int8 needs
 * them). Returns 0 on success. */
int ragged_attention(const void* q, int64_t q_row_stride, const void* k, const void* v,
                     const int64_t* indices, const int64_t* kv_indptr, const int64_t* q_indptr,
                     const int64_t* q_pos0, int R, void* out, int H, int Hkv, int D, float scale,
                     int dtype, int64_t window, int kv_dtype, const float* k_scale,
                     const float* v_scale) {
    int G = H / Hkv;
    if (G > MAX_GROUP || D > MAX_DIM || H % Hkv != 0) return -1;
    if (kv_dtype < KV_F32 || kv_dtype > KV_FP8_E4M3 || (kv_dtype == KV_INT8 && !k_scale) ||
        (kv_dtype == KV_INT8 && !v_scale))
        return -3;
    const int mixed = kv_dtype != dtype;
    const int q_bytes = dtype ? 2 : 4, eb = kv_elem_bytes(kv_dtype);
    const int rows = ROW_GROUP / G;
    int64_t N = q_indptr[R];
    /* rows with several blocks get partial slots; a row has at most one task per block */
    int64_t ntasks = 0, nslots = 0;
    int64_t* row_slot0 = (int64_t*)malloc(sizeof(int64_t) * (N > 0 ? N : 1));
    int64_t* row_nb = (int64_t*)malloc(sizeof(int64_t) * (N > 0 ? N : 1));
    if (!row_slot0 || !row_nb) {
        free(row_slot0); free(row_nb);
        return -2;
    }
    for (int r = 0; r < R; ++r)
        for (int64_t i = q_indptr[r]; i < q_indptr[r + 1]; ++i) {
            int64_t p = q_pos0[r] + (i - q_indptr[r]);
            int64_t lo = window > 0 && p + 1 > window ? p + 1 - window : 0;
            int64_t nb = (p + 1 - lo + KEY_BLOCK - 1) / KEY_BLOCK;
            row_nb[i] = nb;
            row_slot0[i] = nb > 1 ? nslots : -1;
            ntasks += nb;
            if (nb > 1) nslots += nb;
        }
    Task* tasks = (Task*)malloc(sizeof(Task) * (ntasks > 0 ? ntasks : 1));
    int64_t per_slot = (int64_t)Hkv * G * (D + 2);
    float* partial = (float*)malloc(sizeof(float) * (nslots > 0 ? nslots * per_slot : 1));
    if (!tasks || !partial) {
        free(tasks); free(row_slot0); free(row_nb); free(partial);
        return -2;
    }
    /* shared[r]: blocks r shares with r - 1; cover[r]: its blocks planned across requests (none
     * under a sliding window, whose rows' keys start apart) */
    int64_t* shared = (int64_t*)calloc((size_t)(R > 0 ? 2 * R : 1), sizeof(int64_t));
    if (!shared) {
        free(tasks); free(row_slot0); free(row_nb); free(partial);
        return -2;
    }
    int64_t* cover = shared + R;
    const int threads = team_threads(); /* read once: the plan and the team agree */
    int64_t t = 0;
    if (window <= 0) {
        for (int r = 1; r < R; ++r)
            if (q_indptr[r + 1] > q_indptr[r] && q_indptr[r] > q_indptr[r - 1])
                shared[r] = blocks_shared_with_previous(indices, kv_indptr, q_pos0, r);
        plan_shared_blocks(tasks, &t, shared, cover, kv_indptr, q_indptr, R, rows,
                           (ROWS_MIN_VECTORS + G - 1) / G, Hkv, threads);
    }
    for (int r = 0; r < R; ++r)
        plan_request(tasks, &t, kv_indptr[r], q_indptr[r], q_indptr[r + 1], q_pos0[r], window,
                     rows, cover[r]);
    free(shared);
    ntasks = t;
    int64_t maxq = 1; /* the most query vectors of a task: sizes the scratch */
    for (int64_t i = 0; i < ntasks; ++i)
        if (tasks[i].nrows * (int64_t)G > maxq) maxq = tasks[i].nrows * (int64_t)G;
    if (maxq < G) maxq = G;
    int64_t tok_stride = (int64_t)Hkv * D;
    int kind = -1; /* the AVX-512 kernel's reading of the pool, -1: the scalar kernels */
#ifdef __AVX512F__
    if (D % 16 == 0) {
        if (!mixed) kind = dtype == 0 ? RK_F32 : RK_HAVE_DP && D % 32 == 0 ? RK_DP : RK_BF16;
        else if (kv_dtype != KV_F32)
            kind = kv_dtype == KV_INT8 ? RK_KVQ_I8 : kv_dtype == KV_FP8_E4M3 ? RK_KVQ_FP8 : RK_KVQ_BF16;
    }
#endif
    (void)kind;
    (void)eb;
    int64_t jobs = ntasks * Hkv;
    /* a thread takes every head of a task in turn (the first prefetches whole token rows for the
     * rest) unless there are too few tasks to keep the threads busy */
    int chunk = ntasks >= 2 * (int64_t)threads ? Hkv : 1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        /* scratch: scores, q * scale, output, value scales */
        float* buf = (float*)malloc(sizeof(float) * (maxq * (KEY_BLOCK + 2 * D) + KEY_BLOCK));
        if (!buf) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, chunk)
        for (int64_t j = 0; j < jobs; ++j) {
            if (!buf) continue;
            const Task* tk = &tasks[j / Hkv];
            int h = (int)(j % Hkv);
            int nq = tk->nrows * G;
            float* scores = buf;
            float* qf = buf + maxq * KEY_BLOCK;
            float* acc = qf + maxq * D;
            float ms[ROW_GROUP], ls[ROW_GROUP];
            const int64_t* idx = indices + tk->first;
            int done = 0;
#ifdef __AVX512F__
            if (kind >= 0 && nq >= ROWS_MIN_VECTORS) {
                RowsWork w;
                w.nq = nq;
                w.qf = qf;
                w.scores = scores;
                w.acc = acc;
                w.vsc = acc + maxq * D;
                for (int r = 0; r < tk->nrows; ++r) {
                    int64_t n = tk->n + r < KEY_BLOCK ? tk->n + r : KEY_BLOCK;
                    const char* qr = (const char*)q + ((tk->row + r) * q_row_stride + (int64_t)h * G * D) * q_bytes;
                    for (int g = 0; g < G; ++g) {
                        w.nk[r * G + g] = n;
                        w.qb[r * G + g] = (const uint16_t*)qr + g * D;
                    }
                    if (kind != RK_DP) kvq_load_q(qr, dtype, G, D, scale, qf + (int64_t)r * G * D);
                }
                int pf_bytes = h == 0 ? (int)(tok_stride * eb) : D * eb;
                done = run_rows(kind, D / 16, &w, (const char*)k + (int64_t)h * D * eb,
                                (const char*)v + (int64_t)h * D * eb, k_scale, v_scale, Hkv, h,
                                idx, tok_stride, pf_bytes, scale) == 0;
                if (done)
                    for (int i = 0; i < nq; ++i) { ms[i] = w.m[i]; ls[i] = w.l[i]; }
            }
#elif defined(SIMD_W)
            if (nq >= ROWS_MIN_VECTORS && D % SIMD_W == 0) {
                int64_t nk[ROW_GROUP];
                for (int r = 0; r < tk->nrows; ++r) {
                    int64_t n = tk->n + r < KEY_BLOCK ? tk->n + r : KEY_BLOCK;
                    const char* qr = (const char*)q + ((tk->row + r) * q_row_stride + (int64_t)h * G * D) * q_bytes;
                    for (int g = 0; g < G; ++g) nk[r * G + g] = n;
                    kvq_load_q(qr, dtype, G, D, scale, qf + (int64_t)r * G * D);
                }
                rows_simd(mixed ? kv_dtype : dtype, nq, qf, nk, k, v, mixed ? k_scale : NULL,
                          mixed ? v_scale : NULL, Hkv, h, D, idx, scores, acc, ms, ls);
                done = 1;
            }
#endif
            for (int r = 0; r < tk->nrows && !done; ++r) { /* row by row: the same arithmetic */
                int64_t n = tk->n + r < KEY_BLOCK ? tk->n + r : KEY_BLOCK;
                int64_t qoff = (tk->row + r) * q_row_stride + (int64_t)h * G * D;
                float *a = acc + (int64_t)r * G * D, *m = ms + r * G, *l = ls + r * G;
                if (mixed)
                    run_block_kvq((const char*)q + qoff * q_bytes, dtype, k, v, kv_dtype, k_scale,
                                  v_scale, Hkv, h, D, idx, n, G, scale, a, m, l, scores);
                else
                    run_block(q, qoff, k, v, h, D, idx, n, tok_stride, G, scale, dtype, a, m, l,
                              scores);
            }
            for (int r = 0; r < tk->nrows; ++r) {
                int64_t row = tk->row + r;
                const float* a = acc + (int64_t)r * G * D;
                if (row_nb[row] <= 1) {
                    for (int g = 0; g < G; ++g) {
                        float inv = ls[r * G + g] > 0.f ? 1.f / ls[r * G + g] : 0.f;
                        write_out(out, dtype, (row * H + (int64_t)h * G + g) * D, a + g * D, inv, D);
                    }
                } else {
                    float* base = partial + (row_slot0[row] + tk->block) * per_slot + (int64_t)h * G * (D + 2);
                    memcpy(base, a, sizeof(float) * G * D);
                    memcpy(base + G * D, ms + r * G, sizeof(float) * G);
                    memcpy(base + G * D + G, ls + r * G, sizeof(float) * G);
                }
            }
        }
        free(buf);
#pragma omp for schedule(dynamic, 8)
        for (int64_t j = 0; j < N * Hkv; ++j) {
            int64_t i = j / Hkv;
            int h = (int)(j % Hkv);
            if (row_nb[i] <= 1) continue;
            for (int g = 0; g < G; ++g) {
                float mx = -INFINITY;
                for (int64_t b = 0; b < row_nb[i]; ++b) {
                    const float* base = partial + (row_slot0[i] + b) * per_slot + (int64_t)h * G * (D + 2);
                    float mb = base[G * D + g];
                    if (mb > mx) mx = mb;
                }
                float o[MAX_DIM];
                float lsum = 0.f;
                for (int d = 0; d < D; ++d) o[d] = 0.f;
                for (int64_t b = 0; b < row_nb[i]; ++b) {
                    const float* base = partial + (row_slot0[i] + b) * per_slot + (int64_t)h * G * (D + 2);
                    float w = expf(base[G * D + g] - mx);
                    lsum += w * base[G * D + G + g];
                    const float* a = base + g * D;
                    for (int d = 0; d < D; ++d) o[d] += w * a[d];
                }
                float inv = lsum > 0.f ? 1.f / lsum : 0.f;
                write_out(out, dtype, (i * H + (int64_t)h * G + g) * D, o, inv, D);
            }
        }
    }
    free(tasks);
    free(row_slot0);
    free(row_nb);
    free(partial);
    return failed ? -2 : 0;
}
