// The decode mat-vec over int8 activations (the MV_X8 knob): y [m, n] = xs [m, k] · w [n, k]ᵀ
// for m ≤ 4 token rows, in two launches.
//
// 1. quantize_x8 makes each token row's activations (the source: as they are, rms-normalised,
//    or a GLU's act(gate) · up) once, and writes them as MVX_PARTS int8 parts a value with a
//    scale a group of 32 values, plus the group's exact f32 sum (for the K-quants' mins).
// 2. mat_vec_x8_<fmt> takes the weight's codes as int8 and the activation parts into integer
//    dot products (dp4a: 4 products and their sum, exact in the 32-bit accumulator), one part
//    at a time, and scales each group's sums once.
//
// Why: the f32 kernels (mat_vec.cuh) spend about 3 instructions a weight (unpack, convert,
// FMA) and read a 4-byte activation from shared memory for every weight they multiply; at the
// HBM rate that is more shared-memory traffic and more instructions than the SMs issue (ncu,
// H100, 2026-11-27: L1/shared pipe 74 %, DRAM 26 %). Here a Q4_K weight costs 2·MVX_PARTS/8
// dp4a and a share of the nibble unpacking, each lane keeps its activation words in registers
// for all MVX_ROWS rows it takes, and the weights are staged through shared memory.
//
// The error bound. A group g of 32 values x_i with a = max |x_i| has scale s = a / 127 and
// t_i = x_i · (127 / a) in [-127, 127] (f32, so t_i = x_i / s · (1 + e), |e| ≤ 1.5 · 2^-23 from
// the three roundings of 127 / a, a / 127 and the product). The parts: h = rint(t) (|h| ≤ 127),
// r = t - h in [-0.5, 0.5] (exact: Sterbenz); m = rint(254 r) (|m| ≤ 127), r' = 254 r - m in
// [-0.5, 0.5] (254 r rounded: at most 2^-25 · 127 more); l = rint(254 r') (|l| ≤ 127). Then
// x' = s (h + m / 254 + l / 254²) differs from x by at most
//   1 part:  s / 2                = a / 254          (3.9e-3 a; a measurement knob only)
//   2 parts: s / (2 · 254)        = a / 64516        (1.6e-5 a)
//   3 parts: s / (2 · 254²) + s · 2^-25 · 127 / 254 + |x| 1.5 · 2^-23
//            ≤ a · 6.3e-8 + |x| 1.8e-7   (a few of f32's own roundings)
// per value, so |Σ w x' - Σ w x| ≤ Σ_g a_g Σ_{i∈g} |w_i| · (that factor). The default, 3
// parts, is within a few f32 ulps of each value. A group whose largest magnitude is below
// 2^-100 (127 / a would overflow) is stored as zeros: an error below 2^-100 a value. Every dp4a sum is exact: at most 16 products of a code
// (|q| ≤ 15 for Q4_K's nibbles) and a part (|p| ≤ 127) a lane and group, |Σ| ≤ 30480, far
// inside 32 bits, and turned into a float exactly (below 2^22: int_as_f32). The part sums are
// combined in f32 (S_h + (S_m + S_l / 254) / 254, relative rounding 2^-23 each), then the
// group's scale, the block's scale d · sc and its min term dmin · m · Σx are applied as the
// f32 kernels apply them.
//
// Layout of one token row's quantized activations (k a multiple of 256): for each group g,
// MVX_PARTS runs of 32 int8 at byte 32 (MVX_PARTS g + p); after all groups, for each pair of
// groups (2j, 2j + 1) the float4 (s_2j, Σx_2j, s_2j+1, Σx_2j+1). Row stride
// k (MVX_PARTS + 1/4) bytes (a multiple of 64). The launcher sizes the scratch from the same
// knob (plan/mat_mul.rs, x8_row_bytes).

#ifndef MVX_PARTS
#define MVX_PARTS 3
#endif
// MVX_SPLIT: 1 (the default) for the split kernel (a block's warps split the rows' k, up to 8
// rows a block, weights loaded straight into registers), 0 for the staged one (a warp owns its
// rows over the whole k, weights staged through shared memory by cp.async). MVX_ROWS: the
// rows a block (split) or a warp (staged) takes.
#ifndef MVX_SPLIT
#define MVX_SPLIT 1
#endif
#ifndef MVX_ROWS
#if MVX_SPLIT
#define MVX_ROWS 8
#else
#define MVX_ROWS 2
#endif
#endif
static_assert(MVX_PARTS >= 1 && MVX_PARTS <= 3, "MVX_PARTS: 1 to 3 int8 parts a value");
// MVX_MMA, MVX_WARPS, MVX_DEPTH, MVX_BLOCKS: the tensor-core form of the Q4_K kernel (at the end of
// the file). Its defaults (3 blocks in flight a warp, 2 blocks an SM: at most 128 registers)
// build with no local memory for sm_90a, sm_100a and sm_120a; depth 2 spills on sm_100a.
#ifndef MVX_MMA
#define MVX_MMA 0
#endif
#ifndef MVX_WARPS
#define MVX_WARPS 8
#endif
#ifndef MVX_DEPTH
#define MVX_DEPTH 3
#endif
// MVX_BLOCKS: the blocks an SM must hold (__launch_bounds__), so the registers a thread.
#ifndef MVX_BLOCKS
#define MVX_BLOCKS 2
#endif
static_assert(MVX_WARPS >= 1 && MVX_WARPS <= 8, "MVX_WARPS: 1 to 8 warps a block");
static_assert(MVX_BLOCKS >= 1 && MVX_BLOCKS <= 8, "MVX_BLOCKS: 1 to 8 blocks an SM");
static_assert(MVX_DEPTH >= 1 && MVX_DEPTH <= 4, "MVX_DEPTH: 1 to 4 blocks in flight a warp");
static_assert(MVX_ROWS >= 1 && MVX_ROWS <= 8, "MVX_ROWS: 1 to 8 rows");

#define X8_THREADS 128
#define X8_VALUES 1024  // values a quantize_x8 block takes: 8 a thread

__device__ __forceinline__ size_t x8_row_bytes(u32 k) { return (size_t)k * MVX_PARTS + (size_t)k / 4; }

// The three parts of t (|t| ≤ 127), each in [-127, 127]. fminf/fmaxf send a NaN to the bound.
__device__ __forceinline__ void x8_split(float t, int* p) {
    float h = fminf(fmaxf(rintf(t), -127.0f), 127.0f);
    float r = t - h;
    p[0] = (int)h;
#pragma unroll
    for (int i = 1; i < MVX_PARTS; i++) {
        const float u = r * 254.0f;
        const float q = fminf(fmaxf(rintf(u), -127.0f), 127.0f);
        p[i] = (int)q;
        r = u - q;
    }
}

// 4 floats at p: one vector load where p is 16-byte aligned (al, uniform), else 4 loads.
__device__ __forceinline__ float4 load4f(const float* p, bool al) {
    if (al) return *(const float4*)p;
    float4 r;
    r.x = p[0], r.y = p[1], r.z = p[2], r.w = p[3];
    return r;
}

// kind 0: x = a; 1: rms_norm(a) with weight b (+ add), eps; 2: act(a) · b (act 0 SiLU, 1 tanh-GELU).
// Grid (ceil(k / 1024), m), X8_THREADS threads; each thread 8 values, 4 threads a group. Started
// early by programmatic dependent launch (its loads wait for the kernel before), and lets the
// mat-vec after it start at once, so that one's weights are in flight while this runs. Every
// load a thread makes is issued before the first is used (one memory round trip, two for
// the norm's sum of squares).
// @hot
// @pdl
extern "C" __global__ void __launch_bounds__(X8_THREADS)
quantize_x8(const float* a, const float* b, float* q, u32 m, u32 k, u32 kind, float eps, float add, u32 act) {
    __shared__ float red[X8_THREADS / WARP];
    grid_wait();
    grid_launch_dependents();
    const u32 t = blockIdx.y, lane = threadIdx.x % WARP;
    const float* ar = a + (size_t)t * k;
    const bool al = ((size_t)a & 15) == 0 && ((size_t)b & 15) == 0;  // every row alike: k % 256 == 0
    const u32 v0 = blockIdx.x * X8_VALUES + 8 * threadIdx.x;
    const bool mine = v0 < k;
    float x[8] = {}, y[8] = {};
    if (mine) {
        const float4 x0 = load4f(ar + v0, al), x1 = load4f(ar + v0 + 4, al);
        x[0] = x0.x, x[1] = x0.y, x[2] = x0.z, x[3] = x0.w, x[4] = x1.x, x[5] = x1.y, x[6] = x1.z, x[7] = x1.w;
        if (kind != 0) {
            const float* br = b + (kind == 2 ? (size_t)t * k : 0) + v0;
            const float4 y0 = load4f(br, al), y1 = load4f(br + 4, al);
            y[0] = y0.x, y[1] = y0.y, y[2] = y0.z, y[3] = y0.w, y[4] = y1.x, y[5] = y1.y, y[6] = y1.z, y[7] = y1.w;
        }
    }
    if (kind == 1) {
        // The whole row's mean square, in a fixed order (every block the same sum).
        float ss = 0.0f;
#pragma unroll 4
        for (u32 v = 4 * threadIdx.x; v < k; v += 4 * X8_THREADS) {
            const float4 z = load4f(ar + v, al);
            ss += z.x * z.x + z.y * z.y + z.z * z.z + z.w * z.w;
        }
        ss = warp_sum(ss);
        if (lane == 0) red[threadIdx.x / WARP] = ss;
        __syncthreads();
        float tot = 0.0f;
#pragma unroll
        for (int w = 0; w < X8_THREADS / WARP; w++) tot += red[w];
        const float scale = rsqrtf(tot / (float)k + eps);
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = x[i] * scale * (y[i] + add);
    } else if (kind == 2) {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = (act == 0 ? silu(x[i]) : gelu_tanh(x[i])) * y[i];
    }
    // A warp's 256 values lie wholly inside or past the row (k is a multiple of 256), so the
    // shuffles below see whole warps.
    if (!mine) return;
    float amax = 0.0f, sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        amax = fmaxf(amax, fabsf(x[i]));
        sum += x[i];
    }
    // The group's 4 threads are lanes 4j .. 4j + 3.
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
#if MVX_MMA
    // One scale for the warp's 256 values (a Q4_K block): mat_vec_x8_q4_k_mma adds a block's
    // scaled group sums as integers.
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 4));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 8));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 16));
#endif
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    // Below 2^-100 the group is stored as zeros (127 / amax could overflow to infinity).
    const float inv = amax >= __int_as_float(0x0D800000) ? 127.0f / amax : 0.0f;  // 2^-100
    u32 words[MVX_PARTS][2];
#pragma unroll
    for (int p = 0; p < MVX_PARTS; p++) words[p][0] = words[p][1] = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int parts[MVX_PARTS];
        x8_split(x[i] * inv, parts);
#pragma unroll
        for (int p = 0; p < MVX_PARTS; p++) words[p][i / 4] |= ((u32)parts[p] & 0xFFu) << (8 * (i % 4));
    }
    u8* row = (u8*)q + (size_t)t * x8_row_bytes(k);
    const u32 g = v0 / 32;
#pragma unroll
    for (int p = 0; p < MVX_PARTS; p++) {
        uint2 w;
        w.x = words[p][0], w.y = words[p][1];
        *(uint2*)(row + 32 * (MVX_PARTS * g + p) + 8 * (lane % 4)) = w;
    }
    if (lane % 4 == 0) {
        float* aux = (float*)(row + (size_t)k * MVX_PARTS);
        aux[2 * g] = amax / 127.0f;
        aux[2 * g + 1] = sum;
    }
}

// The block's rows row0 .. row0 + rows: each the sum of its warps' parts (in warp order),
// plus the residual where given. Threads 0 .. rows - 1 write one each.
template <u32 R>
__device__ __forceinline__ void x8_store_rows(const float (*part)[R], u32 warps, u32 rows, u32 row0, u32 n,
                                              const float* res, float* y) {
    if (threadIdx.x < rows) {
        float v = 0.0f;
        for (u32 i = 0; i < warps; i++) v += part[i][threadIdx.x];
        const size_t at = (size_t)blockIdx.y * n + row0 + threadIdx.x;
        y[at] = res != nullptr ? v + res[at] : v;
    }
}

// Σ of the 4 products of a's and b's bytes (signed), plus c.
__device__ __forceinline__ int x8_dp4a(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

// An integer below 2^22 in magnitude as a float, exactly, with two full-rate instructions
// (integer-to-float conversions run at a quarter of the FMA rate on sm_80..sm_90).
__device__ __forceinline__ float int_as_f32(int s) { return __int_as_float(s + 0x4B400000) - 12582912.0f; }

// The parts' sums of one group as one float: S_h + (S_m + S_l / 254) / 254.
__device__ __forceinline__ float x8_combine(const int* s) {
    float f = int_as_f32(s[MVX_PARTS - 1]);
#pragma unroll
    for (int p = MVX_PARTS - 2; p >= 0; p--) f = int_as_f32(s[p]) + f * (1.0f / 254.0f);
    return f;
}

// Q4_K over int8 activations. A warp takes MVX_ROWS consecutive rows (a block 4 warps) over
// the whole row: in step j, lane l takes piece l % 8 (16 bytes of nibbles: 16 values of group
// 2c and the same 16 of group 2c + 1, c = piece / 2) of block 4j + l / 8 of each of its rows.
// A lane loads its activation words once for all the rows. The weights are staged: each step's
// 4 blocks of each row (576 contiguous bytes) are copied by cp.async into a ring of MVX_STAGES
// slots of the warp's own shared memory, MVX_STAGES - 1 steps ahead of the arithmetic, so
// bytes are in flight without registers holding them (a warp has all of a 4096-value row in
// flight at once); the first steps are issued before grid_wait, while the kernel before
// (quantize_x8) still runs. G: the copy unit, 16 (cp.async) or 1 (plain byte copies, for a
// weight view whose alignment allows no more).
#ifndef MVX_STAGES
#define MVX_STAGES 4
#endif
static_assert(MVX_STAGES >= 2 && MVX_STAGES <= 8, "MVX_STAGES: 2 to 8 steps in flight a warp");
#define X8_STEP_BYTES (4 * 144)  // a row's 4 blocks of a step
#if !MVX_SPLIT
// A block's ring: its warps' slots of their rows' steps.
typedef uint4 X8Ring[X8_THREADS / WARP][MVX_STAGES][MVX_ROWS][X8_STEP_BYTES / 16];
static_assert(sizeof(X8Ring) <= 48 * 1024, "MVX_STAGES x MVX_ROWS: at most 48 KiB of static shared memory a block");
#endif

// One lane's piece of a Q4_K block (header h, its 16 bytes of nibbles q) against the
// activation parts xa (group 2c, half `half`) and xb (group 2c + 1) with ax = (s0, Σx0, s1, Σx1).
__device__ __forceinline__ float q4k_piece_x8(const uint4& h, const uint4& q, const uint4* xa, const uint4* xb,
                                              const float4& ax, u32 c, u32 half) {
    const u32 wq[4] = {q.x, q.y, q.z, q.w};
    int s0[MVX_PARTS], s1[MVX_PARTS];
#pragma unroll
    for (int p = 0; p < MVX_PARTS; p++) s0[p] = s1[p] = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 lo = wq[i] & 0x0F0F0F0Fu, hi = (wq[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int p = 0; p < MVX_PARTS; p++) {
            const u32 va[4] = {xa[p].x, xa[p].y, xa[p].z, xa[p].w};
            const u32 vb[4] = {xb[p].x, xb[p].y, xb[p].z, xb[p].w};
            s0[p] = x8_dp4a(lo, va[i], s0[p]);
            s1[p] = x8_dp4a(hi, vb[i], s1[p]);
        }
    }
    float sc0, m0, sc1, m1;
    q4k_pair_scales(h, c, sc0, m0, sc1, m1);
    const float d = f16_bits(h.x & 0xFFFF), dmin = f16_bits(h.x >> 16);
    float t = d * (sc0 * (ax.x * x8_combine(s0)) + sc1 * (ax.z * x8_combine(s1)));
    // The mins once a group: by the lane of its first half.
    if (half == 0) t -= dmin * (m0 * ax.y + m1 * ax.w);
    return t;
}

// This lane's activation parts of block b (16 values of each of groups g0 = 8b + 2c and
// g0 + 1) and the two groups' scales and sums.
__device__ __forceinline__ void x8_load_acts(const u8* parts, const float* aux, u32 b, u32 c, u32 half, uint4* xa,
                                             uint4* xb, float4& ax) {
    const u32 g0 = 8 * b + 2 * c;
#pragma unroll
    for (int p = 0; p < MVX_PARTS; p++) {
        xa[p] = *(const uint4*)(parts + 32 * (MVX_PARTS * g0 + p) + 16 * half);
        xb[p] = *(const uint4*)(parts + 32 * (MVX_PARTS * (g0 + 1) + p) + 16 * half);
    }
    ax = *(const float4*)(aux + 2 * g0);  // s0, Σx0, s1, Σx1
}

#if !MVX_SPLIT
template <u32 G>
__device__ __forceinline__ void mat_vec_x8_q4k_at(X8Ring& ring, const u8* xq, const u8* w, const float* res, float* y,
                                                  u32 n, u32 k, u32 bx) {
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 row0 = (bx * (X8_THREADS / WARP) + warp) * MVX_ROWS;
    if (row0 >= n) return;  // the whole warp (no block-wide barrier below)
    const u32 rows = min((u32)MVX_ROWS, n - row0);
    const u32 nb = k / 256, steps = (nb + 3) / 4, sub = lane % 8, c = sub / 2, half = sub % 2;
    const size_t rb = (size_t)nb * 144;
    const u8* wr[MVX_ROWS];
#pragma unroll
    for (int r = 0; r < MVX_ROWS; r++) wr[r] = w + (size_t)(row0 + min((u32)r, rows - 1)) * rb;
    // Step j's bytes of every row into slot j % MVX_STAGES (one commit group a step, empty
    // past the last step so the wait below counts alike).
    auto issue = [&](u32 j) {
        if (j < steps) {
            const u32 bytes = (min(4 * j + 4, nb) - 4 * j) * 144;
            const size_t off = (size_t)j * X8_STEP_BYTES;
#pragma unroll
            for (int r = 0; r < MVX_ROWS; r++) {
                u8* slot = (u8*)ring[warp][j % MVX_STAGES][r];
                for (u32 u = lane; u < bytes / G; u += WARP) {
                    if constexpr (G >= 4) cp_async<G>(slot + G * u, wr[r] + off + G * u);
                    else slot[u] = wr[r][off + u];
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (u32 j = 0; j + 1 < MVX_STAGES; j++) issue(j);
    grid_launch_dependents();
    grid_wait();
    const u8* parts = xq + (size_t)blockIdx.y * x8_row_bytes(k);
    const float* aux = (const float*)(parts + (size_t)k * MVX_PARTS);
    float acc[MVX_ROWS];
#pragma unroll
    for (int r = 0; r < MVX_ROWS; r++) acc[r] = 0.0f;
    for (u32 j = 0; j < steps; j++) {
        issue(j + MVX_STAGES - 1);
        const u32 b = 4 * j + lane / 8;
        // This piece's activations (loaded while this step's weights land).
        uint4 xa[MVX_PARTS], xb[MVX_PARTS];
        float4 ax;
        x8_load_acts(parts, aux, min(b, nb - 1), c, half, xa, xb, ax);
        cp_async_wait<MVX_STAGES - 1>();
        __syncwarp();
        if (b < nb) {
#pragma unroll
            for (int r = 0; r < MVX_ROWS; r++) {
                const u8* blk = (const u8*)ring[warp][j % MVX_STAGES][r] + 144 * (lane / 8);
                const uint4 h = *(const uint4*)blk, q = *(const uint4*)(blk + 16 + 16 * sub);
                acc[r] += q4k_piece_x8(h, q, xa, xb, ax, c, half);
            }
        }
        // Every lane is done with the slot before a later issue refills it.
        __syncwarp();
    }
#pragma unroll
    for (int r = 0; r < MVX_ROWS; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == (u32)r && (u32)r < rows) {
            const size_t at = (size_t)blockIdx.y * n + row0 + r;
            y[at] = res != nullptr ? v + res[at] : v;
        }
    }
}

#endif  // !MVX_SPLIT

#if MVX_SPLIT
// The split kernel: a block takes MVX_ROWS consecutive rows; its warps (blockDim.x / 32, 1 to
// 4: the launcher gives rows of few blocks fewer warps) split the rows' blocks, warp w taking
// steps j = w, w + warps, .. of 4 blocks each (lane l: piece l % 8 of block 4j + l / 8 of every
// row, as above). A lane's activation words serve all MVX_ROWS rows, so the activations cost
// 1 / MVX_ROWS of what they would for one row (the L1 traffic that bounds these kernels); all
// the rows' loads of a step are issued together, the first step's before grid_wait. The
// warps' sums meet in shared memory, added in warp order. A: the weight's load width (16, or
// 1 for a weight view whose alignment allows no more).
template <u32 A>
__device__ __forceinline__ void mat_vec_x8_q4k_split(const u8* xq, const u8* w, const float* res, float* y, u32 n,
                                                     u32 k, u32 bx) {
    __shared__ float part[X8_THREADS / WARP][MVX_ROWS];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    const u32 row0 = bx * MVX_ROWS;
    if (row0 >= n) return;  // the whole block (the grid has none such)
    const u32 rows = min((u32)MVX_ROWS, n - row0);
    const u32 nb = k / 256, sub = lane % 8, c = sub / 2, half = sub % 2;
    const size_t rb = (size_t)nb * 144;
    const u8* wr[MVX_ROWS];
#pragma unroll
    for (int r = 0; r < MVX_ROWS; r++) wr[r] = w + (size_t)(row0 + min((u32)r, rows - 1)) * rb;
    float acc[MVX_ROWS];
#pragma unroll
    for (int r = 0; r < MVX_ROWS; r++) acc[r] = 0.0f;
    uint4 h[MVX_ROWS], q[MVX_ROWS];
    auto fetch = [&](u32 b) {
#pragma unroll
        for (int r = 0; r < MVX_ROWS; r++) {
            h[r] = load16<A>(wr[r] + 144 * b);
            q[r] = load16<A>(wr[r] + 144 * b + 16 + 16 * sub);
        }
    };
    const u32 step = 4 * warps;
    u32 b = 4 * warp + lane / 8;
    if (b < nb) fetch(b);
    grid_launch_dependents();
    grid_wait();
    const u8* parts = xq + (size_t)blockIdx.y * x8_row_bytes(k);
    const float* aux = (const float*)(parts + (size_t)k * MVX_PARTS);
    while (b < nb) {
        uint4 xa[MVX_PARTS], xb[MVX_PARTS];
        float4 ax;
        x8_load_acts(parts, aux, b, c, half, xa, xb, ax);
#pragma unroll
        for (int r = 0; r < MVX_ROWS; r++) acc[r] += q4k_piece_x8(h[r], q[r], xa, xb, ax, c, half);
        b += step;
        if (b < nb) fetch(b);
    }
#pragma unroll
    for (int r = 0; r < MVX_ROWS; r++) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
    }
    __syncthreads();
    x8_store_rows(part, warps, rows, row0, n, res, y);
}
#endif  // MVX_SPLIT

// One to three weights of one width (n1 = n2 = 0 and null w1, w2 for one), the grid's blocks
// over w0's rows, then w1's, then w2's; res (one weight only) is added as y is written.
// Grid (Σ ceil(n_j / R), m) with R = MVX_ROWS (split: 32 · min(4, ceil(k / 1024)) threads) or
// 4 MVX_ROWS (staged: X8_THREADS threads).
// @hot
// @pdl
extern "C" __global__ void __launch_bounds__(X8_THREADS)
mat_vec_x8_q4_k(const float* xq, const u8* w0, const u8* w1, const u8* w2, const float* res, float* y0, float* y1,
                float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k) {
#if MVX_SPLIT
    constexpr u32 RB = MVX_ROWS;
#else
    __shared__ X8Ring ring;  // one for both copy units
    constexpr u32 RB = (X8_THREADS / WARP) * MVX_ROWS;
#endif
    const WeightShare s = weight_share(RB, w0, w1, w2, y0, y1, y2, n0, n1, n2);
    const u8* w = (const u8*)s.w;
    float* y = s.y;
    const u32 n = s.n, bx = s.bx;
#if MVX_SPLIT
    if (((size_t)w & 15) == 0)
        mat_vec_x8_q4k_split<16>((const u8*)xq, w, res, y, n, k, bx);
    else
        mat_vec_x8_q4k_split<1>((const u8*)xq, w, res, y, n, k, bx);
#else
    if (((size_t)w & 15) == 0)
        mat_vec_x8_q4k_at<16>(ring, (const u8*)xq, w, res, y, n, k, bx);
    else
        mat_vec_x8_q4k_at<1>(ring, (const u8*)xq, w, res, y, n, k, bx);
#endif
}

// The tensor-core form (MVX_MMA=1): a block takes 16 rows, its warps (blockDim.x / 32: the
// launcher spreads the row's 256-value blocks evenly over at most MVX_WARPS) split the rows'
// blocks (warp w: blocks w, w + warps, ..), and a warp multiplies a block's 16 rows into the
// activation parts with one mma.m16n8k32 (int8, exact int32 sums) a group of 32: A is the 16
// rows' nibbles of the group, B's columns are the group's parts (column p = part p; columns
// MVX_PARTS .. 7 zero), so one instruction makes every row's part sums, and a warp reads a
// group's activations once for 16 rows.
//
// The dot product of a group does not depend on the order of its 32 values, so the kernel
// gives the mma's k index its own order: lane (g, t) = (lane / 4, lane % 4) loads bytes
// 8t .. 8t + 7 of each 32-byte run of nibbles of rows g and g + 8 (one 8-byte load a row and
// run; a quad of lanes reads each row's run whole), whose low nibbles are values 8t .. 8t + 7
// of group 2j and high nibbles of group 2j + 1; the mma's A takes them as k = 4t .. 4t + 3
// (a[0], a[1]) and 16 + 4t .. 16 + 4t + 3 (a[2], a[3]), and B takes the parts of the same
// values in the same places (lane (p, t), p < MVX_PARTS: bytes 8t .. 8t + 7 of part p's run).
// Lane (g, t) gets back sums of parts 2t and 2t + 1 for rows g and g + 8 (t = 0: parts 0 and
// 1, t = 1: part 2).
//
// With MVX_MMA, quantize_x8 gives all 8 groups of a 256-value block one activation scale (the
// block's largest magnitude / 127: each value's error bound above holds with a the block's
// largest magnitude instead of its group's), so the scaled sums of a block stay integers: a
// lane multiplies each group's part sums by the row's 6-bit group scale and adds them in
// int32 (|Σ| ≤ 8 · 63 · 32 · 15 · 127 < 2^25), and turns them into floats once a block:
// d · s · (S_p0 + S_p1 / 254 + S_p2 / 254²) (each lane its own parts). The mins (dmin · m ·
// Σx, Σx the group's exact f32 sum) are spread over the quad, lane t taking groups 2t and
// 2t + 1 of both rows; the quad's sums meet at the end. A warp has MVX_DEPTH blocks' weights
// in flight; the first are loaded before grid_wait.

// One block's weights for lane (g, t): headers of rows g and g + 8, and of each 64-value
// chunk j, bytes 8t .. 8t + 7 of its 32 bytes of nibbles.
struct Q4kMmaBlock {
    uint4 ha, hb;
    uint2 qa[4], qb[4];
};

template <u32 A>
__device__ __forceinline__ void q4k_mma_fetch(Q4kMmaBlock& s, const u8* ra, const u8* rb, u32 t) {
    s.ha = load16<A>(ra);
    s.hb = load16<A>(rb);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        s.qa[j] = bytes8<A>(ra + 16 + 32 * j + 8 * t);
        s.qb[j] = bytes8<A>(rb + 16 + 32 * j + 8 * t);
    }
}

// A Q4_K header's 6-bit scales (sc) or mins (m) of groups 0-3 (lo) and 4-7 (hi), a byte each.
__device__ __forceinline__ void q4k_scales4(const uint4& h, u32& sc_lo, u32& sc_hi, u32& m_lo, u32& m_hi) {
    sc_lo = h.y & 0x3F3F3F3Fu;
    m_lo = h.z & 0x3F3F3F3Fu;
    sc_hi = (h.w & 0x0F0F0F0Fu) | ((h.y >> 2) & 0x30303030u);
    m_hi = ((h.w >> 4) & 0x0F0F0F0Fu) | ((h.z >> 2) & 0x30303030u);
}

// Block b into acc[0] (row g) and acc[1] (row g + 8): pw[i], the weight of this lane's output
// column 2t + i (254^-(2t+i) for a part, 0 past them).
__device__ __forceinline__ void q4k_mma_block(const Q4kMmaBlock& s, const u8* parts, const float* aux, u32 b, u32 g,
                                              u32 t, const float* pw, float* acc) {
    u32 sca[2], scb[2], ma[2], mb[2];
    q4k_scales4(s.ha, sca[0], sca[1], ma[0], ma[1]);
    q4k_scales4(s.hb, scb[0], scb[1], mb[0], mb[1]);
    int ia[2] = {0, 0}, ib[2] = {0, 0};
#pragma unroll
    for (u32 grp = 0; grp < 8; grp++) {
        const u32 j = grp / 2, hi = grp % 2;
        u32 bf[2] = {0u, 0u};
        if (g < MVX_PARTS) {
            const uint2 v = *(const uint2*)(parts + 32 * (MVX_PARTS * (8 * b + grp) + g) + 8 * t);
            bf[0] = v.x, bf[1] = v.y;
        }
        const u32 sh = 4 * hi;
        const u32 af[4] = {(s.qa[j].x >> sh) & 0x0F0F0F0Fu, (s.qb[j].x >> sh) & 0x0F0F0F0Fu,
                           (s.qa[j].y >> sh) & 0x0F0F0F0Fu, (s.qb[j].y >> sh) & 0x0F0F0F0Fu};
        int c[4] = {0, 0, 0, 0};
        mma_s8_16832(c, af, bf);
        const int ka = (int)__byte_perm(sca[grp / 4], 0, 0x4440 | (grp % 4));
        const int kb = (int)__byte_perm(scb[grp / 4], 0, 0x4440 | (grp % 4));
        ia[0] += c[0] * ka, ia[1] += c[1] * ka;
        ib[0] += c[2] * kb, ib[1] += c[3] * kb;
    }
    const float xs = aux[2 * 8 * b];  // the block's activation scale (every group's)
    const float da = f16_bits(s.ha.x & 0xFFFF), dma = f16_bits(s.ha.x >> 16);
    const float db = f16_bits(s.hb.x & 0xFFFF), dmb = f16_bits(s.hb.x >> 16);
    acc[0] += (da * xs) * ((float)ia[0] * pw[0] + (float)ia[1] * pw[1]);
    acc[1] += (db * xs) * ((float)ib[0] * pw[0] + (float)ib[1] * pw[1]);
    // This lane's mins: groups 2t and 2t + 1 (bytes 2t % 4 and 2t % 4 + 1 of the lo or hi word).
    const float2 sx0 = *(const float2*)(aux + 2 * (8 * b + 2 * t));      // s, Σx of group 2t
    const float2 sx1 = *(const float2*)(aux + 2 * (8 * b + 2 * t + 1));  // s, Σx of group 2t + 1
    const u32 sel = 0x4440 | ((2 * t) % 4), sel1 = 0x4440 | ((2 * t) % 4 + 1);
    const u32 wa = t < 2 ? ma[0] : ma[1], wb = t < 2 ? mb[0] : mb[1];
    acc[0] -= dma * ((float)__byte_perm(wa, 0, sel) * sx0.y + (float)__byte_perm(wa, 0, sel1) * sx1.y);
    acc[1] -= dmb * ((float)__byte_perm(wb, 0, sel) * sx0.y + (float)__byte_perm(wb, 0, sel1) * sx1.y);
}

template <u32 A>
__device__ __forceinline__ void mat_vec_x8_q4k_mma_at(const u8* xq, const u8* w, const float* res, float* y, u32 n,
                                                      u32 k, u32 bx) {
    __shared__ float part[MVX_WARPS][16];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, warps = blockDim.x / WARP;
    const u32 g = lane / 4, t = lane % 4;
    const u32 row0 = bx * 16;
    if (row0 >= n) return;  // the whole block (the grid has none such)
    const u32 rows = min(16u, n - row0);
    const u32 nb = k / 256;
    const size_t rbytes = (size_t)nb * 144;
    // Rows past the weight's end compute its last row again (never written).
    const u8* wa = w + (size_t)(row0 + min(g, rows - 1)) * rbytes;
    const u8* wb = w + (size_t)(row0 + min(g + 8, rows - 1)) * rbytes;
    float pw[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const u32 p = 2 * t + i;
        pw[i] = p >= MVX_PARTS ? 0.0f : p == 0 ? 1.0f : p == 1 ? 1.0f / 254.0f : 1.0f / (254.0f * 254.0f);
    }
    float acc[2] = {0.0f, 0.0f};
    // A ring of MVX_DEPTH blocks: slot i holds block b + i · warps.
    Q4kMmaBlock ring[MVX_DEPTH] = {};
    u32 b = warp;
#pragma unroll
    for (u32 i = 0; i < MVX_DEPTH; i++) {
        const u32 bi = b + i * warps;
        if (bi < nb) q4k_mma_fetch<A>(ring[i], wa + 144 * bi, wb + 144 * bi, t);
    }
    grid_launch_dependents();
    grid_wait();
    const u8* parts = xq + (size_t)blockIdx.y * x8_row_bytes(k);
    const float* aux = (const float*)(parts + (size_t)k * MVX_PARTS);
    while (b < nb) {
#pragma unroll
        for (u32 i = 0; i < MVX_DEPTH; i++) {
            const u32 bi = b + i * warps;
            if (bi < nb) {
                q4k_mma_block(ring[i], parts, aux, bi, g, t, pw, acc);
                const u32 bn = bi + MVX_DEPTH * warps;
                if (bn < nb) q4k_mma_fetch<A>(ring[i], wa + 144 * bn, wb + 144 * bn, t);
            }
        }
        b += MVX_DEPTH * warps;
    }
    // The quad's four lanes hold parts of the same two rows' sums.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
        acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
    }
    if (t == 0) {
        part[warp][g] = acc[0];
        part[warp][g + 8] = acc[1];
    }
    __syncthreads();
    x8_store_rows(part, warps, rows, row0, n, res, y);
}

// As mat_vec_x8_q4_k, over the tensor-core form: grid (Σ ceil(n_j / 16), m), 32 · w threads
// (w ≤ MVX_WARPS). Needs quantize_x8 built with MVX_MMA (one activation scale a block).
// @hot
// @pdl
extern "C" __global__ void __launch_bounds__(32 * MVX_WARPS, MVX_BLOCKS)
mat_vec_x8_q4_k_mma(const float* xq, const u8* w0, const u8* w1, const u8* w2, const float* res, float* y0,
                    float* y1, float* y2, u32 m, u32 n0, u32 n1, u32 n2, u32 k) {
    const WeightShare s = weight_share(16, w0, w1, w2, y0, y1, y2, n0, n1, n2);
    const u8* w = (const u8*)s.w;
    if (((size_t)w & 15) == 0)
        mat_vec_x8_q4k_mma_at<16>((const u8*)xq, w, res, s.y, s.n, k, s.bx);
    else
        mat_vec_x8_q4k_mma_at<1>((const u8*)xq, w, res, s.y, s.n, k, s.bx);
}
