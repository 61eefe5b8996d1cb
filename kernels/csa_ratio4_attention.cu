/*
 * Stages 6-7, ratio 4: one block per (batch, query, head) row.  Candidates
 * are the dense window followed by the shared top-k selection (read from
 * index head 0 of selected_indices); a -1 slot is invalid.  Scores, the
 * f32::max, the ascending glibc-expf denominator with the logit-only sink
 * and the per-dimension value sums follow the reference's order exactly.
 */
__device__ __forceinline__ float csa_r4_value(
    const float* current_kv, const unsigned char* compressed, long long dense_row, long long record_row,
    int dim, int d)
{
    if (dense_row >= 0) return current_kv[dense_row * dim + d];
    return csa_fp8_record_value(compressed + record_row * 583, d);
}

extern "C" __global__ void csa_ratio4_sink_attention(const float* query, const float* current_kv,
    const unsigned char* compressed, const int* selected, const float* sink, const float* bias,
    float* output, float* scores, int batch, int sequence, int heads, int dim,
    int current_kv_len, const long long* total_ptr, int compressed_capacity, int index_heads,
    int topk_width, int scratch_stride, int bias_present,
    int bias_b, int bias_h, int bias_s, int bias_k, float scale)
{
    const int row = (int)blockIdx.x;
    if (row >= batch * sequence * heads) return;
    const int head = row % heads;
    const int s = (row / heads) % sequence;
    const int b = row / (heads * sequence);
    const long long total = total_ptr[0];
    const long long first_position = total - (long long)sequence;
    const long long position = first_position + s;
    const long long kv_base = total - (long long)current_kv_len;
    const int dense = first_position == 0 ? min(current_kv_len, 128) : 128;
    const long long window = position + 1 - 128 > 0 ? position + 1 - 128 : 0;
    const long long dense_start = kv_base > window ? kv_base : window;
    const int* shared_selection = selected + ((long long)b * index_heads * sequence + s) * topk_width;
    const float* q = query + (long long)row * dim;
    float* slot_scores = scores + (long long)row * scratch_stride;

    __shared__ float shared_maximum;
    __shared__ float shared_denominator;
    if (threadIdx.x == 0u) {
        for (int c = 0; c < scratch_stride; ++c) slot_scores[c] = CSA_NEG_INF;
        float maximum = CSA_NEG_INF;
        for (int c = 0; c < dense + topk_width; ++c) {
            long long dense_row = -1;
            long long record_row = -1;
            if (c < dense) {
                const long long absolute = dense_start + c;
                if (absolute > position || absolute - kv_base >= current_kv_len) continue;
                dense_row = (long long)b * current_kv_len + (absolute - kv_base);
            } else {
                const int record = shared_selection[c - dense];
                if (record < 0 || record >= compressed_capacity) continue;
                record_row = (long long)b * compressed_capacity + record;
            }
            float dot = 0.0f;
            for (int i = 0; i < dim; ++i)
                dot = dot + q[i] * csa_r4_value(current_kv, compressed, dense_row, record_row, dim, i);
            float score = dot * scale;
            if (bias_present != 0) {
                const long long at = (((long long)(bias_b == 1 ? 0 : b) * bias_h + (bias_h == 1 ? 0 : head)) * bias_s
                    + (bias_s == 1 ? 0 : s)) * bias_k + (bias_k == 1 ? 0 : c);
                score = score + bias[at];
            }
            slot_scores[c] = score;
            maximum = fmaxf(score, maximum);
        }
        float denominator = 0.0f;
        if (maximum != CSA_NEG_INF) {
            for (int c = 0; c < dense + topk_width; ++c)
                if (slot_scores[c] != CSA_NEG_INF) denominator = denominator + csa_expf(slot_scores[c] - maximum);
            denominator = denominator + csa_expf(sink[head] - maximum);
        }
        shared_maximum = maximum;
        shared_denominator = denominator;
    }
    __syncthreads();  // thread 0 has published the softmax statistics

    const float maximum = shared_maximum;
    const float denominator = shared_denominator;
    for (int d = (int)threadIdx.x; d < dim; d += (int)blockDim.x) {
        float accumulated = 0.0f;
        if (maximum != CSA_NEG_INF) {
            for (int c = 0; c < dense + topk_width; ++c) {
                const float logit = slot_scores[c];
                if (logit == CSA_NEG_INF) continue;
                const long long dense_row = c < dense ? (long long)b * current_kv_len + (dense_start + c - kv_base) : -1;
                const long long record_row = c < dense ? -1 : (long long)b * compressed_capacity + shared_selection[c - dense];
                const float probability = csa_expf(logit - maximum) / denominator;
                accumulated = accumulated
                    + probability * csa_r4_value(current_kv, compressed, dense_row, record_row, dim, d);
            }
        }
        output[(long long)row * dim + d] = accumulated;
    }
}
