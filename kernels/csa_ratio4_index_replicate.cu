/*
 * Stage 5 output: every index head repeats the shared per-(batch, query)
 * selection, selected_indices[b, head, s, slot] = shared[b, s, slot].
 * One thread per output element.
 */
extern "C" __global__ void csa_ratio4_index_replicate(const int* shared, int* selected, int batch,
    int index_heads, int sequence, int topk_width)
{
    const long long element = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long count = (long long)batch * index_heads * sequence * topk_width;
    if (element >= count) return;
    const long long slot = element % topk_width;
    const long long s = (element / topk_width) % sequence;
    const long long b = element / ((long long)topk_width * sequence * index_heads);
    selected[element] = shared[(b * sequence + s) * topk_width + slot];
}
