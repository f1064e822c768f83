// Decode matmuls: y [M, N] = x [M, K] (f32) · w [N, K]ᵀ, one warp per output element, the
// weight row read once per token row in its stored format (f32, f16, bf16, Q8_0, Q4_0) and
// dequantized in registers. Blocks of 4 warps: 4 output columns per block.

template <typename T>
__device__ __forceinline__ void mat_vec_float(const float* x, const T* w, float* y, u32 m, u32 n, u32 k) {
    const u32 col = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const u32 row = blockIdx.y;
    const u32 lane = threadIdx.x % WARP;
    if (col >= n || row >= m) return;
    const float* xr = x + (size_t)row * k;
    const T* wr = w + (size_t)col * k;
    float acc = 0.0f;
    for (u32 j = lane; j < k; j += WARP) acc += xr[j] * to_f32(wr[j]);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}

// @hot
extern "C" __global__ void mat_vec_f32(const float* x, const float* w, float* y, u32 m, u32 n, u32 k) {
    mat_vec_float(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_vec_f16(const float* x, const __half* w, float* y, u32 m, u32 n, u32 k) {
    mat_vec_float(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_vec_bf16(const float* x, const __nv_bfloat16* w, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_vec_float(x, w, y, m, n, k);
}

// The dot product of one 32-value block with 32 activations, in order, times the scale.
__device__ __forceinline__ float block_dot(const block_q8_0& blk, const float* xb) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) s += xb[i] * (float)blk.qs[i];
    return s * __half2float(blk.d);
}

__device__ __forceinline__ float block_dot(const block_q4_0& blk, const float* xb) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const u8 q = blk.qs[i];
        s += xb[i] * (float)((int)(q & 0xF) - 8) + xb[i + 16] * (float)((int)(q >> 4) - 8);
    }
    return s * __half2float(blk.d);
}

// Each lane takes whole 32-value blocks; the lanes' sums meet in a warp reduction.
template <typename B>
__device__ __forceinline__ void mat_vec_block32(const float* x, const B* w, float* y, u32 m, u32 n, u32 k) {
    const u32 col = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const u32 row = blockIdx.y;
    const u32 lane = threadIdx.x % WARP;
    if (col >= n || row >= m) return;
    const u32 nb = k / 32;
    const float* xr = x + (size_t)row * k;
    const B* wr = w + (size_t)col * nb;
    float acc = 0.0f;
    for (u32 b = lane; b < nb; b += WARP) acc += block_dot(wr[b], xr + b * 32);
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}

// @hot
extern "C" __global__ void mat_vec_q8_0(const float* x, const block_q8_0* w, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_vec_block32(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void mat_vec_q4_0(const float* x, const block_q4_0* w, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_vec_block32(x, w, y, m, n, k);
}
