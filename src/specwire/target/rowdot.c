/* The row-invariant product behind `--linear rowdot` (built and loaded by specwire/target/rowdot.py).
 *
 * y[m, n] = bias[n] + sum_k x[m, k] * w[n, k], in float32, with w stored as nn.Linear stores it ([N, K]), in
 * one of four forms, each rebuilt into the float32 weight, bitwise, as it is loaded:
 * - float32 (`specwire_rowdot_f32`);
 * - bfloat16 (`specwire_rowdot_bf16w`): widening a bf16 number is exact (the draft's weights are bf16 numbers);
 * - q4_1 (`specwire_rowdot_q4_1`): per block of 32 k, w = fl(fl(d * q) + m), q a 4-bit code;
 * - q8_0 (`specwire_rowdot_q8_0`): per block of 32 k, w = fl(q * d), q an int8 code.
 * The block forms are exact for weights that were dequantized from a GGUF file with those operations (the
 * built-in target's); specwire/target/compact.py packs them and checks every element. A one-row product is
 * bound by reading the weights, so fewer bytes a weight (16, about 6 and 9 bits against 32) is a faster
 * step, with every product, and so every logit, bitwise unchanged.
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
 * reads each weight row once per 4 rows. A block form trades bytes for instructions (about 5 to rebuild 8
 * weights): it wins where float32 weights would stream from memory, not where they sit in cache. The
 * columns are split across threads. Compiled with -O3 -mavx2
 * -mfma -fopenmp, and without -ffast-math: the order is the point.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "rowkernels.h"


/* Where a weight row's numbers come from: `codes` (float32, bf16, packed 4-bit or int8 codes) and, for the
 * block forms, one scale d (and q4_1's offset m) per 32 k. Each points at the tile's first row. */
typedef struct {
    const void *codes;
    const float *d, *m;
} wsrc;

enum { F32 = 0, BF16 = 1, Q4_1 = 2, Q8_0 = 3 };

/* v as computed: an empty asm the compiler cannot see through, so a product is rounded before it is added
 * (no contraction of a * b + c into a fused multiply-add: the float32 weight was built with two roundings). */
static inline __attribute__((always_inline)) __m256 rounded(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

/* 8 float32 weights of row j at k (k a multiple of 8) in a per-weight form: float32, or BF16 (a bf16 number is
 * the top half of a float32, so widening is a 16-bit shift: exact). */
static inline __attribute__((always_inline)) __m256 load8(const int WF, const wsrc *w, int64_t K, int64_t j, int64_t k) {
    const int64_t i = j * K + k;
    if (WF == BF16) {
        const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w->codes + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    return _mm256_loadu_ps((const float *)w->codes + i);
}

/* one weight of row j at k: the k tail (K mod 8) of the per-weight forms (the block forms have K % 32 == 0) */
static inline __attribute__((always_inline)) float load1(const int WF, const wsrc *w, int64_t K, int64_t j, int64_t k) {
    const int64_t i = j * K + k;
    if (WF == BF16) {
        union { uint32_t u; float f; } v = {.u = (uint32_t)((const uint16_t *)w->codes)[i] << 16};
        return v.f;
    }
    return ((const float *)w->codes)[i];
}

/* The 32 float32 weights of row j's block kb (k = 32 kb ... 32 kb + 31) in a block form, as 4 vectors of 8 k,
 * bitwise the float32 weight:
 * Q4_1: w = fl(fl(d * q) + m) (GGUF's dequantization), q the 4-bit codes, 16 bytes a block: byte i holds
 *       code i in its low half and code i + 16 in its high half (GGUF's layout);
 * Q8_0: w = fl(q * d), q the int8 codes, 32 bytes a block. */
static inline __attribute__((always_inline)) void decode32(const int WF, const wsrc *w, int64_t K, int64_t j,
                                                           int64_t kb, __m256 out[4]) {
    const int64_t b = j * (K / 32) + kb;
    const __m256 d = _mm256_broadcast_ss(w->d + b);
    if (WF == Q4_1) {
        const __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)w->codes + 16 * b));
        const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(15)), hi = _mm_and_si128(_mm_srli_epi16(v, 4),
                                                                                   _mm_set1_epi8(15));
        const __m128i q[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
        const __m256 m = _mm256_broadcast_ss(w->m + b);
        for (int s = 0; s < 4; s++)
            out[s] = _mm256_add_ps(rounded(_mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q[s])))), m);
        return;
    }
    const int8_t *q = (const int8_t *)w->codes + 32 * b;
    for (int s = 0; s < 4; s++)
        out[s] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * s)))),
                               d);
}

/* Ask for row j's block kb + 4 (codes, d, m) now: a tile reads 2 or 3 short streams a row, 8 rows at once, more
 * than the hardware prefetcher follows; without this a one-row pass waits on memory, not on the decoding. */
static inline __attribute__((always_inline)) void fetch_ahead(const int WF, const wsrc *w, int64_t K, int64_t j,
                                                              int64_t kb) {
    const int64_t b = j * (K / 32) + kb + 4;
    _mm_prefetch((const char *)w->codes + (WF == Q4_1 ? 16 : 32) * b, _MM_HINT_T0);
    _mm_prefetch((const char *)(w->d + b), _MM_HINT_T0);
    if (WF == Q4_1) _mm_prefetch((const char *)(w->m + b), _MM_HINT_T0);
}

/* y[i, j] (+ bias[j]) for i < R, j < C: x rows ldx apart, w rows K apart, y rows ldy apart. R, C and WF are
 * compile-time constants at every call, so the accumulators live in registers. A block form is decoded a
 * block (4 steps of 8 k) at a time; each accumulator still takes its k in ascending steps of 8. */
static inline __attribute__((always_inline)) void tile(const int WF, const int R, const int C, const float *x,
                                                       int64_t ldx, const wsrc *w, int64_t K, const float *bias,
                                                       float *y, int64_t ldy) {
    __m256 a[4][8];
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) a[i][j] = _mm256_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    if (WF == Q4_1 || WF == Q8_0)
        for (int64_t kb = 0; kb < K / 32; kb++)
            for (int j = 0; j < C; j++) {
                __m256 wv[4];
                fetch_ahead(WF, w, K, j, kb);
                decode32(WF, w, K, j, kb, wv);
                for (int s = 0; s < 4; s++)
                    for (int i = 0; i < R; i++)
                        a[i][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * ldx + 32 * kb + 8 * s), wv[s], a[i][j]);
            }
    else
        for (int64_t k = 0; k < K8; k += 8) {
            __m256 wv[8];
            for (int j = 0; j < C; j++) wv[j] = load8(WF, w, K, j, k);
            for (int i = 0; i < R; i++) {
                const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
                for (int j = 0; j < C; j++) a[i][j] = _mm256_fmadd_ps(xv, wv[j], a[i][j]);
            }
        }
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            float r = fold8(a[i][j]);
            for (int64_t t = K8; t < K; t++) r = fmaf(x[i * ldx + t], load1(WF, w, K, j, t), r);
            y[i * ldy + j] = bias ? r + bias[j] : r;
        }
}

/* the tile's weights: its first row n0 in each of w's arrays (a q4_1 row is K / 2 bytes of codes) */
static inline __attribute__((always_inline)) wsrc at_row(const int WF, const wsrc *w, int64_t K, int64_t n0) {
    const int64_t row_bytes = WF == F32 ? 4 * K : WF == BF16 ? 2 * K : WF == Q4_1 ? K / 2 : K;
    const int64_t blocks = K / 32;
    wsrc r = {(const char *)w->codes + n0 * row_bytes, w->d ? w->d + n0 * blocks : 0, w->m ? w->m + n0 * blocks : 0};
    return r;
}

/* the R x C tile at rows m0, columns n0, its weights in w from row `first` on */
#define TILE(WF, R, C, w, first)                                                                                \
    do {                                                                                                        \
        const wsrc wt = at_row(WF, w, K, n0 - (first));                                                         \
        tile(WF, R, C, x + m0 * K, K, &wt, K, bias ? bias + n0 : 0, y + m0 * N + n0, N);                        \
    } while (0)

/* the tiles of one strip of nc <= 3 columns from nb, rows m0 ... m0 + mr - 1 (mr <= 4) */
#define TILES(WF, w, first)                                                                                     \
    if (nc == 3) {                                                                                              \
        const int64_t n0 = nb;                                                                                  \
        switch (mr) {                                                                                           \
            case 4: TILE(WF, 4, 3, w, first); break;                                                            \
            case 3: TILE(WF, 3, 3, w, first); break;                                                            \
            case 2: TILE(WF, 2, 3, w, first); break;                                                            \
            default: TILE(WF, 1, 3, w, first);                                                                  \
        }                                                                                                       \
    } else                                                                                                      \
        for (int64_t n0 = nb; n0 < nb + nc; n0++) switch (mr) {                                                 \
                case 4: TILE(WF, 4, 1, w, first); break;                                                        \
                case 3: TILE(WF, 3, 1, w, first); break;                                                        \
                case 2: TILE(WF, 2, 1, w, first); break;                                                        \
                default: TILE(WF, 1, 1, w, first);                                                              \
            }

/* x [M, K], w [N, K] (in form WF), bias [N] or NULL, y [M, N]: contiguous, row-major; this thread's share
 * (`part` of `parts`) of the column strips. A pass of more than 4 rows over a block form first decodes each
 * strip of 3 weight rows into float32 (on the stack: 12 K bytes, in L1 for common K) and runs the float32 tiles
 * over it, so each weight is decoded once per pass, not once per 4 rows. Called with a constant WF from inside
 * each entry point's parallel region (a region is outlined before inlining, so a form passed into it would
 * be a run-time value, and no loop would specialise). */
static inline __attribute__((always_inline)) void rowdot_part(const int WF, const float *x, int64_t M, int64_t K,
                                                              const wsrc *w, int64_t N, const float *bias, float *y,
                                                              int part, int parts) {
    const int64_t width = M == 1 ? 8 : 3, blocks = (N + width - 1) / width, share = (blocks + parts - 1) / parts;
    const int64_t first_block = part * share, last_block = first_block + share < blocks ? first_block + share : blocks;
    if (M == 1) {
        for (int64_t b = first_block; b < last_block; b++) {
            const int64_t m0 = 0;
            if (b * 8 + 8 <= N) {
                const int64_t n0 = b * 8;
                TILE(WF, 1, 8, w, 0);
            } else
                for (int64_t n0 = b * 8; n0 < N; n0++) TILE(WF, 1, 1, w, 0);
        }
        return;
    }
    const int block_form = (WF == Q4_1 || WF == Q8_0) && M > 4;  /* decode once into a strip, not per 4 rows */
    for (int64_t b = first_block; b < last_block; b++) {
        const int64_t nb = b * 3, nc = N - nb < 3 ? N - nb : 3;
        float strip[block_form ? 3 * K : 1];  /* the strip's rows decoded (block forms only) */
        const wsrc decoded = {strip, 0, 0};  /* row nb + j at strip + j K */
        if (block_form)
            for (int64_t j = 0; j < nc; j++) {
                const wsrc row = at_row(WF, w, K, nb + j);
                for (int64_t kb = 0; kb < K / 32; kb++) {
                    __m256 wv[4];
                    fetch_ahead(WF, &row, K, 0, kb);
                    decode32(WF, &row, K, 0, kb, wv);
                    for (int s = 0; s < 4; s++) _mm256_storeu_ps(strip + j * K + 32 * kb + 8 * s, wv[s]);
                }
            }
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            if (block_form) {
                TILES(F32, &decoded, nb)
            } else {
                TILES(WF, w, 0)
            }
        }
    }
}

#define PARALLEL(WF, src)                                                                                       \
    _Pragma("omp parallel num_threads(threads)")                                                                \
    rowdot_part(WF, x, M, K, &src, N, bias, y, omp_get_thread_num(), omp_get_num_threads())

void specwire_rowdot_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, const float *bias,
                         float *y, int threads) {
    const wsrc src = {w, 0, 0};
    PARALLEL(F32, src);
}

void specwire_rowdot_bf16w(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, const float *bias,
                           float *y, int threads) {
    const wsrc src = {w, 0, 0};
    PARALLEL(BF16, src);
}

/* codes uint8 [N, K / 2], d and m float32 [N, K / 32]; K % 32 == 0 */
void specwire_rowdot_q4_1(const float *x, int64_t M, int64_t K, const uint8_t *codes, const float *d, const float *m,
                          int64_t N, const float *bias, float *y, int threads) {
    const wsrc src = {codes, d, m};
    PARALLEL(Q4_1, src);
}

/* codes int8 [N, K], d float32 [N, K / 32]; K % 32 == 0 */
void specwire_rowdot_q8_0(const float *x, int64_t M, int64_t K, const int8_t *codes, const float *d, int64_t N,
                          const float *bias, float *y, int threads) {
    const wsrc src = {codes, d, 0};
    PARALLEL(Q8_0, src);
}

int specwire_rowdot_abi(void) { return 4; }
