// Decode mat-vec and embedding lookup for more GGUF formats: Q4_1, Q5_0 (32-value blocks) and
// Q4_K, Q6_K (256-value super-blocks), read from the raw row bytes. Each warp takes the row in
// chunks of 256 values, each lane 8 consecutive ones (8 never straddle a scale group), and
// dequantizes in registers.

struct Q4_1 {
    static constexpr u32 QK = 32, BYTES = 20;
    // d, m (f16), then 16 bytes of nibbles: value j < 16 the low nibble of byte j, j >= 16 the
    // high nibble of byte j - 16; value = d * q + m.
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = __half2float(*(const __half*)b), m = __half2float(*(const __half*)(b + 2));
        const u32 j0 = v % QK;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 j = j0 + i;
            const int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
            out[i] = d * (float)q + m;
        }
    }
};

struct Q5_0 {
    static constexpr u32 QK = 32, BYTES = 22;
    // d (f16), qh (32 high bits, little-endian), 16 bytes of nibbles; value = d * (q - 16)
    // where q is the nibble with bit j of qh on top.
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
    // values is the low (g even) or high (g odd) nibbles of bytes 32*(g/2) .. +32.
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = __half2float(*(const __half*)b), dmin = __half2float(*(const __half*)(b + 2));
        const u32 e0 = v % QK, g = e0 / 32;
        float sc, m;
        scale_min_k4(g, b + 4, &sc, &m);
        const float d1 = d * sc, m1 = dmin * m;
        const u8* qs = b + 16 + 32 * (g / 2);
        const u32 shift = 4 * (g % 2);
#pragma unroll
        for (int i = 0; i < 8; i++) out[i] = d1 * (float)((qs[(e0 % 32) + i] >> shift) & 0xF) - m1;
    }
};

struct Q6_K {
    static constexpr u32 QK = 256, BYTES = 210;
    // ql[128], qh[64], scales[16] (int8), d (f16). In half h (128 values), quarter q, index l:
    // low 4 bits from ql[64h + 32*(q%2) + l] (low nibble for q < 2, high for q >= 2), top 2
    // bits from qh[32h + l] at shift 2q, scale scales[8h + l/16 + 2q]; value = d*sc*(q6 - 32).
    __device__ static void load8(const u8* row, u32 v, float* out) {
        const u8* b = row + (v / QK) * BYTES;
        const float d = __half2float(*(const __half*)(b + 208));
        const u32 e0 = v % QK, h = e0 / 128, r = e0 % 128, q = r / 32, l0 = r % 32;
        const u8* ql = b + 64 * h + 32 * (q % 2);
        const u8* qh = b + 128 + 32 * h;
        const float sc = d * (float)(i8)b[192 + 8 * h + l0 / 16 + 2 * q];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const u32 l = l0 + i;
            const int lo = q < 2 ? (ql[l] & 0xF) : (ql[l] >> 4);
            const int hi = (qh[l] >> (2 * q)) & 3;
            out[i] = sc * (float)((lo | (hi << 4)) - 32);
        }
    }
};

template <typename B>
__device__ __forceinline__ void mat_vec_blocks(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    const u32 col = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    const u32 row = blockIdx.y;
    const u32 lane = threadIdx.x % WARP;
    if (col >= n || row >= m) return;
    const float* xr = x + (size_t)row * k;
    const u8* wr = w + (size_t)col * (k / B::QK) * B::BYTES;
    float acc = 0.0f;
    for (u32 s = 0; s < k; s += 256) {
        const u32 v = s + 8 * lane;
        if (v >= k) break;
        float wv[8];
        B::load8(wr, v, wv);
#pragma unroll
        for (int i = 0; i < 8; i++) acc += xr[v + i] * wv[i];
    }
    acc = warp_sum(acc);
    if (lane == 0) y[(size_t)row * n + col] = acc;
}

// @hot
extern "C" __global__ void mat_vec_q4_1(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q4_1>(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_vec_q5_0(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q5_0>(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_vec_q4_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q4_K>(x, w, y, m, n, k);
}
// @hot
extern "C" __global__ void mat_vec_q6_k(const float* x, const u8* w, float* y, u32 m, u32 n, u32 k) {
    mat_vec_blocks<Q6_K>(x, w, y, m, n, k);
}

// Embedding lookup: one thread per 8 values of an output row; bad ids give zeros.
template <typename B>
__device__ __forceinline__ void get_rows_blocks(const u8* table, const int* ids, float* out, u32 n, u32 d,
                                                u32 v) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 per_row = d / 8;
    if (i >= n * per_row) return;
    const u32 r = i / per_row, c = (i % per_row) * 8;
    const int id = ids[r];
    float vals[8];
    if (id >= 0 && (u32)id < v) {
        B::load8(table + (size_t)id * (d / B::QK) * B::BYTES, c, vals);
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) vals[j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) out[(size_t)r * d + c + j] = vals[j];
}

extern "C" __global__ void get_rows_q4_1(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q4_1>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_q5_0(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q5_0>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_q4_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q4_K>(t, ids, out, n, d, v);
}
extern "C" __global__ void get_rows_q6_k(const u8* t, const int* ids, float* out, u32 n, u32 d, u32 v) {
    get_rows_blocks<Q6_K>(t, ids, out, n, d, v);
}
