// RoPE on x [T, H, D] (f32): pairs (2i, 2i+1) (normal) or (i, i + n_rot/2) (neox) of the first
// n_rot dims turn by pos * freq_scale * base^(-2i/n_rot) / factor[i]; dims past n_rot pass
// through. One thread per pair.
extern "C" __global__ void rope_f32(const float* x, const int* pos, const float* factors, float* y,
                                    u32 t, u32 h, u32 d, u32 n_rot, u32 neox, float base,
                                    float freq_scale, float attn_factor, u32 has_factors) {
    const u32 half = n_rot / 2;
    const u32 idx = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 per_tok = h * (d - half);
    if (idx >= t * per_tok) return;
    const u32 tok = idx / per_tok;
    const u32 rem = idx % per_tok;
    const u32 head = rem / (d - half);
    const u32 j = rem % (d - half);
    const size_t row = ((size_t)tok * h + head) * d;
    if (j >= half) {
        // A pass-through dim (one thread per dim past n_rot).
        const u32 k = j - half + n_rot;
        if (k < d) y[row + k] = x[row + k];
        return;
    }
    u32 i0, i1;
    float y0, y1;
    rope_turn(x + row, factors, has_factors, pos[tok], j, n_rot, neox, base, freq_scale, attn_factor, i0, i1,
              y0, y1);
    y[row + i0] = y0;
    y[row + i1] = y1;
}
