// Block diffusion's canvas ops (DiffusionGemma), as the CPU reference defines them
// (core/src/cpu/canvas.rs; the hashes in core/src/op/canvas.rs).
//
// canvas_draw_f32: one block of 256 threads per canvas row. Pass 1 writes the processed row
// (logits · scale) and finds the argmax of the logits; pass 2 sums exp(p − m) and
// exp(p − m)·(p − m) for the entropy and finds the Gumbel-max draw, the argmax of p + g.
//
// canvas_accept: one block for the whole canvas (T ≤ 1024). Each thread ranks its positions by
// (entropy, index); thread 0 forms the running sums in rank order; then each position is
// accepted or re-noised, the argmax history checked and shifted, and the status
// (accepted, stop) written.

#define CANVAS_THREADS 256
#define CANVAS_MAX 1024

__device__ __forceinline__ u32 canvas_mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

__device__ __forceinline__ u32 canvas_row_key(u32 seed_lo, u32 seed_hi, u32 row) {
    const u32 s = canvas_mix32(seed_hi ^ 0x9e3779b9u);
    return canvas_mix32(row ^ canvas_mix32(seed_lo ^ s));
}

// −ln(u) for u = ((h >> 8) + 0.5) / 2^24; near u = 1 the series of −ln(1 − w), w = 1 − u.
__device__ __forceinline__ float canvas_exponential(u32 h) {
    const u32 k = h >> 8;
    const float w = ((float)(16777216u - k) - 0.5f) * (1.0f / 16777216.0f);
    if (w <= 0.0625f) {
        return w * (1.0f + w * (0.5f + w * (1.0f / 3.0f + w * (0.25f + w * (0.2f + w * (1.0f / 6.0f))))));
    }
    return -logf(((float)k + 0.5f) * (1.0f / 16777216.0f));
}

// A float's place in IEEE total order as an unsigned key (larger is later).
__device__ __forceinline__ u32 canvas_key(float v) {
    const u32 b = (u32)__float_as_int(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Best (largest key, then lowest index) over the block; every thread gets the index.
__device__ u32 canvas_best(u32* keys, u32* idx, u32 k, u32 i) {
    const u32 t = threadIdx.x;
    keys[t] = k;
    idx[t] = i;
    __syncthreads();
    for (u32 s = CANVAS_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            const u32 ok = keys[t + s], oi = idx[t + s];
            if (oi != 0xffffffffu &&
                (idx[t] == 0xffffffffu || ok > keys[t] || (ok == keys[t] && oi < idx[t]))) {
                keys[t] = ok;
                idx[t] = oi;
            }
        }
        __syncthreads();
    }
    const u32 r = idx[0];
    __syncthreads();
    return r;
}

extern "C" __global__ void canvas_draw_f32(const float* x, float* processed, int* amax, int* drawn,
                                           float* ent, u32 n, float scale, u32 seed_lo,
                                           u32 seed_hi) {
    __shared__ u32 keys[CANVAS_THREADS];
    __shared__ u32 idx[CANVAS_THREADS];
    __shared__ float sz[CANVAS_THREADS];
    __shared__ float sez[CANVAS_THREADS];
    const u32 t = threadIdx.x, r = blockIdx.x;
    const float* xr = x + (size_t)r * n;
    float* pr = processed + (size_t)r * n;
    u32 bk = 0, bi = 0xffffffffu;
    for (u32 j = t; j < n; j += CANVAS_THREADS) {
        const float v = xr[j];
        pr[j] = v * scale;
        const u32 k = canvas_key(v);
        if (bi == 0xffffffffu || k > bk) {  // strides visit indices in order: ties keep the first
            bk = k;
            bi = j;
        }
    }
    const u32 a = canvas_best(keys, idx, bk, bi);
    const float m = xr[a] * scale;
    if ((((u32)__float_as_int(m)) & 0x7f800000u) == 0x7f800000u) {
        if (t == 0) {
            amax[r] = (int)a;
            drawn[r] = (int)a;
            ent[r] = 0.0f;
        }
        return;
    }
    const u32 key = canvas_row_key(seed_lo, seed_hi, r);
    float z = 0.0f, ez = 0.0f;
    bk = 0;
    bi = 0xffffffffu;
    for (u32 j = t; j < n; j += CANVAS_THREADS) {
        const float v = xr[j] * scale;
        const float d = v - m;
        if (d > -3.4e38f) {
            const float e = expf(d);
            z += e;
            ez += e * d;
        }
        const float g = -logf(canvas_exponential(canvas_mix32(j ^ key)));
        const u32 k = canvas_key(v + g);
        if (bi == 0xffffffffu || k > bk) {
            bk = k;
            bi = j;
        }
    }
    sz[t] = z;
    sez[t] = ez;
    __syncthreads();
    for (u32 s = CANVAS_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) {
            sz[t] += sz[t + s];
            sez[t] += sez[t + s];
        }
        __syncthreads();
    }
    const float tz = sz[0], tez = sez[0];
    const u32 d = canvas_best(keys, idx, bk, bi);
    if (t == 0) {
        amax[r] = (int)a;
        drawn[r] = (int)d;
        ent[r] = fmaxf(logf(tz) - tez / tz, 0.0f);
    }
}

extern "C" __global__ void canvas_accept(const int* amax, const int* drawn, const float* ent,
                                         int* canvas, int* history, int* status, u32 n,
                                         u32 stability, u32 vocab, float bound,
                                         float confidence, u32 seed_lo, u32 seed_hi) {
    __shared__ float sorted[CANVAS_MAX];
    __shared__ float cum[CANVAS_MAX];
    __shared__ u32 rank_of[CANVAS_MAX];
    __shared__ int accepted[CANVAS_MAX];
    __shared__ int unstable;
    const u32 t = threadIdx.x;
    if (t == 0) unstable = 0;
    // Ranks: lower entropy first, then lower index.
    for (u32 i = t; i < n; i += CANVAS_THREADS) {
        const u32 ki = canvas_key(ent[i]);
        u32 rank = 0;
        for (u32 j = 0; j < n; j++) {
            const u32 kj = canvas_key(ent[j]);
            if (kj < ki || (kj == ki && j < i)) rank++;
        }
        rank_of[i] = rank;
        sorted[rank] = ent[i];
    }
    __syncthreads();
    if (t == 0) {
        float s = 0.0f;
        for (u32 r = 0; r < n; r++) {
            s += sorted[r];
            cum[r] = s;
        }
    }
    for (u32 i = t; i < n; i += CANVAS_THREADS) {
        for (u32 h = 0; h < stability; h++) {
            if (history[(size_t)h * n + i] != amax[i]) unstable = 1;
        }
    }
    __syncthreads();
    for (u32 i = t; i < n; i += CANVAS_THREADS) {
        const float e = ent[i];
        const bool acc = cum[rank_of[i]] - e <= bound;
        accepted[i] = acc ? 1 : 0;
        if (acc) {
            canvas[i] = drawn[i];
        } else {
            const u32 h = canvas_mix32(0xffffffffu ^ canvas_row_key(seed_lo, seed_hi, i));
            canvas[i] = (int)(h % vocab);
        }
        for (u32 h = 0; h + 1 < stability; h++) {
            history[(size_t)h * n + i] = history[(size_t)(h + 1) * n + i];
        }
        if (stability > 0) history[(size_t)(stability - 1) * n + i] = amax[i];
    }
    __syncthreads();
    if (t == 0) {
        int count = 0;
        for (u32 i = 0; i < n; i++) count += accepted[i];
        const bool stop = unstable == 0 && cum[n - 1] < confidence * (float)n;
        status[0] = count;
        status[1] = stop ? 1 : 0;
    }
}
