// Writes k [T, H, D] and v [T, H, Dv] (f32) into paged caches [B, bs, H, D] at slots [T]
// (slot = block * bs + offset); a negative slot, or one past the cache's n_slots rows, is
// skipped. f32 and f16 caches.

template <typename C>
__device__ void kv_write(const float* k, const float* v, const int* slots, C* kc, C* vc, u32 t, u32 hd,
                         u32 hdv, u32 n_slots) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 row = hd + hdv;
    if (i >= t * row) return;
    const u32 tok = i / row, j = i % row;
    const int s = slots[tok];
    if (s < 0 || (u32)s >= n_slots) return;
    if (j < hd) {
        from_f32(k[(size_t)tok * hd + j], &kc[(size_t)s * hd + j]);
    } else {
        const u32 jv = j - hd;
        from_f32(v[(size_t)tok * hdv + jv], &vc[(size_t)s * hdv + jv]);
    }
}

extern "C" __global__ void kv_write_f32(const float* k, const float* v, const int* slots, float* kc,
                                        float* vc, u32 t, u32 hd, u32 hdv, u32 n_slots) {
    kv_write(k, v, slots, kc, vc, t, hd, hdv, n_slots);
}

extern "C" __global__ void kv_write_f16(const float* k, const float* v, const int* slots, __half* kc,
                                        __half* vc, u32 t, u32 hd, u32 hdv, u32 n_slots) {
    kv_write(k, v, slots, kc, vc, t, hd, hdv, n_slots);
}

// Any cache format (codes in formats.cuh), K and V each its own: one thread per 32-value block
// of a token's row, encoding it with the CPU reference's arithmetic (core/src/quant: q8_0 and
// q4_0 as ggml does, the TurboQuant blocks as quant/turbo.rs documents; floats rounded to
// nearest even). A block's bytes are its thread's alone.
// (Every field sits at an even address: block and row sizes are even; f32 rows at multiples
// of 4.)
__device__ __forceinline__ void kv_store_f16(u8* p, float v) { *(__half*)p = __float2half_rn(v); }

// The residual sketch of a tq4p/tq3p block whose codes block (f16 scale, `bits`-bit codes) is
// written at `out`: r = x - the codes' values, y = H32 * D * r (turbo.rs's butterflies, in its
// order), the signs of y and rho = |r|^2 / sum |y| after the codes.
__device__ void kv_sketch32(u32 bits, const float* x, u8* out) {
    const u32 cb = 2u + 4u * bits;
    const float s = f16_at(out);
    float r[32];
    float norm2 = 0.0f;
    for (u32 j = 0; j < 32; j++) {
        const u32 bit = j * bits, at = 2u + bit / 8u;
        const u32 two = out[at] | ((at + 1u < cb ? (u32)out[at + 1u] : 0u) << 8);
        const u32 code = (two >> (bit % 8u)) & ((1u << bits) - 1u);
        const float v = __fsub_rn(x[j], __fmul_rn(s, kv_tq_point(bits, code)));
        norm2 = __fadd_rn(norm2, __fmul_rn(v, v));
        r[j] = ((KV_QJL_SIGNS >> j) & 1u) ? -v : v;
    }
    for (u32 h = 1; h < 32; h *= 2)
        for (u32 i = 0; i < 32; i += 2 * h)
            for (u32 j = i; j < i + h; j++) {
                const float a = r[j], c = r[j + h];
                r[j] = a + c;
                r[j + h] = a - c;
            }
    u32 sigma = 0;
    float l1 = 0.0f;
    for (u32 j = 0; j < 32; j++) {
        if (r[j] < 0.0f) sigma |= 1u << j;
        l1 += fabsf(r[j]);
    }
    for (u32 k = 0; k < 4; k++) out[cb + k] = (u8)(sigma >> (8 * k));
    kv_store_f16(out + cb + 4, l1 > 0.0f ? norm2 / l1 : 0.0f);
}

// 1 / the root mean square of a block of 32 (summed in order and rounded as the CPU does), or 0
// for a zero, NaN or infinite block, which the TurboQuant writers leave all zero (scale 0).
__device__ float kv_inverse_rms(const float* x) {
    float sumsq = 0.0f;
    for (int j = 0; j < 32; j++) sumsq = __fadd_rn(sumsq, __fmul_rn(x[j], x[j]));
    const float sigma = sqrtf(sumsq / 32.0f);
    if (!(sigma > 0.0f) || sigma > 3.0e38f) return 0.0f;
    return 1.0f / sigma;
}

// A tq3t/tq2t block (turbo.rs's trellis quantizer, in its order and rounding): the Viterbi
// search over the 8 states for the path of least squared error against x / sigma (ties: the
// lower state, then the lower branch, then the lower point), then the least-squares scale for
// its points. A step into state nt comes by branch bit nt & 1 from state (nt >> 1) | (top << 2):
// from[i] keeps, per state, that top bit and the point within the subset (4 bits a state).
__device__ void kv_trellis32(u32 bits, const float* x, u8* out) {
    const u32 bytes = 2u + 4u * bits, per = 1u << (bits - 1u);
    for (u32 j = 0; j < bytes; j++) out[j] = 0;
    const float inv = kv_inverse_rms(x);
    if (inv == 0.0f) return;
    float cost[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    u32 live = 1u, from[32];
    for (u32 i = 0; i < 32; i++) {
        const float z = __fmul_rn(x[i], inv);
        float next[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        u32 nlive = 0u, f = 0u;
        for (u32 t = 0; t < 8; t++) {
            if (!(live & (1u << t))) continue;
            for (u32 u = 0; u < 2; u++) {
                const u32 k = 2u * u + (__popc(t & 5u) & 1u);
                u32 bj = 0;
                float bd = 0.0f;
                for (u32 j = 0; j < per; j++) {
                    const float e = __fsub_rn(z, __fmul_rn(0.9f, kv_tq_point(bits + 1u, 4u * j + k)));
                    const float d = __fmul_rn(e, e);
                    if (j == 0 || d < bd) bj = j, bd = d;
                }
                const u32 nt = (2u * t + u) & 7u;
                const float c = __fadd_rn(cost[t], bd);
                if (!(nlive & (1u << nt)) || c < next[nt]) {
                    next[nt] = c;
                    nlive |= 1u << nt;
                    f = (f & ~(15u << (4u * nt))) | (((t >> 2) | (bj << 1)) << (4u * nt));
                }
            }
        }
        for (u32 t = 0; t < 8; t++) cost[t] = next[t];
        live = nlive;
        from[i] = f;
    }
    u32 t = 0;
    for (u32 s = 1; s < 8; s++)
        if (cost[s] < cost[t]) t = s;
    u32 codes[32];
    for (int i = 31; i >= 0; i--) {
        const u32 f = (from[i] >> (4u * t)) & 15u;
        codes[i] = (t & 1u) | ((f >> 1) << 1);
        t = (t >> 1) | ((f & 1u) << 2);
    }
    float num = 0.0f, den = 0.0f;
    t = 0;
    for (u32 i = 0; i < 32; i++) {
        const u32 code = codes[i];
        const float pt = kv_tcq_point(bits, code, __popc(t & 5u) & 1u);
        num = __fadd_rn(num, __fmul_rn(x[i], pt));
        den = __fadd_rn(den, __fmul_rn(pt, pt));
        t = (2u * t + (code & 1u)) & 7u;
        const u32 bit = i * bits, c = code << (bit % 8u);
        out[2 + bit / 8u] |= (u8)c;
        if (c >> 8) out[3 + bit / 8u] |= (u8)(c >> 8);
    }
    kv_store_f16(out, den > 0.0f ? num / den : 0.0f);
}

__device__ void kv_encode32(u32 f, const float* x, u8* out) {
    switch (f) {
        case 0:
            for (int j = 0; j < 32; j++) ((float*)out)[j] = x[j];
            return;
        case 1:
            for (int j = 0; j < 32; j++) kv_store_f16(out + 2 * j, x[j]);
            return;
        case 2:
            for (int j = 0; j < 32; j++) ((__nv_bfloat16*)out)[j] = __float2bfloat16_rn(x[j]);
            return;
        case 3: {
            float amax = 0.0f;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            kv_store_f16(out, d);
            for (int j = 0; j < 32; j++) {
                const float r = roundf(x[j] * id);  // halves away from zero
                out[2 + j] = (u8)(i8)(r >= 127.0f ? 127 : (r <= -128.0f ? -128 : (int)r));
            }
            return;
        }
        case 4: {
            float mx = x[0], amax = fabsf(x[0]);
            for (int j = 1; j < 32; j++)
                if (fabsf(x[j]) > amax) {
                    amax = fabsf(x[j]);
                    mx = x[j];
                }
            const float d = mx / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            kv_store_f16(out, d);
            int q[32];
            for (int j = 0; j < 32; j++) {
                const float v = x[j] * id + 8.5f;
                q[j] = v > 0.0f ? (v < 15.0f ? (int)v : 15) : 0;
            }
            for (int j = 0; j < 16; j++) out[2 + j] = (u8)(q[j] | (q[j + 16] << 4));
            return;
        }
        default: {
            if (f >= 10u) {
                kv_trellis32(kv_tq_bits(f), x, out);
                return;
            }
            const u32 bits = kv_tq_bits(f), n = 1u << (bits - 1u), bytes = kv_tq_bytes(f);
            for (u32 j = 0; j < bytes; j++) out[j] = 0;
            const float inv = kv_inverse_rms(x);
            if (inv == 0.0f) return;
            // Rounded as the CPU rounds (no fused multiply-adds: NVRTC fuses by default).
            float num = 0.0f, den = 0.0f;
            for (u32 j = 0; j < 32; j++) {
                const float v = x[j], a = fabsf(v * inv);
                u32 k = 0;
                while (k + 1 < n && a > 0.5f * (kv_tq_half(bits, k) + kv_tq_half(bits, k + 1))) k++;
                const float pt = v < 0.0f ? -kv_tq_half(bits, k) : kv_tq_half(bits, k);
                const u32 code = v < 0.0f ? n - 1 - k : n + k;
                num = __fadd_rn(num, __fmul_rn(v, pt));
                den = __fadd_rn(den, __fmul_rn(pt, pt));
                const u32 bit = j * bits, c = code << (bit % 8u);
                out[2 + bit / 8u] |= (u8)c;
                if (c >> 8) out[3 + bit / 8u] |= (u8)(c >> 8);
            }
            kv_store_f16(out, den > 0.0f ? num / den : 0.0f);
            if (kv_tq_sketched(f)) kv_sketch32(bits, x, out);
            return;
        }
    }
}

extern "C" __global__ void kv_write_kv(const float* k, const float* v, const int* slots, u8* kc, u8* vc, u32 t,
                                       u32 hd, u32 hdv, u32 n_slots, u32 kfmt, u32 vfmt) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 kb = hd / 32u, row = kb + hdv / 32u;
    if (i >= t * row) return;
    const u32 tok = i / row, b = i % row;
    const int s = slots[tok];
    if (s < 0 || (u32)s >= n_slots) return;
    if (b < kb) {
        const u32 rb = kv_row_bytes(kfmt, hd);
        kv_encode32(kfmt, k + (size_t)tok * hd + b * 32u, kc + (size_t)s * rb + kv_row_bytes(kfmt, b * 32u));
    } else {
        const u32 bv = b - kb, rb = kv_row_bytes(vfmt, hdv);
        kv_encode32(vfmt, v + (size_t)tok * hdv + bv * 32u, vc + (size_t)s * rb + kv_row_bytes(vfmt, bv * 32u));
    }
}

// RoPE of q (into q_out) and of k, and the K/V write of the rotated k and of v, in one launch:
// rope_f32's and kv_write's arithmetic (f32 and f16 caches). One thread per unit of a token: a
// rotary pair or pass-through dim of a query head, the same of a key head (written to the
// cache at the token's slot), or a value dim. A negative slot, or one past the cache's n_slots
// rows, writes nothing to the cache (the token's q is still rotated).
template <typename C>
__device__ void rope_kv_write(const float* q, const float* k, const float* v, const int* pos,
                              const int* slots, const float* factors, float* qo, C* kc, C* vc, u32 t,
                              u32 hq, u32 hkv, u32 d, u32 dv, u32 n_rot, u32 neox, float base,
                              float freq_scale, float attn_factor, u32 has_factors, u32 n_slots) {
    const u32 half = n_rot / 2, per_head = d - half;
    const u32 uq = hq * per_head, uk = hkv * per_head, uv = hkv * dv;
    const u32 per_tok = uq + uk + uv;
    const u32 idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= t * per_tok) return;
    const u32 tok = idx / per_tok;
    u32 rem = idx % per_tok;
    const int s = slots[tok];
    const bool write = s >= 0 && (u32)s < n_slots;
    if (rem >= uq + uk) {
        // A value dim.
        if (!write) return;
        const u32 j = rem - uq - uk;
        from_f32(v[(size_t)tok * uv + j], &vc[(size_t)s * uv + j]);
        return;
    }
    const bool is_q = rem < uq;
    if (!is_q) {
        if (!write) return;
        rem -= uq;
    }
    const u32 head = rem / per_head, j = rem % per_head;
    const float* x = is_q ? q + ((size_t)tok * hq + head) * d : k + ((size_t)tok * hkv + head) * d;
    // Element e of the head's output: q_out's row, or the cache row at the slot.
    auto put = [&](u32 e, float val) {
        if (is_q)
            qo[((size_t)tok * hq + head) * d + e] = val;
        else
            from_f32(val, &kc[((size_t)s * hkv + head) * d + e]);
    };
    if (j >= half) {
        // A pass-through dim.
        const u32 e = j - half + n_rot;
        if (e < d) put(e, x[e]);
        return;
    }
    u32 i0, i1;
    float y0, y1;
    rope_turn(x, factors, has_factors, pos[tok], j, n_rot, neox, base, freq_scale, attn_factor, i0, i1, y0,
              y1);
    put(i0, y0);
    put(i1, y1);
}

extern "C" __global__ void rope_kv_write_f32(const float* q, const float* k, const float* v, const int* pos,
                                             const int* slots, const float* factors, float* qo, float* kc,
                                             float* vc, u32 t, u32 hq, u32 hkv, u32 d, u32 dv, u32 n_rot,
                                             u32 neox, float base, float freq_scale, float attn_factor,
                                             u32 has_factors, u32 n_slots) {
    rope_kv_write(q, k, v, pos, slots, factors, qo, kc, vc, t, hq, hkv, d, dv, n_rot, neox, base, freq_scale,
                  attn_factor, has_factors, n_slots);
}

extern "C" __global__ void rope_kv_write_f16(const float* q, const float* k, const float* v, const int* pos,
                                             const int* slots, const float* factors, float* qo, __half* kc,
                                             __half* vc, u32 t, u32 hq, u32 hkv, u32 d, u32 dv, u32 n_rot,
                                             u32 neox, float base, float freq_scale, float attn_factor,
                                             u32 has_factors, u32 n_slots) {
    rope_kv_write(q, k, v, pos, slots, factors, qo, kc, vc, t, hq, hkv, d, dv, n_rot, neox, base, freq_scale,
                  attn_factor, has_factors, n_slots);
}
