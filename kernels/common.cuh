// Shared by every kernel file (prepended by the compiler driver, backend-cuda/src/kernels.rs).
// Types, warp reductions and the GGUF block layouts kiln's CUDA kernels read.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;
typedef unsigned char u8;
typedef signed char i8;

#define WARP 32
// +inf (NVRTC has no math.h, so no INFINITY).
#define KILN_INF __int_as_float(0x7f800000)

__device__ __forceinline__ u32 u16_at(const u8* p) { return *(const unsigned short*)p; }

// A little-endian word at p, read in loads of A bytes (4, 2 or 1: what the caller knows of
// p's alignment at compile time, so no branch stands between a kernel's loads and they can
// all be in flight at once).
template <u32 A>
__device__ __forceinline__ u32 word_at(const u8* p) {
    if constexpr (A >= 4) {
        return *(const u32*)p;
    } else if constexpr (A >= 2) {
        return u16_at(p) | (u16_at(p + 2) << 16);
    } else {
        return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
    }
}

// 8 consecutive bytes at p as two little-endian words, in loads of A bytes (8, 4, 2 or 1).
template <u32 A>
__device__ __forceinline__ uint2 bytes8(const u8* p) {
    if constexpr (A >= 8) {
        return *(const uint2*)p;
    } else {
        uint2 r;
        r.x = word_at<A>(p);
        r.y = word_at<A>(p + 4);
        return r;
    }
}

// 16 bytes at p, in loads of A bytes (16: one vector load; 1: bytes).
template <u32 A>
__device__ __forceinline__ uint4 load16(const u8* p) {
    if constexpr (A >= 16) {
        return *(const uint4*)p;
    } else {
        uint4 r;
        r.x = word_at<A>(p), r.y = word_at<A>(p + 4), r.z = word_at<A>(p + 8), r.w = word_at<A>(p + 12);
        return r;
    }
}

// The f16 whose bits are the low 16 of h.
__device__ __forceinline__ float f16_bits(u32 h) { return __half2float(__ushort_as_half((unsigned short)h)); }

// Byte i (0..7, a compile-time constant in unrolled loops) of bytes8's result.
__device__ __forceinline__ u32 byte_of(uint2 q, int i) { return ((i < 4 ? q.x : q.y) >> (8 * (i & 3))) & 0xFFu; }

// The code u (a byte of w picked by i, 0..255) as a float minus `bias`, exactly, with no
// conversion instruction (integer-to-float conversions run at an eighth of the FMA rate on
// sm_80..sm_90): the byte placed under the exponent of 2^23 is 2^23 + u, and 2^23 + u - bias
// is exact for the small biases used here. i must be a compile-time constant (0..3).
__device__ __forceinline__ float byte_as_float(u32 w, u32 i, float bias = 8388608.0f) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7440u | i)) - bias;
}

// Asynchronous global-to-shared copies of G bytes (16, 8 or 4; both addresses G-aligned):
// cp.async on sm_80 and later, so a block's weight bytes are in flight without registers; a
// plain copy elsewhere (and in the CPU emulation). commit closes a group of copies; wait<N>
// returns when at most N of this thread's groups are still in flight.
template <u32 G>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    if constexpr (G == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(d), "l"(src), "n"(G) : "memory");
    }
#else
    if constexpr (G == 16) {
        *(uint4*)dst = *(const uint4*)src;
    } else if constexpr (G == 8) {
        *(uint2*)dst = *(const uint2*)src;
    } else {
        *(u32*)dst = *(const u32*)src;
    }
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Programmatic dependent launch (sm_90 and later; no-ops elsewhere and in the CPU emulation).
// A kernel the launcher starts with the programmatic-serialization attribute (device.rs,
// PDL_KERNELS) may begin while the kernel before it is still running: it must call grid_wait()
// before it reads anything an earlier kernel wrote or writes anything at all (what it reads
// before, such as weights, must be constant for the whole step). grid_wait returns once the
// previous kernel has finished and its writes are visible. grid_launch_dependents lets the
// next kernel's blocks start (into their own grid_wait) as soon as every block of this one
// has called it, instead of at this kernel's end.
__device__ __forceinline__ void grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// D = A·B + D over one warp's 16×8×16 tile: A (16×16) and B (16×8) in bf16, D in f32 — PTX's
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (sm_80 and later). With g = lane / 4 and
// t = lane % 4 a lane holds (PTX ISA, "Matrix fragments for mma.m16n8k16 with floating point
// type"; each word two bf16, the lower-numbered element in its low half):
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// Every lane of the warp calls it with the same control flow. The CPU emulation computes the
// same tile from the same fragments (kiln_emu.h), so the kernels' fragment indexing is checked
// without a GPU.
__device__ __forceinline__ void mma_bf16_16816(float* d, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    kiln_emu_mma_bf16_16816(d, a, b);
#endif
}

// The same tile with A and B in f16 — PTX's mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
// (sm_80 and later), the fragments laid out as for bf16 above. A product of two f16 (11
// significant bits each) is exact in f32.
__device__ __forceinline__ void mma_f16_16816(float* d, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    kiln_emu_mma_f16_16816(d, a, b);
#endif
}

// D = A·B + D over one warp's 16×8×32 tile of signed 8-bit integers, D in int32 — PTX's
// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (sm_80 and later). With g = lane / 4 and
// t = lane % 4 a lane holds (PTX ISA, "Matrix fragments for mma.m16n8k32"; byte j of a word is
// its element j):
//   a[0] = A[g][4t .. 4t+3]   a[1] = A[g+8][4t .. 4t+3]   a[2] = A[g][16+4t .. 16+4t+3]   a[3] = A[g+8][16+4t ..]
//   b[0] = B[4t .. 4t+3][g]   b[1] = B[16+4t .. 16+4t+3][g]
//   d[0], d[1] = D[g][2t, 2t+1]   d[2], d[3] = D[g+8][2t, 2t+1]
// The sums are exact. Every lane of the warp calls it with the same control flow; the CPU
// emulation computes the same tile from the same fragments (kiln_emu.h).
__device__ __forceinline__ void mma_s8_16832(int* d, const u32* a, const u32* b) {
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    kiln_emu_mma_s8_16832(d, a, b);
#endif
}

// v as two bf16 (bit patterns), hi = bf16(v) and lo = bf16(v - hi), so that hi + lo carries 16
// of f32's 24 significant bits: bf16 rounds to nearest with 8 significant bits, so
// |v - hi| <= 2^-8 |v|; v - hi is exact in f32; |(v - hi) - lo| <= 2^-8 |v - hi|; hence
// |v - hi - lo| <= 2^-16 |v|. A non-finite hi keeps lo zero (an infinity stays one instead of
// becoming inf - inf = NaN).
__device__ __forceinline__ void split_bf16(float v, u32& hi, u32& lo) {
    hi = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    const float rest = v - __uint_as_float(hi << 16);
    lo = (hi & 0x7F80u) == 0x7F80u ? 0u : (u32)__bfloat16_as_ushort(__float2bfloat16_rn(rest));
}

// v as two f16 (bit patterns), hi = f16(v) and lo = f16(v - hi), for |v| <= 2^15 (the caller
// scales): v - hi is exact in f32 (hi is v rounded to a coarser grid), so hi + lo is v to
// 2^-11 of |v - hi| <= 2^-22 |v| where lo is normal, and to 2^-25 (half of f16's subnormal
// step) where it is not.
__device__ __forceinline__ void split_f16(float v, u32& hi, u32& lo) {
    const __half h = __float2half_rn(v);
    hi = __half_as_ushort(h);
    lo = __half_as_ushort(__float2half_rn(v - __half2float(h)));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = warp_sum(v);
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    const int nw = blockDim.x / WARP;
    v = (threadIdx.x < nw) ? scratch[threadIdx.x] : 0.0f;
    if (w == 0) v = warp_sum(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
    v = warp_max(v);
    if (lane == 0) scratch[w] = v;
    __syncthreads();
    const int nw = blockDim.x / WARP;
    v = (threadIdx.x < nw) ? scratch[threadIdx.x] : -KILN_INF;
    if (w == 0) v = warp_max(v);
    if (threadIdx.x == 0) scratch[0] = v;
    __syncthreads();
    v = scratch[0];
    __syncthreads();
    return v;
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void from_f32(float v, float* p) { *p = v; }
__device__ __forceinline__ void from_f32(float v, __half* p) { *p = __float2half_rn(v); }
__device__ __forceinline__ void from_f32(float v, __nv_bfloat16* p) { *p = __float2bfloat16_rn(v); }

// GGUF Q8_0: 32 values as an f16 scale and 32 int8s (34 bytes).
struct block_q8_0 {
    __half d;
    i8 qs[32];
};

// GGUF Q4_0: 32 values as an f16 scale and 16 bytes of nibbles (low nibbles are values
// 0..15, high nibbles 16..31), each value (q - 8) * d (18 bytes).
struct block_q4_0 {
    __half d;
    u8 qs[16];
};

__device__ __forceinline__ float silu(float x) { return x / (1.0f + __expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

// RoPE's pair j of n_rot at position pos: the indices of its two values in a head (adjacent,
// or halves for NeoX) and the turned pair, with the angle pos · freq_scale · base^(-2j/n_rot)
// / factors[j] and cos and sin scaled by attn_factor (rope.cu, attention_kv_write.cu).
__device__ __forceinline__ void rope_turn(const float* x, const float* factors, u32 has_factors, int pos, u32 j,
                                          u32 n_rot, u32 neox, float base, float freq_scale, float attn_factor,
                                          u32& i0, u32& i1, float& y0, float& y1) {
    float inv = powf(base, -2.0f * (float)j / (float)n_rot);
    if (has_factors) inv /= factors[j];
    const float a = (float)pos * freq_scale * inv;
    float s, c;
    sincosf(a, &s, &c);
    c *= attn_factor;
    s *= attn_factor;
    const u32 half = n_rot / 2;
    i0 = neox ? j : 2 * j;
    i1 = neox ? j + half : 2 * j + 1;
    const float x0 = x[i0], x1 = x[i1];
    y0 = x0 * c - x1 * s;
    y1 = x0 * s + x1 * c;
}
