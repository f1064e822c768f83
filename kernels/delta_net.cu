// The Gated DeltaNet recurrence, over a batch of sequences (prefill), and as one fused decode
// step per sequence on a state pool addressed by slot:
//
// - delta_net_decode: per (sequence, value head) block: q and k optionally L2-normalised,
//   S ← e^g · S; S += k ⊗ β(v − Sᵀk); o = Sᵀ(q · scale). The state [P, Hv, Dk, Dv] is read
//   from the sequence's slot and written back in place; each thread owns one value column of S
//   (Dk values in registers), so the update needs no synchronisation between columns.

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

// delta_net: one block per (sequence, value head), the sequence's tokens in order. The state
// is copied to state_out and updated there; each thread owns value columns of S, so only the
// shared q/k rows need barriers. Per token, with a = e^g:
//   o = scale · (a·Sᵀq + (k·q)·δ),  δ = β(v − a·Sᵀk),  S ← a·S + k ⊗ δ
// (the same function as the CPU's, one read and one write of S per token). The chunked (WY)
// form would put the work on tensor cores; this is the sequential form.
extern "C" __global__ void delta_net_f32(const float* q, const float* k, const float* v, const float* g,
                                         const float* beta, const float* state, const int* seq_start, float* o,
                                         float* state_out, u32 hk, u32 hv, u32 dk, u32 dv, u32 t, float scale) {
    __shared__ float qs[MAX_DK], ks[MAX_DK];
    const u32 seq = blockIdx.x, h = blockIdx.y, kh = h / (hv / hk);
    const int a = seq_start[seq], b = seq_start[seq + 1];
    if (a < 0 || b < a || b > (int)t) return;  // uniform over the block: no barrier skipped
    const size_t sz = (size_t)dk * dv;
    const float* S0 = state + ((size_t)seq * hv + h) * sz;
    float* S = state_out + ((size_t)seq * hv + h) * sz;
    for (u32 col = threadIdx.x; col < dv; col += blockDim.x)
        for (u32 r = 0; r < dk; r++) S[(size_t)r * dv + col] = S0[(size_t)r * dv + col];
    for (int tok = a; tok < b; tok++) {
        __syncthreads();  // the previous token's q/k rows are no longer read
        for (u32 j = threadIdx.x; j < dk; j += blockDim.x) {
            qs[j] = q[((size_t)tok * hk + kh) * dk + j];
            ks[j] = k[((size_t)tok * hk + kh) * dk + j];
        }
        __syncthreads();
        const size_t idx = (size_t)tok * hv + h;
        const float decay = __expf(g[idx]), bt = beta[idx];
        for (u32 col = threadIdx.x; col < dv; col += blockDim.x) {
            float sk = 0.0f, sq = 0.0f, kq = 0.0f;
            for (u32 r = 0; r < dk; r++) {
                const float sv = S[(size_t)r * dv + col];
                sk += sv * ks[r];
                sq += sv * qs[r];
                kq += ks[r] * qs[r];
            }
            const float delta = bt * (v[idx * dv + col] - decay * sk);
            o[idx * dv + col] = scale * (decay * sq + kq * delta);
            for (u32 r = 0; r < dk; r++) S[(size_t)r * dv + col] = decay * S[(size_t)r * dv + col] + ks[r] * delta;
        }
    }
}
