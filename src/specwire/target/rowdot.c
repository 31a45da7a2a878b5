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
 *
 * Where the CPU has AVX-512, specwire/target/rowdot.py builds it with -DSPECWIRE_AVX512 as well: the same
 * chains, two outputs' 8-lane accumulators side by side in one zmm register (the section below), so every
 * output is bitwise the AVX2 build's and each instruction does twice the work. Its tiles are narrower in
 * columns (3 pairs for one row, 2 for 2-4 rows): each column is 2 or 3 weight streams, and fewer streams
 * a tile read faster than more accumulators on the machine it was tuned on (a 2-core AMD EPYC, Zen 5).
 * Float32 weights in passes of one or two rows keep the ymm tiles: loading two rows into one register cost
 * more there than it saved.
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

#ifdef SPECWIRE_AVX512
/* ---- AVX-512: the same chains, two outputs to a register ------------------------------------------------
 * A zmm accumulator holds the 8-lane accumulators of two outputs (columns j and j + 1 of one row) side by
 * side: its low 8 lanes are column j's, its high 8 lanes column j + 1's, each lane taking the same k by the
 * same fused multiply-adds in the same order as the ymm kernel above, and each half folded by `fold8`. So
 * every output is bitwise the AVX2 build's; one instruction does the work of two. A weight pair is loaded
 * (or decoded) as one zmm, the input's 8 k broadcast to both halves. Built where the CPU has AVX-512
 * (F, BW, DQ, VL), with -DSPECWIRE_AVX512; an odd last column of a strip takes the ymm tile. */

enum { PAIRS = 4 };  /* float32 weight rows interleaved by pairs: pair p's k-step s is 16 floats at 2pK + 16s */

static inline __attribute__((always_inline)) __m512 rounded512(__m512 v) {
    __asm__("" : "+v"(v));
    return v;
}

static inline __attribute__((always_inline)) __m512 pair256(__m256 lo, __m256 hi) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

static inline __attribute__((always_inline)) __m256i pair128(__m128i lo, __m128i hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

/* rows j and j + 1's 8 float32 weights at k (a multiple of 8), as [row j | row j + 1] */
static inline __attribute__((always_inline)) __m512 load8x2(const int WF, const wsrc *w, int64_t K, int64_t j,
                                                            int64_t k) {
    if (WF == PAIRS) return _mm512_loadu_ps((const float *)w->codes + j * K + 2 * k);
    if (WF == BF16) {
        const uint16_t *c = (const uint16_t *)w->codes + j * K + k;
        const __m256i h = pair128(_mm_loadu_si128((const __m128i *)c), _mm_loadu_si128((const __m128i *)(c + K)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    const float *c = (const float *)w->codes + j * K + k;
    return pair256(_mm256_loadu_ps(c), _mm256_loadu_ps(c + K));
}

/* rows j and j + 1's block kb in a block form, as 4 pairs [row j's 8 k | row j + 1's 8 k]: `decode32`'s
 * operations, two rows at once */
static inline __attribute__((always_inline)) void decode32x2(const int WF, const wsrc *w, int64_t K, int64_t j,
                                                             int64_t kb, __m512 out[4]) {
    const int64_t b0 = j * (K / 32) + kb, b1 = b0 + K / 32;
    const __m512 d = pair256(_mm256_broadcast_ss(w->d + b0), _mm256_broadcast_ss(w->d + b1));
    if (WF == Q4_1) {
        const uint8_t *c = (const uint8_t *)w->codes;
        const __m256i v = pair128(_mm_loadu_si128((const __m128i *)(c + 16 * b0)),
                                  _mm_loadu_si128((const __m128i *)(c + 16 * b1)));
        const __m256i nib = _mm256_set1_epi8(15);
        /* 64-bit quarters [q0 q1 | q2 q3] -> [q0 q2 | q1 q3]: each half of the result is one step of both rows */
        const __m256i lo = _mm256_permute4x64_epi64(_mm256_and_si256(v, nib), 0xD8);
        const __m256i hi = _mm256_permute4x64_epi64(_mm256_and_si256(_mm256_srli_epi16(v, 4), nib), 0xD8);
        const __m128i q[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1),
                              _mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)};
        const __m512 m = pair256(_mm256_broadcast_ss(w->m + b0), _mm256_broadcast_ss(w->m + b1));
        for (int s = 0; s < 4; s++)
            out[s] = _mm512_add_ps(rounded512(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q[s])))), m);
        return;
    }
    const int8_t *q0 = (const int8_t *)w->codes + 32 * b0, *q1 = (const int8_t *)w->codes + 32 * b1;
    for (int s = 0; s < 4; s++) {
        const __m128i q = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(q0 + 8 * s)),
                                             _mm_loadl_epi64((const __m128i *)(q1 + 8 * s)));
        out[s] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d);
    }
}

/* `tile` with P pairs of columns (2P outputs a row): y[i, j] (+ bias[j]) for i < R, j < 2P */
static inline __attribute__((always_inline)) void tile512(const int WF, const int R, const int P, const float *x,
                                                          int64_t ldx, const wsrc *w, int64_t K, const float *bias,
                                                          float *y, int64_t ldy) {
    __m512 a[4][8];
    for (int i = 0; i < R; i++)
        for (int p = 0; p < P; p++) a[i][p] = _mm512_setzero_ps();
    const int64_t K8 = K & ~(int64_t)7;
    if (WF == Q4_1 || WF == Q8_0)
        for (int64_t kb = 0; kb < K / 32; kb++)
            for (int p = 0; p < P; p++) {
                __m512 wv[4];
                fetch_ahead(WF, w, K, 2 * p, kb);
                fetch_ahead(WF, w, K, 2 * p + 1, kb);
                decode32x2(WF, w, K, 2 * p, kb, wv);
                for (int s = 0; s < 4; s++)
                    for (int i = 0; i < R; i++)
                        a[i][p] = _mm512_fmadd_ps(_mm512_broadcast_f32x8(_mm256_loadu_ps(x + i * ldx + 32 * kb + 8 * s)),
                                                  wv[s], a[i][p]);
            }
    else
        for (int64_t k = 0; k < K8; k += 8) {
            __m512 wv[8];
            for (int p = 0; p < P; p++) wv[p] = load8x2(WF, w, K, 2 * p, k);
            for (int i = 0; i < R; i++) {
                const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + i * ldx + k));
                for (int p = 0; p < P; p++) a[i][p] = _mm512_fmadd_ps(xv, wv[p], a[i][p]);
            }
        }
    for (int i = 0; i < R; i++)
        for (int p = 0; p < P; p++)
            for (int h = 0; h < 2; h++) {
                const int j = 2 * p + h;
                float r = fold8(h ? _mm512_extractf32x8_ps(a[i][p], 1) : _mm512_castps512_ps256(a[i][p]));
                for (int64_t t = K8; t < K; t++) r = fmaf(x[i * ldx + t], load1(WF, w, K, j, t), r);
                y[i * ldy + j] = bias ? r + bias[j] : r;
            }
}

/* the R x 2P tile at rows m0, columns n0, its weights in w from row `first` on (PAIRS: K floats a row too) */
#define TILE512(WF, R, P, w, first)                                                                             \
    do {                                                                                                        \
        const wsrc wt = at_row(WF == PAIRS ? F32 : WF, w, K, n0 - (first));                                     \
        tile512(WF, R, P, x + m0 * K, K, &wt, K, bias ? bias + n0 : 0, y + m0 * N + n0, N);                     \
    } while (0)

#define ROWS512(WF, P, w, first)                                                                                \
    switch (mr) {                                                                                               \
        case 4: TILE512(WF, 4, P, w, first); break;                                                             \
        case 3: TILE512(WF, 3, P, w, first); break;                                                             \
        case 2: TILE512(WF, 2, P, w, first); break;                                                             \
        default: TILE512(WF, 1, P, w, first);                                                                   \
    }

/* the tiles of one strip of nc <= 2 * WIDE_PAIRS columns from nb: whole strips in one tile of WIDE_PAIRS pairs,
 * a short last strip pair by pair, its odd column by the ymm tile over the source form */
#define STRIP512(WF, WIDE_PAIRS, w, first)                                                                      \
    if (nc == 2 * (WIDE_PAIRS)) {                                                                               \
        const int64_t n0 = nb;                                                                                  \
        ROWS512(WF, WIDE_PAIRS, w, first)                                                                       \
    } else                                                                                                      \
        for (int64_t n0 = nb; n0 + 1 < nb + nc; n0 += 2) {                                                      \
            ROWS512(WF, 1, w, first)                                                                            \
        }

#ifndef ONE_ROW_PAIRS
#define ONE_ROW_PAIRS 3
#endif
#ifndef FEW_ROWS_PAIRS
#define FEW_ROWS_PAIRS 2
#endif
#ifndef STRIP_PAIRS
#define STRIP_PAIRS 3
#endif
/* `rowdot_part` two columns a register: strips of 2 * ONE_ROW_PAIRS columns for one row, 2 * FEW_ROWS_PAIRS for
 * 2-4 rows, 2 * STRIP_PAIRS (decoded once into a strip for the block forms) for more */
static inline __attribute__((always_inline)) void rowdot_part512(const int WF, const float *x, int64_t M,
                                                                 int64_t K, const wsrc *w, int64_t N,
                                                                 const float *bias, float *y, int part,
                                                                 int parts) {
    const int64_t width = 2 * (M == 1 ? ONE_ROW_PAIRS : M <= 4 ? FEW_ROWS_PAIRS : STRIP_PAIRS);
    const int64_t blocks = (N + width - 1) / width, share = (blocks + parts - 1) / parts;
    const int64_t first_block = part * share, last_block = first_block + share < blocks ? first_block + share : blocks;
    const int block_form = (WF == Q4_1 || WF == Q8_0) && M > 4;  /* decode once into a strip, not per 4 rows */
    for (int64_t b = first_block; b < last_block; b++) {
        const int64_t nb = b * width, nc = N - nb < width ? N - nb : width, even = nc & ~(int64_t)1;
        float strip[block_form ? 2 * STRIP_PAIRS * K : 1];  /* the strip's row pairs decoded, interleaved (PAIRS) */
        const wsrc decoded = {strip, 0, 0};
        if (block_form)
            for (int64_t j = 0; j < even; j += 2) {
                const wsrc rows = at_row(WF, w, K, nb + j);
                for (int64_t kb = 0; kb < K / 32; kb++) {
                    __m512 wv[4];
                    fetch_ahead(WF, &rows, K, 0, kb);
                    fetch_ahead(WF, &rows, K, 1, kb);
                    decode32x2(WF, &rows, K, 0, kb, wv);
                    for (int s = 0; s < 4; s++) _mm512_storeu_ps(strip + j * K + 64 * kb + 16 * s, wv[s]);
                }
            }
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            if (M == 1) {
                STRIP512(WF, ONE_ROW_PAIRS, w, 0)
            } else if (block_form) {
                STRIP512(PAIRS, STRIP_PAIRS, &decoded, nb)
            } else if (M <= 4) {
                STRIP512(WF, FEW_ROWS_PAIRS, w, 0)
            } else {
                STRIP512(WF, STRIP_PAIRS, w, 0)
            }
            if (nc & 1) {
                const int64_t n0 = nb + nc - 1;
                switch (mr) {
                    case 4: TILE(WF, 4, 1, w, 0); break;
                    case 3: TILE(WF, 3, 1, w, 0); break;
                    case 2: TILE(WF, 2, 1, w, 0); break;
                    default: TILE(WF, 1, 1, w, 0);
                }
            }
        }
    }
}
/* float32 weights in one or two rows: the pairs' loads (two rows into one register) cost more than they save,
 * so those take the ymm tiles (bitwise the same); every other pass takes the zmm ones */
#define ROWDOT_PART(WF, x, M, ...) \
    ((WF) == F32 && (M) <= 2 ? rowdot_part(WF, x, M, __VA_ARGS__) : rowdot_part512(WF, x, M, __VA_ARGS__))
#else
#define ROWDOT_PART rowdot_part
#endif

#define PARALLEL(WF, src)                                                                                       \
    _Pragma("omp parallel num_threads(threads)")                                                                \
    ROWDOT_PART(WF, x, M, K, &src, N, bias, y, omp_get_thread_num(), omp_get_num_threads())

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

int specwire_rowdot_abi(void) { return 7; }
