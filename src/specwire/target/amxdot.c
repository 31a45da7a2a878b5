/* specwire amxdot: y = x @ W.T (+ bias) in bf16 on Intel AMX, each row of y bitwise independent of the rows
 * beside it. The kernel behind `--linear amx` (specwire/target/amx.py builds and calls it).
 *
 * The product is computed transposed: C[n][t] = sum_k W[n][k] * x[t][k], with W as AMX's A operand (16 output
 * features a tile, 32 k a tile row, read straight from the model's bf16 weight [N][K]) and x as the B
 * operand (16 tokens a tile, in AMX's pair-interleaved layout, laid out once a call). TDPBF16PS defines
 * every element of C from its own row of A and column of B alone, with the k pairs taken in order and fp32
 * accumulation, and the kernel walks k in blocks of 32 from 0 to K for every tile. So an output's chain of
 * operations is fixed by (n, K) alone: not by the token count, the tile that holds the token, or the
 * thread. That is the batch invariance decoding needs, by construction.
 *
 * The output is bf16(C + bias), rounded to nearest even by VCVTNEPS2BF16 (which also flushes denormals to
 * zero: a fixed rule, the same for every row).
 *
 * Speed: a one-token step is bound by reading the weights (their bf16 bytes stream into the A tiles); AMX
 * makes the arithmetic of up to 32 tokens nearly free, so a verify pass costs little more than a one-token
 * step. Output features are split across threads in blocks of 32. (Decoding GGUF block codes into the A
 * tiles, as rowdot reads them, was measured too: fewer bytes, but on a 2-core AMX Xeon the decoding cost
 * more than the bytes it saved; so was one call for sibling layers that read the same input, q/k/v and
 * gate/up: no gain.) Compiled with -O3 -mavx512f -mavx512bw -mavx512bf16 -mamx-tile -mamx-bf16
 * -fopenmp.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

/* Ask the kernel for the AMX tile state (once per process); 0 when granted. */
int specwire_amx_init(void) {
    return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
}

/* Tiles 0-3: C (16 features x 16 tokens, fp32); 4-5: A (16 features x 32 k, bf16); 6-7: B (16 k pairs x 16
 * tokens x 2, bf16). Every tile is 16 rows of 64 bytes. */
static void configure(void) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* Dword i of a tile row, i = 0..15, as a gather/scatter index in dwords. */
static inline __m512i dwords_of_rows(void) {
    return _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                              _mm512_set1_epi32(16));
}

/* x [M][K] bf16 (M <= 32) -> the B-tile layout [K/32][TB][16 k pairs][16 tokens][2], zero-padded to TB * 16 tokens:
 * x[t][kb*32 + 2r + {0,1}] goes to tile (kb, t / 16), row r, token t % 16. */
static void layout_x(const uint16_t *x, int64_t M, int64_t K, int64_t TB, uint16_t *xb) {
    const int64_t KB = K / 32;
    const __m512i rows = dwords_of_rows();
    memset(xb, 0, (size_t)(KB * TB * 512) * sizeof(uint16_t));
    for (int64_t t = 0; t < M; t++)
        for (int64_t kb = 0; kb < KB; kb++)
            _mm512_i32scatter_epi32(xb + (kb * TB + t / 16) * 512 + (t % 16) * 2, rows,
                                    _mm512_loadu_si512(x + t * K + kb * 32), 4);
}

/* One thread's share: blocks of 32 output features, nb = tid, tid + nthreads, ... */
static void amxdot_part(const uint16_t *xb, int64_t M, int64_t TB, int64_t K, const uint16_t *w, int64_t N,
                        const uint16_t *bias, uint16_t *y, int tid, int nthreads) {
    const int64_t KB = K / 32, NB = (N + 31) / 32;
    float cbuf[16 * 16] __attribute__((aligned(64)));
    const __m512i column = dwords_of_rows();  /* element (i, t) of a stored C tile is cbuf[16 i + t] */
    configure();
    for (int64_t nb = tid; nb < NB; nb += nthreads) {
        const int64_t n0 = nb * 32;
        const int two = n0 + 16 < N;  /* a second tile of 16 features */
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int64_t kb = 0; kb < KB; kb++) {
            _tile_loadd(4, w + n0 * K + kb * 32, K * 2);
            if (two) _tile_loadd(5, w + (n0 + 16) * K + kb * 32, K * 2);
            _tile_loadd(6, xb + (kb * TB + 0) * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (two) _tile_dpbf16ps(1, 5, 6);
            if (TB > 1) {
                _tile_loadd(7, xb + (kb * TB + 1) * 512, 64);
                _tile_dpbf16ps(2, 4, 7);
                if (two) _tile_dpbf16ps(3, 5, 7);
            }
        }
        for (int j = 0; j < 2 * TB; j++) {  /* tile j: features n0 + 16 * (j % 2), tokens 16 * (j / 2) */
            const int64_t nf = n0 + 16 * (j % 2), t0 = 16 * (j / 2);
            if (nf >= N) continue;
            switch (j) {  /* tile numbers must be constants */
                case 0: _tile_stored(0, cbuf, 64); break;
                case 1: _tile_stored(1, cbuf, 64); break;
                case 2: _tile_stored(2, cbuf, 64); break;
                default: _tile_stored(3, cbuf, 64); break;
            }
            const __m512 b = bias ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(bias + nf))), 16))
                                  : _mm512_setzero_ps();
            for (int64_t t = t0; t < M && t < t0 + 16; t++) {  /* column t of the tile: 16 features */
                __m512 v = _mm512_i32gather_ps(_mm512_add_epi32(column, _mm512_set1_epi32((int)(t - t0))), cbuf, 4);
                if (bias) v = _mm512_add_ps(v, b);
                _mm256_storeu_si256((__m256i *)(y + t * N + nf), (__m256i)_mm512_cvtneps_pbh(v));
            }
        }
    }
    _tile_release();
}

/* y [M][N] = x [M][K] @ w [N][K].T (+ bias [N]), all bf16; N % 16 == 0, K % 32 == 0. Rows are taken 32 at a
 * time (each row's chain is the same in every call). Returns 0, or -1 when out of memory. */
int specwire_amxdot_bf16(const uint16_t *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                         const uint16_t *bias, uint16_t *y, int threads) {
    uint16_t *xb = aligned_alloc(64, (size_t)(K / 32) * 2 * 512 * sizeof(uint16_t));
    if (!xb) return -1;
    for (int64_t r0 = 0; r0 < M; r0 += 32) {
        const int64_t rows = M - r0 < 32 ? M - r0 : 32, TB = (rows + 15) / 16;
        layout_x(x + r0 * K, rows, K, TB, xb);
        _Pragma("omp parallel num_threads(threads)")
        amxdot_part(xb, rows, TB, K, w, N, bias, y + r0 * N, omp_get_thread_num(), omp_get_num_threads());
    }
    free(xb);
    return 0;
}

int specwire_amxdot_abi(void) { return 2; }
