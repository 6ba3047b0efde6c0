/* y = x @ W^T with W kept in GGUF's Q4_0 / Q4_1 / Q8_0 blocks (never dequantised to float).
 *
 * For decode (a few rows of x): the weights are read once per call, 4.5-8.5 bits a value,
 * instead of 16 (bfloat16) or 32. x is quantised per 32 values to int8 with one float scale
 * (ggml's Q8_0 for activations); each 32-value block product is an integer dot product
 * (AVX512-VNNI vpdpbusd: unsigned weight nibbles x signed activations) scaled once:
 *   Q4_1 (w = d*q + m):  d_w d_x sum(q x_q) + m_w d_x sum(x_q)
 *   Q4_0 (w = d*(q-8)):  d_w d_x (sum(q x_q) - 8 sum(x_q))
 *   Q8_0 (w = d*q):      d_w d_x sum(q x_q)     (|q| as unsigned, x_q with q's sign)
 * Layouts: W [N rows][K/32 blocks] of the type's records (GGUF order: rows along ne[1]); x, y
 * row-major [M, K] and [M, N], both float32 or both bfloat16 (`io_dtype` 0 / 1: the model's
 * own activations, so the caller converts nothing; y rounded to nearest even once). K a
 * multiple of 32. Parallel over output rows (N) where the matrix is big enough to pay for
 * waking a second thread (PARALLEL_MIN_BYTES).
 * A portable C path computes the same integer sums where AVX512-VNNI is absent (or with
 * -DNATIVE_PORTABLE).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q8_0 = 8 };
/* Q8_0 blocks against float activations (not quantised): int8 weight-only (models/quantization.py) */
enum { Q8_0_FLOAT_X = 108 };
/* Weight bytes ahead of the block being read to prefetch (0: none). One thread reading a matrix
 * from DRAM ran at ~40% of a plain read without it: the hardware prefetcher does not keep
 * enough lines in flight for a loop this slow per byte. 2-16 KiB measured alike (1.3-1.4x). */
#ifndef PF_DIST
#define PF_DIST 4096
#endif
#if PF_DIST > 0
#define PREFETCH_W(p) __builtin_prefetch((const char *)(p) + PF_DIST, 0, 3)
#else
#define PREFETCH_W(p) ((void)0)
#endif
#define QK 32
#define ROWS_PER_PASS 8
/* below this many weight bytes one thread does the whole matrix: waking the team costs more */
#define PARALLEL_MIN_BYTES (64 * 1024)
enum { IO_F32 = 0, IO_BF16 = 1 };

typedef struct { uint16_t d; uint8_t qs[16]; } __attribute__((packed)) block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[16]; } __attribute__((packed)) block_q4_1;
typedef struct { uint16_t d; int8_t qs[32]; } __attribute__((packed)) block_q8_0;

#if defined(__F16C__) && !defined(NATIVE_PORTABLE)
#include <immintrin.h>
/* one instruction (vcvtph2ps) instead of the branches below: per weight block, on the hot path */
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }
#else
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) v.u = sign | 0x7f800000 | (man << 13);
    else if (exp) v.u = sign | ((exp + 112) << 23) | (man << 13);
    else { v.f = (float)man * (1.0f / 16777216.0f); v.u |= sign; }
    return v.f;
}
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && !defined(NATIVE_PORTABLE)
#include <immintrin.h>
#define HAVE_VNNI 1
static inline __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m128i mask = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), mask), _mm_and_si128(v, mask));
}
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One weight block against 32 int8 activations: the 8 lanes of d_w * (integer partial sums)
 * (times the activations' scale, the caller's) and in *mw the block's offset factor. */
static inline __attribute__((always_inline)) __m256 block_dot(const uint8_t *blk, int type, const int8_t *xq,
                                                               float *mw) {
    float dw;
    __m256i wu, xv = _mm256_loadu_si256((const __m256i *)xq);
    if (type == GGML_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)blk;
        const __m256i w = _mm256_loadu_si256((const __m256i *)b->qs);
        dw = half_to_float(b->d);
        *mw = 0.f;
        wu = _mm256_sign_epi8(w, w);
        xv = _mm256_sign_epi8(xv, w);
    } else if (type == GGML_Q4_1) {
        const block_q4_1 *b = (const block_q4_1 *)blk;
        dw = half_to_float(b->d);
        *mw = half_to_float(b->m);
        wu = unpack_nibbles(b->qs);
    } else {
        const block_q4_0 *b = (const block_q4_0 *)blk;
        dw = half_to_float(b->d);
        *mw = -8.f * dw;
        wu = unpack_nibbles(b->qs);
    }
    return _mm256_mul_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, xv)), _mm256_set1_ps(dw));
}

/* Decode's one row of x against one weight row (a compile-time type once inlined): two
 * independent accumulator chains, since one FMA's latency per block would otherwise bound the
 * loop rather than memory. Adds into acc[0] / scalar[0]; returns the blocks done (all but an
 * odd last one). */
static inline __attribute__((always_inline)) int64_t one_row(const uint8_t *wrow, int type, int64_t bsz, int64_t nb,
                                                              const int8_t *xq, const float *xd, const float *xs,
                                                              __m256 *acc, float *scalar) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float scalar0 = 0.f, scalar1 = 0.f; /* locals: the caller's arrays could alias xd / xs */
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        float m_a, m_b;
        PREFETCH_W(wrow + b * bsz);
        acc0 = _mm256_fmadd_ps(block_dot(wrow + b * bsz, type, xq + b * QK, &m_a), _mm256_set1_ps(xd[b]), acc0);
        acc1 = _mm256_fmadd_ps(block_dot(wrow + (b + 1) * bsz, type, xq + (b + 1) * QK, &m_b), _mm256_set1_ps(xd[b + 1]), acc1);
        scalar0 += m_a * xs[b];
        scalar1 += m_b * xs[b + 1];
    }
    acc[0] = _mm256_add_ps(acc[0], _mm256_add_ps(acc0, acc1));
    scalar[0] += scalar0 + scalar1;
    return b;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && !defined(GGUF_NO_512)
#define HAVE_VNNI512 1
/* Batch 1 with 512-bit registers: two weight blocks per vpdpbusd (lanes 0-7 block b, 8-15 block
 * b+1, against the 64 contiguous activation bytes of both), their scales converted together
 * (Q4_1's d and m of both blocks in one vcvtph2ps) and spread to the two halves by one permute,
 * the offset terms summed in a vector. Per pair of blocks about half the instructions of two
 * 256-bit block_dot calls: at one thread the loop is instruction-bound, not memory-bound. */
static inline __attribute__((always_inline)) __m512i unpack_nibbles2(const uint8_t *qa, const uint8_t *qb) {
    /* [a lo nibbles, a hi nibbles, b lo, b hi]: each 16 qs bytes twice, the upper copy shifted */
    __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)qa));
    z = _mm512_mask_broadcast_i32x4(z, 0xff00, _mm_loadu_si128((const __m128i *)qb));
    z = _mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
}

static inline __attribute__((always_inline)) int64_t one_row512(const uint8_t *wrow, int type, int64_t bsz,
                                                                 int64_t nb, const int8_t *xq, const float *xd,
                                                                 const float *xs, __m256 *acc, float *scalar) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m128 off = _mm_setzero_ps(); /* Q4_1: lanes 1 and 3 gather m_w * xs; Q4_0 likewise (m = -8 d) */
    const __m512i halves = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    int64_t b = 0;
#define PAIR(ACC)                                                                                          \
    do {                                                                                                   \
        const uint8_t *ba = wrow + b * bsz, *bb = ba + bsz;                                                \
        PREFETCH_W(ba);                                                                                    \
        __m512i wu, xv = _mm512_loadu_si512((const void *)(xq + b * QK));                                  \
        __m128 sc; /* [d_a x_a, ., d_b x_b, .] */                                                          \
        const __m128 xds = _mm_unpacklo_ps(_mm_castpd_ps(_mm_load_sd((const double *)(xd + b))),           \
                                           _mm_castpd_ps(_mm_load_sd((const double *)(xs + b))));         \
        /* xds = [xd_a, xs_a, xd_b, xs_b] */                                                               \
        if (type == GGML_Q4_1) {                                                                           \
            uint32_t ha, hb;                                                                               \
            memcpy(&ha, ba, 4);                                                                            \
            memcpy(&hb, bb, 4);                                                                            \
            const __m128 dm = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)ha), (int)hb, 1));      \
            sc = _mm_mul_ps(dm, xds); /* [d_a xd_a, m_a xs_a, d_b xd_b, m_b xs_b] */                       \
            off = _mm_add_ps(off, sc);                                                                     \
            wu = unpack_nibbles2(((const block_q4_1 *)ba)->qs, ((const block_q4_1 *)bb)->qs);              \
        } else if (type == GGML_Q4_0) {                                                                    \
            uint16_t ha, hb;                                                                               \
            memcpy(&ha, ba, 2);                                                                            \
            memcpy(&hb, bb, 2);                                                                            \
            const uint32_t a2 = ha | (uint32_t)ha << 16, b2 = hb | (uint32_t)hb << 16;                    \
            const __m128 dd = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)a2), (int)b2, 1));     \
            sc = _mm_mul_ps(_mm_mul_ps(dd, xds), _mm_set_ps(-8.f, 1.f, -8.f, 1.f));                        \
            off = _mm_add_ps(off, sc);                                                                     \
            wu = unpack_nibbles2(((const block_q4_0 *)ba)->qs, ((const block_q4_0 *)bb)->qs);              \
        } else {                                                                                           \
            uint16_t ha, hb;                                                                               \
            memcpy(&ha, ba, 2);                                                                            \
            memcpy(&hb, bb, 2);                                                                            \
            const uint32_t a2 = ha | (uint32_t)ha << 16, b2 = hb | (uint32_t)hb << 16;                    \
            sc = _mm_mul_ps(_mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)a2), (int)b2, 1)), xds); \
            const __m512i w = _mm512_inserti64x4(                                                          \
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)((const block_q8_0 *)ba)->qs)), \
                _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)bb)->qs), 1);                     \
            wu = _mm512_abs_epi8(w);                                                                       \
            xv = _mm512_mask_sub_epi8(xv, _mm512_movepi8_mask(w), _mm512_setzero_si512(), xv);            \
        }                                                                                                  \
        const __m512 scale = _mm512_permutexvar_ps(halves, _mm512_castps128_ps512(sc));                    \
        ACC = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wu, xv)),   \
                              scale, ACC);                                                                 \
    } while (0)
    for (; b + 3 < nb; b += 4) {
        PAIR(acc0);
        b += 2;
        PAIR(acc1);
        b -= 2;
    }
    if (b + 1 < nb) {
        PAIR(acc0);
        b += 2;
    }
#undef PAIR
    const __m512 sum = _mm512_add_ps(acc0, acc1);
    acc[0] = _mm256_add_ps(acc[0], _mm256_add_ps(_mm512_castps512_ps256(sum), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum), 1))));
    if (type != GGML_Q8_0) {
        float o[4];
        _mm_storeu_ps(o, off);
        scalar[0] += o[1] + o[3];
    }
    return b;
}
#else
#define HAVE_VNNI512 0
#endif
#else
#define HAVE_VNNI 0
#define HAVE_VNNI512 0
#endif

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

static inline uint16_t float_to_bf16(float f) { /* round to nearest even, as torch's .to(bfloat16) */
    union { float f; uint32_t u; } v = {.f = f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays a quiet NaN */
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* x [M, K] (io_dtype) -> xq int8 [M, K], xd [M, K/32] scales, xs [M, K/32] = xd * sum of the block's xq */
static void quantize_rows(const void *x, int io_dtype, int64_t M, int64_t K, int8_t *xq, float *xd, float *xs) {
    float v[QK];
    for (int64_t i = 0; i < M * K / QK; i++) {
        if (io_dtype == IO_BF16)
            for (int j = 0; j < QK; j++) v[j] = bf16_to_float(((const uint16_t *)x)[i * QK + j]);
        else
            memcpy(v, (const float *)x + i * QK, sizeof v);
        float amax = 0.f;
        for (int j = 0; j < QK; j++) amax = fabsf(v[j]) > amax ? fabsf(v[j]) : amax;
        const float d = amax / 127.f, inv = d ? 1.f / d : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int q = (int)lrintf(v[j] * inv);
            xq[i * QK + j] = (int8_t)q;
            sum += q;
        }
        xd[i] = d;
        xs[i] = d * (float)sum;
    }
}

/* integer dot product of one weight block (values q, unsigned for Q4 types) with 32 int8 */
static inline int32_t dot_block_portable(const void *blk, int type, const int8_t *xq) {
    int32_t s = 0;
    if (type == GGML_Q8_0) {
        const block_q8_0 *b = blk;
        for (int j = 0; j < QK; j++) s += (int32_t)b->qs[j] * xq[j];
    } else {
        const uint8_t *qs = type == GGML_Q4_1 ? ((const block_q4_1 *)blk)->qs : ((const block_q4_0 *)blk)->qs;
        for (int j = 0; j < 16; j++) s += (int32_t)(qs[j] & 0x0f) * xq[j] + (int32_t)(qs[j] >> 4) * xq[j + 16];
    }
    return s;
}

static inline int64_t block_bytes(int type) {
    return type == GGML_Q4_0 ? (int64_t)sizeof(block_q4_0) : type == GGML_Q4_1 ? (int64_t)sizeof(block_q4_1)
                                                                               : (int64_t)sizeof(block_q8_0);
}

/* output row n of y (all M rows of x) */
static inline __attribute__((always_inline)) void output_row(const void *w, int64_t type, void *y, int64_t M,
                                                             int64_t N, int64_t K, int64_t io_dtype, int64_t nb,
                                                             int64_t bsz, int64_t row_bytes, const int8_t *xq,
                                                             const float *xd, const float *xs, int64_t n) {
    {
        const uint8_t *wrow = (const uint8_t *)w + n * row_bytes;
        for (int64_t m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
            const int64_t rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
            float scalar[ROWS_PER_PASS] = {0};
#if HAVE_VNNI
            __m256 acc[ROWS_PER_PASS];
            for (int64_t r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
#endif
            int64_t b = 0;
#if HAVE_VNNI
            if (rows == 1 && HAVE_VNNI512 && type == GGML_Q4_1) {
                /* Q4_1 only: Q8_0 measured as fast in 256 bits (0.93-0.99x), Q4_0 mixed (0.8-1.25x) */
#if HAVE_VNNI512
                b = one_row512(wrow, GGML_Q4_1, bsz, nb, xq + m0 * K, xd + m0 * nb, xs + m0 * nb, acc, scalar);
#endif
            } else if (rows == 1) {
                if (type == GGML_Q4_1) b = one_row(wrow, GGML_Q4_1, bsz, nb, xq + m0 * K, xd + m0 * nb, xs + m0 * nb, acc, scalar);
                else if (type == GGML_Q4_0) b = one_row(wrow, GGML_Q4_0, bsz, nb, xq + m0 * K, xd + m0 * nb, xs + m0 * nb, acc, scalar);
                else b = one_row(wrow, GGML_Q8_0, bsz, nb, xq + m0 * K, xd + m0 * nb, xs + m0 * nb, acc, scalar);
            }
#endif
            for (; b < nb; b++) {
                const void *blk = wrow + b * bsz;
                PREFETCH_W(blk);
                float dw, mw = 0.f;
                if (type == GGML_Q4_1) { dw = half_to_float(((const block_q4_1 *)blk)->d); mw = half_to_float(((const block_q4_1 *)blk)->m); }
                else if (type == GGML_Q4_0) { dw = half_to_float(((const block_q4_0 *)blk)->d); mw = -8.f * dw; }
                else dw = half_to_float(((const block_q8_0 *)blk)->d);
#if HAVE_VNNI
                __m256i wu, wsign = _mm256_setzero_si256();
                if (type == GGML_Q8_0) {
                    wsign = _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)blk)->qs);
                    wu = _mm256_sign_epi8(wsign, wsign);
                } else {
                    wu = unpack_nibbles(type == GGML_Q4_1 ? ((const block_q4_1 *)blk)->qs : ((const block_q4_0 *)blk)->qs);
                }
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t xi = (m0 + r) * nb + b;
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + xi * QK));
                    if (type == GGML_Q8_0) xv = _mm256_sign_epi8(xv, wsign);
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, xv)), _mm256_set1_ps(dw * xd[xi]), acc[r]);
                    scalar[r] += mw * xs[xi];
                }
#else
                for (int64_t r = 0; r < rows; r++) {
                    const int64_t xi = (m0 + r) * nb + b;
                    scalar[r] += dw * xd[xi] * (float)dot_block_portable(blk, (int)type, xq + xi * QK) + mw * xs[xi];
                }
#endif
            }
            for (int64_t r = 0; r < rows; r++) {
#if HAVE_VNNI
                const float value = hsum8(acc[r]) + scalar[r];
#else
                const float value = scalar[r];
#endif
                if (io_dtype == IO_BF16) ((uint16_t *)y)[(m0 + r) * N + n] = float_to_bf16(value);
                else ((float *)y)[(m0 + r) * N + n] = value;
            }
        }
    }
}

/* Output rows [n0, n1). The block type, the I/O dtype and (for decode's one token) M are passed
 * to the always-inline output_row as compile-time constants for every combination, so its block
 * addressing (b * block bytes), its branches on type and dtype and its row loop fold away: built
 * as a shared library (-fPIC, where nothing is inlined across the exported entry point), the
 * runtime-shaped loop read Q4_1 at 20 GB/s on one Zen 5 core, the specialised one at 30-31
 * (Q8_0: 27 -> 36), against a 41 GB/s plain read. */
static void output_rows(const void *w, int64_t type, void *y, int64_t M, int64_t N, int64_t K, int64_t io_dtype,
                        int64_t nb, int64_t row_bytes, const int8_t *xq, const float *xd, const float *xs,
                        int64_t n0, int64_t n1) {
#define SPECIALISE(TYPE_ID, BLOCK)                                                                          \
    if (type == TYPE_ID) {                                                                                 \
        const int64_t bsz = (int64_t)sizeof(BLOCK);                                                        \
        if (M == 1 && io_dtype == IO_BF16)                                                                 \
            for (int64_t n = n0; n < n1; n++) output_row(w, TYPE_ID, y, 1, N, K, IO_BF16, nb, bsz, row_bytes, xq, xd, xs, n); \
        else if (M == 1)                                                                                   \
            for (int64_t n = n0; n < n1; n++) output_row(w, TYPE_ID, y, 1, N, K, IO_F32, nb, bsz, row_bytes, xq, xd, xs, n); \
        else if (io_dtype == IO_BF16)                                                                      \
            for (int64_t n = n0; n < n1; n++) output_row(w, TYPE_ID, y, M, N, K, IO_BF16, nb, bsz, row_bytes, xq, xd, xs, n); \
        else                                                                                               \
            for (int64_t n = n0; n < n1; n++) output_row(w, TYPE_ID, y, M, N, K, IO_F32, nb, bsz, row_bytes, xq, xd, xs, n); \
        return;                                                                                            \
    }
    SPECIALISE(GGML_Q4_1, block_q4_1)
    SPECIALISE(GGML_Q4_0, block_q4_0)
    SPECIALISE(GGML_Q8_0, block_q8_0)
#undef SPECIALISE
}

/* Inside a parallel region: this thread's contiguous share [n0, n1) of N rows, as
 * schedule(static) would give it. */
static inline void thread_rows(int64_t N, int64_t *n0, int64_t *n1) {
#ifdef _OPENMP
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    const int64_t t = 0, nt = 1;
#endif
    const int64_t per = (N + nt - 1) / nt;
    *n0 = t * per < N ? t * per : N;
    *n1 = *n0 + per < N ? *n0 + per : N;
}

/* ---- Q8_0 weights, float activations: weight-only int8 ----
 * y[m, n] = sum_b d_w[n, b] * sum_j q[n, b, j] * x[m, 32 b + j] in float32: each int8 value
 * widened exactly, x as given (bfloat16 widened exactly), no activation quantisation, so the only
 * error is the weights' own. One weight block is widened once for all M rows. */
static void q8_float_rows(const uint8_t *w, const float *xf, void *y, int64_t M, int64_t N, int64_t K,
                          int64_t io_dtype, int64_t n0, int64_t n1) {
    const int64_t nb = K / QK, row_bytes = nb * (int64_t)sizeof(block_q8_0);
    for (int64_t n = n0; n < n1; n++) {
        const block_q8_0 *row = (const block_q8_0 *)(w + n * row_bytes);
        for (int64_t m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
            const int64_t rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
            float value[ROWS_PER_PASS];
#if defined(__AVX512F__) && !defined(NATIVE_PORTABLE)
            __m512 acc[ROWS_PER_PASS];
            for (int64_t r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                PREFETCH_W(row + b);
                const __m512 d = _mm512_set1_ps(half_to_float(row[b].d));
                const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)row[b].qs))), d);
                const __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row[b].qs + 16)))), d);
                for (int64_t r = 0; r < rows; r++) {
                    const float *xr = xf + (m0 + r) * K + b * QK;
                    acc[r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xr + 16), _mm512_fmadd_ps(w0, _mm512_loadu_ps(xr), acc[r]));
                }
            }
            for (int64_t r = 0; r < rows; r++) value[r] = _mm512_reduce_add_ps(acc[r]);
#else
            for (int64_t r = 0; r < rows; r++) {
                float sum = 0.f;
                for (int64_t b = 0; b < nb; b++) {
                    const float d = half_to_float(row[b].d);
                    const float *xr = xf + (m0 + r) * K + b * QK;
                    for (int j = 0; j < QK; j++) sum += ((float)row[b].qs[j] * d) * xr[j];
                }
                value[r] = sum;
            }
#endif
            for (int64_t r = 0; r < rows; r++) {
                if (io_dtype == IO_BF16) ((uint16_t *)y)[(m0 + r) * N + n] = float_to_bf16(value[r]);
                else ((float *)y)[(m0 + r) * N + n] = value[r];
            }
        }
    }
}

static int q8_float_matmul(const void *w, const void *x, void *y, int64_t M, int64_t N, int64_t K,
                           int64_t num_threads, int64_t io_dtype) {
    float *xf = malloc(sizeof(float) * (size_t)(M * K));
    if (!xf) return -1;
    for (int64_t i = 0; i < M * K; i++)
        xf[i] = io_dtype == IO_BF16 ? bf16_to_float(((const uint16_t *)x)[i]) : ((const float *)x)[i];
    const int64_t row_bytes = K / QK * (int64_t)sizeof(block_q8_0);
    if (num_threads > 1 && N * row_bytes >= PARALLEL_MIN_BYTES) {
#pragma omp parallel num_threads(num_threads)
        {
            int64_t n0, n1;
            thread_rows(N, &n0, &n1);
            if (M == 1 && io_dtype == IO_BF16) q8_float_rows(w, xf, y, 1, N, K, IO_BF16, n0, n1);
            else q8_float_rows(w, xf, y, M, N, K, io_dtype, n0, n1);
        }
    } else if (M == 1 && io_dtype == IO_BF16) {
        q8_float_rows(w, xf, y, 1, N, K, IO_BF16, 0, N);
    } else {
        q8_float_rows(w, xf, y, M, N, K, io_dtype, 0, N);
    }
    free(xf);
    return 0;
}

/* Returns 0, or -1 for an unsupported type, io_dtype or shape. */
int gguf_matmul(const void *w, int64_t type, const void *x, void *y, int64_t M, int64_t N, int64_t K,
                int64_t num_threads, int64_t io_dtype) {
    if (io_dtype != IO_F32 && io_dtype != IO_BF16) return -1;
    if (type == Q8_0_FLOAT_X && K % QK == 0 && M >= 1) return q8_float_matmul(w, x, y, M, N, K, num_threads, io_dtype);
    if ((type != GGML_Q4_0 && type != GGML_Q4_1 && type != GGML_Q8_0) || K % QK || M < 1) return -1;
    const int64_t nb = K / QK, bsz = block_bytes((int)type), row_bytes = nb * bsz;
    int8_t *xq = malloc((size_t)(M * K));
    float *xd = malloc(sizeof(float) * (size_t)(M * nb)), *xs = malloc(sizeof(float) * (size_t)(M * nb));
    if (!xq || !xd || !xs) { free(xq); free(xd); free(xs); return -1; }
    quantize_rows(x, (int)io_dtype, M, K, xq, xd, xs);
    if (num_threads > 1 && N * row_bytes >= PARALLEL_MIN_BYTES) {
#pragma omp parallel num_threads(num_threads)
        { /* contiguous shares of the rows, as schedule(static) */
            int64_t n0, n1;
            thread_rows(N, &n0, &n1);
            output_rows(w, type, y, M, N, K, io_dtype, nb, row_bytes, xq, xd, xs, n0, n1);
        }
    } else {
        /* no OpenMP region at all: one from inside decode_layers' thread team would be a nested
         * team of one, started and joined per call */
        output_rows(w, type, y, M, N, K, io_dtype, nb, row_bytes, xq, xd, xs, 0, N);
    }
    free(xq); free(xd); free(xs);
    return 0;
}
