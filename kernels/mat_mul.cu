// Prefill matmul: y [M, N] = x [M, K] (f32) · w [N, K]ᵀ for float weights, in 32×32 output
// tiles through shared memory (each thread computes a 4×1 strip; 32×8 threads).

#define TILE 32

template <typename T>
__device__ __forceinline__ void mat_mul_tiled(const float* x, const T* w, float* y, u32 m, u32 n, u32 k) {
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const u32 tx = threadIdx.x, ty = threadIdx.y;  // 32 × 8
    const u32 row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 k0 = 0; k0 < k; k0 += TILE) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 r = ty + 8 * i;
            const u32 kk = k0 + tx;
            xs[r][tx] = (row0 + r < m && kk < k) ? x[(size_t)(row0 + r) * k + kk] : 0.0f;
            ws[r][tx] = (col0 + r < n && kk < k) ? to_f32(w[(size_t)(col0 + r) * k + kk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 j = 0; j < TILE; j++) {
            const float wv = ws[tx][j];
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] += xs[ty + 8 * i][j] * wv;
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 r = row0 + ty + 8 * i, c = col0 + tx;
        if (r < m && c < n) y[(size_t)r * n + c] = acc[i];
    }
}

// @hot
extern "C" __global__ void mat_mul_f32(const float* x, const float* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_tiled(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_mul_f16(const float* x, const __half* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_tiled(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_mul_bf16(const float* x, const __nv_bfloat16* w, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_mul_tiled(x, w, y, m, n, k);
}
