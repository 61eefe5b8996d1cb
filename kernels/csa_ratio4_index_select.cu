/*
 * Stages 3-5, ratio 4, one block of CSA_SELECT_THREADS threads per (batch,
 * query) row (declared below; the seed launches one thread per row):
 *   3. finalize every index-query head (bf16, compressed RoPE at the query's
 *      absolute position, Hadamard, FP4 round trip) into `transformed`, heads
 *      strided over the threads;
 *   4. score each causal record c < (pos+1)/4, records strided over the
 *      threads and each record summed on one thread in the reference's order:
 *      the head sum (ascending) of relu(dot(q, key_c)) * w *
 *      (1/sqrt(index_dim)/sqrt(index_heads)); non-causal entries are left to
 *      the caller's -inf fill;
 *   5. select the first topk_width records by descending score (total order
 *      of f32::total_cmp, lower record first on equal keys), -1 padded: a
 *      radix select finds the k-th largest key, the records above it and the
 *      first records equal to it are gathered into the row's `selected`, and
 *      a bitonic sort puts them in that order.
 */
#define CSA_SELECT_THREADS 512
__constant__ int csa_block_csa_ratio4_index_select = CSA_SELECT_THREADS;

/* f32::total_cmp's order as an unsigned comparison of the bit pattern. */
__device__ __forceinline__ unsigned int csa_select_key(float x)
{
    const unsigned int bits = __float_as_uint(x);
    return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

/* Record a comes before record b in the selection's order. */
__device__ __forceinline__ bool csa_selected_before(const float* scores, int a, int b)
{
    const unsigned int key_a = csa_select_key(scores[a]);
    const unsigned int key_b = csa_select_key(scores[b]);
    return key_a > key_b || (key_a == key_b && a < b);
}

/* The key of the k-th record in the selection's order among `candidates`
 * (k >= 1), one 8-bit digit per pass from the top; `*equal_taken` is how many
 * records with exactly that key the top k hold, `*equal_count` how many there
 * are. */
__device__ unsigned int csa_kth_key(const float* scores, int candidates, int k, int* equal_taken, int* equal_count)
{
    __shared__ unsigned int histogram[256];
    __shared__ unsigned int prefix;
    __shared__ int remaining;
    __shared__ int equal;
    if (threadIdx.x == 0u) {
        prefix = 0u;
        remaining = k;
    }
    unsigned int mask = 0u;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int digit = (int)threadIdx.x; digit < 256; digit += (int)blockDim.x) histogram[digit] = 0u;
        __syncthreads();  // the histogram is clear
        const unsigned int found = prefix;
        for (int c = (int)threadIdx.x; c < candidates; c += (int)blockDim.x) {
            const unsigned int key = csa_select_key(scores[c]);
            if ((key & mask) == found) atomicAdd(&histogram[(key >> shift) & 255u], 1u);
        }
        __syncthreads();  // every matching record is counted
        if (threadIdx.x == 0u) {
            int digit = 255;
            while ((int)histogram[digit] < remaining) remaining -= (int)histogram[digit--];
            prefix = found | ((unsigned int)digit << shift);
            equal = (int)histogram[digit];
        }
        mask |= 255u << shift;
        __syncthreads();  // thread 0 has published the digit and is done with the histogram
    }
    *equal_taken = remaining;
    *equal_count = equal;
    return prefix;
}

/* The top k of `candidates` records into selected[0, k) in the selection's
 * order: gathered in any order, then a bitonic sort in which every
 * compare-exchange puts the earlier record at the lower slot, the slots past
 * k standing for records after every real one (so never exchanged). */
__device__ void csa_select_top(const float* scores, int candidates, int k, int* selected)
{
    __shared__ int gathered;
    int equal_taken = 0;
    int equal_count = 0;
    const unsigned int kth = csa_kth_key(scores, candidates, k, &equal_taken, &equal_count);
    if (threadIdx.x == 0u) gathered = 0;
    __syncthreads();  // the gather counter is clear
    const bool every_equal = equal_taken == equal_count;
    for (int c = (int)threadIdx.x; c < candidates; c += (int)blockDim.x) {
        const unsigned int key = csa_select_key(scores[c]);
        if (key > kth || (every_equal && key == kth)) selected[atomicAdd(&gathered, 1)] = c;
    }
    if (!every_equal && threadIdx.x == 0u)  // tied at the k-th key: the lowest records take the places
        for (int c = 0, taken = 0; taken < equal_taken; ++c)
            if (csa_select_key(scores[c]) == kth) {
                selected[atomicAdd(&gathered, 1)] = c;
                ++taken;
            }
    __syncthreads();  // the top k are gathered

    int span = 1;
    while (span < k) span *= 2;
    for (int size = 2; size <= span; size *= 2) {
        for (int stride = size / 2; stride >= 1; stride /= 2) {
            for (int pair = (int)threadIdx.x; pair < span / 2; pair += (int)blockDim.x) {
                const int offset = pair % stride;
                const int low = (pair / stride) * 2 * stride + offset;
                /* first step of each size: the mirror pair; then pairs `stride` apart */
                const int high = stride == size / 2 ? low + 2 * (stride - offset) - 1 : low + stride;
                if (high < k && csa_selected_before(scores, selected[high], selected[low])) {
                    const int earlier = selected[high];
                    selected[high] = selected[low];
                    selected[low] = earlier;
                }
            }
            __syncthreads();  // this step's exchanges are done
        }
    }
}

extern "C" __global__ void csa_ratio4_index_select(const float* index_query,
    const float* index_weight, const unsigned char* index_key, float* transformed, float* scores,
    int* selected, int batch, int sequence, int index_heads, int index_dim, int rope_dim,
    int record_capacity, const long long* total_ptr,
    int topk_width)
{
    const int row = (int)blockIdx.x;
    if (row >= batch * sequence) return;
    const int b = row / sequence;
    const int s = row % sequence;
    const long long position = *total_ptr - (long long)sequence + s;
    const long long causal = (position + 1) / 4;
    const int limit = causal < (long long)record_capacity ? (int)causal : record_capacity;

    float* queries = transformed + (long long)row * index_heads * index_dim;
    for (int h = (int)threadIdx.x; h < index_heads; h += (int)blockDim.x) {
        float* q = queries + (long long)h * index_dim;
        const float* source = index_query + ((long long)row * index_heads + h) * index_dim;
        for (int d = 0; d < index_dim; ++d) q[d] = csa_round_bf16(source[d]);
        CSA_PROBE("bf16", q, index_dim);
        csa_compressed_rope(q + index_dim - rope_dim, rope_dim, position);
        csa_hadamard_bf16(q, index_dim);
        for (int block = 0; 32 * block < index_dim; ++block) {
            unsigned char scale;
            unsigned char packed[16];
            float* values = q + 32 * block;
            quantize_fp4_e2m1_block(values, &scale, packed);
            const float block_scale = e8m0_scale(scale);
            for (int i = 0; i < 16; ++i) {
                values[2 * i] = decode_e2m1(packed[i]) * block_scale;
                values[2 * i + 1] = decode_e2m1((unsigned char)(packed[i] >> 4)) * block_scale;
            }
        }
    }
    __syncthreads();  // every head's query is final

    const float weight_scale = 1.0f / sqrtf((float)index_dim) / sqrtf((float)index_heads);
    const float* weights = index_weight + (long long)row * index_heads;
    float* record_scores = scores + (long long)row * record_capacity;
    const int key_bytes = index_dim / 32 * 17;
    for (int record_id = (int)threadIdx.x; record_id < limit; record_id += (int)blockDim.x) {
        const unsigned char* key = index_key + ((long long)b * record_capacity + record_id) * key_bytes;
        float weighted = 0.0f;
        for (int h = 0; h < index_heads; ++h) {
            const float* q = queries + (long long)h * index_dim;
            float dot = 0.0f;
            for (int d = 0; d < index_dim; ++d) {
                const unsigned char* block = key + 17 * (d / 32);
                const unsigned char byte = block[1 + (d % 32) / 2];
                const unsigned char code = (d % 2) ? (unsigned char)(byte >> 4) : byte;
                dot = dot + csa_mul(q[d], decode_e2m1(code) * e8m0_scale(block[0]));
            }
            CSA_PROBE("index_dots", &dot, 1);
            const float relu = fmaxf(dot, 0.0f);
            CSA_PROBE("index_relu", &relu, 1);
            weighted = weighted + csa_mul(relu * weights[h], weight_scale);
        }
        CSA_PROBE("index_score", &weighted, 1);
        record_scores[record_id] = weighted;
    }
    __syncthreads();  // every causal score is written

    int* row_selected = selected + (long long)row * topk_width;
    const int candidates = limit;
    const int chosen = candidates < topk_width ? candidates : topk_width;
    if (chosen > 0) csa_select_top(record_scores, candidates, chosen, row_selected);
    for (int rank = chosen + (int)threadIdx.x; rank < topk_width; rank += (int)blockDim.x) row_selected[rank] = -1;
}
