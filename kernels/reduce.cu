// Row reductions: argmax over x [R, N] (f32) → [R] (i32), the first index of the maximum in
// IEEE total order (the CPU reference's order: +NaN above +inf, -NaN below -inf). One block of
// 256 threads per row; each thread scans a stride, then a tree in shared memory.

#define ARGMAX_THREADS 256

// A float's place in IEEE total order, as a signed integer.
__device__ __forceinline__ int total_key(float v) {
    const int k = __float_as_int(v);
    return k ^ (int)(((u32)(k >> 31)) >> 1);
}

extern "C" __global__ void argmax_f32(const float* x, int* out, u32 n) {
    __shared__ int keys[ARGMAX_THREADS];
    __shared__ u32 idx[ARGMAX_THREADS];
    const u32 t = threadIdx.x;
    const float* xr = x + (size_t)blockIdx.x * n;
    int bk = -2147483647 - 1;
    u32 bi = 0xffffffffu;
    for (u32 j = t; j < n; j += ARGMAX_THREADS) {
        const int k = total_key(xr[j]);
        if (k > bk) {  // strides visit indices in increasing order: ties keep the first
            bk = k;
            bi = j;
        }
    }
    keys[t] = bk;
    idx[t] = bi;
    __syncthreads();
    for (u32 s = ARGMAX_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            const int ko = keys[t + s];
            const u32 io = idx[t + s];
            if (ko > keys[t] || (ko == keys[t] && io < idx[t])) {
                keys[t] = ko;
                idx[t] = io;
            }
        }
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = (int)idx[0];
}
