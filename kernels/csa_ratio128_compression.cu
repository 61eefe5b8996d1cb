/*
 * Stage 1, ratio 128: write each new position into its carry slot
 * (pos mod 128, score = gate + ape[slot]) and, at every block end, pool one
 * record per dimension over the 128 slots, finalize it (bf16, RMSNorm,
 * compressed RoPE at the block start, FP8 block-64 + bf16 tail) and clear the
 * carry.  One thread per batch row keeps the reference's sequential order.
 * The f32 cache holds the logical (dequantized) record.
 */
extern "C" __global__ void csa_ratio128_compress(
    const float* kv, const float* gate, const float* ape, const float* norm,
    const float* past_carry, const unsigned char* past_cache,
    float* carry, unsigned char* cache,
    int batch, int sequence, int dim, int past_row_records, int cache_row_records, int cache_fp8,
    const long long* total_ptr)
{
    const int b = (int)blockIdx.x;
    if (b >= batch || threadIdx.x != 0) return;
    const int ratio = 128;
    const int rope_dim = 64;
    const long long first_position = *total_ptr - (long long)sequence;
    const int kept_records = (int)(first_position / ratio);
    const long long slot_stride = 2LL * dim;
    const long long carry_size = (long long)ratio * slot_stride;
    const long long record_bytes = cache_fp8 ? 583 : 4LL * dim;
    float* state = carry + (long long)b * carry_size;
    const float* past_state = past_carry + (long long)b * carry_size;
    unsigned char* records = cache + (long long)b * cache_row_records * record_bytes;
    const unsigned char* past_records = past_cache + (long long)b * past_row_records * record_bytes;

    for (long long i = 0; i < carry_size; ++i) state[i] = past_state[i];
    for (long long i = 0; i < (long long)kept_records * record_bytes; ++i) records[i] = past_records[i];
    if (first_position == 0)
        for (long long i = 0; i < carry_size; ++i) state[i] = (i / dim) % 2 ? CSA_NEG_INF : 0.0f;

    int written = kept_records;
    for (int s = 0; s < sequence; ++s) {
        const long long position = first_position + s;
        const int slot = (int)(position % ratio);
        const float* kv_row = kv + ((long long)b * sequence + s) * dim;
        const float* gate_row = gate + ((long long)b * sequence + s) * dim;
        for (int d = 0; d < dim; ++d) {
            state[slot * slot_stride + d] = kv_row[d];
            state[slot * slot_stride + dim + d] = gate_row[d] + ape[(long long)slot * dim + d];
        }
        if ((position + 1) % ratio != 0) continue;

        float record[512];
        for (int d = 0; d < dim; ++d)
            record[d] = csa_pool_dimension(state + dim + d, state + d, ratio, slot_stride);
        csa_rms_normalize(record, norm, dim);
        csa_compressed_rope(record + dim - rope_dim, rope_dim, position + 1 - ratio);
        unsigned char* out = records + (long long)written * record_bytes;
        if (cache_fp8) {
            csa_store_fp8_record(record, dim, rope_dim, out);
        } else {
            unsigned char scratch[583];
            csa_store_fp8_record(record, dim, rope_dim, scratch);
            float* logical = (float*)out;
            for (int d = 0; d < dim; ++d) logical[d] = record[d];
        }
        ++written;
        for (long long i = 0; i < carry_size; ++i) state[i] = (i / dim) % 2 ? CSA_NEG_INF : 0.0f;
    }
}
