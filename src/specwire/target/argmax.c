/* The greedy pick over rows of logits, for decoding on CPU (built into the kernels library with rowdot.c and
 * rowattn.c, called through specwire/target/rowdot.py `argmax_rows`, used by specwire/decode/sampling.py).
 *
 * For each row: the first index of its maximum, as torch.argmax gives it (+0 and -0 are equal, so the first
 * of them wins). A row holding a NaN gets -1 (torch then decides: NaN wins there). The maximum is exact in
 * any order, so it is taken 8 lanes at a time, then the row is searched for the first element equal to it.
 * Why: torch's CPU argmax over a verify pass's bf16 logits (9 rows of a 49k vocabulary) took about 0.8 ms,
 * its max 0.2-0.3 ms; this takes about 0.05 ms. Rows are split across threads.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "rowkernels.h"

static inline __attribute__((always_inline)) int64_t argmax_row(const int BF, const void *row, int64_t n) {
    const int64_t n8 = n & ~(int64_t)7;
    __m256 mx = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int64_t e = 0; e < n8; e += 8) {
        const __m256 v = kv8(BF, row, e);
        mx = _mm256_max_ps(mx, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    if (_mm256_movemask_ps(nan)) return -1;
    float lanes[8], m = -INFINITY;
    _mm256_storeu_ps(lanes, mx);
    for (int t = 0; t < 8; t++) m = lanes[t] > m ? lanes[t] : m;
    for (int64_t e = n8; e < n; e++) {
        const float v = kv1(BF, row, e);
        if (v != v) return -1;
        m = v > m ? v : m;
    }
    const __m256 mv = _mm256_set1_ps(m);
    for (int64_t e = 0; e < n8; e += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(kv8(BF, row, e), mv, _CMP_EQ_OQ));
        if (hit) return e + __builtin_ctz(hit);
    }
    for (int64_t e = n8; e < n; e++)
        if (kv1(BF, row, e) == m) return e;
    return -1;  /* (not reached: m is one of the row's numbers) */
}

/* x: [rows, n] float32 (bf16 = 0) or bf16 (bf16 = 1), rows contiguous at stride n; out: [rows] indices, -1
 * for a row holding a NaN. */
void specwire_argmax_rows(const void *x, int64_t rows, int64_t n, int bf16, int64_t *out, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1)
    for (int64_t r = 0; r < rows; r++)
        out[r] = bf16 ? argmax_row(1, (const uint16_t *)x + r * n, n) : argmax_row(0, (const float *)x + r * n, n);
}
