// The decode mat-vec kernels' bodies (prepended to every kernel file after formats.cuh; the
// entry points are in mat_mul_vec.cu, quant.cu and mat_mul_fused.cu): the register-ring kernel,
// the staged one (MV_STAGED=1), the lane-per-row one (MV_STAGED=2 for every format it has a
// decoder for; 3, the default, for Q4_K and Q6_K), the dispatch between them, and the sources
// (plain, rms-normed, GLU) they read the activations through. Q4_K weights take the int8
// activation kernel of mat_mul_vec_x8.cu instead unless MV_X8=0 (the launch planner decides).

// The share of a grid over one to three weights of one width (rms_norm_mat_vecs, the
// mat_vec_x8 kernels): the first ceil(n0 / rb) blocks take w0's rows (rb a block), the next
// ceil(n1 / rb) w1's, the rest w2's. Returns this block's weight, output, row count and its
// block index within the weight.
struct WeightShare {
    const void* w;
    float* y;
    u32 n, bx;
};
__device__ __forceinline__ WeightShare weight_share(u32 rb, const void* w0, const void* w1, const void* w2, float* y0,
                                                    float* y1, float* y2, u32 n0, u32 n1, u32 n2) {
    const u32 b0 = (n0 + rb - 1) / rb, b1 = (n1 + rb - 1) / rb, bx = blockIdx.x;
    if (bx >= b0 + b1) return {w2, y2, n2, bx - b0 - b1};
    if (bx >= b0) return {w1, y1, n1, bx - b0};
    return {w0, y0, n0, bx};
}

// ---- the decode mat-vec ------------------------------------------------------------------
// y [m, n] = xs [m, k] · w [n, k]ᵀ for m ≤ 4 token rows, where xs is what a source makes of
// its inputs 8 values at a time (the activations as they are, rms-normalised, or a GLU's
// act(gate) · up). A block of MV_WARPS warps computes MV_ROWS consecutive outputs of one token
// row: its warps split the row's k values in chunks of 256 (warp w takes chunks w, w + 4, ..),
// each lane 8 values of a chunk; each lane makes its 8 source values once and multiplies them
// into all MV_ROWS weight rows, so the source is read once per 4 outputs, and later chunks'
// loads are in flight while a chunk is computed. The warps' sums meet in shared memory and are
// added in warp order. Rows must hold a multiple of 8 values; the grid is
// (ceil(n / MV_ROWS), m) blocks of MV_WARPS * 32 threads.
#define MV_WARPS 4
#define MV_ROWS 4
// Tuning knobs (KILN_CUDA_DEFINES sets them without a rebuild): the chunks in the ring, and
// whether the source's values are fetched with the weights (else as their chunk is computed).
#ifndef MV_DEPTH
#define MV_DEPTH 2
#endif
#ifndef MV_X_EARLY
#define MV_X_EARLY 1
#endif
static_assert(MV_DEPTH >= 1 && MV_DEPTH <= 8, "MV_DEPTH: 1 to 8 chunks");
// __launch_bounds__ of every mat-vec entry point: the block size, and with MV_MIN_BLOCKS the
// blocks an SM must be able to hold at once (8 caps a thread at 64 registers, so 32 warps an
// SM fit). Unset by default: even a minimum of 1 changes ptxas's register choices (the ring's
// Q4_K kernels went from 96-128 to 152-168 registers).
#ifdef MV_MIN_BLOCKS
#define MV_BOUNDS MV_WARPS* WARP, MV_MIN_BLOCKS
#else
#define MV_BOUNDS MV_WARPS* WARP
#endif

// The warps' sums meet: after every warp has put its per-row sums and its squares in
// part[warp], the first `rows` threads add them in warp order and write y (plus the source's
// residual row, where it has one: y = xs · wᵀ + res).
template <typename Src>
__device__ __forceinline__ void mv_write(float (*part)[MV_ROWS + 1], const Src& src, float* y, u32 row, u32 n,
                                         u32 col0, u32 rows, u32 k) {
    __syncthreads();
    if (threadIdx.x < rows) {
        float t = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < MV_WARPS; i++) {
            t += part[i][threadIdx.x];
            q += part[i][MV_ROWS];
        }
        const size_t at = (size_t)row * n + col0 + threadIdx.x;
        float v = src.finish(t, q, k);
        // The residual stream, where the source has one: the add's own rounding, after the
        // dot product's.
        if (src.res != nullptr) v += src.res[at];
        y[at] = v;
    }
}

// The same from each lane's sums of all MV_ROWS rows: summed over the warp first.
template <typename Src>
__device__ __forceinline__ void mv_meet(float* acc, float ss, float (*part)[MV_ROWS + 1], const Src& src, float* y,
                                        u32 row, u32 n, u32 col0, u32 rows, u32 k) {
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = warp_sum(acc[r]);
    if (Src::SQUARES) ss = warp_sum(ss);
    if (threadIdx.x % WARP == 0) {
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) part[threadIdx.x / WARP][r] = acc[r];
        part[threadIdx.x / WARP][MV_ROWS] = ss;
    }
    mv_write(part, src, y, row, n, col0, rows, k);
}

template <typename B, u32 A, typename Src>
__device__ __forceinline__ void mat_vec_rows_at(const Src& src, const void* w, float* y, u32 n, u32 k, u32 bx) {
    __shared__ float part[MV_WARPS][MV_ROWS + 1];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = bx * MV_ROWS, row = blockIdx.y;
    const u32 rows = min((u32)MV_ROWS, n - col0);
    const u8* wr[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) wr[r] = weight_row<B>(w, col0 + min((u32)r, rows - 1), k);
    float acc[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = 0.0f;
    float ss = 0.0f;
    // Software-pipelined over a ring of MV_DEPTH chunks: a chunk's loads (its MV_ROWS weight
    // rows, and the source's values if MV_X_EARLY) are issued MV_DEPTH - 1 chunks before its
    // arithmetic, so memory latency hides behind the chunks in between (a chunk's loads
    // written next to its arithmetic would be scheduled next to it). Lanes past the row's end
    // load its last 8 values again and add nothing.
    constexpr u32 STEP = MV_WARPS * 256;
    typename B::Raw raw[MV_DEPTH][MV_ROWS];
    typename Src::Raw xraw[MV_X_EARLY ? MV_DEPTH : 1];
    // Issues the loads of the chunk at s into slot d (d a constant once unrolled).
    auto fetch_chunk = [&](int d, u32 s) {
        const u32 v = min(s + 8 * lane, k - 8);
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) raw[d][r] = B::template fetch<A>(wr[r], v);
        if constexpr (MV_X_EARLY) src.template fetch<A>(row, v, xraw[d]);
    };
    const u32 first = warp * 256;
#pragma unroll
    for (int d = 0; d < MV_DEPTH; d++) {
        if (first + d * STEP < k) fetch_chunk(d, first + d * STEP);
    }
    for (u32 s = first; s < k; s += MV_DEPTH * STEP) {
#pragma unroll
        for (int d = 0; d < MV_DEPTH; d++) {
            const u32 sd = s + d * STEP;
            if (sd < k) {  // the same for the whole warp
                const u32 v = sd + 8 * lane;
                if constexpr (!MV_X_EARLY) src.template fetch<A>(row, min(v, k - 8), xraw[0]);
                if (v < k) {
                    float xv[8];
                    src.make(xraw[MV_X_EARLY ? d : 0], xv, ss);
#pragma unroll
                    for (int r = 0; r < MV_ROWS; r++) {
                        float wv[8];
                        B::template decode<A>(raw[d][r], v, wv);
#pragma unroll
                        for (int i = 0; i < 8; i++) acc[r] += xv[i] * wv[i];
                    }
                }
                if (sd + MV_DEPTH * STEP < k) fetch_chunk(d, sd + MV_DEPTH * STEP);
            }
        }
    }
    mv_meet(acc, ss, part, src, y, row, n, col0, rows, k);
}

// ---- the staged decode mat-vec (MV_STAGED) -------------------------------------------------
// The same y = xs · wᵀ for the same grid, with the weights staged through shared memory. Each
// warp runs its own pipeline over its chunks of the rows (warp w takes chunks w, w + 4, ..; a
// chunk is I::STAGE values of each of the block's 4 rows): a ring of MV_STAGES slots per warp,
// filled by cp.async in G-byte units (whole 512-byte runs per warp instruction, no register
// held while they fly), so while a warp computes one chunk its next MV_STAGES - 1 chunks are
// in flight, and warps wait only for their own copies (no block-wide barrier until the sums
// meet). A lane takes items of a chunk (I::VALUES values, in I::SEGS runs of 8 of the row)
// for all 4 rows at once: it makes its source values once, and each row's dot product decodes
// the item from shared memory. The sums meet as in mat_vec_rows_at.
//
// Items (how a lane takes a chunk's values):
// - MvItem8<B>: 8 consecutive values through the format's fetch/decode (every format);
// - MvItemQ4K, MvItemQ6K, MvItemQ8_0: 32 values with 16-byte or 2-byte reads of one block,
//   codes turned into floats by byte_as_float (no conversion instructions), each scale group
//   summed as Σ x·q and scaled once.
// 1 lost to the register ring on an H100 (2026-11-27: the 3 B and 1 B BF16 checkpoints 10 %
// slower, the 8 B Q4_K 3 %; README, GPU). 2: Q4_K, Q6_K, Q8_0 and the floats (rows of a
// multiple of 256 values) through the lane-per-row kernel below, the rest through the ring.
// 3, the default: the lane-per-row kernel for Q4_K and Q6_K only, where it was measured to
// win (H100, 2026-11-27, decode steps replayed as graphs: the 8 B Q4_K 11 % and the 3 B 7 %
// faster than the ring, the 1 B as fast), the ring for the rest. 0: the ring everywhere.
#ifndef MV_STAGED
#define MV_STAGED 3
#endif
// __launch_bounds__ of the Q4_K and Q6_K entry points: with the lane-per-row kernel on Hopper,
// 8 blocks an SM at least (64 registers a thread, 32 warps an SM, which it is built for and
// fits with no local memory there) unless MV_MIN_BLOCKS says otherwise. Blackwell's ptxas
// (sm_100a, sm_120a) spills 4-32 bytes a thread under that cap and nothing was measured there,
// so no minimum. The other formats keep MV_BOUNDS: their kernels (the ring among them) spill
// under a 64-register cap.
#if MV_STAGED >= 2 && !defined(MV_MIN_BLOCKS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define MV_BOUNDS_KQ MV_WARPS* WARP, 8
#else
#define MV_BOUNDS_KQ MV_BOUNDS
#endif
#ifndef MV_STAGES
#define MV_STAGES 3
#endif
static_assert(MV_STAGES >= 2 && MV_STAGES <= 4, "MV_STAGES: 2 to 4 slots a warp");

// Scale and min of groups 2c and 2c + 1 of a Q4_K block whose first 16 bytes are h
// (scale_min_k4 by bytes of the header's words).
__device__ __forceinline__ void q4k_pair_scales(const uint4& h, u32 c, float& sc0, float& m0, float& sc1,
                                                float& m1) {
    const u32 sh0 = 8 * ((2 * c) & 3), sh1 = 8 * ((2 * c + 1) & 3);
    const u32 a0 = (h.y >> sh0) & 0xFF, b0 = (h.z >> sh0) & 0xFF, e0 = (h.w >> sh0) & 0xFF;
    const u32 a1 = (h.y >> sh1) & 0xFF, b1 = (h.z >> sh1) & 0xFF, e1 = (h.w >> sh1) & 0xFF;
    const bool low = c < 2;
    sc0 = (float)(low ? (a0 & 63) : ((e0 & 0xF) | ((a0 >> 6) << 4)));
    m0 = (float)(low ? (b0 & 63) : ((e0 >> 4) | ((b0 >> 6) << 4)));
    sc1 = (float)(low ? (a1 & 63) : ((e1 & 0xF) | ((a1 >> 6) << 4)));
    m1 = (float)(low ? (b1 & 63) : ((e1 >> 4) | ((b1 >> 6) << 4)));
}

template <typename B>
struct MvItem8 {
    // A chunk: 256 values (a lane's 8 each) of the 32- and 64-value formats and floats, 1024
    // of the 256-value ones (whole blocks, a multiple of 4 bytes).
    static constexpr u32 VALUES = 8, SEGS = 1, STAGE = B::QK == 256 ? 1024 : 256;
    struct Aux {};
    __device__ static u32 seg(u32 it, u32) { return 8 * it; }
    __device__ static Aux prep(const float*) { return {}; }
    __device__ static float dot(const u8* s, u32 it, const float* xv, const Aux&) {
        float wv[8];
        B::template load8<16>(s, 8 * it, wv);
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) t += xv[i] * wv[i];
        return t;
    }
};

// Q4_K: item it is the 16 bytes of nibbles 16j .. 16j + 16 of block b (it = 8b + j): low
// nibbles are elements 64c + 16h + i of the block (c = j / 2, h = j % 2, group 2c), high
// nibbles the same 32 further (group 2c + 1). Source runs: 0, 1 the low, 2, 3 the high values.
struct MvItemQ4K {
    static constexpr u32 VALUES = 32, SEGS = 4, STAGE = 1024;
    struct Aux {
        float lo, hi;
    };
    __device__ static u32 seg(u32 it, u32 s) {
        const u32 b = it / 8, j = it % 8;
        return 256 * b + 64 * (j / 2) + 16 * (j % 2) + 32 * (s / 2) + 8 * (s % 2);
    }
    __device__ static Aux prep(const float* xv) {
        Aux a{0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < 16; i++) {
            a.lo += xv[i];
            a.hi += xv[16 + i];
        }
        return a;
    }
    __device__ static float dot(const u8* s, u32 it, const float* xv, const Aux& a) {
        const u32 b = it / 8, j = it % 8, c = j / 2;
        const u8* blk = s + 144 * b;
        const uint4 h = *(const uint4*)blk;
        const uint4 q = *(const uint4*)(blk + 16 + 16 * j);
        float sc0, m0, sc1, m1;
        q4k_pair_scales(h, c, sc0, m0, sc1, m1);
        const u32 w[4] = {q.x, q.y, q.z, q.w};
        float alo = 0.0f, ahi = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const u32 lo = w[t] & 0x0F0F0F0Fu, hi = (w[t] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                alo += xv[4 * t + i] * byte_as_float(lo, i);
                ahi += xv[16 + 4 * t + i] * byte_as_float(hi, i);
            }
        }
        const float d = f16_bits(h.x & 0xFFFF), dmin = f16_bits(h.x >> 16);
        return d * (sc0 * alo + sc1 * ahi) - dmin * (m0 * a.lo + m1 * a.hi);
    }
};

// Q6_K: item it is half h, indices l0 .. l0 + 8 of block b (it = 8b + 4h + l0 / 8) in all four
// quarters: source run q is elements 128h + 32q + l0 .. + 8. Blocks are 210 bytes, so only
// 2-byte reads are aligned.
struct MvItemQ6K {
    static constexpr u32 VALUES = 32, SEGS = 4, STAGE = 1024;
    struct Aux {};
    __device__ static u32 seg(u32 it, u32 s) {
        const u32 b = it / 8, h = (it % 8) / 4, l0 = 8 * (it % 4);
        return 256 * b + 128 * h + 32 * s + l0;
    }
    __device__ static Aux prep(const float*) { return {}; }
    __device__ static float dot(const u8* s, u32 it, const float* xv, const Aux&) {
        const u32 b = it / 8, h = (it % 8) / 4, l0 = 8 * (it % 4);
        const u8* blk = s + 210 * b;
        const uint2 qa = bytes8<2>(blk + 64 * h + l0), qb = bytes8<2>(blk + 64 * h + 32 + l0);
        const uint2 qh = bytes8<2>(blk + 128 + 32 * h + l0);
        const u8* sc = blk + 192 + 8 * h + l0 / 16;
        float t = 0.0f;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const uint2 ql = qq % 2 ? qb : qa;
            const u32 ls = qq < 2 ? 0 : 4;
            float aq = 0.0f;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const u32 lw = half ? ql.y : ql.x, hw = half ? qh.y : qh.x;
                const u32 code = ((lw >> ls) & 0x0F0F0F0Fu) | (((hw >> (2 * qq)) & 0x03030303u) << 4);
#pragma unroll
                for (int i = 0; i < 4; i++) aq += xv[8 * qq + 4 * half + i] * byte_as_float(code, i, 8388640.0f);
            }
            t += (float)(i8)sc[2 * qq] * aq;
        }
        return f16_at(blk + 208) * t;
    }
};

// Q8_0: item it is block it (d, then 32 int8 at 2-byte alignment); runs are its 4 eighths.
struct MvItemQ8_0 {
    static constexpr u32 VALUES = 32, SEGS = 4, STAGE = 1024;
    struct Aux {};
    __device__ static u32 seg(u32 it, u32 s) { return 32 * it + 8 * s; }
    __device__ static Aux prep(const float*) { return {}; }
    __device__ static float dot(const u8* s, u32 it, const float* xv, const Aux&) {
        const u8* blk = s + 34 * it;
        float t = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            // Signed codes as unsigned ones + 128: q = (q ^ 0x80) - 128.
            const u32 w = word_at<2>(blk + 2 + 4 * e) ^ 0x80808080u;
#pragma unroll
            for (int i = 0; i < 4; i++) t += xv[4 * e + i] * byte_as_float(w, i, 8388736.0f);
        }
        return f16_at(blk) * t;
    }
};

template <typename B>
struct MvItemOf {
    typedef MvItem8<B> T;
};
template <>
struct MvItemOf<Q4_K> {
    typedef MvItemQ4K T;
};
template <>
struct MvItemOf<Q6_K> {
    typedef MvItemQ6K T;
};
template <>
struct MvItemOf<Q8_0> {
    typedef MvItemQ8_0 T;
};

// A warp's chunk of one row: BYTES of them, in a slot of ROW bytes (16-byte aligned); the
// widest copy unit chunk boundaries allow (GMAX); the slots a warp keeps (at most MV_STAGES,
// and no more than 44 KiB of shared memory for the block).
template <typename B, typename I>
struct MvStage {
    static constexpr u32 BYTES = I::STAGE / B::QK * B::BYTES, ROW = (BYTES + 15) / 16 * 16;
    static constexpr u32 GMAX = BYTES % 16 == 0 ? 16 : (BYTES % 8 == 0 ? 8 : (BYTES % 4 == 0 ? 4 : 0));
    static constexpr u32 FIT = 45056 / (MV_WARPS * MV_ROWS * ROW);
    static constexpr u32 SLOTS = FIT < 2 ? 2 : (FIT < MV_STAGES ? FIT : MV_STAGES);
    static constexpr u32 WORDS = MV_WARPS * SLOTS * MV_ROWS * ROW / 16;
    static_assert(I::STAGE % B::QK == 0 && I::STAGE % I::VALUES == 0, "a chunk is whole blocks and items");
};

// `smem`: the caller's shared memory, MvStage<B, I>::WORDS 16-byte words (one array for the
// three copy units, which would otherwise each reserve their own).
template <typename B, typename I, u32 G, typename Src>
__device__ __forceinline__ void mat_vec_staged(uint4* smem, const Src& src, const void* w, float* y, u32 n,
                                               u32 k, u32 bx) {
    typedef MvStage<B, I> S;
    constexpr u32 CH = I::STAGE;
    __shared__ float part[MV_WARPS][MV_ROWS + 1];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = bx * MV_ROWS, row = blockIdx.y;
    const u32 rows = min((u32)MV_ROWS, n - col0);
    const size_t rb = (size_t)(k / B::QK) * B::BYTES;
    const u8* wr[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) wr[r] = (const u8*)w + (size_t)(col0 + min((u32)r, rows - 1)) * rb;
    u8* mine = (u8*)smem + (size_t)warp * S::SLOTS * MV_ROWS * S::ROW;
    // This warp's chunks: warp, warp + MV_WARPS, ...
    const u32 nch = (k + CH - 1) / CH, count = nch > warp ? (nch - warp + MV_WARPS - 1) / MV_WARPS : 0;
    // Chunk j of this warp into slot j % SLOTS: a whole number of G-byte units of each row (rows
    // and chunks are whole blocks, and G divides the rows' bytes and S::BYTES).
    auto issue = [&](u32 j) {
        const u32 v0 = (warp + MV_WARPS * j) * CH, units = min(CH, k - v0) / B::QK * B::BYTES / G;
        const size_t off = (size_t)(v0 / B::QK) * B::BYTES;
        u8* slot = mine + (j % S::SLOTS) * MV_ROWS * S::ROW;
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) {
            for (u32 u = lane; u < units; u += WARP) cp_async<G>(slot + r * S::ROW + G * u, wr[r] + off + G * u);
        }
        cp_async_commit();
    };
#pragma unroll
    for (u32 j = 0; j + 1 < S::SLOTS; j++) {
        if (j < count) issue(j);
        else cp_async_commit();
    }
    float acc[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = 0.0f;
    float ss = 0.0f;
    for (u32 j = 0; j < count; j++) {
        if (j + S::SLOTS - 1 < count) issue(j + S::SLOTS - 1);
        else cp_async_commit();
        cp_async_wait<S::SLOTS - 1>();
        __syncwarp();
        const u32 v0 = (warp + MV_WARPS * j) * CH, items = min(CH, k - v0) / I::VALUES;
        const u8* slot = mine + (j % S::SLOTS) * MV_ROWS * S::ROW;
        for (u32 it = lane; it < items; it += WARP) {
            float xv[I::VALUES];
#pragma unroll
            for (int sg = 0; sg < (int)I::SEGS; sg++) {
                typename Src::Raw xr;
                src.template fetch<16>(row, v0 + I::seg(it, sg), xr);
                src.make(xr, xv + 8 * sg, ss);
            }
            const typename I::Aux aux = I::prep(xv);
#pragma unroll
            for (int r = 0; r < MV_ROWS; r++) acc[r] += I::dot(slot + r * S::ROW, it, xv, aux);
        }
        // Every lane is done with the slot before a later issue refills it.
        __syncwarp();
    }
    mv_meet(acc, ss, part, src, y, row, n, col0, rows, k);
}

// ---- the lane-per-row decode mat-vec (MV_STAGED=2; 3, the default, for Q4_K and Q6_K) -----
// Built for occupancy (few registers: 64 with 8 blocks an SM, the K-quants' default bounds,
// so 32 warps an SM) and for
// several chunks in flight a warp even at k = 4096. Each warp runs its own pipeline over
// chunks of P::CH values (warp w takes chunks w, w + 4, ..) of the block's 4 rows, the weight
// bytes staged by cp.async into a ring of MV_STAGES slots. For each chunk the warp first makes
// its source values once into shared memory (and the sum of each 16, for Q4_K's mins), then
// lane l takes row l % 4 and piece l / 4 of every 256 values of the chunk: 32 values, decoded
// by the format's piece (P::dot) from shared memory. Lanes of one piece read the same source
// values (a broadcast). The lanes of a row meet by shuffles, the warps in shared memory as in
// mat_vec_rows_at. Pieces: Q4_K, Q6_K, Q8_0, and the float formats.

template <typename B>
struct MvIsQ4K {
    static constexpr bool V = false;
};
template <>
struct MvIsQ4K<Q4_K> {
    static constexpr bool V = true;
};

// Q4_K: piece s is the 16 bytes of nibbles 16s .. 16s + 16 of the block: low nibbles are
// elements 64c + 16h + i (c = s / 2, h = s % 2, group 2c), high nibbles the same 32 further.
struct PieceQ4K {
    static constexpr u32 SB = 144, CH = 512;
    __device__ static float dot(const u8* blk, u32 sub, const float* xs, const float* gs) {
        const u32 c = sub / 2;
        const uint4 h = *(const uint4*)blk;
        const uint4 q = *(const uint4*)(blk + 16 + 16 * sub);
        float sc0, m0, sc1, m1;
        q4k_pair_scales(h, c, sc0, m0, sc1, m1);
        const float* xl = xs + 64 * c + 16 * (sub % 2);
        const u32 wq[4] = {q.x, q.y, q.z, q.w};
        float alo = 0.0f, ahi = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const float4 xa = *(const float4*)(xl + 4 * t), xb = *(const float4*)(xl + 32 + 4 * t);
            const u32 lo = wq[t] & 0x0F0F0F0Fu, hi = (wq[t] >> 4) & 0x0F0F0F0Fu;
            alo += xa.x * byte_as_float(lo, 0) + xa.y * byte_as_float(lo, 1);
            alo += xa.z * byte_as_float(lo, 2) + xa.w * byte_as_float(lo, 3);
            ahi += xb.x * byte_as_float(hi, 0) + xb.y * byte_as_float(hi, 1);
            ahi += xb.z * byte_as_float(hi, 2) + xb.w * byte_as_float(hi, 3);
        }
        // The sums of the 16 values each half takes (group 2c's and 2c + 1's).
        const u32 hs = 4 * c + sub % 2;
        const float d = f16_bits(h.x & 0xFFFF), dmin = f16_bits(h.x >> 16);
        return d * (sc0 * alo + sc1 * ahi) - dmin * (m0 * gs[hs] + m1 * gs[hs + 2]);
    }
};

// Q6_K: piece s is half h = s / 4, indices l0 .. l0 + 8 (l0 = 8 (s % 4)) of all four quarters:
// elements 128h + 32q + l0 + i. Blocks are 210 bytes, so only 2-byte reads are aligned.
struct PieceQ6K {
    static constexpr u32 SB = 210, CH = 512;
    __device__ static float dot(const u8* blk, u32 sub, const float* xs, const float*) {
        const u32 h = sub / 4, l0 = 8 * (sub % 4);
        const uint2 qa = bytes8<2>(blk + 64 * h + l0), qb = bytes8<2>(blk + 64 * h + 32 + l0);
        const uint2 qh = bytes8<2>(blk + 128 + 32 * h + l0);
        const u8* sc = blk + 192 + 8 * h + l0 / 16;
        const float* xh = xs + 128 * h + l0;
        float t = 0.0f;
#pragma unroll
        for (int qq = 0; qq < 4; qq++) {
            const uint2 ql = qq % 2 ? qb : qa;
            const u32 ls = qq < 2 ? 0 : 4;
            float aq = 0.0f;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const u32 lw = half ? ql.y : ql.x, hw = half ? qh.y : qh.x;
                const u32 code = ((lw >> ls) & 0x0F0F0F0Fu) | (((hw >> (2 * qq)) & 0x03030303u) << 4);
                const float4 xv = *(const float4*)(xh + 32 * qq + 4 * half);
                aq += xv.x * byte_as_float(code, 0, 8388640.0f) + xv.y * byte_as_float(code, 1, 8388640.0f);
                aq += xv.z * byte_as_float(code, 2, 8388640.0f) + xv.w * byte_as_float(code, 3, 8388640.0f);
            }
            t += (float)(i8)sc[2 * qq] * aq;
        }
        return f16_at(blk + 208) * t;
    }
};

// Q8_0: the 256 values are 8 blocks; piece s is block s (d, then 32 int8 at 2-byte alignment).
struct PieceQ8_0 {
    static constexpr u32 SB = 272, CH = 512;
    __device__ static float dot(const u8* sb, u32 sub, const float* xs, const float*) {
        const u8* blk = sb + 34 * sub;
        const float* xb = xs + 32 * sub;
        float t = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const u32 w = word_at<2>(blk + 2 + 4 * e) ^ 0x80808080u;
            const float4 xv = *(const float4*)(xb + 4 * e);
            t += xv.x * byte_as_float(w, 0, 8388736.0f) + xv.y * byte_as_float(w, 1, 8388736.0f);
            t += xv.z * byte_as_float(w, 2, 8388736.0f) + xv.w * byte_as_float(w, 3, 8388736.0f);
        }
        return f16_at(blk) * t;
    }
};

// Floats: piece s is values 32s .. 32s + 32 (16-byte reads: a row's 256 values are 16-byte
// aligned in the slot).
template <typename T, u32 SIZE>
struct PieceFloat {
    static constexpr u32 SB = 256 * SIZE, CH = 256;
    __device__ static float dot(const u8* sb, u32 sub, const float* xs, const float*) {
        const uint4* p = (const uint4*)(sb + 32 * SIZE * sub);
        const float* xb = xs + 32 * sub;
        float t = 0.0f;
#pragma unroll
        for (int i = 0; i < 2 * (int)SIZE; i++) {
            const uint4 v = p[i];
            const u32 wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                if constexpr (SIZE == 4) {
                    t += xb[4 * i + j] * __uint_as_float(wv[j]);
                } else {
                    t += xb[8 * i + 2 * j] * f32_of_bits((const T*)nullptr, wv[j] & 0xFFFFu);
                    t += xb[8 * i + 2 * j + 1] * f32_of_bits((const T*)nullptr, wv[j] >> 16);
                }
            }
        }
        return t;
    }
};

// The bytes of a row of k values.
template <typename B>
__device__ __forceinline__ size_t rb_of(u32 k) {
    return (size_t)(k / B::QK) * B::BYTES;
}

// The piece decoder of a weight format (HAS false: none; the format keeps the other kernels).
template <typename B>
struct MvPieceOf {
    static constexpr bool HAS = false;
    static constexpr bool KQUANT = false;
    typedef PieceQ4K T;  // unused
};
template <>
struct MvPieceOf<Q4_K> {
    static constexpr bool HAS = true;
    static constexpr bool KQUANT = true;
    typedef PieceQ4K T;
};
template <>
struct MvPieceOf<Q6_K> {
    static constexpr bool HAS = true;
    static constexpr bool KQUANT = true;
    typedef PieceQ6K T;
};
template <>
struct MvPieceOf<Q8_0> {
    static constexpr bool HAS = true;
    static constexpr bool KQUANT = false;
    typedef PieceQ8_0 T;
};
template <>
struct MvPieceOf<F32W> {
    static constexpr bool HAS = true;
    static constexpr bool KQUANT = false;
    typedef PieceFloat<float, 4> T;
};
template <>
struct MvPieceOf<F16W> {
    static constexpr bool HAS = true;
    static constexpr bool KQUANT = false;
    typedef PieceFloat<__half, 2> T;
};
template <>
struct MvPieceOf<BF16W> {
    static constexpr bool HAS = true;
    static constexpr bool KQUANT = false;
    typedef PieceFloat<__nv_bfloat16, 2> T;
};

// A warp's shared memory: SLOTS slots of the 4 rows' chunk bytes, the chunk's source values,
// their sums of 16.
template <typename P>
struct Mv3 {
    static constexpr u32 CB = P::CH / 256 * P::SB;  // a row's bytes in a chunk
    static constexpr u32 ROW = (CB + 15) / 16 * 16;
    static constexpr u32 GMAX = CB % 16 == 0 ? 16 : (CB % 8 == 0 ? 8 : 4);
    // At most MV_STAGES slots, fewer where the block would pass 44 KiB (f32), at least 2.
    static constexpr u32 FIT = (45056 / MV_WARPS - 4 * P::CH - 4 * (P::CH / 16) - 16) / (MV_ROWS * ROW);
    static constexpr u32 SLOTS = FIT < 2 ? 2 : (FIT < MV_STAGES ? FIT : MV_STAGES);
    static constexpr u32 XOFF = SLOTS * MV_ROWS * ROW, GOFF = XOFF + 4 * P::CH;
    static constexpr u32 WARP_BYTES = (GOFF + 4 * (P::CH / 16) + 15) / 16 * 16;
    static constexpr u32 WORDS = MV_WARPS * WARP_BYTES / 16;
    static_assert(CB % 4 == 0, "a chunk is whole 4-byte units");
    static_assert(MV_WARPS * WARP_BYTES <= 45056, "at most 44 KiB a block");
};

// G: the weight's copy unit (16, 8 or 4: cp.async; 1: plain byte copies, for a weight view
// whose alignment allows no more); A: the source's load width (as in mat_vec_rows_at).
template <typename B, typename P, u32 G, u32 A, typename Src>
__device__ __forceinline__ void mat_vec_lanes(uint4* smem, const Src& src, const void* w, float* y, u32 n, u32 k,
                                              u32 bx) {
    typedef Mv3<P> M;
    constexpr u32 CH = P::CH, ROW = M::ROW;
    __shared__ float part[MV_WARPS][MV_ROWS + 1];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = bx * MV_ROWS, row = blockIdx.y;
    const u32 rows = min((u32)MV_ROWS, n - col0);
    const size_t rb = (size_t)(k / B::QK) * B::BYTES;
    const u8* wr[MV_ROWS];
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) wr[r] = (const u8*)w + (size_t)(col0 + min((u32)r, rows - 1)) * rb;
    u8* mine = (u8*)smem + (size_t)warp * M::WARP_BYTES;
    float* xs = (float*)(mine + M::XOFF);
    float* gs = (float*)(mine + M::GOFF);
    const u32 nch = (k + CH - 1) / CH, count = nch > warp ? (nch - warp + MV_WARPS - 1) / MV_WARPS : 0;
    auto issue = [&](u32 j) {
        const u32 v0 = (warp + MV_WARPS * j) * CH, bytes = min(CH, k - v0) / 256 * P::SB;
        const size_t off = (size_t)(v0 / 256) * P::SB;
        u8* slot = mine + (j % M::SLOTS) * MV_ROWS * ROW;
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) {
            for (u32 u = lane; u < bytes / G; u += WARP) {
                if constexpr (G >= 4) cp_async<G>(slot + r * ROW + G * u, wr[r] + off + G * u);
                else slot[r * ROW + u] = wr[r][off + u];
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (u32 j = 0; j + 1 < M::SLOTS; j++) {
        if (j < count) issue(j);
        else cp_async_commit();
    }
    const u32 r = lane % 4, sub = lane / 4;
    float acc = 0.0f, ss = 0.0f;
    for (u32 j = 0; j < count; j++) {
        if (j + M::SLOTS - 1 < count) issue(j + M::SLOTS - 1);
        else cp_async_commit();
        const u32 v0 = (warp + MV_WARPS * j) * CH, nv = min(CH, k - v0);
        // The chunk's source values, made once, while its weights are in flight.
        for (u32 e = 8 * lane; e < nv; e += 8 * WARP) {
            typename Src::Raw xr;
            src.template fetch<A>(row, v0 + e, xr);
            src.make(xr, xs + e, ss);
        }
        __syncwarp();
        // Sums of each 16 (a Q4_K lane's share of a group, for its mins).
        if constexpr (MvIsQ4K<B>::V) {
            for (u32 g = lane; g < nv / 16; g += WARP) {
                const float4* p = (const float4*)(xs + 16 * g);
                float t = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 v = p[i];
                    t += v.x + v.y + v.z + v.w;
                }
                gs[g] = t;
            }
        }
        cp_async_wait<M::SLOTS - 1>();
        __syncwarp();
        const u8* slot = mine + (j % M::SLOTS) * MV_ROWS * ROW + r * ROW;
        for (u32 b = 0; b < nv / 256; b++) acc += P::dot(slot + P::SB * b, sub, xs + 256 * b, gs + 16 * b);
        // Every lane is done with the slot and the source values before they are refilled.
        __syncwarp();
    }
    // The 8 lanes of each row, then the warps.
#pragma unroll
    for (int o = WARP / 2; o >= 4; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (Src::SQUARES) ss = warp_sum(ss);
    if (lane < MV_ROWS) part[warp][lane] = acc;
    if (lane == 0) part[warp][MV_ROWS] = ss;
    mv_write(part, src, y, row, n, col0, rows, k);
}

// With MV_STAGED=1 and the source's rows 16-byte aligned, the staged kernel in the widest copy
// unit that divides the weight's address, its rows' bytes and its chunks' bytes; else the register-ring kernel,
// with wide loads where the weight is 16-byte aligned, byte-wise ones otherwise. Uniform over
// the grid.
template <typename B, typename Src>
__device__ __forceinline__ void mat_vec_rows(const Src& src, const void* w, float* y, u32 n, u32 k,
                                             u32 bx = blockIdx.x) {
#if MV_STAGED == 2 || MV_STAGED == 3
    // The formats with a piece decoder (with 3, the K-quants' alone) take the lane-per-row
    // kernel whatever the alignments (so no other kernel's registers count against it).
    typedef typename MvPieceOf<B>::T P;
    if constexpr (MvPieceOf<B>::HAS && (MV_STAGED == 2 || MvPieceOf<B>::KQUANT)) {
        // Rows of whole 256 values (always for the K-quants, so for them no other kernel is
        // compiled in); others take the ring below.
        if (B::QK % 256 == 0 || k % 256 == 0) {
        __shared__ uint4 smem3[Mv3<P>::WORDS];
        constexpr u32 GMAX = Mv3<P>::GMAX;
        const size_t a = (size_t)w | rb_of<B>(k);
        if (src.aligned()) {
            if ((a & (GMAX - 1)) == 0) mat_vec_lanes<B, P, GMAX, 16>(smem3, src, w, y, n, k, bx);
            else mat_vec_lanes<B, P, 1, 16>(smem3, src, w, y, n, k, bx);
        } else {
            if ((a & (GMAX - 1)) == 0) mat_vec_lanes<B, P, GMAX, 1>(smem3, src, w, y, n, k, bx);
            else mat_vec_lanes<B, P, 1, 1>(smem3, src, w, y, n, k, bx);
        }
        return;
        }
    }
#endif
#if MV_STAGED == 1
    if (src.aligned()) {
        typedef typename MvItemOf<B>::T I;
        __shared__ uint4 smem[MvStage<B, I>::WORDS];
        constexpr u32 GMAX = MvStage<B, I>::GMAX;
        const size_t a = (size_t)w | (size_t)(k / B::QK) * B::BYTES;
        if constexpr (GMAX >= 16) {
            if ((a & 15) == 0) return mat_vec_staged<B, I, 16>(smem, src, w, y, n, k, bx);
        }
        if constexpr (GMAX >= 8) {
            if ((a & 7) == 0) return mat_vec_staged<B, I, 8>(smem, src, w, y, n, k, bx);
        }
        if constexpr (GMAX >= 4) {
            if ((a & 3) == 0) return mat_vec_staged<B, I, 4>(smem, src, w, y, n, k, bx);
        }
    }
#endif
    if ((((size_t)w) & 15) == 0 && src.aligned())
        mat_vec_rows_at<B, 16>(src, w, y, n, k, bx);
    else
        mat_vec_rows_at<B, 1>(src, w, y, n, k, bx);
}

// 8 floats of row `row` at v (v a multiple of 8): two 16-byte loads when A > 1 (x 16-byte
// aligned and k a multiple of 4).
template <u32 A>
__device__ __forceinline__ void load8_f32(const float* x, u32 k, u32 row, u32 v, float* out) {
    const float* p = x + (size_t)row * k + v;
    if constexpr (A > 1) {
        const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
        out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
        out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = p[i];
    }
}

__device__ __forceinline__ bool aligned16(const void* p) { return (((size_t)p) & 15) == 0; }

// The sources: fetch<A> loads a lane's 8 values of each input (Raw), make turns them into
// the values the dot products take (and adds the squares of x to ss where SQUARES).

// The activations as they are.
struct MvPlain {
    static constexpr bool SQUARES = false;
    struct Raw {
        float x[8];
    };
    const float* x;
    u32 k;
    const float* res;  // [m, n], added to y; null for none
    __device__ __forceinline__ bool aligned() const { return aligned16(x) && k % 4 == 0; }
    template <u32 A>
    __device__ __forceinline__ void fetch(u32 row, u32 v, Raw& r) const {
        load8_f32<A>(x, k, row, v, r.x);
    }
    __device__ __forceinline__ void make(const Raw& r, float* out, float&) const {
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = r.x[i];
    }
    __device__ __forceinline__ float finish(float t, float, u32) const { return t; }
};

// The two-input sources' loads: a at the token's row, b at the token's row or, for a weight
// shared by every row (b_shared), row 0.
struct MvTwo {
    struct Raw {
        float a[8], b[8];
    };
    const float* a;
    const float* b;
    u32 k;
    bool b_shared;
    const float* res;  // [m, n], added to y; null for none
    __device__ __forceinline__ bool aligned() const { return aligned16(a) && aligned16(b) && k % 4 == 0; }
    template <u32 A>
    __device__ __forceinline__ void fetch(u32 row, u32 v, Raw& r) const {
        load8_f32<A>(a, k, row, v, r.a);
        load8_f32<A>(b, k, b_shared ? 0 : row, v, r.b);
    }
};

// rms_norm(x) with weight nw (a = x, b = nw; +1 for Gemma's norms): x · nw goes into the dot
// products and the squares of x are summed on the way, so the norm needs no pass of its own;
// the dot products are scaled by 1 / rms at the end.
struct MvRmsNorm : MvTwo {
    static constexpr bool SQUARES = true;
    float add, eps;
    __device__ __forceinline__ void make(const Raw& r, float* out, float& ss) const {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            ss += r.a[i] * r.a[i];
            out[i] = r.a[i] * (r.b[i] + add);
        }
    }
    __device__ __forceinline__ float finish(float t, float q, u32 k) const { return t * rsqrtf(q / (float)k + eps); }
};

// A GLU's hidden row, act(gate) · up (a = gate, b = up; act 0 SiLU, 1 tanh-GELU).
struct MvGlu : MvTwo {
    static constexpr bool SQUARES = false;
    u32 act;
    __device__ __forceinline__ void make(const Raw& r, float* out, float&) const {
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = (act == 0 ? silu(r.a[i]) : gelu_tanh(r.a[i])) * r.b[i];
    }
    __device__ __forceinline__ float finish(float t, float, u32) const { return t; }
};

