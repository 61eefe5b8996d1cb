/*
 * Stages 6-7, ratio 128: one block per (batch, query, head) row.  Thread 0
 * assembles the candidates (dense window of absolute positions, then every
 * compressed record c < (pos+1)/128), scores them in order (ascending dot,
 * times scale, plus bias), takes f32::max and the ascending glibc-expf
 * denominator plus the logit-only sink; then each thread accumulates its
 * output dimensions over the candidates in order.  Invalid slots stay -inf.
 */
__device__ __forceinline__ float csa_r128_value(
    const float* current_kv, const unsigned char* compressed, int cache_fp8,
    long long dense_row, long long record_row, int dim, int d)
{
    if (dense_row >= 0) return current_kv[dense_row * dim + d];
    if (cache_fp8) return csa_fp8_record_value(compressed + record_row * 583, d);
    return ((const float*)compressed)[record_row * dim + d];
}

extern "C" __global__ void csa_ratio128_sink_attention(const float* query, const float* current_kv,
    const unsigned char* compressed, const float* sink, const float* bias, float* output,
    float* scores, int batch, int sequence, int heads, int dim, int current_kv_len,
    const long long* total_ptr, int compressed_capacity, int scratch_stride, int cache_fp8,
    int bias_present,
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
    const long long causal_records = (position + 1) / 128;
    const int records = causal_records < (long long)compressed_capacity ? (int)causal_records : compressed_capacity;
    const float* q = query + (long long)row * dim;
    float* slot_scores = scores + (long long)row * scratch_stride;

    __shared__ float shared_maximum;
    __shared__ float shared_denominator;
    if (threadIdx.x == 0u) {
        for (int c = 0; c < scratch_stride; ++c) slot_scores[c] = CSA_NEG_INF;
        float maximum = CSA_NEG_INF;
        for (int c = 0; c < dense + records; ++c) {
            long long dense_row = -1;
            long long record_row = (long long)b * compressed_capacity + (c - dense);
            if (c < dense) {
                const long long absolute = dense_start + c;
                if (absolute > position || absolute - kv_base >= current_kv_len) continue;
                dense_row = (long long)b * current_kv_len + (absolute - kv_base);
            }
            float dot = 0.0f;
            for (int i = 0; i < dim; ++i)
                dot = dot + q[i] * csa_r128_value(current_kv, compressed, cache_fp8, dense_row, record_row, dim, i);
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
            for (int c = 0; c < dense + records; ++c)
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
            for (int c = 0; c < dense + records; ++c) {
                const float logit = slot_scores[c];
                if (logit == CSA_NEG_INF) continue;
                const long long dense_row = c < dense ? (long long)b * current_kv_len + (dense_start + c - kv_base) : -1;
                const long long record_row = (long long)b * compressed_capacity + (c - dense);
                const float probability = csa_expf(logit - maximum) / denominator;
                accumulated = accumulated
                    + probability * csa_r128_value(current_kv, compressed, cache_fp8, dense_row, record_row, dim, d);
            }
        }
        output[(long long)row * dim + d] = accumulated;
    }
}
