// Fusions into the decode matmul (formats.cuh's loaders, so every weight type):
//
// rms_norm_mat_vec: y = rms_norm(x) · wᵀ. A warp per output, as the mat-vec kernels; each
// lane also sums the squares of the activations it reads, and since the lanes together read
// the row once, the warp's sum is the row's: the norm costs no pass of its own, and the
// normalised row is never written.
//
// glu_mat_vec: y = (act(gate) · up) · wᵀ. The activation is computed once per block into
// shared memory, a chunk at a time, and serves the block's 32 outputs (8 warps of 4), so the
// SFU work is 1/32 of a per-warp recompute and the GLU output never goes to memory.

template <typename B>
__device__ __forceinline__ void rms_norm_mat_vec(const float* x, const float* nw, const void* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    const u32 col = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const u32 row = blockIdx.y;
    const u32 lane = threadIdx.x % WARP;
    if (col >= n || row >= m) return;
    const float* xr = x + (size_t)row * k;
    const u8* wr = weight_row<B>(w, col, k);
    const float add = one_plus ? 1.0f : 0.0f;
    float acc = 0.0f, ss = 0.0f;
    for (u32 s = 0; s < k; s += 256) {
        const u32 v = s + 8 * lane;
        if (v >= k) break;
        float wv[8];
        B::load8(wr, v, wv);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float xv = xr[v + i];
            ss += xv * xv;
            acc += xv * (nw[v + i] + add) * wv[i];
        }
    }
    acc = warp_sum(acc);
    ss = warp_sum(ss);
    if (lane == 0) y[(size_t)row * n + col] = acc * rsqrtf(ss / (float)k + eps);
}

#define GLU_WARPS 8
#define GLU_COLS 4
#define GLU_CHUNK 2048

template <typename B>
__device__ __forceinline__ void glu_mat_vec(const float* gate, const float* up, const void* w, float* y, u32 m,
                                            u32 n, u32 k, u32 act) {
    __shared__ float h[GLU_CHUNK];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = (blockIdx.x * GLU_WARPS + warp) * GLU_COLS;
    const u32 row = blockIdx.y;
    const float* gr = gate + (size_t)row * k;
    const float* ur = up + (size_t)row * k;
    float acc[GLU_COLS];
#pragma unroll
    for (int c = 0; c < GLU_COLS; c++) acc[c] = 0.0f;
    for (u32 c0 = 0; c0 < k; c0 += GLU_CHUNK) {
        const u32 len = min((u32)GLU_CHUNK, k - c0);
        for (u32 j = threadIdx.x; j < len; j += blockDim.x) {
            const float g = gr[c0 + j];
            h[j] = (act == 0 ? silu(g) : gelu_tanh(g)) * ur[c0 + j];
        }
        __syncthreads();
#pragma unroll
        for (int c = 0; c < GLU_COLS; c++) {
            const u32 col = col0 + c;
            if (col >= n) break;
            const u8* wr = weight_row<B>(w, col, k);
            for (u32 s = 0; s < len; s += 256) {
                const u32 v = s + 8 * lane;
                if (v >= len) break;
                float wv[8];
                B::load8(wr, c0 + v, wv);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[c] += h[v + i] * wv[i];
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int c = 0; c < GLU_COLS; c++) {
        const float s = warp_sum(acc[c]);
        if (lane == 0 && col0 + c < n) y[(size_t)row * n + col0 + c] = s;
    }
}

// ---- entry points, per weight format ----

// @hot
extern "C" __global__ void rms_norm_mat_vec_f32(const float* x, const float* nw, const float* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<F32W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_f32(const float* gate, const float* up, const float* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<F32W>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_f16(const float* x, const float* nw, const __half* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<F16W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_f16(const float* gate, const float* up, const __half* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<F16W>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_bf16(const float* x, const float* nw, const __nv_bfloat16* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<BF16W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_bf16(const float* gate, const float* up, const __nv_bfloat16* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<BF16W>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q8_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q8_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q8_0(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q8_0>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q4_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q4_0(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q4_0>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q4_1(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_1>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q4_1(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q4_1>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q5_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q5_0(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q5_0>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q5_1(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_1>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q5_1(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q5_1>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q2_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q2_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q2_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q2_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q3_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q3_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q3_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q3_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q4_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q4_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q4_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q5_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q5_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q5_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q6_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q6_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q6_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q6_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_q8_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q8_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_q8_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q8_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_mxfp4(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<MXFP4>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_mxfp4(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<MXFP4>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void rms_norm_mat_vec_nvfp4(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<NVFP4>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(GLU_WARPS * WARP)
glu_mat_vec_nvfp4(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<NVFP4>(gate, up, w, y, m, n, k, act);
}
