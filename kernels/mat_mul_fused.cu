// Fusions into the decode matmul (mat_vec.cuh's mat_vec_rows and formats.cuh's loaders, so
// every weight type):
//
// rms_norm_mat_vec: y = rms_norm(x) · wᵀ. The squares of x are summed as the dot products read
// it, so the norm costs no pass of its own and the normalised row is never written.
//
// rms_norm_mat_vecs: the same for two or three weights that share the norm, in one launch.
//
// glu_mat_vec: y = (act(gate) · up) · wᵀ (+ r, the residual, where r is not null). Each lane makes the activation of its 8 values once
// for the block's 4 outputs, and the GLU output never goes to memory.

template <typename B>
__device__ __forceinline__ void rms_norm_mat_vec(const float* x, const float* nw, const void* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    const MvRmsNorm src{{x, nw, k, true}, one_plus ? 1.0f : 0.0f, eps};
    mat_vec_rows<B>(src, w, y, n, k);
}

template <typename B>
__device__ __forceinline__ void glu_mat_vec(const float* gate, const float* up, const void* w, const float* r,
                                            float* y, u32 m, u32 n, u32 k, u32 act) {
    const MvGlu src{{gate, up, k, false, r}, act};
    mat_vec_rows<B>(src, w, y, n, k);
}

// rms_norm_mat_vecs: the projections that share one norm (Q, K and V; gate and up) in one
// launch, y_j = rms_norm(x) · w_jᵀ for two or three weights of one format and width. The grid's
// blocks take w0's rows, then w1's, then w2's (n2 = 0 and null w2, y2 for two weights); each
// block is the single-weight kernel's block for its weight (the same code, so the same bits),
// and the small projections (K and V of a GQA model: a few hundred rows, less than a block an
// SM) run beside the large one instead of leaving most of the GPU idle in launches of their own.
template <typename B>
__device__ __forceinline__ void rms_norm_mat_vecs(const float* x, const float* nw, const void* w0, const void* w1,
                                                  const void* w2, float* y0, float* y1, float* y2, u32 m, u32 n0,
                                                  u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    const MvRmsNorm src{{x, nw, k, true}, one_plus ? 1.0f : 0.0f, eps};
    const WeightShare s = weight_share(MV_ROWS, w0, w1, w2, y0, y1, y2, n0, n1, n2);
    mat_vec_rows<B>(src, s.w, s.y, s.n, k, s.bx);
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
rms_norm_mat_vecs_f32(const float* x, const float* nw, const float* w0, const float* w1, const float* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<F32W>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_f32(const float* gate, const float* up, const float* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<F32W>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_f16(const float* x, const float* nw, const __half* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<F16W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_f16(const float* x, const float* nw, const __half* w0, const __half* w1, const __half* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<F16W>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_f16(const float* gate, const float* up, const __half* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<F16W>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_bf16(const float* x, const float* nw, const __nv_bfloat16* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<BF16W>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_bf16(const float* x, const float* nw, const __nv_bfloat16* w0, const __nv_bfloat16* w1, const __nv_bfloat16* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<BF16W>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_bf16(const float* gate, const float* up, const __nv_bfloat16* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<BF16W>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q8_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q8_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q8_0(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q8_0>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q8_0(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q8_0>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q4_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q4_0(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q4_0>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q4_0(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q4_0>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q4_1(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_1>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q4_1(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q4_1>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q4_1(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q4_1>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q5_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q5_0(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q5_0>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q5_0(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q5_0>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q5_1(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_1>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q5_1(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q5_1>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q5_1(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q5_1>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q2_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q2_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q2_k(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q2_K>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q2_k(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q2_K>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q3_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q3_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q3_k(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q3_K>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q3_k(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q3_K>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
rms_norm_mat_vec_q4_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q4_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
rms_norm_mat_vecs_q4_k(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q4_K>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
glu_mat_vec_q4_k(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q4_K>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q5_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q5_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q5_k(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q5_K>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q5_k(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q5_K>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
rms_norm_mat_vec_q6_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q6_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
rms_norm_mat_vecs_q6_k(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q6_K>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
glu_mat_vec_q6_k(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q6_K>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_q8_k(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<Q8_K>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_q8_k(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<Q8_K>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_q8_k(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<Q8_K>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_mxfp4(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<MXFP4>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_mxfp4(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<MXFP4>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_mxfp4(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<MXFP4>(gate, up, w, r, y, m, n, k, act);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq4_xs(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ4_XS>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq4_xs(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ4_XS>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq4_xs(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ4_XS>(gate, up, w, r, y, m, n, k, act);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq4_nl(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ4_NL>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq2_xxs(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ2_XXS>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq2_xs(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ2_XS>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq2_s(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ2_S>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq3_xxs(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ3_XXS>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq3_s(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ3_S>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq1_s(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ1_S>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_iq1_m(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<IQ1_M>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_tq1_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<TQ1_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_tq2_0(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<TQ2_0>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq4_nl(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ4_NL>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq2_xxs(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ2_XXS>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq2_xs(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ2_XS>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq2_s(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ2_S>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq3_xxs(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ3_XXS>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq3_s(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ3_S>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq1_s(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ1_S>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_iq1_m(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<IQ1_M>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_tq1_0(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<TQ1_0>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_tq2_0(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<TQ2_0>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq4_nl(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ4_NL>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq2_xxs(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ2_XXS>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq2_xs(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ2_XS>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq2_s(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ2_S>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq3_xxs(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ3_XXS>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq3_s(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ3_S>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq1_s(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ1_S>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_iq1_m(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<IQ1_M>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_tq1_0(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<TQ1_0>(gate, up, w, r, y, m, n, k, act);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_tq2_0(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<TQ2_0>(gate, up, w, r, y, m, n, k, act);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vec_nvfp4(const float* x, const float* nw, const u8* w, float* y, u32 m,
                                                 u32 n, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vec<NVFP4>(x, nw, w, y, m, n, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
rms_norm_mat_vecs_nvfp4(const float* x, const float* nw, const u8* w0, const u8* w1, const u8* w2, float* y0, float* y1,
                      float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k, float eps, u32 one_plus) {
    rms_norm_mat_vecs<NVFP4>(x, nw, w0, w1, w2, y0, y1, y2, m, n0, n1, n2, k, eps, one_plus);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
glu_mat_vec_nvfp4(const float* gate, const float* up, const u8* w, const float* r, float* y, u32 m, u32 n,
                 u32 k, u32 act) {
    glu_mat_vec<NVFP4>(gate, up, w, r, y, m, n, k, act);
}
