// Prefill matmuls on the tensor cores (the MM_TC=1 knob, for the weight formats with codes:
// TcCodes below): y [M, N] = x [M, K] · w [N, K]ᵀ in two launches, K a multiple of
// 32, and the grouped MoE matmul (mat_mul.cu's mat_mul_id_grouped) on the same tiles.
//
// 1. tc_split writes each activation row once as MM_PARTS exact bf16 parts (split_parts) in
//    the order the tile stages them: for each 32-value step and part, 16 words of bf16 pairs,
//    each 16-value half in tcc_pos order; and the sum of every 16 values (f32, in a fixed
//    order) for the formats' offsets. Layout of the scratch: the M rows' parts (2 · MM_PARTS
//    · K bytes a row), then the M rows' sums (K / 16 floats a row).
// 2. mat_mul_tc_<fmt> takes 128 weight rows × 64 activation rows a block of 256 threads: 8
//    warps of 32 × 32 outputs (2 × 4 fragments of 4 accumulators a lane, and as many for the
//    group being summed; mma.m16n8k16, the weight's codes as A, a part's activation rows as
//    B). Each 32-value step, the activation parts of the next step are copied by cp.async
//    into the other half of a two-stage ring (no registers hold them, nothing converts
//    them), the weight's raw words of the next step are loaded into registers (thread t:
//    rows r and r + 8 of a fragment tile, 8 values), and this step's codes go into shared
//    memory while those loads are in flight. Per step and warp: 48 mma (3 parts), 32
//    eight-byte fragment loads, and per group 2 FMA an output (acc += a · Σcx + b · Σx).
//
// Why 128 × 64: an activation value is 6 bytes here (3 parts), read once per block of
// weight rows, so the block's weight rows set the bytes a multiply-add takes from L2; the
// weight's codes are decoded once per block of activation rows, which sets the decoding a
// multiply-add takes. Against mat_mul.cu's split tile (which MM_TC=1 leaves to the formats
// without codes): exact products, the activations split once instead of once per block, and
// each warp's fragments feed twice the mma.

// ---- The weight formats' codes -------------------------------------------------------------
// A weight value of these formats is a · c + b: c a small integer code (|c| ≤ 255, so exact
// in bf16, whose 8 significant bits hold it), a and b one pair for a group of G values (16 or
// 32; b = 0 where the format has no offset). So for one group and one activation row,
//   Σ w_i x_i = a · Σ c_i x_i + b · Σ x_i.
// The tiles below multiply the codes into activations split exactly into bf16 parts, so
// every product is exact and only the f32 sums round.

// Bytes i and i + 1 (0..3, compile-time constants) of w, as codes u, as the bf16 pair
// (u_i - bias, u_(i+1) - bias): exact for results below 256 in magnitude (byte_as_float's
// float has at most 8 significant bits, so its top half is the bf16).
__device__ __forceinline__ u32 bf16_pair(u32 w, u32 i, float bias) {
    const float f0 = byte_as_float(w, i, 8388608.0f + bias), f1 = byte_as_float(w, i + 1, 8388608.0f + bias);
    return __byte_perm(__float_as_uint(f0), __float_as_uint(f1), 0x7632);
}

// The 8 code bytes of q (two words) as 4 bf16 pairs, less bias.
__device__ __forceinline__ void bf16_pairs8(uint2 q, float bias, u32* c) {
    c[0] = bf16_pair(q.x, 0, bias), c[1] = bf16_pair(q.x, 2, bias);
    c[2] = bf16_pair(q.y, 0, bias), c[3] = bf16_pair(q.y, 2, bias);
}

// Which formats have codes, their group size G, and codes(): the 8 values at v (a multiple
// of 8, from B::fetch's raw words) as 4 bf16 pairs (value v + 2i in the low half of c[i]),
// with their group's a and b.
template <typename B>
struct TcCodes {
    static constexpr bool value = false;
};
template <>
struct TcCodes<Q8_0> {
    static constexpr bool value = true, plain = false;
    static constexpr u32 G = 32;
    __device__ static void codes(const Q8_0::Raw& r, u32, u32* c, float& a, float& b) {
        const uint2 u = {r.q.x ^ 0x80808080u, r.q.y ^ 0x80808080u};  // int8 + 128
        bf16_pairs8(u, 128.0f, c);
        a = f16_bits(r.d), b = 0.0f;
    }
};
template <>
struct TcCodes<Q4_0> {
    static constexpr bool value = true, plain = false;
    static constexpr u32 G = 32;
    __device__ static void codes(const Q4_0::Raw& r, u32 v, u32* c, float& a, float& b) {
        const u32 sh = v % 32 < 16 ? 0 : 4;
        bf16_pairs8({(r.q.x >> sh) & 0x0F0F0F0Fu, (r.q.y >> sh) & 0x0F0F0F0Fu}, 8.0f, c);
        a = f16_bits(r.d), b = 0.0f;
    }
};
template <>
struct TcCodes<Q4_1> {
    static constexpr bool value = true, plain = false;
    static constexpr u32 G = 32;
    __device__ static void codes(const Q4_1::Raw& r, u32 v, u32* c, float& a, float& b) {
        const u32 sh = v % 32 < 16 ? 0 : 4;
        bf16_pairs8({(r.q.x >> sh) & 0x0F0F0F0Fu, (r.q.y >> sh) & 0x0F0F0F0Fu}, 0.0f, c);
        a = f16_bits(r.dm & 0xFFFF), b = f16_bits(r.dm >> 16);
    }
};
template <>
struct TcCodes<Q4_K> {
    static constexpr bool value = true, plain = false;
    static constexpr u32 G = 32;
    __device__ static void codes(const Q4_K::Raw& r, u32 v, u32* c, float& a, float& b) {
        const u32 g = (v % Q4_K::QK) / 32, sh = 8 * (g & 3);
        const u32 s0 = (r.s0 >> sh) & 0xFF, s1 = (r.s1 >> sh) & 0xFF, s2 = (r.s2 >> sh) & 0xFF;
        const float sc = (float)(g < 4 ? (s0 & 63) : ((s2 & 0xF) | ((s0 >> 6) << 4)));
        const float m = (float)(g < 4 ? (s1 & 63) : ((s2 >> 4) | ((s1 >> 6) << 4)));
        const u32 shift = 4 * (g % 2);
        bf16_pairs8({(r.q.x >> shift) & 0x0F0F0F0Fu, (r.q.y >> shift) & 0x0F0F0F0Fu}, 0.0f, c);
        // Q4_K's own arithmetic (decode): d · sc and dmin · m, each one rounding.
        a = f16_bits(r.dm & 0xFFFF) * sc, b = -(f16_bits(r.dm >> 16) * m);
    }
};
template <>
struct TcCodes<Q6_K> {
    static constexpr bool value = true, plain = false;
    static constexpr u32 G = 16;
    __device__ static void codes(const Q6_K::Raw& r, u32 v, u32* c, float& a, float& b) {
        const u32 q = (v % 128) / 32, lshift = q < 2 ? 0 : 4, hshift = 2 * q;
        const uint2 u = {((r.ql.x >> lshift) & 0x0F0F0F0Fu) | (((r.qh.x >> hshift) & 0x03030303u) << 4),
                         ((r.ql.y >> lshift) & 0x0F0F0F0Fu) | (((r.qh.y >> hshift) & 0x03030303u) << 4)};
        bf16_pairs8(u, 32.0f, c);
        a = f16_bits(r.d) * (float)(i8)r.sc, b = 0.0f;
    }
};
template <>
struct TcCodes<BF16W> {
    static constexpr bool value = true, plain = true;
    static constexpr u32 G = 32;
    __device__ static void codes(const BF16W::Raw& r, u32, u32* c, float& a, float& b) {
#pragma unroll
        for (int i = 0; i < 4; i++) c[i] = r.w[i];
        a = 1.0f, b = 0.0f;
    }
};

// The activations are split exactly into MM_PARTS bf16 parts (x = x_1 + x_2 + x_3, 8
// significant bits each: split_parts), so every product c_i · x_p,i (at most 16 significant
// bits) is exact in the f32 accumulator of mma.m16n8k16, and the only roundings are the f32
// sums', as in the FMA tile: the group's Σ c_i x_i over its parts (smallest first), then
// acc += a · C + b · Σx per group. With MM_PARTS=2 the activations keep 16 of their 24 bits
// (|x - x_1 - x_2| ≤ 2^-16 |x|, a measurement knob: it takes a third less tensor time).
// bf16 weights are their own codes (a = 1, b = 0) and accumulate straight into the result.
#ifndef MM_PARTS
#define MM_PARTS 3
#endif
static_assert(MM_PARTS == 2 || MM_PARTS == 3, "MM_PARTS: 2 or 3 bf16 parts an activation");

// v as MM_PARTS bf16 (bit patterns) that sum to it: p[0] = bf16(v), p[1] = bf16(v - p[0]),
// p[2] = v - p[0] - p[1]. Each difference is exact in f32 and has at most 16, then 8,
// significant bits, so the third part is exact: the parts are v (2 parts: to 2^-16 |v|). A
// non-finite v keeps the rest zero.
__device__ __forceinline__ void split_parts(float v, u32* p) {
    split_bf16(v, p[0], p[1]);
#if MM_PARTS == 3
    const float rest = (v - __uint_as_float(p[0] << 16)) - __uint_as_float(p[1] << 16);
    p[2] = (p[0] & 0x7F80u) == 0x7F80u ? 0u : (u32)__bfloat16_as_ushort(__float2bfloat16_rn(rest));
#endif
}

// Where word i (0..7: values 2i, 2i + 1 of a 16-value half) goes in its staged half.
__device__ __forceinline__ u32 tcc_pos(u32 i) { return i < 4 ? 2 * i : 2 * (i - 4) + 1; }

#define TC_THREADS 256
#define TC_ROWS_W 128  // weight rows a block
#define TC_ROWS_X 64   // activation rows a block
#define TC_STEP 32     // values of K a step
#define TC_SPLIT_THREADS 128
#define TC_SPLIT_VALUES 1024  // values a tc_split block takes: 8 a thread
// Shared memory a block: codes 8 KB, parts 2 × 12 KB (3 parts), scales and sums 3 KB.
// Blocks an SM must hold (__launch_bounds__): 1 lets ptxas take up to 255 registers a thread
// (the 64 accumulators, fragments, the next step's raw weight words and copy addresses);
// TC_BLOCKS=2 (128 registers) is a knob for the sweep.
#ifndef TC_BLOCKS
#define TC_BLOCKS 1
#endif

// Bytes of tc_split's output for m rows of k values.
__device__ __forceinline__ size_t tc_part_bytes(u32 k) { return (size_t)k * 2 * MM_PARTS; }

// Grid (m, ceil(k / 1024)), TC_SPLIT_THREADS threads; each thread 8 values (a quarter of a step).
// @hot
extern "C" __global__ void __launch_bounds__(TC_SPLIT_THREADS) tc_split(const float* x, float* out, u32 m, u32 k) {
    const u32 r = blockIdx.x, v0 = blockIdx.y * TC_SPLIT_VALUES + 8 * threadIdx.x;
    const bool mine = v0 < k;
    const float* xr = x + (size_t)r * k + v0;
    const bool al = ((size_t)x & 15u) == 0;  // every row alike: k % 32 == 0
    float xv[8];
    if (mine && al) {
        const float4 a = *(const float4*)xr, b = *(const float4*)(xr + 4);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) xv[i] = mine ? xr[i] : 0.0f;
    }
    u32 part[8][MM_PARTS];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        split_parts(xv[i], part[i]);
        s += xv[i];
    }
    s += __shfl_xor_sync(0xffffffffu, s, 1);  // the other 8 of the half (every lane takes part)
    if (!mine) return;
    u8* row = (u8*)out + (size_t)r * tc_part_bytes(k);
    const u32 step = v0 / 32, h = (v0 % 32) / 16, i0 = (v0 % 16) / 2;
#pragma unroll
    for (int p = 0; p < MM_PARTS; p++) {
        u32* dst = (u32*)(row + ((size_t)step * MM_PARTS + p) * 64) + 8 * h;
#pragma unroll
        for (u32 i = 0; i < 4; i++) dst[tcc_pos(i0 + i)] = part[2 * i][p] | (part[2 * i + 1][p] << 16);
    }
    if (i0 == 0) {
        float* sums = (float*)((u8*)out + (size_t)m * tc_part_bytes(k));
        sums[(size_t)r * (k / 16) + v0 / 16] = s;
    }
}

// The swizzled word of a staged row: logical word w of pair row pr of the codes (32 words a
// pair row) and of activation row r of a part (16 words a row). Both keep 16-byte chunks
// whole and put a half-warp's 8-byte fragment loads (rows g .. g + 3) on 32 banks.
__device__ __forceinline__ u32 tc_wswz(u32 pr, u32 w) { return pr * 32 + (w ^ ((pr & 3) << 3)); }
__device__ __forceinline__ u32 tc_xswz(u32 r, u32 w) { return r * 16 + (w ^ (((r >> 1) & 1) << 3)); }

// xp: tc_split's output for x's mx rows; w: the weight matrix [n, k], its first byte 16-byte
// aligned when A is 16 (then every block's fields are aligned as B::fetch<16> reads them:
// rows are whole blocks); rows: the tile's activation and output rows (DenseRows, or an
// expert's SlotRows). With splits > 1, block z of the grid's third dimension takes its share
// of the K steps (its caller points y at its own sums, which tc_reduce adds up in order).
template <typename B, u32 A, typename Rows>
__device__ __forceinline__ void mat_mul_tc(const u8* xp, const u8* w, float* y, Rows rows, u32 mx, u32 n, u32 k,
                                           u32 splits) {
    typedef TcCodes<B> Codes;
    __shared__ uint4 ws_[TC_ROWS_W / 2 * 32 / 4];            // codes: pair rows of 32 words
    __shared__ uint4 xs_[2][MM_PARTS][TC_ROWS_X * 16 / 4];  // the ring of activation parts
    __shared__ float2 wab[TC_ROWS_W][2];                    // a, b of each weight row's halves
    __shared__ float2 xsum[2][TC_ROWS_X];                   // Σx of each activation row's halves
    const u32 t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    const u32 g = lane / 4, q = lane % 4;
    const u32 wm = (warp % 4) * 32, wn = (warp / 4) * 32;  // the warp's weight rows, activation rows
    const u32 col0 = blockIdx.x * TC_ROWS_W;
    const u32 per = (k / TC_STEP + splits - 1) / splits, first = blockIdx.z * per;
    const u32 last = min(k / TC_STEP, first + per);  // steps first .. last
    const uint2* ws = (const uint2*)ws_;
    const float* sums = (const float*)(xp + (size_t)mx * tc_part_bytes(k));
    // The weight: pair row pr (rows r0 and r0 + 8), values 16 h + 8 qq .. + 8 of each step.
    const u32 pr = t / 4, h = (t / 2) % 2, qq = t % 2;
    const u32 r0 = 16 * (pr / 8) + pr % 8;
    const u8* wrow0 = weight_row<B>(w, col0 + r0 < n ? col0 + r0 : 0, k);
    const u8* wrow1 = weight_row<B>(w, col0 + r0 + 8 < n ? col0 + r0 + 8 : 0, k);
    typename B::Raw raw[2];
    auto fetch_w = [&](u32 s) {
        raw[0] = B::template fetch<A>(wrow0, TC_STEP * s + 16 * h + 8 * qq);
        raw[1] = B::template fetch<A>(wrow1, TC_STEP * s + 16 * h + 8 * qq);
    };
    // The activation parts: each step, 64 rows × MM_PARTS × 64 bytes as 16-byte copies, TC_X
    // a thread: copy j of thread t is chunk c = t + 256 j (row c / (4 MM_PARTS), part, quarter).
    // Where they come from (less the step's offset) and go, worked out once; tile rows with
    // no activation row are zeros, stored once into both stages (no copy touches them).
    constexpr u32 TC_X = TC_ROWS_X * MM_PARTS * 4 / TC_THREADS;
    static_assert(TC_X * TC_THREADS == TC_ROWS_X * MM_PARTS * 4, "whole copies a thread");
    const u8* src[TC_X];
    u32 dst[TC_X];  // u32 offset into a stage
#pragma unroll
    for (u32 j = 0; j < TC_X; j++) {
        const u32 c = t + TC_THREADS * j, r = c / (MM_PARTS * 4), p = (c / 4) % MM_PARTS, cq = c % 4;
        dst[j] = p * TC_ROWS_X * 16 + tc_xswz(r, 4 * cq);
        const long long xr = rows.x_row(r);
        src[j] = xr >= 0 ? xp + (size_t)xr * tc_part_bytes(k) + p * 64 + 16 * cq : nullptr;
        if (!src[j]) {
            *(uint4*)((u32*)xs_[0] + dst[j]) = make_uint4(0u, 0u, 0u, 0u);
            *(uint4*)((u32*)xs_[1] + dst[j]) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
    const long long sr = t < TC_ROWS_X ? rows.x_row(t) : -1;
    const float* ssrc = sr >= 0 ? sums + (size_t)sr * (k / 16) : nullptr;
    if (t < TC_ROWS_X && !ssrc) xsum[0][t] = xsum[1][t] = float2{0.0f, 0.0f};
    auto stage_x = [&](u32 s, u32 b) {
        const size_t at = (size_t)s * MM_PARTS * 64;
#pragma unroll
        for (u32 j = 0; j < TC_X; j++)
            if (src[j]) cp_async<16>((u32*)xs_[b] + dst[j], src[j] + at);
        if (ssrc) cp_async<8>(&xsum[b][t], ssrc + 2 * s);
        cp_async_commit();
    };
    float acc[2][4][4], grp[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = grp[i][j][e] = 0.0f;
    if (first < last) {
        fetch_w(first);
        stage_x(first, 0);
    }
    for (u32 s = first; s < last; s++) {
        const u32 b = (s - first) % 2;
        {
            // This step's codes (the last step's readers passed the barrier at its end).
            // Rows past n hold row 0's codes: their outputs are never written, and no other
            // output reads them.
            u32 c0[4], c1[4];
            float a0, b0, a1, b1;
            Codes::codes(raw[0], TC_STEP * s + 16 * h + 8 * qq, c0, a0, b0);
            Codes::codes(raw[1], TC_STEP * s + 16 * h + 8 * qq, c1, a1, b1);
            u32* dst_w = (u32*)ws_;
            *(uint4*)(dst_w + tc_wswz(pr, 16 * h + 8 * qq)) = make_uint4(c0[0], c1[0], c0[1], c1[1]);
            *(uint4*)(dst_w + tc_wswz(pr, 16 * h + 8 * qq + 4)) = make_uint4(c0[2], c1[2], c0[3], c1[3]);
            if (qq == 0) {
                wab[r0][h] = float2{a0, b0};
                wab[r0 + 8][h] = float2{a1, b1};
            }
        }
        if (s + 1 < last) {
            stage_x(s + 1, 1 - b);
            fetch_w(s + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const uint2* xs[MM_PARTS];
#pragma unroll
        for (int p = 0; p < MM_PARTS; p++) xs[p] = (const uint2*)xs_[b][p];
#pragma unroll
        for (u32 hh = 0; hh < 2; hh++) {  // the step's two k16 halves
            u32 af[2][4];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const u32 pa = (wm / 16 + i) * 8 + g;  // rows wm + 16 i + g and + 8
                const uint2 lo = ws[tc_wswz(pa, 16 * hh + 2 * q) / 2];      // words q of both rows
                const uint2 hi = ws[tc_wswz(pa, 16 * hh + 2 * q + 8) / 2];  // words q + 4
                af[i][0] = lo.x, af[i][1] = lo.y, af[i][2] = hi.x, af[i][3] = hi.y;
            }
#pragma unroll
            for (int p = MM_PARTS - 1; p >= 0; p--) {  // the small parts first
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint2 bw = xs[p][tc_xswz(wn + 8 * j + g, 8 * hh + 2 * q) / 2];
                    const u32 bf[2] = {bw.x, bw.y};
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        if constexpr (Codes::plain) {
                            mma_bf16_16816(acc[i][j], af[i], bf);
                        } else {
                            mma_bf16_16816(grp[i][j], af[i], bf);
                        }
                    }
                }
            }
            if constexpr (!Codes::plain) {
                if (Codes::G == 16 || hh == 1) {
                    // The group is summed: acc += a · Σ c x + b · Σ x for each output.
#pragma unroll
                    for (int j = 0; j < 4; j++)
#pragma unroll
                        for (int e1 = 0; e1 < 2; e1++) {
                            const float2 s2 = xsum[b][wn + 8 * j + 2 * q + e1];
                            const float sx = Codes::G == 16 ? (hh == 0 ? s2.x : s2.y) : s2.x + s2.y;
#pragma unroll
                            for (int i = 0; i < 2; i++)
#pragma unroll
                                for (int e2 = 0; e2 < 2; e2++) {
                                    const float2 ab = wab[wm + 16 * i + g + 8 * e2][Codes::G == 16 ? hh : 0];
                                    float& o = acc[i][j][2 * e2 + e1];
                                    o = fmaf(ab.y, sx, fmaf(ab.x, grp[i][j][2 * e2 + e1], o));
                                    grp[i][j][2 * e2 + e1] = 0.0f;
                                }
                        }
                }
            }
        }
        __syncthreads();
    }
    // Output (tile row c, weight row r) is y[rows.y_row(c)][col0 + r].
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
            const long long r = rows.y_row(wn + 8 * j + 2 * q + e1);
            if (r < 0) continue;
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const u32 c = col0 + wm + 16 * i + g + 8 * e2;
                    if (c < n) y[(size_t)r * n + c] = acc[i][j][2 * e2 + e1];
                }
        }
}

// The splits' sums: y[i] = Σ_z part[z · count + i], z in order (the same bits every run).
// @hot
extern "C" __global__ void tc_reduce(const float* part, float* y, u32 count, u32 splits) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float v = 0.0f;
    for (u32 z = 0; z < splits; z++) v += part[(size_t)z * count + i];
    y[i] = v;
}

// The dense matmul: grid (ceil(n / 128), ceil(m / 64), splits), TC_THREADS threads; xp:
// tc_split's output for x's m rows. With splits > 1, y is scratch of splits · m · n sums.
template <typename B>
__device__ __forceinline__ void tc_dense(const u8* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    const DenseRows rows{blockIdx.y * TC_ROWS_X, m};
    y += (size_t)blockIdx.z * m * n;
    if (((size_t)w & 15) == 0)
        mat_mul_tc<B, 16>(xp, w, y, rows, m, n, k, splits);
    else
        mat_mul_tc<B, 1>(xp, w, y, rows, m, n, k, splits);
}

// The grouped MoE matmul (mat_mul.cu's mat_mul_id_grouped, on these tiles): grid (ceil(n /
// 128), tiles), TC_THREADS threads; xp: tc_split's output for x's mx rows ([T, K] or
// [T, k, K]); w [E, n, kd].
template <typename B>
__device__ __forceinline__ void tc_grouped(const u8* xp, const u8* w, const int* order, const int* offsets,
                                           const int* tiles, float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne,
                                           u32 mx) {
    u32 e;
    SlotRows rows;
    if (!expert_tile(order, offsets, tiles, blockIdx.y, k, x_per_slot, ne, e, rows)) return;
    const u8* we = weight_row<B>(w, (size_t)e * n, kd);
    if (((size_t)we & 15) == 0)
        mat_mul_tc<B, 16>(xp, we, y, rows, mx, n, kd, 1);
    else
        mat_mul_tc<B, 1>(xp, we, y, rows, mx, n, kd, 1);
}

// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_q8_0(const float* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    tc_dense<Q8_0>((const u8*)xp, w, y, m, n, k, splits);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_id_q8_0(const float* xp, const u8* w, const int* order, const int* offsets, const int* tiles,
                   float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne, u32 mx) {
    tc_grouped<Q8_0>((const u8*)xp, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne, mx);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_q4_0(const float* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    tc_dense<Q4_0>((const u8*)xp, w, y, m, n, k, splits);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_id_q4_0(const float* xp, const u8* w, const int* order, const int* offsets, const int* tiles,
                   float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne, u32 mx) {
    tc_grouped<Q4_0>((const u8*)xp, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne, mx);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_q4_1(const float* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    tc_dense<Q4_1>((const u8*)xp, w, y, m, n, k, splits);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_id_q4_1(const float* xp, const u8* w, const int* order, const int* offsets, const int* tiles,
                   float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne, u32 mx) {
    tc_grouped<Q4_1>((const u8*)xp, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne, mx);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_q4_k(const float* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    tc_dense<Q4_K>((const u8*)xp, w, y, m, n, k, splits);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_id_q4_k(const float* xp, const u8* w, const int* order, const int* offsets, const int* tiles,
                   float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne, u32 mx) {
    tc_grouped<Q4_K>((const u8*)xp, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne, mx);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_q6_k(const float* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    tc_dense<Q6_K>((const u8*)xp, w, y, m, n, k, splits);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_id_q6_k(const float* xp, const u8* w, const int* order, const int* offsets, const int* tiles,
                   float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne, u32 mx) {
    tc_grouped<Q6_K>((const u8*)xp, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne, mx);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_bf16(const float* xp, const u8* w, float* y, u32 m, u32 n, u32 k, u32 splits) {
    tc_dense<BF16W>((const u8*)xp, w, y, m, n, k, splits);
}
// @hot
extern "C" __global__ void __launch_bounds__(TC_THREADS, TC_BLOCKS)
mat_mul_tc_id_bf16(const float* xp, const u8* w, const int* order, const int* offsets, const int* tiles,
                   float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne, u32 mx) {
    tc_grouped<BF16W>((const u8*)xp, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne, mx);
}
