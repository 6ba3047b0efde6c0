/* Decode attention straight from the paged KV pool (one new query token per sequence).
 *
 * Reading K and V where they lie avoids the gather that the PyTorch path needs (which reads
 * the pool, writes a padded copy and reads that again). Built at run time by native.py with
 * -O3 -march=native -fopenmp; OpenMP here binds to the libgomp PyTorch already loaded.
 *
 * Layouts (row-major, float32):
 *   q, out       [B, nh, hd]
 *   k/v pools    [num_blocks, block_size, kvh, hd]
 *   block_tables [B, max_blocks] int64;  context_lens [B] int64
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void paged_decode_attention(const float *q, const float *k_pool, const float *v_pool,
                            const int64_t *block_tables, const int64_t *context_lens,
                            float *out, int64_t B, int64_t nh, int64_t kvh, int64_t hd,
                            int64_t block_size, int64_t max_blocks, float scale) {
    const int64_t group = nh / kvh;
    const int64_t token_stride = kvh * hd;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t b = 0; b < B; b++) {
        for (int64_t kh = 0; kh < kvh; kh++) {
            const int64_t len = context_lens[b];
            const int64_t *table = block_tables + b * max_blocks;
            float *scores = (float *)malloc(sizeof(float) * group * len);
            const float *qg = q + (b * nh + kh * group) * hd;
            for (int64_t t = 0; t < len; t++) {
                const float *k = k_pool + (table[t / block_size] * block_size + t % block_size) * token_stride + kh * hd;
                for (int64_t g = 0; g < group; g++) {
                    const float *qh = qg + g * hd;
                    float s = 0.f;
                    for (int64_t d = 0; d < hd; d++) s += qh[d] * k[d];
                    scores[g * len + t] = s * scale;
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float *sg = scores + g * len;
                float m = -INFINITY;
                for (int64_t t = 0; t < len; t++) m = sg[t] > m ? sg[t] : m;
                float sum = 0.f;
                for (int64_t t = 0; t < len; t++) { sg[t] = expf(sg[t] - m); sum += sg[t]; }
                const float inv = 1.f / sum;
                for (int64_t t = 0; t < len; t++) sg[t] *= inv;
            }
            float *og = out + (b * nh + kh * group) * hd;
            memset(og, 0, sizeof(float) * group * hd);
            for (int64_t t = 0; t < len; t++) {
                const float *v = v_pool + (table[t / block_size] * block_size + t % block_size) * token_stride + kh * hd;
                for (int64_t g = 0; g < group; g++) {
                    const float p = scores[g * len + t];
                    float *oh = og + g * hd;
                    for (int64_t d = 0; d < hd; d++) oh[d] += p * v[d];
                }
            }
            free(scores);
        }
    }
}
