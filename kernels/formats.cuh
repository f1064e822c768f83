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

// IQ4_NL's 16 levels (-127, -104, .., 113), level n as a signed byte of four packed words.
__device__ __forceinline__ float iq4nl_level(u32 n) {
    const u32 w = n < 8 ? (n < 4 ? 0xBFAD9881u : 0xF6EADDCFu) : (n < 12 ? 0x26190D01u : 0x71594535u);
    return (float)(i8)(w >> (8 * (n & 3)));
}

struct IQ4_NL : LoadLater<IQ4_NL> {
    static constexpr u32 QK = 32, BYTES = 18;
    // d (f16), 16 bytes of nibbles (value j < 16 low nibble of byte j, else high nibble of
    // byte j - 16), each a level; value = d * level.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = __half2float(*(const __half*)b);
        const u32 j0 = v % QK, shift = j0 < 16 ? 0 : 4;
        const uint2 q = bytes8<1>(b + 2 + j0 % 16);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d * iq4nl_level((byte_of(q, i) >> shift) & 0xF);
    }
};

struct IQ4_XS : LoadLater<IQ4_XS> {
    static constexpr u32 QK = 256, BYTES = 136;
    // d (f16), the 8 groups' 6-bit scales (high 2 bits in the u16 at 2, low nibbles in the 4
    // bytes at 4), then each group's 16 bytes of IQ4_NL nibbles; value = d * (scale - 32) * level.
    template <u32 A = 1>
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = __half2float(*(const __half*)b);
        const u32 ib = (v % QK) / 32, j0 = v % 32, shift = j0 < 16 ? 0 : 4;
        const u32 hi = ((u32)b[2] | ((u32)b[3] << 8)) >> (2 * ib) & 3;
        const u32 ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (hi << 4);
        const float dl = d * (float)((int)ls - 32);
        const uint2 q = bytes8<1>(b + 8 + 16 * ib + j0 % 16);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = dl * iq4nl_level((byte_of(q, i) >> shift) & 0xF);
    }
};

// ---- the grid i-quants and the ternary formats --------------------------------------------
// All are 256-value blocks with an f16 d; 8 values at a multiple of 8 are one grid point of
// 8 coordinates (IQ2, IQ1) or two of 4 (IQ3), whose coordinates iq_grids.cuh holds as bytes.
// Every value is (scale · coordinate) · ±1, or scale · (coordinate ± 1/8) for IQ1, formed in
// the CPU reference's order (core/src/quant/iquants.rs), so the floats are its bits.
// Their kernels are not marked `// @hot`: Blackwell's ptxas (sm_100a, sm_120a) leaves 8-88
// bytes of local memory in some (IQ1_S, IQ2_S, IQ3_XXS, IQ3_S; 40-80 registers, so not for
// want of registers), Hopper's none, and none of them has been timed on a GPU yet.

// The 8 signs of a 7-bit sign index (bit j set: value j negative); bit 7 makes the count even.
__device__ __forceinline__ u32 iq_ksigns(u32 i) {
    i &= 0x7Fu;
    u32 p = i ^ (i >> 4);
    p ^= p >> 2;
    p ^= p >> 1;
    return i | ((p & 1u) << 7);
}

// out[j] = (db · coordinate j of an 8-coordinate point) negated where sign bit j is set.
__device__ __forceinline__ void iq_put8(float db, unsigned long long point, u32 signs, float* out) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float t = db * (float)(u32)((point >> (8 * j)) & 0xFFu);
        out[j] = (signs >> j) & 1u ? -t : t;
    }
}

// The same for the 4 coordinates of an IQ3 point, sign bits from `shift`.
__device__ __forceinline__ void iq_put4(float db, u32 point, u32 signs, u32 shift, float* out) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float t = db * (float)((point >> (8 * j)) & 0xFFu);
        out[j] = (signs >> (shift + j)) & 1u ? -t : t;
    }
}

// out[j] = dl · (coordinate j + delta) of an IQ1 point (coordinates -1, 0, 1 as signed bytes).
__device__ __forceinline__ void iq_put1(float dl, unsigned long long point, float delta, float* out) {
#pragma unroll
    for (int j = 0; j < 8; j++) out[j] = dl * ((float)(i8)(u8)(point >> (8 * j)) + delta);
}

__device__ __forceinline__ u32 u32_bytes(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

struct IQ2_XXS : LoadLater<IQ2_XXS> {
    static constexpr u32 QK = 256, BYTES = 66;
    // d, then per group of 32: 4 grid indices (a byte each) and a word of four 7-bit sign
    // indices with the 4-bit scale on top; db = d · (0.5 + scale) · 0.25.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, ib = e / 32, l = (e % 32) / 8;
        const u32 aux = u32_bytes(b + 6 + 8 * ib);
        const float db = f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
        iq_put8(db, IQ2XXS_GRID[b[2 + 8 * ib + l]], iq_ksigns(aux >> (7 * l)), out);
    }
};

struct IQ2_XS : LoadLater<IQ2_XS> {
    static constexpr u32 QK = 256, BYTES = 74;
    // d, 32 u16 (9-bit grid index, 7-bit sign index), 8 bytes of two 4-bit scales (the low one
    // for a group's first 16 values).
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, ib = e / 32, l = (e % 32) / 8;
        const u32 q = u16_at(b + 2 + 2 * (4 * ib + l)), sc = b[66 + ib];
        const float db = f16_at(b) * (0.5f + (float)(l < 2 ? sc & 0xFu : sc >> 4)) * 0.25f;
        iq_put8(db, IQ2XS_GRID[q & 511u], iq_ksigns(q >> 9), out);
    }
};

struct IQ2_S : LoadLater<IQ2_S> {
    static constexpr u32 QK = 256, BYTES = 82;
    // d, 32 low index bytes, 32 sign bytes, 8 bytes of high index bits (2 a point), 8 bytes
    // of two 4-bit scales.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, ib = e / 32, l = (e % 32) / 8;
        const u32 idx = (u32)b[2 + 4 * ib + l] | ((((u32)b[66 + ib] >> (2 * l)) & 3u) << 8);
        const u32 sc = b[74 + ib];
        const float db = f16_at(b) * (0.5f + (float)(l < 2 ? sc & 0xFu : sc >> 4)) * 0.25f;
        iq_put8(db, IQ2S_GRID[idx], b[34 + 4 * ib + l], out);
    }
};

struct IQ3_XXS : LoadLater<IQ3_XXS> {
    static constexpr u32 QK = 256, BYTES = 98;
    // d, 64 grid indices (4 coordinates each), then a word per group as IQ2_XXS's; db = d ·
    // (0.5 + scale) · 0.5.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, ib = e / 32, l = (e % 32) / 8;
        const u32 aux = u32_bytes(b + 66 + 4 * ib);
        const float db = f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const u32 signs = iq_ksigns(aux >> (7 * l)), q = 2 + 8 * ib + 2 * l;
        iq_put4(db, IQ3XXS_GRID[b[q]], signs, 0, out);
        iq_put4(db, IQ3XXS_GRID[b[q + 1]], signs, 4, out + 4);
    }
};

struct IQ3_S : LoadLater<IQ3_S> {
    static constexpr u32 QK = 256, BYTES = 110;
    // d, 64 low index bytes, 8 bytes of 9th index bits, 32 sign bytes, 4 bytes of two 4-bit
    // scales; db = d · (1 + 2 · scale).
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, ib = e / 32, l = (e % 32) / 8;
        const u32 s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 0xFu;
        const float db = f16_at(b) * (float)(1u + 2u * s);
        const u32 signs = b[74 + 4 * ib + l];
#pragma unroll
        for (u32 h = 0; h < 2; h++) {
            const u32 i = 8 * ib + 2 * l + h;
            const u32 idx = (u32)b[2 + i] | ((((u32)b[66 + i / 8] >> (i % 8)) & 1u) << 8);
            iq_put4(db, IQ3S_GRID[idx], signs, 4 * h, out + 4 * h);
        }
    }
};

struct IQ1_S : LoadLater<IQ1_S> {
    static constexpr u32 QK = 256, BYTES = 50;
    // d, 32 low index bytes, then a u16 per group: 3 high index bits a point, a 3-bit scale
    // (dl = d · (2 · scale + 1)) and the sign of delta (±1/8) on top.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, ib = e / 32, l = (e % 32) / 8;
        const u32 qh = u16_at(b + 34 + 2 * ib);
        const float dl = f16_at(b) * (float)(2u * ((qh >> 12) & 7u) + 1u);
        const float delta = qh & 0x8000u ? -0.125f : 0.125f;
        const u32 idx = (u32)b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7u) << 8);
        iq_put1(dl, IQ1S_GRID[idx], delta, out);
    }
};

struct IQ1_M : LoadLater<IQ1_M> {
    static constexpr u32 QK = 256, BYTES = 56;
    // 32 low index bytes, 16 bytes of a nibble a point (3 high index bits, delta's sign), four
    // u16 of 3-bit scales (one per 16 values) whose top nibbles make the f16 d.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 i = (v % QK) / 8, k = i / 2;
        const u32 s0 = u16_at(b + 48), s1 = u16_at(b + 50), s2 = u16_at(b + 52), s3 = u16_at(b + 54);
        const u32 bits = (s0 >> 12) | ((s1 >> 8) & 0xF0u) | ((s2 >> 4) & 0xF00u) | (s3 & 0xF000u);
        const u32 sk = u16_at(b + 48 + 2 * (k / 4));
        const float dl = f16_bits(bits) * (float)(2u * ((sk >> (3 * (k % 4))) & 7u) + 1u);
        const u32 nib = (b[32 + i / 2] >> (4 * (i % 2))) & 0xFu;
        const float delta = nib & 8u ? -0.125f : 0.125f;
        iq_put1(dl, IQ1S_GRID[(u32)b[i] | ((nib & 7u) << 8)], delta, out);
    }
};

// 3^n for the n < 5 trits of a TQ1_0 byte.
__device__ __forceinline__ u32 tq1_pow3(u32 n) { return n == 0 ? 1u : n == 1 ? 3u : n == 2 ? 9u : n == 3 ? 27u : 81u; }

struct TQ1_0 : LoadLater<TQ1_0> {
    static constexpr u32 QK = 256, BYTES = 54;
    // 48 bytes of 5 trits and 4 of 4 (trit n of a byte: ((byte · 3^n mod 256) · 3) >> 8),
    // d last: values 32n + m from byte m, 160 + 16n + m from byte 32 + m, 240 + 4n + m from
    // byte 48 + m; value = (trit - 1) · d.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK;
        const float d = f16_at(b + 52);
        // The 8 values' bytes start at `off` (the last 16 values: bytes 48..52 twice, trits n0
        // then n0 + 1).
        u32 off, n0, wrap;
        if (e < 160) {
            off = e % 32, n0 = e / 32, wrap = 7;
        } else if (e < 240) {
            off = 32 + (e - 160) % 16, n0 = (e - 160) / 16, wrap = 7;
        } else {
            off = 48, n0 = (e - 240) / 4, wrap = 3;
        }
        const u32 p0 = tq1_pow3(n0), p1 = wrap == 3 ? 3 * p0 : p0;
#pragma unroll
        for (u32 j = 0; j < 8; j++) {
            const u32 byte = b[off + (j & wrap)], p = j < 4 ? p0 : p1;
            out[j] = d * (float)((int)((((byte * p) & 0xFFu) * 3u) >> 8) - 1);
        }
    }
};

struct TQ2_0 : LoadLater<TQ2_0> {
    static constexpr u32 QK = 256, BYTES = 66;
    // 64 bytes of 2-bit codes (value 128h + 32l + m: bits 2l of byte 32h + m), d last; value =
    // (code - 1) · d.
    template <u32 A = 1>
    __device__ __forceinline__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const u32 e = v % QK, h = e / 128, l = (e % 128) / 32, m = e % 32;
        const float d = f16_at(b + 64);
#pragma unroll
        for (u32 j = 0; j < 8; j++) out[j] = d * (float)((int)((b[32 * h + m + j] >> (2 * l)) & 3u) - 1);
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

// The row maps of the prefill tiles (mat_mul.cu, mat_mul_tc.cu): which activation row (x) and
// output row (y) a tile's row r is, -1 for none.
// Rows row0 .. row0 + 63 of x and y, those below m.
struct DenseRows {
    u32 row0, m;
    __device__ __forceinline__ long long x_row(u32 r) const { return row0 + r < m ? (long long)(row0 + r) : -1; }
    __device__ __forceinline__ long long y_row(u32 r) const { return x_row(r); }
};

// order[base .. end) lists one expert's slots (MoE: slot = token · k + i); the activation row
// of a slot is the slot itself, or its token when every slot shares the token's row.
struct SlotRows {
    const int* order;
    u32 base, end, k, x_per_slot;
    __device__ __forceinline__ long long y_row(u32 r) const {
        return base + r < end ? (long long)order[base + r] : -1;
    }
    __device__ __forceinline__ long long x_row(u32 r) const {
        const long long slot = y_row(r);
        return slot < 0 || x_per_slot ? slot : slot / k;
    }
};

// The grouped MoE matmul's tile `tile` (the slots grouped by expert by moe_group: order,
// offsets [E+1], and tiles [E+1], the first 64-slot tile of each expert): its expert e and
// row map. False past the last tile (an idle block).
__device__ __forceinline__ bool expert_tile(const int* order, const int* offsets, const int* tiles, u32 tile, u32 k,
                                            u32 x_per_slot, u32 ne, u32& e, SlotRows& rows) {
    if (tile >= (u32)tiles[ne]) return false;
    u32 lo = 0, hi = ne;  // the expert: the last e with tiles[e] <= tile
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if ((u32)tiles[mid] <= tile) lo = mid; else hi = mid;
    }
    e = lo;
    rows = SlotRows{order, (u32)offsets[lo] + (tile - (u32)tiles[lo]) * 64, (u32)offsets[lo + 1], k, x_per_slot};
    return true;
}

// ---- KV cache formats ----------------------------------------------------------------------
// The cache types a paged cache can hold, by code (shaders/common/turbo.wgsl uses the same):
// 0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4_0, 5 tq4, 6 tq3, 7 tq2, 8 tq4p, 9 tq3p, 10 tq3t,
// 11 tq2t. The TurboQuant
// blocks (tq*, core/src/quant/turbo.rs): an f16 scale, then 32 b-bit codes as one
// little-endian bit stream; value = scale * the code's Lloyd-Max point of N(0, 1) (the CPU's
// f32 points). tq4p and tq3p follow their codes block (tq3's, tq2's) with a u32 of sketch
// signs and an f16 rho, and add rho * kv_qjl_factor(i, signs) to element i. tq3t and tq2t
// are tq3 and tq2 blocks of trellis codes: element i's point is 2 * code + the parity of the
// branch bits (bit 0) of codes i-1 and i-3 in the next codebook up, times 0.9 (kv_tcq_point).

// Bits per code of a TurboQuant format code (5, 6, 7 -> 4, 3, 2; 8, 9 -> 3, 2; 10, 11 -> 3, 2).
__device__ __forceinline__ u32 kv_tq_bits(u32 f) { return f >= 10u ? 13u - f : f >= 8u ? 11u - f : 9u - f; }

// Whether a TurboQuant format code carries a residual sketch (tq4p, tq3p).
__device__ __forceinline__ bool kv_tq_sketched(u32 f) { return f == 8u || f == 9u; }

// Bytes of a TurboQuant block of 32.
__device__ __forceinline__ u32 kv_tq_bytes(u32 f) { return 2u + 4u * kv_tq_bits(f) + (kv_tq_sketched(f) ? 6u : 0u); }

// The sketch diagonal of tq4p/tq3p (turbo.rs QJL_SIGNS): bit i set where D_i = -1.
#define KV_QJL_SIGNS 0x9E3779B9u

// D_i times row i of H32 applied to the signs `sigma` (bit j set: -1): 32 - 2 * the number
// of places where H32's row i and sigma differ (H32[i][j] = -1 where i & j has odd parity).
__device__ __forceinline__ float kv_qjl_factor(u32 i, u32 sigma) {
    u32 m = 0;
    if (i & 1u) m ^= 0xAAAAAAAAu;
    if (i & 2u) m ^= 0xCCCCCCCCu;
    if (i & 4u) m ^= 0xF0F0F0F0u;
    if (i & 8u) m ^= 0xFF00FF00u;
    if (i & 16u) m ^= 0xFFFF0000u;
    const int t = 32 - 2 * __popc(m ^ sigma);
    return (float)(((KV_QJL_SIGNS >> i) & 1u) ? -t : t);
}

// Bytes of a row of n values (n a multiple of 32 for the block formats).
__device__ __forceinline__ u32 kv_row_bytes(u32 f, u32 n) {
    switch (f) {
        case 0: return 4u * n;
        case 1:
        case 2: return 2u * n;
        case 3: return n / 32u * 34u;
        case 4:
        case 5: return n / 32u * 18u;
        case 6:
        case 10: return n / 32u * 14u;
        case 8: return n / 32u * 20u;
        case 9: return n / 32u * 16u;
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

// The trellis blocks (tq3t, tq2t): the unit-scale point of a `bits`-bit code at a state
// whose tap parity (branch bits of codes i-1 and i-3 XORed) is `par`.
__device__ __forceinline__ float kv_tcq_point(u32 bits, u32 code, u32 par) {
    return __fmul_rn(0.9f, kv_tq_point(bits + 1u, 2u * code + par));
}

// Code i (0..32) of the codes block at `b` (f16 scale, then `bits`-bit codes; the last code
// ends inside its byte and nothing past the codes is read).
__device__ __forceinline__ u32 kv_tq_code(const u8* b, u32 bits, u32 i) {
    const u32 bit = i * bits, at = 2u + bit / 8u, cb = 2u + 4u * bits;
    const u32 two = b[at] | ((at + 1u < cb ? (u32)b[at + 1u] : 0u) << 8);
    return (two >> (bit % 8u)) & ((1u << bits) - 1u);
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
            const u32 bits = kv_tq_bits(f), cb = 2u + 4u * bits;
            const u8* b = row + (j / 32u) * kv_tq_bytes(f);
            const u32 i = j % 32u, code = kv_tq_code(b, bits, i);
            if (f >= 10u) {
                // The branch bits of codes i-1 and i-3 (0 before the block's start).
                const u32 u1 = i >= 1u ? kv_tq_code(b, bits, i - 1u) & 1u : 0u;
                const u32 u3 = i >= 3u ? kv_tq_code(b, bits, i - 3u) & 1u : 0u;
                return __fmul_rn(f16_at(b), kv_tcq_point(bits, code, u1 ^ u3));
            }
            float y = f16_at(b) * kv_tq_point(bits, code);
            if (kv_tq_sketched(f)) {
                const u32 sigma = b[cb] | (b[cb + 1] << 8) | (b[cb + 2] << 16) | ((u32)b[cb + 3] << 24);
                y = __fadd_rn(y, __fmul_rn(f16_at(b + cb + 4), kv_qjl_factor(j % 32u, sigma)));
            }
            return y;
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
