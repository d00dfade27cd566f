/* A Llama-family decoder's layers in one native call (compiled with the other CPU kernels).
 *
 * At batch sizes of a few rows a decode step is ~270 small kernel calls; from Python each costs
 * its ctypes marshalling, a torch allocation and the interpreter's glue (measured ~2.5 ms of a
 * ~8.5 ms Q4_1 step of the default model). Here the same kernels run in the same order over
 * one workspace, so every row is bitwise what the per-op path computes: the projections come
 * out unrounded (float32), rotary and the KV store run on them, q and the attention output are
 * bf16, the residual stream float32 (see llama.py).
 *
 * The layer table: n_layers rows of STACK_WORDS int64 words, pointers and codes in the order of
 * the enum below (bindings.py's DECODER_LAYER_WORDS names them in the same order).
 */
#include <stdint.h>

#include "cpu_common.h"
#include "radixgen_kernels.h"

enum {
    W_IN_NORM,    /* bf16 [hidden]: this layer's input RMSNorm weight */
    W_POST_NORM,  /* bf16 [hidden]: the post-attention RMSNorm weight */
    W_QKV,        /* packed weight, its format (-1: gemm_bf16's layout, else qgemm's fmt), bias */
    W_QKV_FMT,
    W_QKV_BIAS,
    W_O,
    W_O_FMT,
    W_O_BIAS,
    W_GATE_UP,
    W_GATE_UP_FMT,
    W_GATE_UP_BIAS,
    W_DOWN,
    W_DOWN_FMT,
    W_DOWN_BIAS,
    W_K_POOL,     /* [slots, Hkv, D] pools of this layer, in kv_dtype */
    W_V_POOL,
    W_K_SCALE,    /* float32 [slots, Hkv] scales (int8 / scaled fp8 pools), or 0 */
    W_V_SCALE,
    W_WINDOW,     /* sliding window (0: none) */
    STACK_WORDS
};

int decoder_stack_words(void) { return STACK_WORDS; }

int64_t decoder_stack_workspace_bytes(int64_t N, int64_t hidden, int H, int Hkv, int D,
                                      int64_t inter) {
    int64_t qkv = (int64_t)(H + 2 * Hkv) * D, q = (int64_t)H * D;
    /* float32: qkv, gate_up, the residual stream and the MLP's output; bf16: q, the attention
     * output, a norm's output, the MLP's activation */
    int64_t floats = N * (qkv + 2 * inter + 2 * hidden), halves = N * (2 * q + hidden + inter);
    return floats * 4 + halves * 2 + 64;
}

/* y [m, n] (float32) = x [m, k] (bf16) W^T + b, W packed for gemm_bf16 (fmt < 0) or qgemm. */
static int project(const uint16_t* x, int64_t m, int64_t k, const int64_t* w, int slot, int64_t n,
                   float* y) {
    const void* weight = (const void*)(intptr_t)w[slot];
    int fmt = (int)w[slot + 1];
    const float* bias = (const float*)(intptr_t)w[slot + 2];
    if (fmt < 0) return gemm_bf16(x, m, k, (const uint16_t*)weight, n, k, bias, y, n, 1);
    return qgemm(x, m, k, (const uint8_t*)weight, n, k, fmt, bias, y, n, 1);
}

/* Every layer over N rows, and the final norm of the rows the logits need. x: the embeddings
 * (bf16 [N, hidden]): the residual stream starts as them, layer 0's input norm included. Then
 * out (bf16 [M, hidden]) gets final_norm(residual + the last MLP output) of rows[0..M) (rows:
 * NULL for every row, M = N), which is what the per-layer path computes for them. dims: hidden,
 * H, Hkv, D, inter, kv_dtype (kv_quant.h's codes). pos / loc: each row's position and KV slot;
 * kv_indices ... R: the ragged attention layout (ragged_attention.c). work:
 * decoder_stack_workspace_bytes. cancel: NULL, or a flag another thread may set while the stack
 * runs; it is read before each layer, and once set the call stops there (the KV of the layers
 * already run is written, which the caller discards with the step's slots). Returns 0,
 * DECODER_STACK_CANCELLED, or the first failing kernel's code. */
int decoder_stack_forward(const int64_t* layers, int n_layers, const int64_t* dims, float eps,
                          float scale, const float* cos_t, const float* sin_t, const uint16_t* x,
                          const void* final_norm, const int64_t* rows, int64_t M, void* out,
                          const int64_t* pos, const int64_t* loc, int64_t N,
                          const int64_t* kv_indices, const int64_t* kv_indptr,
                          const int64_t* q_indptr, const int64_t* q_pos0, int R, void* work,
                          const int32_t* cancel) {
    const int64_t hidden = dims[0], inter = dims[4];
    const int H = (int)dims[1], Hkv = (int)dims[2], D = (int)dims[3], kv_dtype = (int)dims[5];
    const int64_t qkv_n = (int64_t)(H + 2 * Hkv) * D, q_n = (int64_t)H * D;
    float* qkv = (float*)work;          /* [N, qkv_n] */
    float* gate_up = qkv + N * qkv_n;   /* [N, 2 inter] */
    float* residual = gate_up + N * 2 * inter;  /* [N, hidden] */
    float* mlp = residual + N * hidden;  /* [N, hidden]: the MLP's output */
    uint16_t* q = (uint16_t*)(mlp + N * hidden);  /* [N, H, D] */
    uint16_t* attn = q + N * q_n;       /* [N, H * D] */
    uint16_t* h = attn + N * q_n;       /* [N, hidden]: a norm's output */
    uint16_t* act = h + N * hidden;     /* [N, inter] */
    float* o = mlp;                     /* o_proj's output shares the MLP's: each is added first */
    int rc;
#pragma omp parallel for if (N * hidden >= 65536) schedule(static) num_threads(team_threads())
    for (int64_t i = 0; i < N * hidden; ++i) residual[i] = bf16f(x[i]);
    for (int i = 0; i < n_layers; ++i) {
        if (cancel && __atomic_load_n(cancel, __ATOMIC_RELAXED)) return DECODER_STACK_CANCELLED;
        const int64_t* w = layers + (int64_t)i * STACK_WORDS;
        void* k_pool = (void*)(intptr_t)w[W_K_POOL];
        void* v_pool = (void*)(intptr_t)w[W_V_POOL];
        float* k_scale = (float*)(intptr_t)w[W_K_SCALE];
        float* v_scale = (float*)(intptr_t)w[W_V_SCALE];
        /* layer 0 norms the embeddings alone, the others add the MLP's output first */
        add_rmsnorm(i ? mlp : NULL, residual, (const void*)(intptr_t)w[W_IN_NORM], h, N, hidden,
                    eps, 1, 0);
        if ((rc = project(h, N, hidden, w, W_QKV, qkv_n, qkv))) return rc;
        rope_store_kv(qkv, qkv_n, pos, cos_t, sin_t, q, k_pool, v_pool, loc, N, H, Hkv, D, 1, 0,
                      kv_dtype, k_scale, v_scale);
        rc = ragged_attention(q, q_n, k_pool, v_pool, kv_indices, kv_indptr, q_indptr, q_pos0, R,
                              attn, H, Hkv, D, scale, 1, w[W_WINDOW], kv_dtype, k_scale, v_scale);
        if (rc) return rc;
        if ((rc = project(attn, N, q_n, w, W_O, hidden, o))) return rc;
        add_rmsnorm(o, residual, (const void*)(intptr_t)w[W_POST_NORM], h, N, hidden, eps, 1, 0);
        if ((rc = project(h, N, hidden, w, W_GATE_UP, 2 * inter, gate_up))) return rc;
        silu_mul(gate_up, act, N, inter, 1, 0);
        if ((rc = project(act, N, inter, w, W_DOWN, hidden, mlp))) return rc;
    }
    for (int64_t j = 0; j < M; ++j) {
        int64_t r = rows ? rows[j] : j;
        add_rmsnorm(mlp + r * hidden, residual + r * hidden, final_norm,
                    (uint16_t*)out + j * hidden, 1, hidden, eps, 1, 0);
    }
    return 0;
}
