/*
 * Stages 3-5, ratio 4, one thread per (batch, query) row:
 *   3. finalize every index-query head (bf16, compressed RoPE at the query's
 *      absolute position, Hadamard, FP4 round trip) into `transformed`;
 *   4. score each causal record c < (pos+1)/4: the head sum (ascending) of
 *      relu(dot(q, key_c)) * w * (1/sqrt(index_dim)/sqrt(index_heads));
 *      non-causal entries are left to the caller's -inf fill;
 *   5. select the first topk_width records by descending score (total order
 *      of f32::total_cmp, lower record first on equal keys), -1 padded.
 */
__device__ __forceinline__ int csa_total_order_key(float x)
{
    const int bits = (int)__float_as_uint(x);
    return bits ^ (int)((unsigned int)(bits >> 31) >> 1);
}

extern "C" __global__ void csa_ratio4_index_select(const float* index_query,
    const float* index_weight, const unsigned char* index_key, float* transformed, float* scores,
    int* selected, int batch, int sequence, int index_heads, int index_dim, int rope_dim,
    int record_capacity, const long long* total_ptr,
    int topk_width)
{
    const int row = (int)blockIdx.x;
    if (row >= batch * sequence || threadIdx.x != 0) return;
    const int b = row / sequence;
    const int s = row % sequence;
    const long long position = *total_ptr - (long long)sequence + s;
    const long long causal = (position + 1) / 4;
    const int limit = causal < (long long)record_capacity ? (int)causal : record_capacity;

    float* queries = transformed + (long long)row * index_heads * index_dim;
    for (int h = 0; h < index_heads; ++h) {
        float* q = queries + (long long)h * index_dim;
        const float* source = index_query + ((long long)row * index_heads + h) * index_dim;
        for (int d = 0; d < index_dim; ++d) q[d] = csa_round_bf16(source[d]);
        csa_compressed_rope(q + index_dim - rope_dim, rope_dim, position);
        csa_hadamard_bf16(q, index_dim);
        for (int block = 0; 32 * block < index_dim; ++block) {
            unsigned char scale;
            unsigned char packed[16];
            float* values = q + 32 * block;
            quantize_fp4_e2m1_block(values, &scale, packed);
            const float block_scale = e8m0_scale(scale);
            for (int i = 0; i < 16; ++i) {
                values[2 * i] = decode_e2m1(packed[i]) * block_scale;
                values[2 * i + 1] = decode_e2m1((unsigned char)(packed[i] >> 4)) * block_scale;
            }
        }
    }

    const float weight_scale = 1.0f / sqrtf((float)index_dim) / sqrtf((float)index_heads);
    const float* weights = index_weight + (long long)row * index_heads;
    float* record_scores = scores + (long long)row * record_capacity;
    const int key_bytes = index_dim / 32 * 17;
    for (int record_id = 0; record_id < limit; ++record_id) {
        const unsigned char* key = index_key + ((long long)b * record_capacity + record_id) * key_bytes;
        float weighted = 0.0f;
        for (int h = 0; h < index_heads; ++h) {
            const float* q = queries + (long long)h * index_dim;
            float dot = 0.0f;
            for (int d = 0; d < index_dim; ++d) {
                const unsigned char* block = key + 17 * (d / 32);
                const unsigned char byte = block[1 + (d % 32) / 2];
                const unsigned char code = (d % 2) ? (unsigned char)(byte >> 4) : byte;
                dot = dot + csa_mul(q[d], decode_e2m1(code) * e8m0_scale(block[0]));
            }
            weighted = weighted + csa_mul(fmaxf(dot, 0.0f) * weights[h], weight_scale);
        }
        record_scores[record_id] = weighted;
    }

    int* row_selected = selected + (long long)row * topk_width;
    int previous = -1;
    int previous_key = 0;
    for (int rank = 0; rank < topk_width; ++rank) {
        int best = -1;
        int best_key = 0;
        for (int candidate = 0; candidate < limit; ++candidate) {
            const int key = csa_total_order_key(record_scores[candidate]);
            const int after_previous = previous < 0 || key < previous_key
                || (key == previous_key && candidate > previous);
            const int beats_best = best < 0 || key > best_key;
            if (after_previous && beats_best) {
                best = candidate;
                best_key = key;
            }
        }
        row_selected[rank] = best;
        if (best >= 0) {
            previous = best;
            previous_key = best_key;
        }
    }
}
