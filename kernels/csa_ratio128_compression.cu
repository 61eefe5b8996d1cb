/*
 * Stage 1, ratio 128: write each new position into its carry slot
 * (pos mod 128, score = gate + ape[slot]) and, at every block end, pool one
 * pooled per dimension over the 128 slots, finalize it (bf16, RMSNorm,
 * compressed RoPE at the block start, FP8 block-64 + bf16 tail) and clear the
 * carry.  One thread per batch row keeps the reference's sequential order.
 * The f32 cache holds the logical (dequantized) pooled.
 */
extern "C" __global__ void csa_ratio128_compress(const float* kv, const float* gate,
    const float* ape, const float* norm, const float* past_carry, const unsigned char* past_cache,
    float* carry, unsigned char* cache, int batch, int sequence, int dim,
    int past_row_records, int cache_row_records, int cache_fp8, const long long* total_ptr)
{
    const int b = (int)blockIdx.x;
    if (threadIdx.x != 0 || b >= batch) return;
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
    for (int token = 0; token < sequence; ++token) {
        const long long position = first_position + token;
        const int slot = (int)(position % ratio);
        const float* kv_row = kv + ((long long)b * sequence + token) * dim;
        const float* gate_row = gate + ((long long)b * sequence + token) * dim;
        for (int i = 0; i < dim; ++i) {
            state[slot * slot_stride + i] = kv_row[i];
            state[slot * slot_stride + dim + i] = gate_row[i] + ape[(long long)slot * dim + i];
        }
        if ((position + 1) % ratio != 0) continue;

        float pooled[512];
        for (int i = 0; i < dim; ++i)
            pooled[i] = csa_pool_dimension(state + dim + i, state + i, ratio, slot_stride);
        csa_rms_normalize(pooled, norm, dim);
        csa_compressed_rope(pooled + dim - rope_dim, rope_dim, position + 1 - ratio);
        unsigned char* out = records + (long long)written * record_bytes;
        if (cache_fp8 != 0) {
            csa_store_fp8_record(pooled, dim, rope_dim, out);
        } else {
            unsigned char scratch[583];
            csa_store_fp8_record(pooled, dim, rope_dim, scratch);
            float* logical = (float*)out;
            for (int d = 0; d < dim; ++d) logical[d] = pooled[d];
        }
        ++written;
        for (long long i = 0; i < carry_size; ++i) state[i] = (i / dim) % 2 ? CSA_NEG_INF : 0.0f;
    }
}
