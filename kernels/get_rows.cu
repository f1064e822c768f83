// Embedding lookup: table [V, D] → out [N, D] (f32) for ids [N]; ids outside 0..V give zeros
// (the host checks ids first; this keeps a bad id from reading out of bounds).

template <typename T>
__device__ void get_rows_float(const T* table, const int* ids, float* out, u32 n, u32 d, u32 v) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    const u32 r = i / d, c = i % d;
    const int id = ids[r];
    out[i] = (id >= 0 && (u32)id < v) ? to_f32(table[(size_t)id * d + c]) : 0.0f;
}

extern "C" __global__ void get_rows_f32(const float* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_float(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_f16(const __half* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_float(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_bf16(const __nv_bfloat16* t, const int* ids, float* out, u32 n, u32 d,
                                         u32 v) {
    get_rows_float(t, ids, out, n, d, v);
}

// Value `k` (0..32) of a block.
__device__ __forceinline__ float block_value(const block_q8_0& b, u32 k) {
    return __half2float(b.d) * (float)b.qs[k];
}

__device__ __forceinline__ float block_value(const block_q4_0& b, u32 k) {
    const int q = k < 16 ? (b.qs[k] & 0xF) : (b.qs[k - 16] >> 4);
    return __half2float(b.d) * (float)(q - 8);
}

template <typename B>
__device__ void get_rows_block32(const B* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * d) return;
    const u32 r = i / d, c = i % d;
    const int id = ids[r];
    out[i] = (id >= 0 && (u32)id < v) ? block_value(t[((size_t)id * d + c) / 32], c % 32) : 0.0f;
}

extern "C" __global__ void get_rows_q8_0(const block_q8_0* t, const int* ids, float* out, u32 n, u32 d,
                                         u32 v) {
    get_rows_block32(t, ids, out, n, d, v);
}

extern "C" __global__ void get_rows_q4_0(const block_q4_0* t, const int* ids, float* out, u32 n, u32 d,
                                         u32 v) {
    get_rows_block32(t, ids, out, n, d, v);
}
