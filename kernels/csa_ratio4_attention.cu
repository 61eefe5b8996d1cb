/*
 * Stages 6-7, ratio 4: one block of 256 threads per (batch, query, head)
 * row.  The candidates are the dense window, then the shared top-k selection
 * read from index head 0 of selected_indices (a -1 slot is invalid); the
 * prelude's sink attention scores them and accumulates the output.
 */
extern "C" __global__ void csa_ratio4_sink_attention(const float* query, const float* current_kv,
    const unsigned char* compressed, const int* selected, const float* sink, const float* bias,
    float* output, float* scores, int batch, int sequence, int heads, int dim,
    int current_kv_len, const long long* total_ptr, int compressed_capacity, int index_heads,
    int topk_width, int scratch_stride, int bias_present,
    int bias_b, int bias_h, int bias_s, int bias_k, float scale)
{
    if ((int)blockIdx.x >= batch * sequence * heads) return;
    const CsaAttention attention = {query, current_kv, compressed, sink, bias, output, scores, sequence, heads, dim,
        current_kv_len, total_ptr, compressed_capacity, scratch_stride, 1, bias_present, bias_b, bias_h,
        bias_s, bias_k, scale};
    const CsaAttentionRow r = csa_attention_row(attention, (int)blockIdx.x);
    const int* selection = selected + ((long long)r.b * index_heads * sequence + r.s) * topk_width;
    csa_sink_attention(attention, r, r.dense + topk_width, [&](int c, CsaCandidate* where) {
        if (c < r.dense) return csa_dense_candidate(attention, r, c, where);
        const int record = selection[c - r.dense];
        where->record_row = (long long)r.b * compressed_capacity + record;
        return record >= 0 && record < compressed_capacity;
    });
}
