// Prefill matmuls: y [M, N] = x [M, K] (f32) · w [N, K]ᵀ. Float weights: in 32×32 output
// tiles through shared memory (each thread computes a 4×1 strip; 32×8 threads).

#define TILE 32

template <typename T>
__device__ __forceinline__ void mat_mul_tiled(const float* x, const T* w, float* y, u32 m, u32 n, u32 k) {
    __shared__ float xs[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const u32 tx = threadIdx.x, ty = threadIdx.y;  // 32 × 8
    const u32 row0 = blockIdx.y * TILE, col0 = blockIdx.x * TILE;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 k0 = 0; k0 < k; k0 += TILE) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const u32 r = ty + 8 * i;
            const u32 kk = k0 + tx;
            xs[r][tx] = (row0 + r < m && kk < k) ? x[(size_t)(row0 + r) * k + kk] : 0.0f;
            ws[r][tx] = (col0 + r < n && kk < k) ? to_f32(w[(size_t)(col0 + r) * k + kk]) : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 j = 0; j < TILE; j++) {
            const float wv = ws[tx][j];
#pragma unroll
            for (int i = 0; i < 4; i++) acc[i] += xs[ty + 8 * i][j] * wv;
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const u32 r = row0 + ty + 8 * i, c = col0 + tx;
        if (r < m && c < n) y[(size_t)r * n + c] = acc[i];
    }
}

// @hot
extern "C" __global__ void mat_mul_f32(const float* x, const float* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_tiled(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_mul_f16(const float* x, const __half* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_tiled(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_mul_bf16(const float* x, const __nv_bfloat16* w, float* y, u32 m, u32 n,
                                        u32 k) {
    mat_mul_tiled(x, w, y, m, n, k);
}

// Prefill matmul for block-quantized weights: 64×64 output tiles, 32 values of K per step.
// Each step dequantizes the weight tile once into shared memory (one load8 per thread: 64
// rows × 4 groups of 8) and stages the activation tile beside it; each of the 256 threads
// then accumulates a 4×4 patch of outputs. A weight row is read once per 64 activation rows
// instead of once per row as the mat-vec does. K must be a multiple of 32 (every block
// format's rows are). The tile's rows come from a row map: consecutive rows for the plain
// matmul, one expert's slots for the grouped MoE matmul.

#define QT 64
#define QK_STEP 32

// Which tile kernel the block formats (and float weights with K a multiple of 32) take: 0 (the
// default) the f32 FMA tile, 1 the split tensor-core tile. A knob of KILN_CUDA_DEFINES, so one
// build measures both on a GPU; both tile 64 × 64 with 256 threads, so the launch is the same.
// With MM_TC=1 the formats with integer codes (TcCodes: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, bf16)
// take mat_mul_tc.cu's tiles instead (exact products); the split tile serves the others, and
// its three-product bf16 split is exact to 2^-14 of Σ|x·w| (below), which is 1.5e-3 on the
// logits of the Gemma 4 MTP assistant where transformers' f32 run and the FMA tile agree to
// 1e-3 (tests/tests/mtp.rs). Not the default until a GPU has timed it.
#ifndef MM_TC
#define MM_TC 0
#endif

// Whether every value of weight format B is a bf16 (the split below then has no low part).
template <typename B>
struct ExactBf16 {
    static constexpr bool value = false;
};
template <>
struct ExactBf16<BF16W> {
    static constexpr bool value = true;
};

#if MM_TC
// The split tile: y = x · wᵀ for a 64 × 64 output tile with mma.sync m16n8k16 (bf16 in,
// f32 accumulation), exact to about 2^-14 of Σ|x·w| rather than to bf16's 2^-8. Each staged
// value v (an activation, a dequantized weight) is split into bf16 hi + lo (split_bf16:
// |v - hi - lo| <= 2^-16 |v|) and each product is taken as xh·wh + xh·wl + xl·wh: the terms
// left out, xl·wl and the splits' remainders, are each at most 2^-16 |x·w|, so
// |x·w - the three| <= 3 · 2^-16 |x·w| < 2^-14 |x·w|, and the f32 sums add their own rounding
// as the FMA tile's do. bf16 keeps f32's exponent range, so no activation overflows (f16
// would). Weights whose values are bf16 (BF16W) have no low part and skip its product.
//
// Each 32-value K step: every thread dequantizes 8 weights (row t/4, values (t%4)·8 ..) and
// loads 8 activations of the same place, splits them and stores hi and lo words in shared
// memory, rows padded to 20 words so the fragment loads (8 rows × 4 words a warp) hit 32
// different banks; the loads of the next step are issued before this step's mma so they are
// in flight meanwhile. The 8 warps each take 32 × 16 outputs: 2 × 2 fragments, 4 accumulators
// a lane each.
#define TC_ROW 20  // u32 words a staged row: 16 for 32 bf16, 4 of padding

__device__ __forceinline__ void tc_store8(u32* hi, u32* lo, const float* v) {
    u32 h[8], l[8];
#pragma unroll
    for (int i = 0; i < 8; i++) split_bf16(v[i], h[i], l[i]);
    uint4 a, b;
    a.x = h[0] | (h[1] << 16), a.y = h[2] | (h[3] << 16), a.z = h[4] | (h[5] << 16), a.w = h[6] | (h[7] << 16);
    b.x = l[0] | (l[1] << 16), b.y = l[2] | (l[3] << 16), b.z = l[4] | (l[5] << 16), b.w = l[6] | (l[7] << 16);
    *(uint4*)hi = a;
    *(uint4*)lo = b;
}

// w: the weight matrix [N, K] whose rows col0 .. col0 + 63 this block takes.
template <typename B, typename Rows>
__device__ __forceinline__ void mat_mul_tile(const float* x, const u8* w, float* y, Rows rows, u32 col0, u32 n,
                                             u32 k) {
    // Shared words as uint4 so the 16-byte stores are aligned (TC_ROW words = 5 uint4).
    __shared__ uint4 xs_hi[QT * TC_ROW / 4], xs_lo[QT * TC_ROW / 4], ws_hi[QT * TC_ROW / 4],
        ws_lo[QT * TC_ROW / 4];
    __shared__ long long xrow[QT], yrow[QT];
    const u32 t = threadIdx.x, lane = t % WARP, warp = t / WARP;
    const u32 g = lane / 4, q = lane % 4;
    const u32 wm = (warp / 4) * 32, wn = (warp % 4) * 16;  // the warp's outputs in the tile
    if (t < QT) {
        xrow[t] = rows.x_row(t);
        yrow[t] = rows.y_row(t);
    }
    __syncthreads();
    // This thread's share of each step: row sr of both tiles, values k0 + sc .. + 8.
    const u32 sr = t / 4, sc = (t % 4) * 8;
    const bool w_ok = col0 + sr < n;
    const u8* wrow = weight_row<B>(w, w_ok ? col0 + sr : 0, k);
    const long long xr = xrow[sr];
    const float* xp = xr >= 0 ? x + (size_t)xr * k + sc : nullptr;
    const bool x16 = ((size_t)x & 15u) == 0;  // rows are then 16-byte aligned (K % 32 == 0)
    float wv[8], xv[8];
    auto fetch = [&](u32 k0) {
        if (w_ok) {
            B::load8(wrow, k0 + sc, wv);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = 0.0f;
        }
        if (xp && x16) {
            const float4 a = *(const float4*)(xp + k0), b = *(const float4*)(xp + k0 + 4);
            xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
            xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) xv[i] = xp ? xp[k0 + i] : 0.0f;
        }
    };
    const u32* xh = (const u32*)xs_hi;
    const u32* xl = (const u32*)xs_lo;
    const u32* wh = (const u32*)ws_hi;
    const u32* wl = (const u32*)ws_lo;
    float acc[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    fetch(0);
    for (u32 k0 = 0; k0 < k; k0 += QK_STEP) {
        const u32 at = sr * TC_ROW + sc / 2;
        tc_store8((u32*)xs_hi + at, (u32*)xs_lo + at, xv);
        tc_store8((u32*)ws_hi + at, (u32*)ws_lo + at, wv);
        __syncthreads();
        if (k0 + QK_STEP < k) fetch(k0 + QK_STEP);
#pragma unroll
        for (u32 kw = 0; kw < QK_STEP / 2; kw += 8) {  // two k16 steps, 8 words each
            u32 ah[2][4], al[2][4], bh[2][2], bl[2][2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const u32 r0 = (wm + 16 * i + g) * TC_ROW + kw + q, r1 = r0 + 8 * TC_ROW;
                ah[i][0] = xh[r0], ah[i][1] = xh[r1], ah[i][2] = xh[r0 + 4], ah[i][3] = xh[r1 + 4];
                al[i][0] = xl[r0], al[i][1] = xl[r1], al[i][2] = xl[r0 + 4], al[i][3] = xl[r1 + 4];
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const u32 c0 = (wn + 8 * j + g) * TC_ROW + kw + q;
                bh[j][0] = wh[c0], bh[j][1] = wh[c0 + 4];
                bl[j][0] = wl[c0], bl[j][1] = wl[c0 + 4];
            }
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    // The small terms first, then the large one.
                    mma_bf16_16816(acc[i][j], al[i], bh[j]);
                    if constexpr (!ExactBf16<B>::value) mma_bf16_16816(acc[i][j], ah[i], bl[j]);
                    mma_bf16_16816(acc[i][j], ah[i], bh[j]);
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const long long r = yrow[wm + 16 * i + g + 8 * e2];
            if (r < 0) continue;
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e1 = 0; e1 < 2; e1++) {
                    const u32 c = col0 + wn + 8 * j + 2 * q + e1;
                    if (c < n) y[(size_t)r * n + c] = acc[i][j][2 * e2 + e1];
                }
        }
}
#else
// The FMA tile. w: the weight matrix [N, K] whose rows col0 .. col0 + 63 this block takes.
template <typename B, typename Rows>
__device__ __forceinline__ void mat_mul_tile(const float* x, const u8* w, float* y, Rows rows, u32 col0, u32 n,
                                             u32 k) {
    __shared__ float xs[QK_STEP][QT + 4];
    __shared__ float ws[QK_STEP][QT + 4];
    const u32 t = threadIdx.x;
    const u32 tx = t % 16, ty = t / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    // This thread's share of the weight tile: row wr, values k0 + wg .. +8.
    const u32 wr = t / 4, wg = (t % 4) * 8;
    const bool w_ok = col0 + wr < n;
    const u8* wrow = weight_row<B>(w, w_ok ? col0 + wr : 0, k);
    // The tile's activation and output rows, looked up once (in shared memory, not registers).
    __shared__ long long xrow[QT], yrow[QT];
    if (t < QT) {
        xrow[t] = rows.x_row(t);
        yrow[t] = rows.y_row(t);
    }
    __syncthreads();
    for (u32 k0 = 0; k0 < k; k0 += QK_STEP) {
        float wv[8];
        if (w_ok) {
            B::load8(wrow, k0 + wg, wv);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) wv[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) ws[wg + i][wr] = wv[i];
        // Activations: 64 rows × 32 values, 8 per thread, coalesced along K.
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 r = t / QK_STEP + 8 * i, c = t % QK_STEP;
            xs[c][r] = xrow[r] >= 0 ? x[(size_t)xrow[r] * k + k0 + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (u32 kk = 0; kk < QK_STEP; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = xs[kk][ty * 4 + i];
                b[i] = ws[kk][tx * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const long long r = yrow[ty * 4 + i];
        if (r < 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32 c = col0 + tx * 4 + j;
            if (c < n) y[(size_t)r * n + c] = acc[i][j];
        }
    }
}
#endif

template <typename B>
__device__ __forceinline__ void mat_mul_blocks(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_tile<B>(x, w, y, DenseRows{blockIdx.y * QT, m}, blockIdx.x * QT, n, k);
}

// The grouped MoE matmul, y [T, k, N] = x [T, (k or 1), K] · w[ids]ᵀ with w [E, N, K]: the
// slots arrive grouped by expert (moe_group in moe.cu: order, offsets [E+1], and tiles [E+1],
// the first 64-slot tile of each expert), and grid row z takes tile z, so each expert's weight
// tile is read once per 64 of its slots. Tiles past the last are idle blocks.
template <typename B>
__device__ __forceinline__ void mat_mul_id_grouped(const float* x, const u8* w, const int* order,
                                                   const int* offsets, const int* tiles, float* y, u32 k,
                                                   u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    u32 e;
    SlotRows rows;
    if (!expert_tile(order, offsets, tiles, blockIdx.y, k, x_per_slot, ne, e, rows)) return;
    mat_mul_tile<B>(x, weight_row<B>(w, (size_t)e * n, kd), y, rows, blockIdx.x * QT, n, kd);
}

// Float weights with K a multiple of 32 take the same 64 × 64 tile as the block formats (the
// tensor cores by default); other K the 32 × 32 tile above.
// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_tiles_f32(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<F32W>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_tiles_f16(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<F16W>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_tiles_bf16(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<BF16W>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_f32(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                       float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<F32W>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_bf16(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<BF16W>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q8_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q8_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q4_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q4_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_1>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q5_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q5_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_1>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q2_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q2_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q3_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q3_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q4_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q4_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q5_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q5_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q6_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q6_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_q8_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<Q8_K>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_mxfp4(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<MXFP4>(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq4_xs(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ4_XS>(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq4_nl(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ4_NL>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq2_xxs(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ2_XXS>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq2_xs(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ2_XS>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq2_s(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ2_S>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq3_xxs(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ3_XXS>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq3_s(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ3_S>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq1_s(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ1_S>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_iq1_m(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<IQ1_M>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_tq1_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<TQ1_0>(x, w, y, m, n, k);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_tq2_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<TQ2_0>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_nvfp4(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_mul_blocks<NVFP4>(x, w, y, m, n, k);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q8_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q8_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q4_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q4_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q4_1(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q4_1>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q5_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q5_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q5_1(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q5_1>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q2_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q2_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q3_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q3_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q4_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q4_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q5_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q5_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q6_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q6_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_q8_k(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<Q8_K>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_mxfp4(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<MXFP4>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq4_xs(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ4_XS>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq4_nl(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ4_NL>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq2_xxs(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ2_XXS>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq2_xs(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ2_XS>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq2_s(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ2_S>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq3_xxs(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ3_XXS>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq3_s(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ3_S>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq1_s(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ1_S>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_iq1_m(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<IQ1_M>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_tq1_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<TQ1_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_tq2_0(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<TQ2_0>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}

// @hot
extern "C" __global__ void __launch_bounds__(256, 2)
mat_mul_id_grouped_nvfp4(const float* x, const u8* w, const int* order, const int* offsets, const int* tiles,
                        float* y, u32 k, u32 n, u32 kd, u32 x_per_slot, u32 ne) {
    mat_mul_id_grouped<NVFP4>(x, w, order, offsets, tiles, y, k, n, kd, x_per_slot, ne);
}
