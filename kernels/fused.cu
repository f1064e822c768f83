// Fusions into the decode matmul (mat_vec.cuh's mat_vec_rows and formats.cuh's loaders, so
// every weight type):
//
// rms_norm_mat_vec: y = rms_norm(x) · wᵀ. The squares of x are summed as the dot products read
// it, so the norm costs no pass of its own and the normalised row is never written.
//
// glu_mat_vec: y = (act(gate) · up) · wᵀ. Each lane makes the activation of its 8 values once
// for the block's 4 outputs, and the GLU output never goes to memory.

template <typename B>
__device__ __forceinline__ void rms_norm_mat_vec(const float* x, const float* nw, const void* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    const MvRmsNorm src{{x, nw, k, true}, one_plus ? 1.0f : 0.0f, eps};
    mat_vec_rows<B>(src, w, y, n, k);
}

template <typename B>
__device__ __forceinline__ void glu_mat_vec(const float* gate, const float* up, const void* w, float* y, u32 m,
                                            u32 n, u32 k, u32 act) {
    const MvGlu src{{gate, up, k, false}, act};
    mat_vec_rows<B>(src, w, y, n, k);
}

// ---- entry points, per weight format ----

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_f32(const float* x, const float* nw, const float* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<F32W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_f32(const float* gate, const float* up, const float* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<F32W>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_f16(const float* x, const float* nw, const __half* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<F16W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_f16(const float* gate, const float* up, const __half* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<F16W>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_bf16(const float* x, const float* nw, const __nv_bfloat16* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<BF16W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_bf16(const float* gate, const float* up, const __nv_bfloat16* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<BF16W>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q8_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q8_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q8_0(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q8_0>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q4_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q4_0(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q4_0>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q4_1(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_1>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q4_1(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q4_1>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q5_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q5_0(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q5_0>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q5_1(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_1>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q5_1(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q5_1>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q2_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q2_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q2_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q2_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q3_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q3_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q3_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q3_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q4_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q4_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q4_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q5_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q5_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q5_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q6_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q6_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q6_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q6_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q8_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q8_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q8_k(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<Q8_K>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_mxfp4(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<MXFP4>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_mxfp4(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<MXFP4>(gate, up, w, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_nvfp4(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<NVFP4>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_nvfp4(const float* gate, const float* up, const u8* w, float* y, u32 m, u32 n, u32 k, u32 act) {
    glu_mat_vec<NVFP4>(gate, up, w, y, m, n, k, act);
}
