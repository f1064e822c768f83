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

// top_k over x [R, N] → values [R, k] (f32) and indices [R, k] (i32), largest first in the
// same total order, ties to the lower index. One block per row and k rounds: round r finds the
// best element ranked below round r-1's pick (a tree over 64-bit rank keys, which are unique
// because they carry the index). O(k·N / threads) per row: meant for sampling's small k.

#define TOPK_THREADS 256
typedef unsigned long long u64;

// Larger is better: the total-order key (biased to unsigned), then the lower index.
__device__ __forceinline__ u64 rank_key(float v, u32 j) {
    return ((u64)((u32)total_key(v) ^ 0x80000000u) << 32) | (u64)(0xffffffffu - j);
}

extern "C" __global__ void top_k_f32(const float* x, float* vals, int* ids, u32 n, u32 k) {
    __shared__ u64 best[TOPK_THREADS];
    const u32 t = threadIdx.x;
    const float* xr = x + (size_t)blockIdx.x * n;
    u64 prev = 0;  // rank key of the previous pick (0 before the first: every key is above 0)
    for (u32 r = 0; r < k; r++) {
        u64 b = 0;
        for (u32 j = t; j < n; j += TOPK_THREADS) {
            const u64 c = rank_key(xr[j], j);
            if ((r == 0 || c < prev) && c > b) b = c;
        }
        best[t] = b;
        __syncthreads();
        for (u32 s = TOPK_THREADS / 2; s > 0; s >>= 1) {
            if (t < s && best[t + s] > best[t]) best[t] = best[t + s];
            __syncthreads();
        }
        prev = best[0];
        __syncthreads();  // best[0] is read by every thread before the next round writes it
        if (t == 0) {
            const u32 j = 0xffffffffu - (u32)(prev & 0xffffffffu);
            const size_t o = (size_t)blockIdx.x * k + r;
            vals[o] = j < n ? xr[j] : 0.0f;
            ids[o] = (int)j;
        }
    }
}
