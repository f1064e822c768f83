// The weight formats kernels read from raw row bytes (prepended to every kernel file after
// common.cuh). Each is a struct with QK (values per block), BYTES (bytes per block) and
// load8, which dequantizes 8 consecutive values (starting at a multiple of 8 from the row
// start, so never across a scale group) into registers: every GGUF block format the CPU
// reference reads, and the float formats as 8-value "blocks", so one kernel template serves
// every weight type. load8<A> with A > 1 may assume the weight's first byte is 16-byte aligned,
// so every block starts at a multiple of gcd(16, BYTES) (rows are whole blocks), and reads in
// loads as wide as that leaves its fields aligned; load8<1> (the default) assumes nothing.

// 2 × the E2M1 (FP4) value of a 4-bit code: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 doubled.
__device__ __forceinline__ int e2m1x2(u32 c) {
    const int m = (int)(c & 7u);
    const int v = m <= 4 ? m : (m == 5 ? 6 : (m == 6 ? 8 : 12));
    return (c & 8u) ? -v : v;
}

__device__ __forceinline__ float f16_at(const u8* p) { return __half2float(*(const __half*)p); }
// Two phases of load8, for kernels that want every load of a step in flight before any
// arithmetic: fetch<A> issues the loads of 8 values and returns the raw words (Raw), decode<A>
// turns them into floats; load8<A> is the two in a row. The formats off the hot path keep
// their plain load8 and get these from LoadLater, whose fetch only remembers the row.
template <typename F>
struct LoadLater {
    struct Raw {
        const u8* row;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32) {
        return {row};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32 v, float* out) {
        F::template load8<A>(r.row, v, out);
    }
};

// The load8 of a format with fetch and decode.
#define LOAD8_FROM_PHASES                                                \
    template <u32 A = 1>                                                 \
    __device__ static void load8(const u8* row, u32 v, float* out) {     \
        decode<A>(fetch<A>(row, v), v, out);                             \
    }

struct Q8_0 {
    static constexpr u32 QK = 32, BYTES = 34;
    // d (f16), 32 int8 values; value = d * q.
    struct Raw {
        u32 d;
        uint2 q;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* b = row + (v / QK) * BYTES;
        return {u16_at(b), bytes8<A < 2 ? A : 2>(b + 2 + v % QK)};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32, float* out) {
        const float d = f16_bits(r.d);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * (float)(i8)byte_of(r.q, i);
    }
    LOAD8_FROM_PHASES
};

struct Q4_0 {
    static constexpr u32 QK = 32, BYTES = 18;
    // d (f16), 16 bytes of nibbles (value j < 16 low nibble of byte j, else high nibble of
    // byte j - 16); value = d * (q - 8). 8 values never straddle 16.
    struct Raw {
        u32 d;
        uint2 q;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* b = row + (v / QK) * BYTES;
        return {u16_at(b), bytes8<A < 2 ? A : 2>(b + 2 + v % 16)};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32 v, float* out) {
        const float d = f16_bits(r.d);
        const u32 shift = v % QK < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * (float)((int)((byte_of(r.q, i) >> shift) & 0xF) - 8);
    }
    LOAD8_FROM_PHASES
};

struct Q4_1 {
    static constexpr u32 QK = 32, BYTES = 20;
    // d, m (f16), then 16 bytes of nibbles: value j < 16 the low nibble of byte j, j >= 16 the
    // high nibble of byte j - 16; value = d * q + m.
    struct Raw {
        u32 dm;
        uint2 q;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* b = row + (v / QK) * BYTES;
        return {word_at<A < 4 ? (A < 2 ? 2 : A) : 4>(b), bytes8<A < 4 ? A : 4>(b + 4 + v % 16)};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32 v, float* out) {
        const float d = f16_bits(r.dm & 0xFFFF), m = f16_bits(r.dm >> 16);
        const u32 shift = v % QK < 16 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * (float)((byte_of(r.q, i) >> shift) & 0xF) + m;
    }
    LOAD8_FROM_PHASES
};

struct Q5_0 : LoadLater<Q5_0> {
    static constexpr u32 QK = 32, BYTES = 22;
    // d (f16), qh (32 high bits, little-endian), 16 bytes of nibbles; value = d * (q - 16)
    // where q is the nibble with bit j of qh on top.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = __half2float(*(const __half*)b);
        const u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
        const u32 j0 = v % QK;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 j = j0 + i;
            const int lo = j < 16 ? (b[6 + j] & 0xF) : (b[6 + j - 16] >> 4);
            const int q = lo | (int)(((qh >> j) & 1u) << 4);
            out[i] = d * (float)(q - 16);
        }
    }
};

// The 6-bit scale and min of group j of a Q4_K super-block.
__device__ __forceinline__ void scale_min_k4(u32 j, const u8* s, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

struct Q4_K {
    static constexpr u32 QK = 256, BYTES = 144;
    // d, dmin (f16), 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles: group g of 32
    // values is the low (g even) or high (g odd) nibbles of bytes 32*(g/2) .. +32. Fetched as
    // four words (d and dmin, the scales) and the 8 bytes of nibbles; scale_min_k4 by shifts.
    struct Raw {
        u32 dm, s0, s1, s2;
        uint2 q;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e0 = v % QK, g = e0 / 32;
        constexpr u32 W = A < 4 ? (A < 2 ? 2 : A) : 4;
        return {word_at<W>(b), word_at<W>(b + 4), word_at<W>(b + 8), word_at<W>(b + 12),
                bytes8<A < 8 ? A : 8>(b + 16 + 32 * (g / 2) + e0 % 32)};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32 v, float* out) {
        const u32 g = (v % QK) / 32, sh = 8 * (g & 3);
        const u32 s0 = (r.s0 >> sh) & 0xFF, s1 = (r.s1 >> sh) & 0xFF, s2 = (r.s2 >> sh) & 0xFF;
        const float sc = (float)(g < 4 ? (s0 & 63) : ((s2 & 0xF) | ((s0 >> 6) << 4)));
        const float m = (float)(g < 4 ? (s1 & 63) : ((s2 >> 4) | ((s1 >> 6) << 4)));
        const float d1 = f16_bits(r.dm & 0xFFFF) * sc, m1 = f16_bits(r.dm >> 16) * m;
        const u32 shift = 4 * (g % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d1 * (float)((byte_of(r.q, i) >> shift) & 0xF) - m1;
    }
    LOAD8_FROM_PHASES
};

struct Q6_K {
    static constexpr u32 QK = 256, BYTES = 210;
    // ql[128], qh[64], scales[16] (int8), d (f16). In half h (128 values), quarter q, index l:
    // low 4 bits from ql[64h + 32*(q%2) + l] (low nibble for q < 2, high for q >= 2), top 2
    // bits from qh[32h + l] at shift 2q, scale scales[8h + l/16 + 2q]; value = d*sc*(q6 - 32).
    struct Raw {
        uint2 ql, qh;
        u32 sc, d;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e0 = v % QK, h = e0 / 128, r = e0 % 128, q = r / 32, l0 = r % 32;
        return {bytes8<A < 2 ? A : 2>(b + 64 * h + 32 * (q % 2) + l0), bytes8<A < 2 ? A : 2>(b + 128 + 32 * h + l0),
                b[192 + 8 * h + l0 / 16 + 2 * q], u16_at(b + 208)};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32 v, float* out) {
        const u32 q = (v % 128) / 32, lshift = q < 2 ? 0 : 4, hshift = 2 * q;
        const float sc = f16_bits(r.d) * (float)(i8)r.sc;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int lo = (int)((byte_of(r.ql, i) >> lshift) & 0xF);
            const int hi = (int)((byte_of(r.qh, i) >> hshift) & 3);
            out[i] = sc * (float)((lo | (hi << 4)) - 32);
        }
    }
    LOAD8_FROM_PHASES
};

struct Q5_1 : LoadLater<Q5_1> {
    static constexpr u32 QK = 32, BYTES = 24;
    // d, m (f16), qh (32 high bits), 16 bytes of nibbles as in Q4_1; value = d * q + m.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = f16_at(b), m = f16_at(b + 2);
        const u32 qh = (u32)b[4] | ((u32)b[5] << 8) | ((u32)b[6] << 16) | ((u32)b[7] << 24);
        const u32 j0 = v % QK;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 j = j0 + i;
            const int lo = j < 16 ? (b[8 + j] & 0xF) : (b[8 + j - 16] >> 4);
            out[i] = d * (float)(lo | (int)(((qh >> j) & 1u) << 4)) + m;
        }
    }
};

struct Q2_K : LoadLater<Q2_K> {
    static constexpr u32 QK = 256, BYTES = 84;
    // scales[16] (scale | min << 4 per group of 16), qs[64], d, dmin (f16). Element
    // 128h + 32s + l is bits 2s of qs[32h + l]; value = d * sc * q - dmin * min.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e0 = v % QK, h = e0 / 128, s = (e0 % 128) / 32, l0 = e0 % 32;
        const u8 sc = b[e0 / 16];
        const float dl = f16_at(b + 80) * (float)(sc & 0xF), ml = f16_at(b + 82) * (float)(sc >> 4);
        const u8* qs = b + 16 + 32 * h;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = dl * (float)((qs[l0 + i] >> (2 * s)) & 3) - ml;
    }
};

struct Q3_K : LoadLater<Q3_K> {
    static constexpr u32 QK = 256, BYTES = 110;
    // hmask[32], qs[64], 12 bytes of packed 6-bit scales, d (f16). As Q2_K for the low two
    // bits; the third is bit 4h + s of hmask[l], and a clear bit subtracts 4.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e0 = v % QK, h = e0 / 128, s = (e0 % 128) / 32, l0 = e0 % 32, g = e0 / 16;
        const u8* ps = b + 96;
        const int lo = (ps[g % 8] >> (4 * (g / 8))) & 0xF, hi = (ps[8 + g % 4] >> (2 * (g / 4))) & 3;
        const float dl = f16_at(b + 108) * (float)((lo | (hi << 4)) - 32);
        const u8* qs = b + 32 + 32 * h;
        const u32 bit = 4 * h + s;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (qs[l0 + i] >> (2 * s)) & 3;
            const int sub = ((b[l0 + i] >> bit) & 1) ? 0 : 4;
            out[i] = dl * (float)(low - sub);
        }
    }
};

struct Q5_K : LoadLater<Q5_K> {
    static constexpr u32 QK = 256, BYTES = 176;
    // d, dmin (f16), 12 bytes of 6-bit scales/mins as Q4_K, qh[32], qs[128]: as Q4_K, with
    // bit 4 of group g's element l in bit g of qh[l].
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e0 = v % QK, g = e0 / 32, l0 = e0 % 32;
        float sc, m;
        scale_min_k4(g, b + 4, &sc, &m);
        const float d1 = f16_at(b) * sc, m1 = f16_at(b + 2) * m;
        const u8* qs = b + 48 + 32 * (g / 2);
        const u32 shift = 4 * (g % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 q = ((qs[l0 + i] >> shift) & 0xF) | (((b[16 + l0 + i] >> g) & 1u) << 4);
            out[i] = d1 * (float)q - m1;
        }
    }
};

struct Q8_K : LoadLater<Q8_K> {
    static constexpr u32 QK = 256, BYTES = 292;
    // d (f32), 256 int8 values, 16 int16 group sums (unused here); value = d * q.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = *(const float*)b;
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * (float)(i8)b[4 + v % QK + i];
    }
};

struct MXFP4 : LoadLater<MXFP4> {
    static constexpr u32 QK = 32, BYTES = 17;
    // e (E8M0 scale 2^(e-127)), 16 bytes of E2M1 codes (value j < 16 low nibble of byte j,
    // else high nibble of byte j - 16). Codes are doubled integers, so the scale is halved.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = b[0];
        const float d = __int_as_float(e < 2 ? (int)(0x00200000u << e) : (int)((e - 1) << 23));
        const u32 j0 = v % QK, shift = j0 < 16 ? 0 : 4;
        const uint2 q = bytes8<1>(b + 1 + j0 % 16);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * (float)e2m1x2((byte_of(q, i) >> shift) & 0xF);
    }
};

// Half of an unsigned E4M3 scale (bias 7, bit 7 ignored; 0x00 and 0x7F decode to 0).
__device__ __forceinline__ float ue4m3_half(u32 x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const u32 exp = (x >> 3) & 0xF, man = x & 7;
    const float raw = exp == 0 ? (float)man * __int_as_float((127 - 9) << 23)
                               : (1.0f + (float)man / 8.0f) * __int_as_float((int)((exp + 127 - 7) << 23));
    return raw * 0.5f;
}

struct NVFP4 {
    static constexpr u32 QK = 64, BYTES = 36;
    // 4 UE4M3 scales, then 4 sub-blocks of 16 E2M1 codes in 8 bytes each (value i < 8 low
    // nibble of byte i, else high nibble of byte i - 8).
    struct Raw {
        u32 s;
        uint2 q;
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 s = (v % QK) / 16;
        return {b[s], bytes8<A < 4 ? A : 4>(b + 4 + 8 * s)};
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32 v, float* out) {
        const float d = ue4m3_half(r.s);
        const u32 shift = v % 16 < 8 ? 0 : 4;  // 0 or 8 into the sub-block
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * (float)e2m1x2((byte_of(r.q, i) >> shift) & 0xF);
    }
    LOAD8_FROM_PHASES
};

// Float weights: 8 values of the row, converted to f32.
__device__ __forceinline__ float f32_of_bits(const __half*, u32 b) { return f16_bits(b); }
__device__ __forceinline__ float f32_of_bits(const __nv_bfloat16*, u32 b) { return __uint_as_float(b << 16); }

// With A > 1, 16-byte loads (a row of a multiple of 8 values starts 16-byte aligned). Raw holds
// the 8 values' bits: 8 words for f32, 4 words of two halves for f16 and bf16.
template <typename T, u32 SIZE>
struct FloatFormat {
    static constexpr u32 QK = 8, BYTES = 8 * SIZE;
    struct Raw {
        u32 w[SIZE == 4 ? 8 : 4];
    };
    template <u32 A = 1>
    __device__ static Raw fetch(const u8* row, u32 v) {
        const u8* p = row + (size_t)v * SIZE;
        Raw r;
        if constexpr (A > 1 && SIZE == 4) {
            const uint4 a = ((const uint4*)p)[0], b = ((const uint4*)p)[1];
            r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
            r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
        } else if constexpr (A > 1) {
            const uint4 a = *(const uint4*)p;
            r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
        } else {
#pragma unroll
            for (int i = 0; i < (SIZE == 4 ? 8 : 4); i++) r.w[i] = word_at<SIZE == 4 ? 4 : 2>(p + 4 * i);
        }
        return r;
    }
    template <u32 A = 1>
    __device__ static void decode(const Raw& r, u32, float* out) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            if constexpr (SIZE == 4) {
                out[i] = __uint_as_float(r.w[i]);
            } else {
                out[i] = f32_of_bits((const T*)nullptr, i % 2 ? r.w[i / 2] >> 16 : r.w[i / 2] & 0xFFFFu);
            }
        }
    }
    LOAD8_FROM_PHASES
};
typedef FloatFormat<float, 4> F32W;
typedef FloatFormat<__half, 2> F16W;
typedef FloatFormat<__nv_bfloat16, 2> BF16W;

// The bytes of row `r` of a weight whose rows hold `k` values.
template <typename B>
__device__ __forceinline__ const u8* weight_row(const void* w, size_t r, u32 k) {
    return (const u8*)w + r * (k / B::QK) * B::BYTES;
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

template <typename B, u32 A, typename Src>
__device__ __forceinline__ void mat_vec_rows_at(const Src& src, const void* w, float* y, u32 n, u32 k) {
    __shared__ float part[MV_WARPS][MV_ROWS + 1];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = blockIdx.x * MV_ROWS, row = blockIdx.y;
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
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = warp_sum(acc[r]);
    if (Src::SQUARES) ss = warp_sum(ss);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) part[warp][r] = acc[r];
        part[warp][MV_ROWS] = ss;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        float t = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < MV_WARPS; i++) {
            t += part[i][threadIdx.x];
            q += part[i][MV_ROWS];
        }
        y[(size_t)row * n + col0 + threadIdx.x] = src.finish(t, q, k);
    }
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
// Off by default: on an H100 (2026-11-27) the register-ring kernel above decoded the 3 B and
// 1 B BF16 checkpoints 10 % faster and the 8 B Q4_K one 3 % faster (README, GPU). 2: Q4_K,
// Q6_K, Q8_0 and the floats (rows of a multiple of 256 values) through the lane-per-row
// kernel below, the rest through the ring.
#ifndef MV_STAGED
#define MV_STAGED 0
#endif
#ifndef MV_STAGES
#define MV_STAGES 3
#endif
static_assert(MV_STAGES >= 2 && MV_STAGES <= 4, "MV_STAGES: 2 to 4 slots a warp");

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
        // Scale and min of groups 2c and 2c + 1 (scale_min_k4 by bytes of the three words).
        const u32 sh0 = 8 * ((2 * c) & 3), sh1 = 8 * ((2 * c + 1) & 3);
        const u32 a0 = (h.y >> sh0) & 0xFF, b0 = (h.z >> sh0) & 0xFF, e0 = (h.w >> sh0) & 0xFF;
        const u32 a1 = (h.y >> sh1) & 0xFF, b1 = (h.z >> sh1) & 0xFF, e1 = (h.w >> sh1) & 0xFF;
        const bool low = c < 2;
        const float sc0 = (float)(low ? (a0 & 63) : ((e0 & 0xF) | ((a0 >> 6) << 4)));
        const float m0 = (float)(low ? (b0 & 63) : ((e0 >> 4) | ((b0 >> 6) << 4)));
        const float sc1 = (float)(low ? (a1 & 63) : ((e1 & 0xF) | ((a1 >> 6) << 4)));
        const float m1 = (float)(low ? (b1 & 63) : ((e1 >> 4) | ((b1 >> 6) << 4)));
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
                                               u32 k) {
    typedef MvStage<B, I> S;
    constexpr u32 CH = I::STAGE;
    __shared__ float part[MV_WARPS][MV_ROWS + 1];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = blockIdx.x * MV_ROWS, row = blockIdx.y;
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
#pragma unroll
    for (int r = 0; r < MV_ROWS; r++) acc[r] = warp_sum(acc[r]);
    if (Src::SQUARES) ss = warp_sum(ss);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < MV_ROWS; r++) part[warp][r] = acc[r];
        part[warp][MV_ROWS] = ss;
    }
    __syncthreads();
    if (threadIdx.x < rows) {
        float t = 0.0f, q = 0.0f;
#pragma unroll
        for (int i = 0; i < MV_WARPS; i++) {
            t += part[i][threadIdx.x];
            q += part[i][MV_ROWS];
        }
        y[(size_t)row * n + col0 + threadIdx.x] = src.finish(t, q, k);
    }
}

// ---- the lane-per-row decode mat-vec (MV_STAGED=2) ----------------------------------------
// Built for occupancy (few registers: 64 with MV_MIN_BLOCKS=8, so 32 warps an SM) and for
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
        const u32 sh0 = 8 * ((2 * c) & 3), sh1 = 8 * ((2 * c + 1) & 3);
        const u32 a0 = (h.y >> sh0) & 0xFF, b0 = (h.z >> sh0) & 0xFF, e0 = (h.w >> sh0) & 0xFF;
        const u32 a1 = (h.y >> sh1) & 0xFF, b1 = (h.z >> sh1) & 0xFF, e1 = (h.w >> sh1) & 0xFF;
        const bool low = c < 2;
        const float sc0 = (float)(low ? (a0 & 63) : ((e0 & 0xF) | ((a0 >> 6) << 4)));
        const float m0 = (float)(low ? (b0 & 63) : ((e0 >> 4) | ((b0 >> 6) << 4)));
        const float sc1 = (float)(low ? (a1 & 63) : ((e1 & 0xF) | ((a1 >> 6) << 4)));
        const float m1 = (float)(low ? (b1 & 63) : ((e1 >> 4) | ((b1 >> 6) << 4)));
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
    typedef PieceQ4K T;  // unused
};
template <>
struct MvPieceOf<Q4_K> {
    static constexpr bool HAS = true;
    typedef PieceQ4K T;
};
template <>
struct MvPieceOf<Q6_K> {
    static constexpr bool HAS = true;
    typedef PieceQ6K T;
};
template <>
struct MvPieceOf<Q8_0> {
    static constexpr bool HAS = true;
    typedef PieceQ8_0 T;
};
template <>
struct MvPieceOf<F32W> {
    static constexpr bool HAS = true;
    typedef PieceFloat<float, 4> T;
};
template <>
struct MvPieceOf<F16W> {
    static constexpr bool HAS = true;
    typedef PieceFloat<__half, 2> T;
};
template <>
struct MvPieceOf<BF16W> {
    static constexpr bool HAS = true;
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
__device__ __forceinline__ void mat_vec_lanes(uint4* smem, const Src& src, const void* w, float* y, u32 n, u32 k) {
    typedef Mv3<P> M;
    constexpr u32 CH = P::CH, ROW = M::ROW;
    __shared__ float part[MV_WARPS][MV_ROWS + 1];
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 col0 = blockIdx.x * MV_ROWS, row = blockIdx.y;
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
    __syncthreads();
    if (threadIdx.x < rows) {
        float t = 0.0f, qq = 0.0f;
#pragma unroll
        for (int i = 0; i < MV_WARPS; i++) {
            t += part[i][threadIdx.x];
            qq += part[i][MV_ROWS];
        }
        y[(size_t)row * n + col0 + threadIdx.x] = src.finish(t, qq, k);
    }
}

// With MV_STAGED=1 and the source's rows 16-byte aligned, the staged kernel in the widest copy
// unit that divides the weight's address, its rows' bytes and its chunks' bytes; else the register-ring kernel,
// with wide loads where the weight is 16-byte aligned, byte-wise ones otherwise. Uniform over
// the grid.
template <typename B, typename Src>
__device__ __forceinline__ void mat_vec_rows(const Src& src, const void* w, float* y, u32 n, u32 k) {
#if MV_STAGED == 2
    // The formats with a piece decoder take the lane-per-row kernel whatever the alignments (so
    // no other kernel's registers count against it).
    typedef typename MvPieceOf<B>::T P;
    if constexpr (MvPieceOf<B>::HAS) {
        // Rows of whole 256 values (always for the K-quants, so for them no other kernel is
        // compiled in); others take the ring below.
        if (B::QK % 256 == 0 || k % 256 == 0) {
        __shared__ uint4 smem3[Mv3<P>::WORDS];
        constexpr u32 GMAX = Mv3<P>::GMAX;
        const size_t a = (size_t)w | rb_of<B>(k);
        if (src.aligned()) {
            if ((a & (GMAX - 1)) == 0) mat_vec_lanes<B, P, GMAX, 16>(smem3, src, w, y, n, k);
            else mat_vec_lanes<B, P, 1, 16>(smem3, src, w, y, n, k);
        } else {
            if ((a & (GMAX - 1)) == 0) mat_vec_lanes<B, P, GMAX, 1>(smem3, src, w, y, n, k);
            else mat_vec_lanes<B, P, 1, 1>(smem3, src, w, y, n, k);
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
            if ((a & 15) == 0) return mat_vec_staged<B, I, 16>(smem, src, w, y, n, k);
        }
        if constexpr (GMAX >= 8) {
            if ((a & 7) == 0) return mat_vec_staged<B, I, 8>(smem, src, w, y, n, k);
        }
        if constexpr (GMAX >= 4) {
            if ((a & 3) == 0) return mat_vec_staged<B, I, 4>(smem, src, w, y, n, k);
        }
    }
#endif
    if ((((size_t)w) & 15) == 0 && src.aligned())
        mat_vec_rows_at<B, 16>(src, w, y, n, k);
    else
        mat_vec_rows_at<B, 1>(src, w, y, n, k);
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

// ---- KV cache formats ----------------------------------------------------------------------
// The cache types a paged cache can hold, by code (shaders/common/turbo.wgsl uses the same):
// 0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4_0, 5 tq4, 6 tq3, 7 tq2. The TurboQuant blocks (tq*,
// core/src/quant/turbo.rs): an f16 scale, then 32 b-bit codes as one little-endian bit
// stream; value = scale * the code's Lloyd-Max point of N(0, 1) (the CPU's f32 points).

// Bits per code of a TurboQuant format code (5, 6, 7 -> 4, 3, 2).
__device__ __forceinline__ u32 kv_tq_bits(u32 f) { return 9u - f; }

// Bytes of a row of n values (n a multiple of 32 for the block formats).
__device__ __forceinline__ u32 kv_row_bytes(u32 f, u32 n) {
    switch (f) {
        case 0: return 4u * n;
        case 1:
        case 2: return 2u * n;
        case 3: return n / 32u * 34u;
        case 4:
        case 5: return n / 32u * 18u;
        case 6: return n / 32u * 14u;
        default: return n / 32u * 10u;
    }
}

// The positive half of a TurboQuant codebook, point k (literals, not a table: no global
// arrays in code every kernel file includes).
__device__ __forceinline__ float kv_tq_half(u32 bits, u32 k) {
    if (bits == 4u) {
        switch (k) {
            case 0: return 0.128395f;
            case 1: return 0.3880483f;
            case 2: return 0.6567591f;
            case 3: return 0.9423405f;
            case 4: return 1.2562312f;
            case 5: return 1.6180464f;
            case 6: return 2.0690172f;
            default: return 2.7325896f;
        }
    }
    if (bits == 3u) {
        switch (k) {
            case 0: return 0.2450942f;
            case 1: return 0.7560053f;
            case 2: return 1.3439093f;
            default: return 2.1519457f;
        }
    }
    return k == 0 ? 0.45278f : 1.5104176f;
}

// Point `code` of the increasing codebook (codes below 2^(bits-1) are the mirrored negatives).
__device__ __forceinline__ float kv_tq_point(u32 bits, u32 code) {
    const u32 n = 1u << (bits - 1u);
    return code < n ? -kv_tq_half(bits, n - 1u - code) : kv_tq_half(bits, code - n);
}

// Value j of a row (its bytes at `row`) of a cache in format f, with the CPU's arithmetic.
__device__ __forceinline__ float kv_at(u32 f, const u8* row, u32 j) {
    switch (f) {
        case 0: return ((const float*)row)[j];
        case 1: return __half2float(((const __half*)row)[j]);
        case 2: return __bfloat162float(((const __nv_bfloat16*)row)[j]);
        case 3: {
            const u8* b = row + (j / 32u) * 34u;
            return (float)(i8)b[2 + j % 32u] * f16_at(b);
        }
        case 4: {
            const u8* b = row + (j / 32u) * 18u;
            const u32 i = j % 32u;
            const int q = i < 16u ? (b[2 + i] & 0xF) : (b[2 + i - 16u] >> 4);
            return (float)(q - 8) * f16_at(b);
        }
        default: {
            const u32 bits = kv_tq_bits(f);
            const u8* b = row + (j / 32u) * (2u + 4u * bits);
            const u32 bit = (j % 32u) * bits, at = 2u + bit / 8u;
            // The last code of a block ends inside its byte; never read past the block.
            const u32 two = b[at] | ((at + 1u < 2u + 4u * bits ? (u32)b[at + 1u] : 0u) << 8);
            const u32 code = (two >> (bit % 8u)) & ((1u << bits) - 1u);
            return f16_at(b) * kv_tq_point(bits, code);
        }
    }
}

// Rows of a paged cache as f32 values: plain float storage.
template <typename C>
struct KvPlain {
    const C* p;
    u32 width;
    __device__ __forceinline__ float at(long long row, u32 j) const { return to_f32(p[(size_t)row * width + j]); }
};

// Rows of a paged cache in any format code.
struct KvCoded {
    const u8* p;
    u32 fmt, rb;
    __device__ __forceinline__ float at(long long row, u32 j) const { return kv_at(fmt, p + (size_t)row * rb, j); }
};
