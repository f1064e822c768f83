// Row softmax of x [R, N] * scale, soft-capped (cap * tanh(v / cap)) when cap > 0, plus an
// optional additive mask [R', N] (row r uses mask row r % R'). One block per row.
extern "C" __global__ void softmax_f32(const float* x, const float* mask, float* y, u32 n,
                                       u32 mask_rows, float scale, float cap) {
    __shared__ float scratch[WARP];
    const u32 r = blockIdx.x;
    const float* xr = x + (size_t)r * n;
    const float* mr = mask_rows ? mask + (size_t)(r % mask_rows) * n : nullptr;
    float* yr = y + (size_t)r * n;
    float mx = -KILN_INF;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) {
        float v = xr[j] * scale;
        if (cap > 0.0f) v = cap * tanhf(v / cap);
        if (mr) v += mr[j];
        yr[j] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = mx == -KILN_INF ? 0.0f : __expf(yr[j] - mx);
        yr[j] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) yr[j] *= inv;
}
