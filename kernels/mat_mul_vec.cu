// Decode matmuls on float weights and the two 32-value formats that have block structs:
// mat_vec.cuh's mat_vec_rows (4 outputs a block, the row split among its 4 warps). r: null, or
// the residual [m, n] added to y (the MatMulAdd op).

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_f32(const float* x, const float* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_rows<F32W>(MvPlain{x, k, r}, w, y, n, k);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_f16(const float* x, const __half* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_rows<F16W>(MvPlain{x, k, r}, w, y, n, k);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_bf16(const float* x, const __nv_bfloat16* w, const float* r, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_vec_rows<BF16W>(MvPlain{x, k, r}, w, y, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q8_0(const float* x, const block_q8_0* w, const float* r, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_vec_rows<Q8_0>(MvPlain{x, k, r}, w, y, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q4_0(const float* x, const block_q4_0* w, const float* r, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_vec_rows<Q4_0>(MvPlain{x, k, r}, w, y, n, k);
}
