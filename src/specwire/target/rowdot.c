/* The row-invariant product behind `--linear rowdot` (built and loaded by specwire/target/rowdot.py).
 *
 * y[m, n] = bias[n] + sum_k x[m, k] * w[n, k], in float32, with w stored as nn.Linear stores it ([N, K]):
 * float32 (`specwire_rowdot_f32`), or bfloat16 (`specwire_rowdot_bf16w`), widened to float32 as it is loaded.
 * Widening a bf16 number to float32 is exact, so the bf16 form is bitwise the float32 form over the widened
 * weights, and reads half the bytes: the draft's weights are bf16 numbers, and its one-row products are
 * bound by reading them.
 *
 * The one rule: every output is the same chain of operations whatever the number of rows M, the row m,
 * the column n, the tile that holds it or the thread that computes it. One 8-lane accumulator takes k in
 * steps of 8 (lane j sums k = 8i + j in order of i, by fused multiply-adds), its 8 lanes are folded in a
 * fixed tree, then the k tail (K mod 8) is added one term at a time, and the bias last. So a row of a
 * T-token pass is bitwise the row of a one-token pass, which a BLAS library does not promise: it picks
 * its kernel, and its blocking of k, by the shape.
 *
 * Speed: outputs are computed in register tiles of R rows x C columns (R*C independent accumulators hide
 * the FMA latency; each loaded weight vector serves R rows and each input vector C columns). A one-row
 * pass takes 1x8 tiles and is bound by reading the weights, like a matrix-vector product; a pass of
 * several rows takes 4x3 tiles (12 accumulators, 3 weight and 1 input register: the 16 ymm registers) and
 * reads each weight row once per 4 rows. The columns are split across threads. Compiled with -O3 -mavx2
 * -mfma -fopenmp, and without -ffast-math: the order is the point.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "rowkernels.h"


/* 8 weights from w + i, as float32: w holds float32 (BF = 0) or bf16 (BF = 1; a bf16 number is the top half of
 * a float32, so widening is a 16-bit shift, exact). */
static inline __attribute__((always_inline)) __m256 load8(const int BF, const void *w, int64_t i) {
    if (BF) {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w + i);
}

static inline __attribute__((always_inline)) float load1(const int BF, const void *w, int64_t i) {
    if (BF) {
        union { uint32_t u; float f; } v = {.u = (uint32_t)((const uint16_t *)w)[i] << 16};
        return v.f;
    }
    return ((const float *)w)[i];
}

/* y[i, j] (+ bias[j]) for i < R, j < C: x rows ldx apart, w rows K apart, y rows ldy apart. R, C and BF are
 * compile-time constants at every call, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void tile(const int BF, const int R, const int C, const float *x,
                                                       int64_t ldx, const void *w, int64_t K, const float *bias,
                                                       float *y, int64_t ldy) {
    __m256 a[4][8];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) a[i][j] = _mm256_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    for (int64_t k = 0; k < K8; k += 8) {
        __m256 wv[8];
        for (int j = 0; j < C; j++) wv[j] = load8(BF, w, j * K + k);
        for (int i = 0; i < R; i++) {
            const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
            for (int j = 0; j < C; j++) a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            float r = fold8(a[i][j]);
            for (int64_t t = K8; t < K; t++) r = fmaf(x[i * ldx + t], load1(BF, w, j * K + t), r);
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

#define TILE(R, C) tile(BF, R, C, x + m0 * K, K, (const char *)w + n0 * K * (BF ? 2 : 4), K, \
                        bias ? bias + n0 : 0, y + m0 * N + n0, N)

/* x [M, K], w [N, K] (float32 or bf16: BF), bias [N] or NULL, y [M, N]: contiguous, row-major. */
static inline __attribute__((always_inline)) void rowdot(const int BF, const float *x, int64_t M, int64_t K,
                                                         const void *w, int64_t N, const float *bias, float *y,
                                                         int threads) {
    if (M == 1) {
        const int64_t blocks = (N + 7) / 8;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t m0 = 0;
            if (b * 8 + 8 <= N) {
                const int64_t n0 = b * 8;
                TILE(1, 8);
            } else
                for (int64_t n0 = b * 8; n0 < N; n0++) TILE(1, 1);
        }
        return;
    }
    const int64_t blocks = (N + 2) / 3;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t nb = b * 3, nc = N - nb < 3 ? N - nb : 3;
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            if (nc == 3) {
                const int64_t n0 = nb;
                switch (mr) {
                    case 4: TILE(4, 3); break;
                    case 3: TILE(3, 3); break;
                    case 2: TILE(2, 3); break;
                    default: TILE(1, 3);
                }
            } else
                for (int64_t n0 = nb; n0 < nb + nc; n0++) switch (mr) {
                        case 4: TILE(4, 1); break;
                        case 3: TILE(3, 1); break;
                        case 2: TILE(2, 1); break;
                        default: TILE(1, 1);
                    }
        }
    }
}

void specwire_rowdot_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                         float *y, int threads) {
    rowdot(0, x, M, K, w, N, bias, y, threads);
}

void specwire_rowdot_bf16w(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, const float *bias,
                           float *y, int threads) {
    rowdot(1, x, M, K, w, N, bias, y, threads);
}

int specwire_rowdot_abi(void) { return 3; }
