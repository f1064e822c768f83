// A CPU emulation of the CUDA C subset kiln's kernels use, so the kernels in kernels/ can run
// (and be checked against the CPU reference) on a machine without a GPU. The test in
// backend-cuda/src/emu.rs compiles each kernel file with a host C++ compiler with this header
// forced in front (`-include kiln_emu.h`) and calls the kernels through generated wrappers.
//
// Model: blocks run one after another; the threads of a block are fibers on the calling OS
// thread (started with makecontext/swapcontext, then switched with _setjmp/_longjmp, which
// unlike swapcontext make no signal-mask system call), switched at barriers, so
// __syncthreads is a real barrier and __shared__ arrays are function statics (shared by the
// block's threads, reused by the next block). Warp shuffles exchange through a per-warp
// buffer between two warp barriers. A thread that returns
// leaves every barrier, as an exited GPU thread does. A block whose threads all wait at
// barriers that can never complete (a barrier in divergent code) is reported and aborts.
// Not modelled: the GPU memory model beyond these barriers, and timing.
#pragma once

#include <cmath>
#include <math.h>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <cstdio>
#include <cstdlib>
#include <setjmp.h>
#include <ucontext.h>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__

using std::max;
using std::min;

// CUDA's vector types, with their alignment (kernels load through them).
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace kiln_emu {

enum Wait { RUNNABLE, AT_SYNCTHREADS, AT_WARP };

struct Fiber {
    ucontext_t ctx;  // the first entry
    jmp_buf jb;      // where it waits at a barrier
    bool started = false;
    Wait wait = RUNNABLE;
    bool done = false;
};

struct Block {
    unsigned n = 0;
    std::vector<Fiber> fibers;
    ucontext_t sched;
    jmp_buf sched_jb;  // the scheduler, between two fiber switches
    unsigned cur = 0;
    int live = 0, arrived = 0;
    std::vector<int> warp_live, warp_arrived;
    std::vector<float> shfl_f;
    std::vector<unsigned> mma;  // each thread's operand words of a warp-wide mma (6 a thread)
    const std::function<void()>* body = nullptr;
};

inline thread_local Block* current = nullptr;

}  // namespace kiln_emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace kiln_emu {
// The running fiber waits at a barrier: back to the scheduler until it is released.
inline void wait_at(Wait w) {
    Block* b = current;
    Fiber& me = b->fibers[b->cur];
    me.wait = w;
    if (w == AT_SYNCTHREADS)
        b->arrived++;
    else
        b->warp_arrived[b->cur / 32]++;
    if (!_setjmp(me.jb)) _longjmp(b->sched_jb, 1);
}
}  // namespace kiln_emu

inline void __syncthreads() { kiln_emu::wait_at(kiln_emu::AT_SYNCTHREADS); }

inline unsigned kiln_emu_lane_index() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

// A barrier of the calling thread's warp (every lane of it must arrive; kiln's kernels call
// it with the full mask only).
inline void __syncwarp(unsigned = 0xffffffffu) { kiln_emu::wait_at(kiln_emu::AT_WARP); }

inline float __shfl_xor_sync(unsigned, float v, int o) {
    auto* b = kiln_emu::current;
    const unsigned t = kiln_emu_lane_index(), w = t / 32, lane = t % 32;
    b->shfl_f[t] = v;
    kiln_emu::wait_at(kiln_emu::AT_WARP);
    const float r = b->shfl_f[w * 32 + (lane ^ (unsigned)o)];
    kiln_emu::wait_at(kiln_emu::AT_WARP);
    return r;
}

// ---- atomics (blocks may run on several host threads) ----
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }

// ---- math ----
// Bytes of x (0..3) and y (4..7) picked by the selector's low three bits of each nibble.
inline int __popc(unsigned x) { return __builtin_popcount(x); }
// Rounded single operations (never contracted into a fused multiply-add).
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long b = (unsigned long long)x | ((unsigned long long)y << 32);
    unsigned r = 0;
    for (int j = 0; j < 4; j++) r |= (unsigned)((b >> (8 * ((s >> (4 * j)) & 7))) & 0xFF) << (8 * j);
    return r;
}
// dp4a: the four products of a's and b's bytes as signed 8-bit integers, summed into c.
inline int __dp4a(int a, int b, int c) {
    for (int j = 0; j < 4; j++) c += (int)(signed char)(a >> (8 * j)) * (int)(signed char)(b >> (8 * j));
    return c;
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
// fmaxf, log1pf, powf, tanhf and sincosf (a GNU extension) come from math.h.

// ---- half and bfloat16 as bit patterns, converted with round-to-nearest-even ----
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __half2float(__half h) {
    const uint32_t s = (uint32_t)(h.bits >> 15) << 31, e = (h.bits >> 10) & 0x1f, m = h.bits & 0x3ff;
    uint32_t f;
    if (e == 0) {
        if (m == 0) {
            f = s;
        } else {  // subnormal
            float v = std::ldexp((float)m, -24);
            return s ? -v : v;
        }
    } else if (e == 31) {
        f = s | 0x7f800000u | (m << 13);
    } else {
        f = s | ((e + 112) << 23) | (m << 13);
    }
    float out;
    std::memcpy(&out, &f, 4);
    return out;
}

inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}

inline __half __float2half_rn(float v) {
    uint32_t x;
    std::memcpy(&x, &v, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const float a = std::fabs(v);
    if (std::isnan(v)) return __half{(uint16_t)(sign | 0x7e00)};
    if (a >= 65520.0f) return __half{(uint16_t)(sign | 0x7c00)};
    if (a < 6.103515625e-05f) {  // subnormal or zero: multiples of 2^-24, ties to even
        const float q = std::nearbyint(a * 16777216.0f);
        return __half{(uint16_t)(sign | (uint16_t)q)};
    }
    uint32_t ax;
    std::memcpy(&ax, &a, 4);
    uint32_t e = (ax >> 23) - 112, m = ax & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13);
    const uint32_t rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return __half{(uint16_t)(sign | h)};
}

inline float __bfloat162float(__nv_bfloat16 b) {
    const uint32_t f = (uint32_t)b.bits << 16;
    float out;
    std::memcpy(&out, &f, 4);
    return out;
}

inline __nv_bfloat16 __float2bfloat16_rn(float v) {
    uint32_t x;
    std::memcpy(&x, &v, 4);
    if (std::isnan(v)) return __nv_bfloat16{(uint16_t)((x >> 16) | 0x40)};
    const uint32_t lsb = (x >> 16) & 1;
    x += 0x7fff + lsb;
    return __nv_bfloat16{(uint16_t)(x >> 16)};
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }

// One warp's mma: every lane's fragments (four words of A, two of B) exchanged through the
// block's buffer between two warp barriers, then `tile(warp, g, q, out)` computes this lane's
// four outputs from the warp's words (lane l's at warp[6 l ..]). Every lane of the warp must
// call it, as on a GPU.
template <class T, class F>
inline void kiln_emu_mma(T* c, const unsigned* a, const unsigned* b, F tile) {
    auto* blk = kiln_emu::current;
    const unsigned t = kiln_emu_lane_index(), w = t / 32, lane = t % 32;
    unsigned* mine = &blk->mma[6 * (std::size_t)t];
    for (int i = 0; i < 4; i++) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    kiln_emu::wait_at(kiln_emu::AT_WARP);
    T out[4];
    tile(&blk->mma[6 * 32 * (std::size_t)w], lane / 4, lane % 4, out);
    kiln_emu::wait_at(kiln_emu::AT_WARP);  // every lane has read the fragments
    for (int i = 0; i < 4; i++) c[i] = out[i];
}

// PTX's mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16} for the calling warp: c (this
// lane's four outputs of the 16×8 tile D = A·B + C) from every lane's fragments of A (16×16,
// four words) and B (16×8, two words). The layout is PTX's ("Matrix fragments for
// mma.m16n8k16 with floating point type"); with g = lane / 4 and t = lane % 4, a lane holds
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// each word holding two elements, the lower-numbered one in its low half. Each output is C
// plus the sum of its 16 exact products,
// rounded once (a tensor core's f32 sum rounds in its own order; the kernels' results are
// checked against the CPU within tolerances that cover both). `elem(bits)` widens an element
// to float: the bf16 and f16 forms below differ only there.
template <class E>
inline void kiln_emu_mma_16816(float* c, const unsigned* a, const unsigned* b, E elem) {
    kiln_emu_mma(c, a, b, [&](const unsigned* warp, unsigned g, unsigned q, float* out) {
        auto half = [&](unsigned word, unsigned hi) { return elem((uint16_t)(hi ? word >> 16 : word & 0xFFFFu)); };
        auto A = [&](unsigned r, unsigned k) {
            return half(warp[6 * ((r % 8) * 4 + (k % 8) / 2) + r / 8 + 2 * (k / 8)], k & 1);
        };
        auto B = [&](unsigned k, unsigned n) { return half(warp[6 * (n * 4 + (k % 8) / 2) + 4 + k / 8], k & 1); };
        for (unsigned i = 0; i < 4; i++) {
            const unsigned r = g + 8 * (i / 2), n = 2 * q + (i & 1);
            double s = c[i];
            for (unsigned k = 0; k < 16; k++) s += (double)A(r, k) * (double)B(k, n);
            out[i] = (float)s;
        }
    });
}

inline void kiln_emu_mma_bf16_16816(float* c, const unsigned* a, const unsigned* b) {
    kiln_emu_mma_16816(c, a, b, [](uint16_t bits) { return __bfloat162float(__nv_bfloat16{bits}); });
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32: the same tile with f16 elements.
inline void kiln_emu_mma_f16_16816(float* c, const unsigned* a, const unsigned* b) {
    kiln_emu_mma_16816(c, a, b, [](uint16_t bits) { return __half2float(__half{bits}); });
}

// PTX's mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 for the calling warp: c (this lane's
// four outputs of the 16×8 tile D = A·B + C, int32) from every lane's fragments of A (16×32
// int8, four words) and B (32×8 int8, two words). The layout is PTX's ("Matrix fragments for
// mma.m16n8k32", .s8); with g = lane / 4 and t = lane % 4, byte j of each word being element j:
//   a[0] = A[g][4t .. 4t+3]   a[1] = A[g+8][4t .. 4t+3]   a[2] = A[g][16+4t ..]   a[3] = A[g+8][16+4t ..]
//   b[0] = B[4t .. 4t+3][g]   b[1] = B[16+4t .. 16+4t+3][g]
//   c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3] = C[g+8][2t, 2t+1]
// The sums are exact (as on a tensor core: 32 products of 8-bit integers and an int32, which
// the kernels keep far from overflow).
inline void kiln_emu_mma_s8_16832(int* c, const unsigned* a, const unsigned* b) {
    kiln_emu_mma(c, a, b, [&](const unsigned* warp, unsigned g, unsigned q, int* out) {
        auto byte = [](unsigned word, unsigned j) { return (int)(signed char)(word >> (8 * j)); };
        auto A = [&](unsigned r, unsigned k) {
            return byte(warp[6 * ((r % 8) * 4 + (k % 16) / 4) + r / 8 + 2 * (k / 16)], k % 4);
        };
        auto B = [&](unsigned k, unsigned n) { return byte(warp[6 * (n * 4 + (k % 16) / 4) + 4 + k / 16], k % 4); };
        for (unsigned i = 0; i < 4; i++) {
            const unsigned r = g + 8 * (i / 2), n = 2 * q + (i & 1);
            long long s = c[i];
            for (unsigned k = 0; k < 32; k++) s += (long long)A(r, k) * B(k, n);
            out[i] = (int)s;
        }
    });
}

namespace kiln_emu {

// Releases every barrier whose live threads have all arrived.
inline void release(Block& b) {
    if (b.arrived > 0 && b.arrived >= b.live) {
        for (auto& f : b.fibers)
            if (f.wait == AT_SYNCTHREADS) f.wait = RUNNABLE;
        b.arrived = 0;
    }
    for (unsigned w = 0; w < b.warp_live.size(); w++) {
        if (b.warp_arrived[w] > 0 && b.warp_arrived[w] >= b.warp_live[w]) {
            for (unsigned t = 32 * w; t < std::min(b.n, 32 * w + 32); t++)
                if (b.fibers[t].wait == AT_WARP) b.fibers[t].wait = RUNNABLE;
            b.warp_arrived[w] = 0;
        }
    }
}

inline void fiber_main() {
    Block* b = current;
    const unsigned t = b->cur;
    (*b->body)();
    b->fibers[t].done = true;
    b->live--;
    b->warp_live[t / 32]--;
    _longjmp(b->sched_jb, 1);  // never returns: the scheduler goes on from its last switch
}

constexpr std::size_t STACK = 256 * 1024;

// Runs `body` once per thread of every block of the grid.
inline void launch(const unsigned* dims, const std::function<void()>& body) {
    const dim3 grid{dims[0], dims[1], dims[2]}, block{dims[3], dims[4], dims[5]};
    const unsigned n = block.x * block.y * block.z;
    static std::vector<std::vector<char>> stacks;
    while (stacks.size() < n) stacks.emplace_back(STACK);
    gridDim = grid;
    blockDim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                Block b;
                b.n = n;
                b.fibers = std::vector<Fiber>(n);
                b.live = (int)n;
                const unsigned nw = (n + 31) / 32;
                b.warp_live.resize(nw);
                b.warp_arrived.assign(nw, 0);
                for (unsigned w = 0; w < nw; w++) b.warp_live[w] = (int)std::min(32u, n - 32 * w);
                b.shfl_f.assign(n, 0.0f);
                b.mma.assign(6 * (std::size_t)n, 0u);
                b.body = &body;
                current = &b;
                blockIdx = dim3{bx, by, bz};
                for (unsigned t = 0; t < n; t++) {
                    Fiber& f = b.fibers[t];
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp = stacks[t].data();
                    f.ctx.uc_stack.ss_size = STACK;
                    f.ctx.uc_link = &b.sched;
                    makecontext(&f.ctx, fiber_main, 0);
                }
                unsigned left = n;
                while (left > 0) {
                    bool ran = false;
                    for (unsigned t = 0; t < n; t++) {
                        Fiber& f = b.fibers[t];
                        if (f.done || f.wait != RUNNABLE) continue;
                        b.cur = t;
                        threadIdx = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        if (!_setjmp(b.sched_jb)) {
                            if (f.started) _longjmp(f.jb, 1);
                            f.started = true;
                            swapcontext(&b.sched, &f.ctx);
                        }
                        if (f.done) left--;
                        release(b);
                        ran = true;
                    }
                    if (!ran && left > 0) {
                        std::fprintf(stderr,
                                     "kiln_emu: block (%u,%u,%u) deadlocked: %u threads wait at barriers "
                                     "that cannot complete (a barrier in divergent code?)\n",
                                     bx, by, bz, left);
                        std::abort();
                    }
                }
                current = nullptr;
            }
}

// Calls kernel `f` with its parameters read from `args` as cuLaunchKernel does: args[i]
// points at the value of parameter i.
template <typename... P, std::size_t... I>
inline void invoke(void (*f)(P...), void** args, std::index_sequence<I...>) {
    f(*reinterpret_cast<typename std::remove_reference<P>::type*>(args[I])...);
}

template <typename... P>
inline void call(void (*f)(P...), const unsigned* dims, void** args) {
    launch(dims, [&] { invoke(f, args, std::index_sequence_for<P...>{}); });
}

}  // namespace kiln_emu
