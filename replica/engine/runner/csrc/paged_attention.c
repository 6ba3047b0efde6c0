/* Decode attention straight from the paged KV pool (one new query token per sequence).
 *
 * Reading K and V where they lie avoids the gather that the PyTorch path needs (which reads
 * the pool, writes a padded copy and reads that again). Built at run time by native.py with
 * -O3 -march=native -fopenmp; OpenMP here binds to the libgomp PyTorch already loaded, so
 * num_threads (the caller passes torch.get_num_threads(): OpenMP's own default is per calling
 * thread, and the engine steps on a thread of its own) share the (sequence, kv head) pairs.
 *
 * Layouts (row-major):
 *   q, out       [B, nh, hd] float32 (the caller converts; B * nh * hd values are few)
 *   k/v pools    [num_blocks, block_size, kvh, hd] in float32, bfloat16 or float16 (kv_dtype)
 *   block_tables [B, max_blocks] int64;  context_lens [B] int64
 *
 * Two implementations of the same arithmetic: an AVX-512 one (head dim a multiple of 16, when
 * the compiler targets AVX-512: 16-lane loads that widen bfloat16/float16, a vector exp, tokens in
 * chunks of 16) and a portable one the compiler vectorises as it can (any head dim, any CPU);
 * -DNATIVE_PORTABLE (native.load(portable=True)) builds the portable one alone, for its tests.
 *
 * Arithmetic: every K/V element is widened to float32 exactly (bfloat16 and float16 are subsets
 * of float32), dot products, softmax and the weighted sum run in float32. Softmax is computed
 * block by block with a running maximum (one rescale of the accumulator per block, not per
 * token), so K and V of a block are read once, one after the other, while both are in cache.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2 };

#define MAX_HD 256
#define MAX_GROUP 16
#define MAX_BS 256

static inline float bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

#if defined(__FLT16_MAX__)
static inline float f16_to_f32(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
#else
static inline float f16_to_f32(uint16_t h) { /* IEEE half -> float, subnormals included */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0x1f) v.u = sign | 0x7f800000 | (man << 13);
    else if (exp) v.u = sign | ((exp + 112) << 23) | (man << 13);
    else { v.f = (float)man * (1.0f / 16777216.0f); v.u |= sign; }
    return v.f;
}
#endif

/* n values of one pool row (any kv dtype) -> float32; the loops vectorise under -march=native */
static inline void widen(const void *pool, int64_t offset, int64_t n, int kv_dtype, float *dst) {
    if (kv_dtype == KV_F32) {
        memcpy(dst, (const float *)pool + offset, sizeof(float) * n);
    } else if (kv_dtype == KV_BF16) {
        const uint16_t *src = (const uint16_t *)pool + offset;
        for (int64_t d = 0; d < n; d++) dst[d] = bf16_to_f32(src[d]);
    } else {
        const uint16_t *src = (const uint16_t *)pool + offset;
        for (int64_t d = 0; d < n; d++) dst[d] = f16_to_f32(src[d]);
    }
}

#if defined(__AVX512F__) && !defined(NATIVE_PORTABLE)
#include <immintrin.h>
#define HAVE_AVX512 1

/* 16 pool values at `offset` (of a compile-time kv dtype once inlined) -> float32, exactly */
static inline __attribute__((always_inline)) __m512 load16(const void *pool, int64_t offset, int kv_dtype) {
    if (kv_dtype == KV_F32) return _mm512_loadu_ps((const float *)pool + offset);
    const __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + offset));
    if (kv_dtype == KV_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* exp on 16 lanes (Cephes' expf: range reduction by ln 2, degree-6 polynomial; within 2 ulp of
 * expf over the range softmax uses, x <= 0) */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* One (sequence, kv head) pair, hd a multiple of 16: tokens in chunks of up to 16 (never across
 * a block boundary), a chunk's scores one vector per query head, one rescale per chunk. */
static inline __attribute__((always_inline)) void attend_avx512(
        const float *qg, const void *k_pool, const void *v_pool, const int64_t *table, int64_t len,
        int64_t group, int64_t hd, int64_t kh, int64_t block_size, int64_t token_stride, float scale,
        float *og, int kv_dtype) {
    const int64_t nv = hd / 16;
    __m512 qv[MAX_GROUP][MAX_HD / 16], acc[MAX_GROUP][MAX_HD / 16];
    float m[MAX_GROUP], l[MAX_GROUP];
    float sc[MAX_GROUP][16] __attribute__((aligned(64)));
    for (int64_t g = 0; g < group; g++) {
        for (int64_t j = 0; j < nv; j++) {
            qv[g][j] = _mm512_mul_ps(_mm512_loadu_ps(qg + g * hd + 16 * j), _mm512_set1_ps(scale));
            acc[g][j] = _mm512_setzero_ps();
        }
        m[g] = 0.f;
        l[g] = 0.f;
    }
    for (int64_t start = 0; start < len;) {
        const int64_t in_block = start % block_size;
        int64_t n = block_size - in_block;
        if (n > 16) n = 16;
        if (n > len - start) n = len - start;
        const int64_t base = (table[start / block_size] * block_size + in_block) * token_stride + kh * hd;
        for (int64_t t = 0; t < n; t++) {
            const int64_t row = base + t * token_stride;
            for (int64_t g = 0; g < group; g++) {
                __m512 dot = _mm512_mul_ps(qv[g][0], load16(k_pool, row, kv_dtype));
                for (int64_t j = 1; j < nv; j++)
                    dot = _mm512_fmadd_ps(qv[g][j], load16(k_pool, row + 16 * j, kv_dtype), dot);
                sc[g][t] = _mm512_reduce_add_ps(dot);
            }
        }
        const __mmask16 valid = (__mmask16)((1u << n) - 1u);
        for (int64_t g = 0; g < group; g++) {
            const __m512 s = _mm512_maskz_loadu_ps(valid, sc[g]);
            float chunk_max = _mm512_mask_reduce_max_ps(valid, s);
            if (start && m[g] > chunk_max) chunk_max = m[g];
            const __m512 p = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(s, _mm512_set1_ps(chunk_max))));
            _mm512_store_ps(sc[g], p);
            if (start) {
                const float correction = expf(m[g] - chunk_max);
                l[g] *= correction;
                if (correction != 1.f)
                    for (int64_t j = 0; j < nv; j++) acc[g][j] = _mm512_mul_ps(acc[g][j], _mm512_set1_ps(correction));
            }
            l[g] += _mm512_reduce_add_ps(p);
            m[g] = chunk_max;
        }
        for (int64_t t = 0; t < n; t++) {
            const int64_t row = base + t * token_stride;
            for (int64_t j = 0; j < nv; j++) {
                const __m512 v = load16(v_pool, row + 16 * j, kv_dtype);
                for (int64_t g = 0; g < group; g++)
                    acc[g][j] = _mm512_fmadd_ps(_mm512_set1_ps(sc[g][t]), v, acc[g][j]);
            }
        }
        start += n;
    }
    for (int64_t g = 0; g < group; g++) {
        const __m512 inv = _mm512_set1_ps(l[g] > 0.f ? 1.f / l[g] : 0.f);
        for (int64_t j = 0; j < nv; j++) _mm512_storeu_ps(og + g * hd + 16 * j, _mm512_mul_ps(acc[g][j], inv));
    }
}

/* 32 pool values at `offset` -> two float32 vectors holding them exactly, in the order
 * `order32` names: bfloat16 splits even and odd elements (one 512-bit load, a shift and a mask:
 * no widening instruction), float32 and float16 take the two halves. Dot products and weighted
 * sums do not care about the order as long as q and the output use the same one. */
static inline __attribute__((always_inline)) void load32(const void *pool, int64_t offset, int kv_dtype,
                                                         __m512 *a, __m512 *b) {
    if (kv_dtype == KV_F32) {
        *a = _mm512_loadu_ps((const float *)pool + offset);
        *b = _mm512_loadu_ps((const float *)pool + offset + 16);
    } else if (kv_dtype == KV_F16) {
        *a = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + offset)));
        *b = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)pool + offset + 16)));
    } else {
        const __m512i x = _mm512_loadu_si512((const void *)((const uint16_t *)pool + offset));
        *a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));                               /* 0, 2, ... 30 */
        *b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xFFFF0000u))); /* 1, 3, ... 31 */
    }
}

#ifndef ATT_K_ONCE
#define ATT_K_ONCE 1
#endif

/* Prefetch n rows of hd values, `stride` values apart, into the cache (every 64-byte line). */
static inline __attribute__((always_inline)) void prefetch_rows(const void *pool, int64_t offset, int64_t n,
                                                                int64_t stride, int64_t hd, int kv_dtype) {
    const int64_t esize = kv_dtype == KV_F32 ? 4 : 2;
    const char *p = (const char *)pool + offset * esize;
    for (int64_t t = 0; t < n; t++)
        for (int64_t byte = 0; byte < hd * esize; byte += 64) _mm_prefetch(p + t * stride * esize + byte, _MM_HINT_T0);
}


/* The chunk that starts at token `start` of a sequence of `len`: up to 16 tokens, never across a
 * block boundary; *base is its first row's offset (KV head kh) in the pool. Returns its length. */
static inline __attribute__((always_inline)) int64_t chunk_at(int64_t start, int64_t len, const int64_t *table,
                                                               int64_t block_size, int64_t token_stride, int64_t kh,
                                                               int64_t hd, int64_t *base) {
    const int64_t in_block = start % block_size;
    int64_t n = block_size - in_block;
    if (n > 16) n = 16;
    if (n > len - start) n = len - start;
    *base = (table[start / block_size] * block_size + in_block) * token_stride + kh * hd;
    return n;
}

/* The next chunk's K and V rows on their way while this one computes. */
static inline __attribute__((always_inline)) void prefetch_next_chunk(
        const void *k_pool, const void *v_pool, int64_t next, int64_t len, const int64_t *table,
        int64_t block_size, int64_t token_stride, int64_t kh, int64_t hd, int kv_dtype) {
    if (next >= len) return;
    int64_t nbase;
    const int64_t nn = chunk_at(next, len, table, block_size, token_stride, kh, hd, &nbase);
    prefetch_rows(k_pool, nbase, nn, token_stride, hd, kv_dtype);
    prefetch_rows(v_pool, nbase, nn, token_stride, hd, kv_dtype);
}

/* One query head's online softmax over a chunk's scores s (lanes past `valid` ignored): the
 * chunk's weights exp(s - max) (zero past valid), the running max *m and sum *l updated and the
 * head's nacc accumulators rescaled when the max moved. */
static inline __attribute__((always_inline)) __m512 softmax_chunk(__m512 s, __mmask16 valid, int first, float *m,
                                                                  float *l, __m512 *acc, int64_t nacc) {
    float chunk_max = _mm512_mask_reduce_max_ps(valid, s);
    if (!first && *m > chunk_max) chunk_max = *m;
    const __m512 e = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(s, _mm512_set1_ps(chunk_max))));
    if (!first) {
        const float correction = expf(*m - chunk_max);
        *l *= correction;
        if (correction != 1.f)
            for (int64_t j = 0; j < nacc; j++) acc[j] = _mm512_mul_ps(acc[j], _mm512_set1_ps(correction));
    }
    *l += _mm512_reduce_add_ps(e);
    *m = chunk_max;
    return e;
}

/* How the accumulators hold a head's dims: lane `lane` of vector 2p + half is dim 32p + ...
 *   ORDER_HALVES: 16 half + lane (float32 / float16 through load32),
 *   ORDER_EVEN_ODD: 2 lane + half (bfloat16 through load32),
 *   ORDER_UNPACK: 8 (lane / 4) + 4 half + lane % 4 (vpunpck{l,h}wd of two V rows). */
enum { ORDER_HALVES = 0, ORDER_EVEN_ODD = 1, ORDER_UNPACK = 2 };

static inline int order32_of(int kv_dtype) { return kv_dtype == KV_BF16 ? ORDER_EVEN_ODD : ORDER_HALVES; }

static inline __attribute__((always_inline)) int dim_of(int order, int half, int lane) {
    return order == ORDER_UNPACK ? 8 * (lane / 4) + 4 * half + lane % 4
         : order == ORDER_EVEN_ODD ? 2 * lane + half : 16 * half + lane;
}

/* The group's outputs in dim order, each head's accumulators divided by its softmax sum. */
static inline __attribute__((always_inline)) void store_heads(__m512 acc[][MAX_HD / 16], const float *l,
                                                              int64_t group, int64_t np, int64_t hd, float *og,
                                                              int order) {
    for (int64_t g = 0; g < group; g++) {
        float tmp[MAX_HD] __attribute__((aligned(64)));
        for (int64_t j = 0; j < 2 * np; j++) _mm512_store_ps(tmp + 16 * j, acc[g][j]);
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        for (int64_t p = 0; p < np; p++)
            for (int half = 0; half < 2; half++)
                for (int lane = 0; lane < 16; lane++)
                    og[g * hd + 32 * p + dim_of(order, half, lane)] = tmp[32 * p + 16 * half + lane] * inv;
    }
}

/* 16 vectors -> one vector whose lane t is the sum of v[t]'s lanes (a transposing add tree:
 * 15 adds and 30 shuffles for all 16 sums instead of 16 serial horizontal reductions). */
static inline __attribute__((always_inline)) __m512 sum16x16(const __m512 *v) {
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < 8; i++)  /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
        w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)  /* per 128-bit lane: tokens 4i .. 4i+3, that lane's part */
        x[i] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(w[2 * i], w[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++)  /* lanes: [8i..8i+3 (L0+L1), (L2+L3), 8i+4..8i+7 (L0+L1), (L2+L3)] */
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* One (sequence, kv head) pair, hd a multiple of 32: as attend_avx512, but K/V rows come in 32
 * at a time through load32 (q and the accumulator live in its order), and a chunk's 16 scores
 * of one query head come out of one sum16x16. */
static inline __attribute__((always_inline)) void attend32_avx512(
        const float *qg, const void *k_pool, const void *v_pool, const int64_t *table, int64_t len,
        int64_t group, int64_t hd, int64_t kh, int64_t block_size, int64_t token_stride, float scale,
        float *og, int kv_dtype) {
    const int64_t np = hd / 32;
    float qp[MAX_GROUP][MAX_HD] __attribute__((aligned(64)));
    float sc[MAX_GROUP][16] __attribute__((aligned(64)));
    __m512 acc[MAX_GROUP][MAX_HD / 16];
    float m[MAX_GROUP], l[MAX_GROUP];
    for (int64_t g = 0; g < group; g++) {
        for (int64_t p = 0; p < np; p++)
            for (int half = 0; half < 2; half++)
                for (int lane = 0; lane < 16; lane++)
                    qp[g][32 * p + 16 * half + lane] = qg[g * hd + 32 * p + dim_of(order32_of(kv_dtype), half, lane)] * scale;
        for (int64_t j = 0; j < 2 * np; j++) acc[g][j] = _mm512_setzero_ps();
        m[g] = 0.f;
        l[g] = 0.f;
    }
    for (int64_t start = 0; start < len;) {
        int64_t base;
        const int64_t n = chunk_at(start, len, table, block_size, token_stride, kh, hd, &base);
        const __mmask16 valid = (__mmask16)((1u << n) - 1u);
        prefetch_next_chunk(k_pool, v_pool, start + n, len, table, block_size, token_stride, kh, hd, kv_dtype);
#if ATT_K_ONCE
        /* each K row loaded (and widened) once for all the group's query heads */
        __m512 dd[MAX_GROUP][16];
        for (int64_t t = 0; t < n; t++) {
            const int64_t row = base + t * token_stride;
            __m512 dot[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) dot[g] = _mm512_setzero_ps();
            for (int64_t p = 0; p < np; p++) {
                __m512 a, b;
                load32(k_pool, row + 32 * p, kv_dtype, &a, &b);
                for (int64_t g = 0; g < group; g++) {
                    dot[g] = _mm512_fmadd_ps(_mm512_load_ps(qp[g] + 32 * p), a, dot[g]);
                    dot[g] = _mm512_fmadd_ps(_mm512_load_ps(qp[g] + 32 * p + 16), b, dot[g]);
                }
            }
            for (int64_t g = 0; g < group; g++) dd[g][t] = dot[g];
        }
#endif
        for (int64_t g = 0; g < group; g++) {
#if ATT_K_ONCE
            __m512 *d = dd[g];
#else
            __m512 d[16];
            for (int64_t t = 0; t < n; t++) {
                const int64_t row = base + t * token_stride;
                __m512 a, b, dot = _mm512_setzero_ps();
                for (int64_t p = 0; p < np; p++) {
                    load32(k_pool, row + 32 * p, kv_dtype, &a, &b);
                    dot = _mm512_fmadd_ps(_mm512_load_ps(qp[g] + 32 * p), a, dot);
                    dot = _mm512_fmadd_ps(_mm512_load_ps(qp[g] + 32 * p + 16), b, dot);
                }
                d[t] = dot;
            }
#endif
            for (int64_t t = n; t < 16; t++) d[t] = _mm512_setzero_ps();
            _mm512_store_ps(sc[g], softmax_chunk(sum16x16(d), valid, start == 0, &m[g], &l[g], acc[g], 2 * np));
        }
        for (int64_t t = 0; t < n; t++) {
            const int64_t row = base + t * token_stride;
            for (int64_t p = 0; p < np; p++) {
                __m512 a, b;
                load32(v_pool, row + 32 * p, kv_dtype, &a, &b);
                for (int64_t g = 0; g < group; g++) {
                    const __m512 w = _mm512_set1_ps(sc[g][t]);
                    acc[g][2 * p] = _mm512_fmadd_ps(w, a, acc[g][2 * p]);
                    acc[g][2 * p + 1] = _mm512_fmadd_ps(w, b, acc[g][2 * p + 1]);
                }
            }
        }
        start += n;
    }
    store_heads(acc, l, group, np, hd, og, order32_of(kv_dtype));
}

#if defined(__AVX512BF16__)
#define HAVE_BF16DP 1
/* bfloat16 pools, queries that are bfloat16 values (the engine's own: its q comes out of a
 * bfloat16 product and RoPE), hd a multiple of 32: the products in AVX512-BF16's vdpbf16ps,
 * which multiplies bfloat16 pairs exactly and adds them in float32, with no widening at all.
 *   q . k: one vdpbf16ps per 32 values of a K row and query head (the 16 lanes' pair sums then
 *     go through sum16x16 as before), times the scale after the sum;
 *   p . V: two tokens at a time, their V rows interleaved value by value (vpunpck{l,h}wd) and
 *     multiplied by the pair (p_t, p_t+1) rounded to bfloat16, as PyTorch's own CPU attention
 *     rounds its probabilities before the product with V (FlashAttentionKernel.cpp); the
 *     running sums, the softmax and the rescaling stay float32.
 * The accumulators hold dims in unpack order: lane 4j + k of acc[2p] is dim 32p + 8j + k, of
 * acc[2p + 1] dim 32p + 8j + 4 + k. */
static inline __attribute__((always_inline)) void attend_bf16dp(
        const float *qg, const void *k_pool, const void *v_pool, const int64_t *table, int64_t len,
        int64_t group, int64_t hd, int64_t kh, int64_t block_size, int64_t token_stride, float scale,
        float *og) {
    const int64_t np = hd / 32;
    const uint16_t *kp = (const uint16_t *)k_pool, *vp = (const uint16_t *)v_pool;
    __m512bh qb[MAX_GROUP][MAX_HD / 32];
    __m512 acc[MAX_GROUP][MAX_HD / 16];
    float m[MAX_GROUP], l[MAX_GROUP];
    uint32_t pair[MAX_GROUP][8] __attribute__((aligned(64))); /* p of tokens 2i, 2i+1 as bf16 */
    for (int64_t g = 0; g < group; g++) {
        for (int64_t p = 0; p < np; p++) /* exact: every q value is a bfloat16 (the caller checked) */
            qb[g][p] = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(qg + g * hd + 32 * p + 16), _mm512_loadu_ps(qg + g * hd + 32 * p));
        for (int64_t j = 0; j < 2 * np; j++) acc[g][j] = _mm512_setzero_ps();
        m[g] = 0.f;
        l[g] = 0.f;
    }
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t start = 0; start < len;) {
        int64_t base;
        const int64_t n = chunk_at(start, len, table, block_size, token_stride, kh, hd, &base);
        const __mmask16 valid = (__mmask16)((1u << n) - 1u);
        prefetch_next_chunk(k_pool, v_pool, start + n, len, table, block_size, token_stride, kh, hd, KV_BF16);
        __m512 dd[MAX_GROUP][16];
        for (int64_t t = 0; t < n; t++) {
            const uint16_t *row = kp + base + t * token_stride;
            __m512 dot[MAX_GROUP];
            for (int64_t g = 0; g < group; g++) dot[g] = _mm512_setzero_ps();
            for (int64_t p = 0; p < np; p++) {
                const __m512bh k = (__m512bh)_mm512_loadu_si512((const void *)(row + 32 * p));
                for (int64_t g = 0; g < group; g++) dot[g] = _mm512_dpbf16_ps(dot[g], qb[g][p], k);
            }
            for (int64_t g = 0; g < group; g++) dd[g][t] = dot[g];
        }
        for (int64_t g = 0; g < group; g++) {
            __m512 *d = dd[g];
            for (int64_t t = n; t < 16; t++) d[t] = _mm512_setzero_ps();
            const __m512 e = softmax_chunk(_mm512_mul_ps(sum16x16(d), vscale), valid, start == 0, &m[g], &l[g], acc[g],
                                           2 * np);
            _mm256_store_si256((__m256i *)pair[g], (__m256i)_mm512_cvtneps_pbh(e)); /* zero past n */
        }
        for (int64_t t = 0; t < n; t += 2) {
            const uint16_t *ra = vp + base + t * token_stride, *rb = ra + token_stride;
            const int have_b = t + 1 < n; /* an odd last token pairs with zeros (its p pair's upper half is 0 too) */
            for (int64_t p = 0; p < np; p++) {
                const __m512i a = _mm512_loadu_si512((const void *)(ra + 32 * p));
                const __m512i b = have_b ? _mm512_loadu_si512((const void *)(rb + 32 * p)) : _mm512_setzero_si512();
                const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b), hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
                for (int64_t g = 0; g < group; g++) {
                    const __m512bh w = (__m512bh)_mm512_set1_epi32((int)pair[g][t / 2]);
                    acc[g][2 * p] = _mm512_dpbf16_ps(acc[g][2 * p], lo, w);
                    acc[g][2 * p + 1] = _mm512_dpbf16_ps(acc[g][2 * p + 1], hi, w);
                }
            }
        }
        start += n;
    }
    store_heads(acc, l, group, np, hd, og, ORDER_UNPACK);
}

#else
#define HAVE_BF16DP 0
#endif
#else
#define HAVE_AVX512 0
#endif

/* 1 (default): bfloat16 pools with bfloat16 queries go through attend_bf16dp where the CPU has
 * AVX512-BF16; 0: through the widening float32 path (benchmarks.attention_kernel compares). */
#ifndef HAVE_BF16DP
#define HAVE_BF16DP 0
#endif

/* every query value a bfloat16 (low 16 bits zero): vdpbf16ps then multiplies exactly what the
 * float32 path would */
static int queries_are_bf16(const float *q, int64_t n) {
    uint32_t low = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, q + i, 4);
        low |= u & 0xFFFFu;
    }
    return low == 0;
}
static int bf16_dot = 1;
void paged_attention_set_bf16_dot(int64_t on) { bf16_dot = on != 0; }
int64_t paged_attention_has_bf16_dot(void) { return HAVE_BF16DP; }

/* one (sequence b, KV head kh) task: the group of query heads sharing that KV head */
static void attend_task(
    const float *q, const void *k_pool, const void *v_pool, const int64_t *block_tables, const int64_t *context_lens,
    float *out, int64_t nh, int64_t hd, int64_t block_size, int64_t max_blocks, float scale, int64_t kv_dtype,
    int64_t group, int64_t token_stride, int64_t b, int64_t kh, int use_bf16_dot) {
    {
#if HAVE_AVX512
    if (hd % 32 == 0) {
        const float *qa = q + (b * nh + kh * group) * hd;
        float *oa = out + (b * nh + kh * group) * hd;
        const int64_t *ta = block_tables + b * max_blocks;
#if HAVE_BF16DP
        if (use_bf16_dot) {
            if (hd == 64 && group == 3) attend_bf16dp(qa, k_pool, v_pool, ta, context_lens[b], 3, 64, kh, block_size, token_stride, scale, oa);
            else attend_bf16dp(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa);
            return;
        }
#endif
        if (kv_dtype == KV_BF16 && (hd == 64 || hd == 128) && group <= 8) {
            /* the common shapes with compile-time group and head dim: the accumulators
             * stay in registers (1.2-1.3x over the runtime-shaped loop) */
#define ATTEND_BF16(G, HD) attend32_avx512(qa, k_pool, v_pool, ta, context_lens[b], G, HD, kh, block_size, token_stride, scale, oa, KV_BF16)
#define ATTEND_BF16_G(G) if (hd == 64) ATTEND_BF16(G, 64); else ATTEND_BF16(G, 128)
            switch (group) {
                case 1: ATTEND_BF16_G(1); break;
                case 2: ATTEND_BF16_G(2); break;
                case 3: ATTEND_BF16_G(3); break;
                case 4: ATTEND_BF16_G(4); break;
                case 5: ATTEND_BF16_G(5); break;
                case 6: ATTEND_BF16_G(6); break;
                case 7: ATTEND_BF16_G(7); break;
                default: ATTEND_BF16_G(8); break;
            }
#undef ATTEND_BF16_G
#undef ATTEND_BF16
        } else if (kv_dtype == KV_BF16)
            attend32_avx512(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa, KV_BF16);
        else if (kv_dtype == KV_F16)
            attend32_avx512(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa, KV_F16);
        else
            attend32_avx512(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa, KV_F32);
        return;
    }
    if (hd % 16 == 0) {
        const float *qa = q + (b * nh + kh * group) * hd;
        float *oa = out + (b * nh + kh * group) * hd;
        const int64_t *ta = block_tables + b * max_blocks;
        if (kv_dtype == KV_BF16)
            attend_avx512(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa, KV_BF16);
        else if (kv_dtype == KV_F16)
            attend_avx512(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa, KV_F16);
        else
            attend_avx512(qa, k_pool, v_pool, ta, context_lens[b], group, hd, kh, block_size, token_stride, scale, oa, KV_F32);
        return;
    }
#endif
    float kf[MAX_HD], vf[MAX_HD];
    float scores[MAX_GROUP][MAX_BS];
    float acc[MAX_GROUP][MAX_HD];
    float m[MAX_GROUP], l[MAX_GROUP];
    const int64_t len = context_lens[b];
    const int64_t *table = block_tables + b * max_blocks;
    const float *qg = q + (b * nh + kh * group) * hd;
    for (int64_t g = 0; g < group; g++) {
        m[g] = 0.f; /* unused until the first block sets it */
        l[g] = 0.f;
        memset(acc[g], 0, sizeof(float) * hd);
    }
    for (int64_t start = 0; start < len; start += block_size) {
        const int64_t n = len - start < block_size ? len - start : block_size;
        const int64_t base = table[start / block_size] * block_size * token_stride + kh * hd;
        for (int64_t t = 0; t < n; t++) {
            widen(k_pool, base + t * token_stride, hd, (int)kv_dtype, kf);
            for (int64_t g = 0; g < group; g++) {
                const float *qh = qg + g * hd;
                float s = 0.f;
                for (int64_t d = 0; d < hd; d++) s += qh[d] * kf[d];
                scores[g][t] = s * scale;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            float block_max = start ? m[g] : scores[g][0];
            for (int64_t t = 0; t < n; t++) block_max = scores[g][t] > block_max ? scores[g][t] : block_max;
            const float correction = start ? expf(m[g] - block_max) : 0.f;
            float sum = 0.f;
            for (int64_t t = 0; t < n; t++) {
                scores[g][t] = expf(scores[g][t] - block_max);
                sum += scores[g][t];
            }
            l[g] = l[g] * correction + sum;
            m[g] = block_max;
            if (correction != 1.f)
                for (int64_t d = 0; d < hd; d++) acc[g][d] *= correction;
        }
        for (int64_t t = 0; t < n; t++) {
            widen(v_pool, base + t * token_stride, hd, (int)kv_dtype, vf);
            for (int64_t g = 0; g < group; g++) {
                const float p = scores[g][t];
                float *a = acc[g];
                for (int64_t d = 0; d < hd; d++) a[d] += p * vf[d];
            }
        }
    }
    float *og = out + (b * nh + kh * group) * hd;
    for (int64_t g = 0; g < group; g++) {
        const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
        for (int64_t d = 0; d < hd; d++) og[g * hd + d] = acc[g][d] * inv;
    }
}
}

/* Returns 0, or -1 when a dimension exceeds the stack buffers (the caller then uses PyTorch). */
int paged_decode_attention(const float *q, const void *k_pool, const void *v_pool,
                           const int64_t *block_tables, const int64_t *context_lens,
                           float *out, int64_t B, int64_t nh, int64_t kvh, int64_t hd,
                           int64_t block_size, int64_t max_blocks, float scale, int64_t kv_dtype,
                           int64_t num_threads) {
    const int64_t group = nh / kvh;
    if (hd > MAX_HD || group > MAX_GROUP || block_size > MAX_BS || group * kvh != nh) return -1;
    const int64_t token_stride = kvh * hd;
    /* the vdpbf16ps path for the whole call, or none of it: checked once, not per task */
    const int use_bf16_dot = HAVE_BF16DP && bf16_dot && kv_dtype == KV_BF16 && hd % 32 == 0 &&
                             queries_are_bf16(q, B * nh * hd);
    if (num_threads > 1) {
#pragma omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads)
        for (int64_t b = 0; b < B; b++)
            for (int64_t kh = 0; kh < kvh; kh++)
                attend_task(q, k_pool, v_pool, block_tables, context_lens, out, nh, hd, block_size, max_blocks,
                            scale, kv_dtype, group, token_stride, b, kh, use_bf16_dot);
    } else { /* no OpenMP region (e.g. called from inside decode_layers' thread team) */
        for (int64_t b = 0; b < B; b++)
            for (int64_t kh = 0; kh < kvh; kh++)
                attend_task(q, k_pool, v_pool, block_tables, context_lens, out, nh, hd, block_size, max_blocks,
                            scale, kv_dtype, group, token_stride, b, kh, use_bf16_dot);
    }
    return 0;
}
