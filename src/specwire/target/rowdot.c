/* The row-invariant product behind `--linear rowdot` (built and loaded by specwire/target/rowdot.py).
 *
 * y[m, n] = bias[n] + sum_k x[m, k] * w[n, k], in float32, with w stored as nn.Linear stores it ([N, K]).
 *
 * The one rule: every output is the same chain of operations whatever the number of rows M, the row m,
 * the column n or the thread that computes it. Four 8-lane accumulators take k in steps of 32 (lane j of
 * accumulator a sums k = 32i + 8a + j in order of i), they are added in a fixed tree, the 8 lanes are
 * folded in a fixed tree, then the k tail (K mod 32) is added one term at a time, and the bias last.
 * So a row of a T-token pass is bitwise the row of a one-token pass, which a BLAS library does not
 * promise: it picks its kernel, and its blocking of k, by the shape.
 *
 * Speed: each weight row is read once per block of 4 input rows, and the columns are split across
 * threads, so a pass of a few rows costs about what reading the weights costs, like a matrix-vector
 * product. Compiled with -O3 -mavx2 -mfma -fopenmp, and without -ffast-math: the order is the point.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define MR 4 /* input rows per tile: 4 rows x 4 accumulators fill 16 ymm registers */

static inline float fold8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* lane i + lane i+4 */
    __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));                                 /* (0+4)+(2+6), (1+5)+(3+7) */
    t = _mm_add_ss(t, _mm_shuffle_ps(t, t, 1));
    return _mm_cvtss_f32(t);
}

/* out[i] = sum_k x[i, k] * w[k] for i < mr (mr <= MR); x rows are ldx apart. */
static inline void tile(const float *x, int64_t ldx, int mr, const float *w, int64_t K, float *out) {
    __m256 a[MR][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    const int64_t K32 = K & ~(int64_t)31;
    for (; k < K32; k += 32) {
        const __m256 w0 = _mm256_loadu_ps(w + k), w1 = _mm256_loadu_ps(w + k + 8);
        const __m256 w2 = _mm256_loadu_ps(w + k + 16), w3 = _mm256_loadu_ps(w + k + 24);
        for (int i = 0; i < mr; i++) {
            const float *xi = x + i * ldx + k;
            a[i][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xi), w0, a[i][0]);
            a[i][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 8), w1, a[i][1]);
            a[i][2] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 16), w2, a[i][2]);
            a[i][3] = _mm256_fmadd_ps(_mm256_loadu_ps(xi + 24), w3, a[i][3]);
        }
    }
    for (int i = 0; i < mr; i++) {
        float r = fold8(_mm256_add_ps(_mm256_add_ps(a[i][0], a[i][1]), _mm256_add_ps(a[i][2], a[i][3])));
        const float *xi = x + i * ldx;
        for (int64_t t = k; t < K; t++) r = fmaf(xi[t], w[t], r);
        out[i] = r;
    }
}

/* x [M, K], w [N, K], bias [N] or NULL, y [M, N]: contiguous, row-major. */
void specwire_rowdot_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                         float *y, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *wn = w + n * K;
        float acc[MR];
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int mr = (int)(M - m0 < MR ? M - m0 : MR);
            tile(x + m0 * K, K, mr, wn, K, acc);
            for (int i = 0; i < mr; i++) y[(m0 + i) * N + n] = bias ? acc[i] + bias[n] : acc[i];
        }
    }
}

int specwire_rowdot_abi(void) { return 1; }
