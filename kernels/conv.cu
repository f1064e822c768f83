// The causal depthwise conv1d of the hybrid models' short convolutions, over a batch of
// sequences with carried state (prefill), and as one decode step per sequence on a state pool
// addressed by slot:
//
// - conv1d_decode: y = SiLU?(Σ_k w[c, k] · window[k]) over the last K-1 inputs and the new
//   one; the state [P, K-1, C] is shifted in place.

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


// Prefill over a batch of sequences, seq_start [S + 1] giving each sequence's tokens. A row
// whose sequence cannot be found (seq_start not increasing from 0 to T) is left unwritten;
// nothing outside the tensors is read or written.

// The sequence holding token `r`, or n_seqs if there is none.
__device__ __forceinline__ u32 seq_of_token(const int* seq_start, u32 n_seqs, u32 r) {
    u32 lo = 0, hi = n_seqs;  // the last s with seq_start[s] <= r lies in [lo, hi)
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (seq_start[mid] <= (int)r) lo = mid; else hi = mid;
    }
    if (n_seqs == 0 || seq_start[lo] < 0 || seq_start[lo] > (int)r || seq_start[lo + 1] <= (int)r) return n_seqs;
    return lo;
}

// conv1d: thread per (token, channel). Window position j of token r is input r + j - (K-1),
// taken from the carried state [S, K-1, C] where it falls before the sequence's first token.
extern "C" __global__ void conv1d_f32(const float* x, const float* w, const float* state, const int* seq_start,
                                      float* y, u32 t, u32 c, u32 k, u32 n_seqs, u32 silu_out) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= t * c) return;
    const u32 r = i / c, ch = i % c;
    const u32 s = seq_of_token(seq_start, n_seqs, r);
    if (s >= n_seqs) return;
    const int a = seq_start[s];
    float acc = 0.0f;
    for (u32 j = 0; j < k; j++) {
        const int src = (int)r + (int)j - (int)(k - 1);
        const float xv = src >= a ? x[(size_t)src * c + ch]
                                  : state[((size_t)s * (k - 1) + (u32)((int)r - a + (int)j)) * c + ch];
        acc += w[(size_t)ch * k + j] * xv;
    }
    y[i] = silu_out ? silu(acc) : acc;
}

// The state after each sequence: its last K-1 inputs, counting the carried state before it.
extern "C" __global__ void conv1d_state_f32(const float* x, const float* state, const int* seq_start,
                                            float* state_out, u32 t, u32 c, u32 k, u32 n_seqs) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_seqs * (k - 1) * c) return;
    const u32 s = i / ((k - 1) * c), j = i / c % (k - 1), ch = i % c;
    const int a = seq_start[s], b = seq_start[s + 1];
    if (a < 0 || b < a || b > (int)t) return;
    const u32 at = (u32)(b - a) + j;  // position in (carried state ++ the sequence's inputs)
    state_out[i] = at < k - 1 ? state[((size_t)s * (k - 1) + at) * c + ch] : x[((size_t)a + at - (k - 1)) * c + ch];
}
