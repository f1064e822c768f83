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
// format's rows are). The tile's rows come from a row map: consecutive rows for the plain
// matmul, one expert's slots for the grouped MoE matmul.

#define QT 64
#define QK_STEP 32

// Rows row0 .. row0 + 63 of x and y, those below m.
struct DenseRows {
    u32 row0, m;
    __device__ __forceinline__ long long x_row(u32 r) const { return row0 + r < m ? (long long)(row0 + r) : -1; }
    __device__ __forceinline__ long long y_row(u32 r) const { return x_row(r); }
};

// order[base .. end) lists one expert's slots (MoE: slot = token · k + i); the activation row
// of a slot is the slot itself, or its token when every slot shares the token's row.
struct SlotRows {
    const int* order;
    u32 base, end, k, x_per_slot;
    __device__ __forceinline__ long long y_row(u32 r) const {
        return base + r < end ? (long long)order[base + r] : -1;
    }
    __device__ __forceinline__ long long x_row(u32 r) const {
        const long long slot = y_row(r);
        return slot < 0 || x_per_slot ? slot : slot / k;
    }
};

// w: the weight matrix [N, K] whose rows col0 .. col0 + 63 this block takes.
template <typename B, typename Rows>
__device__ __forceinline__ void mat_mul_tile(const float* x, const u8* w, float* y, Rows rows, u32 col0, u32 n,
                                             u32 k) {
    __shared__ float xs[QK_STEP][QT + 4];
    __shared__ float ws[QK_STEP][QT + 4];
    const u32 t = threadIdx.x;
    const u32 tx = t % 16, ty = t / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    // This thread's share of the weight tile: row wr, values k0 + wg .. +8.
    const u32 wr = t / 4, wg = (t % 4) * 8;
    const bool w_ok = col0 + wr < n;
    const u8* wrow = weight_row<B>(w, w_ok ? col0 + wr : 0, k);
    // The tile's activation and output rows, looked up once (in shared memory, not registers).
    __shared__ long long xrow[QT], yrow[QT];
    if (t < QT) {
        xrow[t] = rows.x_row(t);
        yrow[t] = rows.y_row(t);
    }
    __syncthreads();
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
            const u32 r = t / QK_STEP + 8 * i, c = t % QK_STEP;
            xs[c][r] = xrow[r] >= 0 ? x[(size_t)xrow[r] * k + k0 + c] : 0.0f;
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
        const long long r = yrow[ty * 4 + i];
        if (r < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 c = col0 + tx * 4 + j;
            if (c < n) y[(size_t)r * n + c] = acc[i][j];
        }
    }
}

template <typename B>
__device__ __forceinline__ void mat_mul_blocks(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_tile<B>(x, w, y, DenseRows{blockIdx.y * QT, m}, blockIdx.x * QT, n, k);
}

// The grouped MoE matmul, y [T, k, N] = x [T, (k or 1), K] · w[ids]ᵀ with w [E, N, K]: the
// slots arrive grouped by expert (moe_group in moe.cu: order, offsets [E+1], and tiles [E+1],
// the first 64-slot tile of each expert), and grid row z takes tile z, so each expert's weight
// tile is read once per 64 of its slots. Tiles past the last are idle blocks.
template <typename B>
__device__ __forceinline__ void mat_mul_id_grouped(const float* x, const u8* w, const int* order,
                                                   const int* offsets, const int* tiles, float* y, u32 k,
                                                   u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    const u32 tile = blockIdx.y;
    if (tile >= (u32)tiles[ne]) return;  // uniform over the block
    u32 lo = 0, hi = ne;  // the expert: the last e with tiles[e] <= tile
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if ((u32)tiles[mid] <= tile) lo = mid; else hi = mid;
    }
    const u32 base = (u32)offsets[lo] + (tile - (u32)tiles[lo]) * QT;
    const SlotRows rows{order, base, (u32)offsets[lo + 1], k, x_per_slot};
    mat_mul_tile<B>(x, weight_row<B>(w, (size_t)lo * n, kd), y, rows, blockIdx.x * QT, n, kd);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q8_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q8_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q4_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q4_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_1>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q5_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q5_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_1>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q2_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q2_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q3_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q3_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q4_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q5_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q6_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q6_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q8_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q8_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_mxfp4(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<MXFP4>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_nvfp4(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<NVFP4>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q8_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q8_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q4_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q4_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q4_1(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q4_1>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q5_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q5_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q5_1(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q5_1>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q2_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q2_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q3_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q3_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q4_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q4_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q5_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q5_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q6_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q6_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q8_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q8_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_mxfp4(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<MXFP4>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_nvfp4(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<NVFP4>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
