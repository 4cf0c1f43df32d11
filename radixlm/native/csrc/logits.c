/* What the sampler does to a step's logits in C: a grammar's packed token bitmask. */
#include "rlm.h"

/* Row b of logits (fp32, rows ld floats apart, vocab used) keeps token j where bit j % 32
 * of word j / 32 of mask row b (words int32 words a row) is set and becomes -inf elsewhere,
 * past the mask's 32 words tokens included: ref.apply_token_bitmask's contract, in place.
 * A grammar's mask is mostly whole words of zeros (a run of -inf) or of ones (untouched). */
void rlm_apply_bitmask(float *logits, int64_t ld, int rows, int64_t vocab,
                       const int32_t *mask, int64_t words) {
    const int64_t covered = vocab < 32 * words ? vocab : 32 * words;
    for (int b = 0; b < rows; b++) {
        float *l = logits + (int64_t)b * ld;
        const uint32_t *m = (const uint32_t *)mask + (int64_t)b * words;
        for (int64_t j0 = 0; j0 < covered; j0 += 32) {
            const uint32_t bits = m[j0 / 32];
            if (bits == 0xffffffffu) continue;
            const int n = covered - j0 < 32 ? (int)(covered - j0) : 32;
            for (int j = 0; j < n; j++)
                if (!(bits >> j & 1u)) l[j0 + j] = -INFINITY;
        }
        for (int64_t j = covered; j < vocab; j++) l[j] = -INFINITY;
    }
}
