// The recurrent layers' decode steps, fused, with state kept in pools addressed by slot:
//
// - conv1d_decode: y = SiLU?(Σ_k w[c, k] · window[k]) over the last K-1 inputs and the new
//   one; the state [P, K-1, C] is shifted in place.
// - delta_net_decode: per (sequence, value head) block: q and k optionally L2-normalised,
//   S ← e^g · S; S += k ⊗ β(v − Sᵀk); o = Sᵀ(q · scale). The state [P, Hv, Dk, Dv] is read
//   from the sequence's slot and written back in place; each thread owns one value column of S
//   (Dk values in registers), so the update needs no synchronisation between columns.

extern "C" __global__ void conv1d_decode_f32(const float* x, const float* w, const int* slots, float* y,
                                             float* state, u32 s, u32 c, u32 k, u32 silu_out, u32 pool) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= s * c) return;
    const u32 seq = i / c, ch = i % c;
    const int slot = slots[seq];
    if (slot < 0 || (u32)slot >= pool) return;  // a bad slot is skipped, never written outside
    float* st = state + (size_t)slot * (k - 1) * c;
    const float xn = x[i];
    float acc = w[(size_t)ch * k + (k - 1)] * xn;
    for (u32 j = 0; j + 1 < k; j++) acc += w[(size_t)ch * k + j] * st[(size_t)j * c + ch];
    for (u32 j = 0; j + 2 < k; j++) st[(size_t)j * c + ch] = st[(size_t)(j + 1) * c + ch];
    if (k > 1) st[(size_t)(k - 2) * c + ch] = xn;
    y[i] = silu_out ? silu(acc) : acc;
}

#define MAX_DK 256

// @hot
extern "C" __global__ void delta_net_decode_f32(const float* q, const float* k, const float* v,
                                                const float* g, const float* beta, const int* slots,
                                                float* o, float* state, u32 hk, u32 hv, u32 dk, u32 dv,
                                                float scale, float l2_eps, u32 l2, u32 pool) {
    __shared__ float qs[MAX_DK], ks[MAX_DK], scratch[WARP];
    const u32 seq = blockIdx.x, h = blockIdx.y, kh = h / (hv / hk);
    const int slot = slots[seq];
    if (slot < 0 || (u32)slot >= pool) return;  // uniform over the block: no barrier skipped
    const float* qh = q + ((size_t)seq * hk + kh) * dk;
    const float* kh_ = k + ((size_t)seq * hk + kh) * dk;
    float qn = 0.0f, kn = 0.0f;
    for (u32 j = threadIdx.x; j < dk; j += blockDim.x) {
        qs[j] = qh[j];
        ks[j] = kh_[j];
        qn += qs[j] * qs[j];
        kn += ks[j] * ks[j];
    }
    __syncthreads();
    float qi = 1.0f, ki = 1.0f;
    if (l2) {
        qi = rsqrtf(block_sum(qn, scratch) + l2_eps);
        ki = rsqrtf(block_sum(kn, scratch) + l2_eps);
    }
    const size_t idx = (size_t)seq * hv + h;
    const float decay = __expf(g[idx]);
    const float b = beta[idx];
    float* S = state + ((size_t)slot * hv + h) * dk * dv;
    for (u32 col = threadIdx.x; col < dv; col += blockDim.x) {
        // Stᵀk for this column, after the decay.
        float sk = 0.0f;
        for (u32 r = 0; r < dk; r++) sk += decay * S[(size_t)r * dv + col] * ks[r] * ki;
        const float delta = b * (v[idx * dv + col] - sk);
        float out = 0.0f;
        for (u32 r = 0; r < dk; r++) {
            const float sv = decay * S[(size_t)r * dv + col] + ks[r] * ki * delta;
            S[(size_t)r * dv + col] = sv;
            out += sv * qs[r] * qi * scale;
        }
        o[idx * dv + col] = out;
    }
}
