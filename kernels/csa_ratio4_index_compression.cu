/*
 * Stage 2: the same 8-slot overlapped compressor on the index stream
 * (width `dim` = 128 per channel), finalized as an index pooled: bf16,
 * RMSNorm, compressed RoPE at the block start, Hadamard, then FP4 E2M1
 * block-32 (68 bytes: 4 x [E8M0 scale, 16 nibble pairs, low nibble first]).
 */
extern "C" __global__ void csa_ratio4_index_compress(const float* kv, const float* gate,
    const float* ape, const float* norm, const unsigned char* past_key, const float* past_carry,
    unsigned char* key, float* carry, int batch, int sequence, int dim, int rope_dim,
    int past_row_records, int key_row_records, const long long* total_ptr)
{
    const int b = (int)blockIdx.x;
    if (threadIdx.x != 0 || b >= batch) return;
    const int ratio = 4;
    const int record_bytes = 68;
    const long long first_position = *total_ptr - (long long)sequence;
    const int kept_records = (int)(first_position / ratio);
    const int width = 2 * dim;
    const long long slot_stride = 2LL * width;
    const long long carry_size = 2LL * ratio * slot_stride;
    float* state = carry + (long long)b * carry_size;
    const float* past_state = past_carry + (long long)b * carry_size;
    unsigned char* records = key + (long long)b * key_row_records * record_bytes;
    const unsigned char* past_records = past_key + (long long)b * past_row_records * record_bytes;

    for (long long i = 0; i < carry_size; ++i) state[i] = past_state[i];
    for (long long i = 0; i < (long long)kept_records * record_bytes; ++i) records[i] = past_records[i];
    if (first_position == 0)
        for (long long i = 0; i < carry_size; ++i) state[i] = (i / width) % 2 ? CSA_NEG_INF : 0.0f;

    int written = kept_records;
    for (int token = 0; token < sequence; ++token) {
        const long long position = first_position + token;
        const int phase = (int)(position % ratio);
        float* current = state + (ratio + phase) * slot_stride;
        const float* kv_row = kv + ((long long)b * sequence + token) * width;
        const float* gate_row = gate + ((long long)b * sequence + token) * width;
        for (int d = 0; d < width; ++d) {
            current[d] = kv_row[d];
            current[width + d] = gate_row[d] + ape[(long long)phase * width + d];
        }
        if ((position + 1) % ratio != 0) continue;

        float pooled[128];
        for (int i = 0; i < dim; ++i) {
            float scores[8];
            float values[8];
            for (int c = 0; c < 2 * ratio; ++c) {
                const long long at = c * slot_stride + (c < ratio ? i : dim + i);
                values[c] = state[at];
                scores[c] = state[at + width];
            }
            pooled[i] = csa_pool_dimension(scores, values, 2 * ratio, 1);
        }
        csa_rms_normalize(pooled, norm, dim);
        csa_compressed_rope(pooled + dim - rope_dim, rope_dim, position + 1 - ratio);
        csa_hadamard_bf16(pooled, dim);
        unsigned char* out = records + (long long)written * record_bytes;
        for (int block = 0; block < dim / 32; ++block)
            quantize_fp4_e2m1_block(pooled + 32 * block, out + 17 * block, out + 17 * block + 1);
        ++written;
        for (long long i = 0; i < ratio * slot_stride; ++i) {
            state[i] = state[ratio * slot_stride + i];
            state[ratio * slot_stride + i] = (i / width) % 2 ? CSA_NEG_INF : 0.0f;
        }
    }
}
