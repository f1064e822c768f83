// Writes k [T, H, D] and v [T, H, Dv] (f32) into paged caches [B, bs, H, D] at slots [T]
// (slot = block * bs + offset); a negative slot, or one past the cache's n_slots rows, is
// skipped. f32 and f16 caches.

template <typename C>
__device__ void kv_write(const float* k, const float* v, const int* slots, C* kc, C* vc, u32 t, u32 hd,
                         u32 hdv, u32 n_slots) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 row = hd + hdv;
    if (i >= t * row) return;
    const u32 tok = i / row, j = i % row;
    const int s = slots[tok];
    if (s < 0 || (u32)s >= n_slots) return;
    if (j < hd) {
        from_f32(k[(size_t)tok * hd + j], &kc[(size_t)s * hd + j]);
    } else {
        const u32 jv = j - hd;
        from_f32(v[(size_t)tok * hdv + jv], &vc[(size_t)s * hdv + jv]);
    }
}

extern "C" __global__ void kv_write_f32(const float* k, const float* v, const int* slots, float* kc,
                                        float* vc, u32 t, u32 hd, u32 hdv, u32 n_slots) {
    kv_write(k, v, slots, kc, vc, t, hd, hdv, n_slots);
}

extern "C" __global__ void kv_write_f16(const float* k, const float* v, const int* slots, __half* kc,
                                        __half* vc, u32 t, u32 hd, u32 hdv, u32 n_slots) {
    kv_write(k, v, slots, kc, vc, t, hd, hdv, n_slots);
}
