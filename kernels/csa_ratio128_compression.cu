/*
 * Stage 1, ratio 128: the prelude's compressor walk over a 128-slot carry.
 * Each block's pooled vector is finalized here: bf16 RMSNorm, compressed
 * RoPE of the last 64 dimensions at the block start, then the 583-byte
 * FP8/bf16 record, or for an f32 cache that record's logical (dequantized)
 * value, which is what the reference keeps.
 * The block's threads copy the past records (the seed launches one thread).
 */
__constant__ int csa_block_csa_ratio128_compress = 256;

extern "C" __global__ void csa_ratio128_compress(const float* kv, const float* gate,
    const float* ape, const float* norm, const float* past_carry, const unsigned char* past_cache,
    float* carry, unsigned char* cache, int batch, int sequence, int dim,
    int past_row_records, int cache_row_records, int cache_fp8, const long long* total_ptr)
{
    const int rope_dim = 64;
    const long long record_bytes = cache_fp8 ? 583 : 4LL * dim;
    auto finalize = [&](float* pooled, unsigned char* record, long long block_start) {
        csa_rms_normalize(pooled, norm, dim);
        csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);
        if (cache_fp8 != 0) {
            csa_store_fp8_record(pooled, dim, rope_dim, record);
            return;
        }
        unsigned char packed[583];
        csa_store_fp8_record(pooled, dim, rope_dim, packed);
        for (int d = 0; d < dim; ++d) ((float*)record)[d] = pooled[d];
    };
    csa_compress_row(kv, gate, ape, past_carry, past_cache, carry, cache, batch, sequence, dim, 128, record_bytes,
        past_row_records, cache_row_records, total_ptr, finalize);
}
