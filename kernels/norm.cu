// Row norms on f32, one block per row: RMSNorm (x / rms(x) * w, or * (1 + w)), the L2 norm
// of Qwen3.5's q and k (x / sqrt(sum x^2 + eps)), and LayerNorm ((x - mean) / sqrt(var + eps)
// * w + b, the variance taken about the mean in a second pass). Rows of w repeat over the x
// rows.

// @hot
extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y, u32 d, float eps,
                                        u32 one_plus) {
    __shared__ float scratch[WARP];
    const float* xr = x + (size_t)blockIdx.x * d;
    float* yr = y + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
        const float wj = one_plus ? 1.0f + w[j] : w[j];
        yr[j] = xr[j] * inv * wj;
    }
}

extern "C" __global__ void l2_norm_f32(const float* x, float* y, u32 d, float eps) {
    __shared__ float scratch[WARP];
    const float* xr = x + (size_t)blockIdx.x * d;
    float* yr = y + (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss + eps);
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) yr[j] = xr[j] * inv;
}

extern "C" __global__ void layer_norm_f32(const float* x, const float* w, const float* b, float* y,
                                          u32 d, float eps) {
    __shared__ float scratch[WARP];
    const float* xr = x + (size_t)blockIdx.x * d;
    float* yr = y + (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) s += xr[j];
    const float mean = block_sum(s, scratch) / (float)d;
    float v = 0.0f;
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
        const float c = xr[j] - mean;
        v += c * c;
    }
    const float inv = rsqrtf(block_sum(v, scratch) / (float)d + eps);
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) yr[j] = (xr[j] - mean) * inv * w[j] + b[j];
}
