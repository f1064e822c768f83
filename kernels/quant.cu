// Block-quantized weights (formats.cuh): decode mat-vec (formats.cuh's mat_vec_rows), embedding
// lookup and the matmul by expert id, for every GGUF format the CPU reference reads.

// y [T, k, N] = x [T, (k or 1), K] · w[ids[t, i]]ᵀ for block-quantized w [E, N, K]: a warp per
// output; a bad expert id gives zeros.
template <typename B>
__device__ __forceinline__ void mat_mul_id_blocks(const float* x, const u8* w, const int* ids, float* y, u32 t,
                                                  u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    const u32 gw = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    const u32 lane = threadIdx.x % WARP;
    if (gw >= t * k * n) return;
    const u32 col = gw % n, slot = gw / n;
    const int ex = ids[slot];
    float acc = 0.0f;
    if (ex >= 0 && (u32)ex < ne) {
        const float* xr = x + (size_t)(x_per_slot ? slot : slot / k) * kd;
        const u8* wr = w + ((size_t)ex * n + col) * (kd / B::QK) * B::BYTES;
        for (u32 s = 0; s < kd; s += 256) {
            const u32 v = s + 8 * lane;
            if (v >= kd) break;
            float wv[8];
            B::load8(wr, v, wv);
#pragma unroll
            for (int i = 0; i < 8; i++) acc += xr[v + i] * wv[i];
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)slot * n + col] = acc;
}

template <typename B>
__device__ __forceinline__ void mat_vec_blocks(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n,
                                               u32 k) {
    mat_vec_rows<B>(MvPlain{x, k, r}, w, y, n, k);
}

// Embedding lookup: one thread per 8 values of an output row; bad ids give zeros.
template <typename B>
__device__ __forceinline__ void get_rows_blocks(const u8* table, const int* ids, float* out, u32 n, u32 d,
                                                u32 v) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 per_row = d / 8;
    if (i >= n * per_row) return;
    const u32 r = i / per_row, c = (i % per_row) * 8;
    const int id = ids[r];
    float vals[8];
    if (id >= 0 && (u32)id < v) {
        B::load8(table + (size_t)id * (d / B::QK) * B::BYTES, c, vals);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) vals[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) out[(size_t)r * d + c + j] = vals[j];
}

// ---- entry points, per format ----

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q4_1(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q4_1>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q4_1(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q4_1>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q5_0(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q5_0>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q5_0(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q5_0>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q5_1(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q5_1>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q5_1(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q5_1>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q2_k(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q2_K>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q2_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q2_K>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q3_k(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q3_K>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q3_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q3_K>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
mat_vec_q4_k(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q4_K>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q4_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q4_K>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q5_k(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q5_K>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q5_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q5_K>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS_KQ)
mat_vec_q6_k(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q6_K>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q6_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q6_K>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_q8_k(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q8_K>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_q8_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q8_K>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_mxfp4(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<MXFP4>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_mxfp4(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<MXFP4>(t, ids, out, n, d, v);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq4_xs(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ4_XS>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_iq4_xs(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ4_XS>(t, ids, out, n, d, v);
}
// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq4_nl(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ4_NL>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq2_xxs(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ2_XXS>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq2_xs(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ2_XS>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq2_s(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ2_S>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq3_xxs(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ3_XXS>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq3_s(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ3_S>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq1_s(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ1_S>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_iq1_m(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<IQ1_M>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_tq1_0(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<TQ1_0>(x, w, r, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_tq2_0(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<TQ2_0>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_iq4_nl(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ4_NL>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq2_xxs(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ2_XXS>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq2_xs(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ2_XS>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq2_s(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ2_S>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq3_xxs(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ3_XXS>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq3_s(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ3_S>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq1_s(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ1_S>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_iq1_m(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<IQ1_M>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_tq1_0(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<TQ1_0>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_tq2_0(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<TQ2_0>(t, ids, out, n, d, v);
}

// @hot
extern "C" __global__ void __launch_bounds__(MV_BOUNDS)
mat_vec_nvfp4(const float* x, const u8* w, const float* r, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<NVFP4>(x, w, r, y, m, n, k);
}
extern "C" __global__ void get_rows_nvfp4(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<NVFP4>(t, ids, out, n, d, v);
}

extern "C" __global__ void mat_mul_id_q8_0(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q8_0>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q4_0(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q4_0>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q4_1(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q4_1>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q5_0(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q5_0>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q5_1(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q5_1>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q2_k(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q2_K>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q3_k(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q3_K>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q4_k(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q4_K>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q5_k(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q5_K>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q6_k(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q6_K>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_q8_k(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<Q8_K>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_mxfp4(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<MXFP4>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq4_xs(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ4_XS>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq4_nl(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ4_NL>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq2_xxs(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ2_XXS>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq2_xs(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ2_XS>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq2_s(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ2_S>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq3_xxs(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ3_XXS>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq3_s(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ3_S>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq1_s(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ1_S>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_iq1_m(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<IQ1_M>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_tq1_0(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<TQ1_0>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void mat_mul_id_tq2_0(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<TQ2_0>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_nvfp4(const float* x, const u8* w, const int* ids, float* y, u32 t, u32 k,
                                        u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_blocks<NVFP4>(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}
