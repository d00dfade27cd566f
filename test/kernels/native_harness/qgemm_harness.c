/* Runs gemm_quant.c's qgemm on a case written by test/kernels/test_gemm_quant_cross.py, so a
 * variant this machine cannot run natively (aarch64 NEON, under qemu-user) is checked against
 * reference outputs made on x86.
 *
 *   qgemm_harness IN OUT SIZE...
 *
 * IN (little-endian): int64 fmt, n, k, m, ldx, has_bias, has_min, d_count, d_bytes (2 or 4);
 * q [n, k] bytes; d [d_count] (d_bytes each); m [d_count] if has_min; bias float32 [n] if
 * has_bias; x bf16 [m, ldx]. OUT: float32 [m, n] with every row computed alone, then for each
 * SIZE the float32 [SIZE, n] of the batch of the first SIZE rows, then bf16 [m, n] of the whole
 * batch. Exit status 0, or 1 with a message on stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../../kernels/cpu/radixgen_kernels.h"

static void* read_exact(FILE* f, size_t bytes) {
    void* p = malloc(bytes ? bytes : 1);
    if (!p || fread(p, 1, bytes, f) != bytes) {
        fprintf(stderr, "short input\n");
        exit(1);
    }
    return p;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s IN OUT SIZE...\n", argv[0]);
        return 1;
    }
    if (!qgemm_available()) {
        fprintf(stderr, "qgemm unavailable in this build\n");
        return 1;
    }
    FILE* in = fopen(argv[1], "rb");
    if (!in) {
        fprintf(stderr, "cannot open %s\n", argv[1]);
        return 1;
    }
    int64_t* h = (int64_t*)read_exact(in, 9 * sizeof(int64_t));
    int fmt = (int)h[0];
    int64_t n = h[1], k = h[2], m = h[3], ldx = h[4], d_count = h[7], d_bytes = h[8];
    uint8_t* q = (uint8_t*)read_exact(in, (size_t)(n * k));
    void* d = read_exact(in, (size_t)(d_count * d_bytes));
    void* mins = h[6] ? read_exact(in, (size_t)(d_count * d_bytes)) : NULL;
    float* bias = h[5] ? (float*)read_exact(in, (size_t)n * sizeof(float)) : NULL;
    uint16_t* x = (uint16_t*)read_exact(in, (size_t)(m * ldx) * 2);
    fclose(in);

    int64_t bytes = qgemm_packed_bytes(n, k, fmt);
    if (bytes < 0) {
        fprintf(stderr, "bad shape or format\n");
        return 1;
    }
    uint8_t* packed = (uint8_t*)malloc((size_t)bytes);
    float* y = (float*)malloc((size_t)(m * n) * sizeof(float));
    uint16_t* yb = (uint16_t*)malloc((size_t)(m * n) * 2);
    FILE* out = fopen(argv[2], "wb");
    if (!packed || !y || !yb || !out) {
        fprintf(stderr, "out of memory or cannot write %s\n", argv[2]);
        return 1;
    }
    qgemm_pack(q, d, mins, n, k, fmt, packed);
    for (int64_t r = 0; r < m; ++r)
        if (qgemm(x + r * ldx, 1, ldx, packed, n, k, fmt, bias, y + r * n, n, 1) != 0) {
            fprintf(stderr, "qgemm failed\n");
            return 1;
        }
    fwrite(y, sizeof(float), (size_t)(m * n), out);
    for (int a = 3; a < argc; ++a) {
        int64_t size = atoll(argv[a]);
        if (size < 1 || size > m || qgemm(x, size, ldx, packed, n, k, fmt, bias, y, n, 1) != 0) {
            fprintf(stderr, "bad size %s or qgemm failed\n", argv[a]);
            return 1;
        }
        fwrite(y, sizeof(float), (size_t)(size * n), out);
    }
    if (qgemm(x, m, ldx, packed, n, k, fmt, bias, yb, n, 0) != 0) {
        fprintf(stderr, "qgemm failed\n");
        return 1;
    }
    fwrite(yb, 2, (size_t)(m * n), out);
    fclose(out);
    return 0;
}
