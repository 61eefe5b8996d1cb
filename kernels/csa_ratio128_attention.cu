/*
 * Stages 6-7, ratio 128: one block of 256 threads per (batch, query, head)
 * row.  The candidates are the dense window, then every compressed record
 * c < (pos+1)/128 (the cache may hold records completed later in the step);
 * the prelude's sink attention scores them and accumulates the output.
 */
extern "C" __global__ void csa_ratio128_sink_attention(const float* query, const float* current_kv,
    const unsigned char* compressed, const float* sink, const float* bias, float* output,
    float* scores, int batch, int sequence, int heads, int dim, int current_kv_len,
    const long long* total_ptr, int compressed_capacity, int scratch_stride, int cache_fp8,
    int bias_present,
    int bias_b, int bias_h, int bias_s, int bias_k, float scale)
{
    if ((int)blockIdx.x >= batch * sequence * heads) return;
    const CsaAttention attention = {query, current_kv, compressed, sink, bias, output, scores, sequence, heads, dim,
        current_kv_len, total_ptr, compressed_capacity, scratch_stride, cache_fp8, bias_present, bias_b, bias_h,
        bias_s, bias_k, scale};
    const CsaAttentionRow r = csa_attention_row(attention, (int)blockIdx.x);
    const long long causal_records = (r.position + 1) / 128;
    const int records = causal_records < (long long)compressed_capacity ? (int)causal_records : compressed_capacity;
    csa_sink_attention(attention, r, r.dense + records, [&](int c, CsaCandidate* where) {
        if (c < r.dense) return csa_dense_candidate(attention, r, c, where);
        where->record_row = (long long)r.b * compressed_capacity + (c - r.dense);
        return true;
    });
}
