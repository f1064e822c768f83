// Prefill matmuls: y [M, N] = x [M, K] (f32) · w [N, K]ᵀ. Float weights: in 32×32 output
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

// Prefill matmul for block-quantized weights: 64×64 output tiles, 32 values of K per step.
// Each step dequantizes the weight tile once into shared memory (one load8 per thread: 64
// rows × 4 groups of 8) and stages the activation tile beside it; each of the 256 threads
// then accumulates a 4×4 patch of outputs. A weight row is read once per 64 activation rows
// instead of once per row as the mat-vec does. K must be a multiple of 32 (every block
// format's rows are).

#define QT 64
#define QK_STEP 32

template <typename B>
__device__ __forceinline__ void mat_mul_blocks(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    __shared__ float xs[QK_STEP][QT + 4];
    __shared__ float ws[QK_STEP][QT + 4];
    const u32 t = threadIdx.x;
    const u32 tx = t % 16, ty = t / 16;
    const u32 row0 = blockIdx.y * QT, col0 = blockIdx.x * QT;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    // This thread's share of the weight tile: row wr, values k0 + wg .. +8.
    const u32 wr = t / 4, wg = (t % 4) * 8;
    const bool w_ok = col0 + wr < n;
    const u8* wrow = weight_row<B>(w, w_ok ? col0 + wr : 0, k);
    for (u32 k0 = 0; k0 < k; k0 += QK_STEP) {
        float wv[8];
        if (w_ok) {
            B::load8(wrow, k0 + wg, wv);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) ws[wg + i][wr] = wv[i];
        // Activations: 64 rows × 32 values, 8 per thread, coalesced along K.
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 e = t + 256 * i;
            const u32 r = e / QK_STEP, c = e % QK_STEP;
            xs[c][r] = row0 + r < m ? x[(size_t)(row0 + r) * k + k0 + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 kk = 0; kk < QK_STEP; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = xs[kk][ty * 4 + i];
                b[i] = ws[kk][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 r = row0 + ty * 4 + i;
        if (r >= m) break;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 c = col0 + tx * 4 + j;
            if (c < n) y[(size_t)r * n + c] = acc[i][j];
        }
    }
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q8_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q8_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q4_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q4_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_1>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q5_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q5_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_1>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q2_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q2_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q3_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q3_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q4_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q5_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q6_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q6_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_q8_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q8_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_mxfp4(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<MXFP4>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256)
mat_mul_nvfp4(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<NVFP4>(x, w, y, m, n, k);
}
