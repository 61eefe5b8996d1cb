/*
 * Stage 2: the prelude's 8-slot overlap compressor walk on the index stream
 * (`dim` = 128 per channel).  Each block's pooled vector becomes a 68-byte
 * index key: bf16 RMSNorm, compressed RoPE at the block start, Hadamard,
 * then FP4 E2M1 block-32 (4 x [E8M0 scale, 16 nibble pairs, low nibble first]).
 * The block's threads copy the past records (the seed launches one thread).
 */
__constant__ int csa_block_csa_ratio4_index_compress = 256;

extern "C" __global__ void csa_ratio4_index_compress(const float* kv, const float* gate,
    const float* ape, const float* norm, const unsigned char* past_key, const float* past_carry,
    unsigned char* key, float* carry, int batch, int sequence, int dim, int rope_dim,
    int past_row_records, int key_row_records, const long long* total_ptr)
{
    auto finalize = [&](float* pooled, unsigned char* record, long long block_start) {
        csa_rms_normalize(pooled, norm, dim);
        csa_compressed_rope(pooled + dim - rope_dim, rope_dim, block_start);
        csa_hadamard_bf16(pooled, dim);
        for (int block = 0; block < dim / 32; ++block)
            quantize_fp4_e2m1_block(pooled + 32 * block, record + 17 * block, record + 17 * block + 1);
    };
    csa_compress_row(kv, gate, ape, past_carry, past_key, carry, key, batch, sequence, dim, 4, 68,
        past_row_records, key_row_records, total_ptr, finalize);
}
