/*
 * Stage 1, ratio 4: the prelude's compressor walk over the 8-slot overlap
 * carry.  Each block's pooled vector becomes a 583-byte record: bf16
 * RMSNorm, compressed RoPE of the last `rope_dim` dimensions at the block
 * start, FP8 E4M3 block-64 for the first 448 dimensions and a bf16 tail.
 * The block's threads copy the past records (the seed launches one thread).
 */
__constant__ int csa_block_csa_ratio4_main_compress = 256;

extern "C" __global__ void csa_ratio4_main_compress(const float* kv, const float* gate,
    const float* ape, const float* norm, const unsigned char* past_cache, const float* past_carry,
    unsigned char* cache, float* carry, int batch, int sequence, int dim, int rope_dim,
    int past_row_records, int cache_row_records, const long long* total_ptr)
{
    auto finalize = [&](float* pooled, unsigned char* record, long long block_start) {
        csa_rms_normalize(pooled, norm, dim);
        csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);
        csa_store_fp8_record(pooled, dim, rope_dim, record);
    };
    csa_compress_row(kv, gate, ape, past_carry, past_cache, carry, cache, batch, sequence, dim, 4, 583,
        past_row_records, cache_row_records, total_ptr, finalize);
}
