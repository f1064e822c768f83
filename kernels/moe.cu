// MoE: the router (softmax or sigmoid top-k over E experts, renormalised when asked; one
// thread per token, ties to the lower expert), the matmul by expert id for float weights
// (one warp per output), and the weighted sum of the experts' outputs.

extern "C" __global__ void moe_route_f32(const float* logits, float* weights, int* ids, u32 t, u32 e,
                                         u32 k, u32 sigmoid, u32 normalize) {
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= t) return;
    const float* lr = logits + (size_t)r * e;
    float mx = -KILN_INF;
    for (u32 j = 0; j < e; j++) mx = fmaxf(mx, lr[j]);
    float sum = 0.0f;
    for (u32 j = 0; j < e; j++) sum += __expf(lr[j] - mx);
    float prev_v = KILN_INF;
    int prev_i = -1;
    float total = 0.0f;
    for (u32 i = 0; i < k; i++) {
        float best_v = -KILN_INF;
        int best_i = -1;
        for (u32 j = 0; j < e; j++) {
            const float v = sigmoid ? 1.0f / (1.0f + __expf(-lr[j])) : __expf(lr[j] - mx) / sum;
            // After (prev_v, prev_i) in the order: larger value first, then lower index.
            const bool after = v < prev_v || (v == prev_v && (int)j > prev_i);
            if (after && (best_i < 0 || v > best_v)) {
                best_v = v;
                best_i = (int)j;
            }
        }
        weights[(size_t)r * k + i] = best_v;
        ids[(size_t)r * k + i] = best_i;
        total += best_v;
        prev_v = best_v;
        prev_i = best_i;
    }
    if (normalize && total > 0.0f)
        for (u32 i = 0; i < k; i++) weights[(size_t)r * k + i] /= total;
}

// y [T, k, N] = x [T, (k or 1), K] · w[ids[t, i]] ᵀ, w [E, N, K] float.
template <typename T>
__device__ void mat_mul_id(const float* x, const T* w, const int* ids, float* y, u32 t, u32 k, u32 n,
                           u32 kd, u32 x_per_slot, u32 ne) {
    const u32 gw = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    const u32 lane = threadIdx.x % WARP;
    if (gw >= t * k * n) return;
    const u32 col = gw % n, slot = gw / n;
    const int ex = ids[slot];
    float acc = 0.0f;
    if (ex >= 0 && (u32)ex < ne) {
        const float* xr = x + (size_t)(x_per_slot ? slot : slot / k) * kd;
        const T* wr = w + ((size_t)ex * n + col) * kd;
        for (u32 j = lane; j < kd; j += WARP) acc += xr[j] * to_f32(wr[j]);
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)slot * n + col] = acc;
}

extern "C" __global__ void mat_mul_id_f32(const float* x, const float* w, const int* ids, float* y, u32 t,
                                          u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void mat_mul_id_bf16(const float* x, const __nv_bfloat16* w, const int* ids, float* y,
                                           u32 t, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id(x, w, ids, y, t, k, n, kd, x_per_slot, ne);
}

extern "C" __global__ void moe_sum_f32(const float* y, const float* w, float* out, u32 t, u32 k, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t * n) return;
    const u32 r = i / n, j = i % n;
    float acc = 0.0f;
    for (u32 s = 0; s < k; s++) acc += w[(size_t)r * k + s] * y[((size_t)r * k + s) * n + j];
    out[i] = acc;
}

// Groups the slots of a matmul by expert id for the grouped GEMM (mat_mul_id_grouped in
// mat_mul.cu), in one block: counts per expert, their running sums (offsets [E+1] into order,
// and tiles [E+1], each expert's first 64-slot tile), then order [S] lists the slots expert by
// expert (in no fixed order within one: each slot's output does not depend on its place). A
// slot whose id is out of range gets a row of zeros here, as the CPU gives.
#define MOE_GROUP_THREADS 256
#define MAX_EXPERTS 1024

extern "C" __global__ void __launch_bounds__(MOE_GROUP_THREADS)
moe_group(const int* ids, int* order, int* offsets, int* tiles, float* y, u32 s, u32 ne, u32 n) {
    __shared__ int count[MAX_EXPERTS];  // counts, then each expert's next free place in order
    const u32 t = threadIdx.x;
    for (u32 e = t; e < ne; e += MOE_GROUP_THREADS) count[e] = 0;
    __syncthreads();
    for (u32 i = t; i < s; i += MOE_GROUP_THREADS) {
        const int e = ids[i];
        if (e >= 0 && (u32)e < ne) {
            atomicAdd(&count[e], 1);
        } else {
            for (u32 j = 0; j < n; j++) y[(size_t)i * n + j] = 0.0f;
        }
    }
    __syncthreads();
    if (t == 0) {
        int off = 0, tile = 0;
        for (u32 e = 0; e < ne; e++) {
            const int c = count[e];
            offsets[e] = off;
            tiles[e] = tile;
            count[e] = off;
            off += c;
            tile += (c + 63) / 64;
        }
        offsets[ne] = off;
        tiles[ne] = tile;
    }
    __syncthreads();
    for (u32 i = t; i < s; i += MOE_GROUP_THREADS) {
        const int e = ids[i];
        if (e >= 0 && (u32)e < ne) order[atomicAdd(&count[e], 1)] = (int)i;
    }
}
