// A CPU emulation of the CUDA C subset kiln's kernels use, so the kernels in kernels/ can run
// (and be checked against the CPU reference) on a machine without a GPU. The test in
// backend-cuda/src/emu.rs compiles each kernel file with a host C++ compiler with this header
// forced in front (`-include kiln_emu.h`) and calls the kernels through generated wrappers.
//
// Model: blocks run one after another; the threads of a block run as OS threads at once, so
// __syncthreads is a real barrier and __shared__ arrays are function statics (shared by the
// block's threads, reused by the next block). Warp shuffles exchange through a per-warp buffer
// between two warp barriers. A thread that returns drops out of every barrier, as an exited
// GPU thread does. Not modelled: the GPU memory model beyond these barriers, and timing.
#pragma once

#include <cmath>
#include <math.h>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
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

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace kiln_emu {

// A barrier whose party count shrinks when a thread leaves.
struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    int count = 0, waiting = 0;
    unsigned gen = 0;
    void arrive_wait() {
        std::unique_lock<std::mutex> l(m);
        const unsigned g = gen;
        if (++waiting >= count) {
            waiting = 0;
            gen++;
            cv.notify_all();
        } else {
            cv.wait(l, [&] { return gen != g; });
        }
    }
    void drop() {
        std::unique_lock<std::mutex> l(m);
        count--;
        if (waiting > 0 && waiting >= count) {
            waiting = 0;
            gen++;
            cv.notify_all();
        }
    }
};

struct Block {
    Barrier block;
    std::vector<Barrier> warps;
    std::vector<float> shfl_f;
    std::vector<unsigned> shfl_u;
};

inline thread_local Block* current = nullptr;

}  // namespace kiln_emu

inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() { kiln_emu::current->block.arrive_wait(); }

inline unsigned kiln_emu_lane_index() {
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

inline float __shfl_xor_sync(unsigned, float v, int o) {
    auto* b = kiln_emu::current;
    const unsigned t = kiln_emu_lane_index(), w = t / 32, lane = t % 32;
    b->shfl_f[t] = v;
    b->warps[w].arrive_wait();
    const float r = b->shfl_f[w * 32 + (lane ^ (unsigned)o)];
    b->warps[w].arrive_wait();
    return r;
}

// ---- math ----
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
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

namespace kiln_emu {

// Runs `body` once per thread of every block of the grid.
inline void launch(const unsigned* dims, const std::function<void()>& body) {
    const dim3 grid{dims[0], dims[1], dims[2]}, block{dims[3], dims[4], dims[5]};
    const unsigned n = block.x * block.y * block.z;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                Block b;
                b.block.count = (int)n;
                b.warps = std::vector<Barrier>((n + 31) / 32);
                for (unsigned w = 0; w < b.warps.size(); w++)
                    b.warps[w].count = (int)std::min(32u, n - 32 * w);
                b.shfl_f.assign(n, 0.0f);
                std::vector<std::thread> threads;
                threads.reserve(n);
                for (unsigned t = 0; t < n; t++) {
                    threads.emplace_back([&, t] {
                        current = &b;
                        gridDim = grid;
                        blockDim = block;
                        blockIdx = dim3{bx, by, bz};
                        threadIdx = dim3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
                        body();
                        b.warps[t / 32].drop();
                        b.block.drop();
                    });
                }
                for (auto& th : threads) th.join();
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
