// Paged attention through the block table, one query token per sequence (decode) or several
// (prefill), and attention over contiguous K/V; causal, sliding-window, bidirectional and
// prefix masks, optionally soft-capped.
//
// Decode: one block per (sequence, KV head, split of the key range). The block's warps split
// the split's keys; every warp serves all the query heads of the KV head's group (GQA), so
// each K/V row is read from the cache once per group. Per query head, an online softmax
// (running max, sum and weighted V) per warp, merged across warps at the end. When the key
// range is split over several blocks (few sequences, long contexts: not enough blocks to fill
// the GPU otherwise) each block writes its partial (max, sum, weighted V) and
// paged_decode_combine merges them. Head dims up to 256 (8 values per lane). K/V caches
// [B, bs, Hkv, D] in f32 or f16 (the `_kv` kernels: any pair of the cache formats of
// formats.cuh, decoded value by value); the block table is read in the kernel, and an entry outside
// the cache's B blocks is skipped rather than read.

#define MAX_D 256
#define MAX_GROUP 8
#define DECODE_WARPS 4

// The scratch record of one (query row, head, split): max, sum, then the D weighted values
// (scaled relative to the max).
__device__ __forceinline__ float* split_record(float* part, u32 row_q, u32 h, u32 hq, u32 split, u32 n_split,
                                               u32 d) {
    return part + (((size_t)row_q * hq + h) * n_split + split) * (d + 2);
}

template <typename KR, typename VR>
__device__ __forceinline__ void paged_decode_row(const float* q, KR kc, VR vc, const int* table,
                                                 float* out, float* part, u32 seq, u32 row_q, int pos, u32 hq,
                                                 u32 hkv, u32 d, u32 bs, u32 max_blocks, u32 n_blocks,
                                                 float scale, float cap, u32 window, int kbeg, int kend) {
    __shared__ float m_s[DECODE_WARPS][MAX_GROUP];
    __shared__ float l_s[DECODE_WARPS][MAX_GROUP];
    __shared__ float o_s[DECODE_WARPS][MAX_GROUP][MAX_D];
    const u32 kvh = blockIdx.y;
    const u32 group = hq / hkv;
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int len = pos + 1;  // keys 0..=pos
    const int first = max(kbeg, window > 0 ? max(0, len - (int)window) : 0);
    const int last = min(len, kend);
    const u32 per = (d + WARP - 1) / WARP;  // values per lane, at most 8
    // Register arrays need indices known at compile time: the loops run to the maxima and
    // skip what is past this call's sizes.
    float qv[MAX_GROUP][8], acc[MAX_GROUP][8], m[MAX_GROUP], l[MAX_GROUP];
#pragma unroll
    for (u32 g = 0; g < MAX_GROUP; g++) {
        const float* qh = q + ((size_t)row_q * hq + kvh * group + (g < group ? g : 0)) * d;
#pragma unroll
        for (u32 i = 0; i < 8; i++) {
            const u32 j = lane + i * WARP;
            qv[g][i] = (g < group && i < per && j < d) ? qh[j] : 0.0f;
            acc[g][i] = 0.0f;
        }
        m[g] = -KILN_INF;
        l[g] = 0.0f;
    }
    for (int p = first + (int)warp; p < last; p += DECODE_WARPS) {
        const int blk = table[(size_t)seq * max_blocks + p / bs];
        if (blk < 0 || (u32)blk >= n_blocks) continue;
        const long long row = ((long long)blk * bs + p % bs) * hkv + kvh;
        float kv[8], vv[8];
#pragma unroll
        for (u32 i = 0; i < 8; i++) {
            const u32 j = lane + i * WARP;
            kv[i] = (i < per && j < d) ? kc.at(row, j) : 0.0f;
            vv[i] = (i < per && j < d) ? vc.at(row, j) : 0.0f;
        }
#pragma unroll
        for (u32 g = 0; g < MAX_GROUP; g++) {
            if (g >= group) break;
            float s = 0.0f;
#pragma unroll
            for (u32 i = 0; i < 8; i++) s += qv[g][i] * kv[i];
            s = warp_sum(s) * scale;
            if (cap > 0.0f) s = cap * tanhf(s / cap);
            const float mn = fmaxf(m[g], s);
            const float corr = __expf(m[g] - mn), e = __expf(s - mn);
            l[g] = l[g] * corr + e;
#pragma unroll
            for (u32 i = 0; i < 8; i++) acc[g][i] = acc[g][i] * corr + e * vv[i];
            m[g] = mn;
        }
    }
#pragma unroll
    for (u32 g = 0; g < MAX_GROUP; g++) {
        if (g >= group) break;
        if (lane == 0) {
            m_s[warp][g] = m[g];
            l_s[warp][g] = l[g];
        }
#pragma unroll
        for (u32 i = 0; i < 8; i++) {
            const u32 j = lane + i * WARP;
            if (i < per && j < d) o_s[warp][g][j] = acc[g][i];
        }
    }
    __syncthreads();
    // Merge the warps' partial results: thread j of the block sums dim j of every head.
    for (u32 g = 0; g < group; g++) {
        const u32 h = kvh * group + g;
        float mx = -KILN_INF;
        for (u32 w = 0; w < DECODE_WARPS; w++) mx = fmaxf(mx, m_s[w][g]);
        float denom = 0.0f;
        for (u32 w = 0; w < DECODE_WARPS; w++)
            denom += m_s[w][g] == -KILN_INF ? 0.0f : l_s[w][g] * __expf(m_s[w][g] - mx);
        float* rec = part ? split_record(part, row_q, h, hq, blockIdx.z, gridDim.z, d) : nullptr;
        if (rec && threadIdx.x == 0) {
            rec[0] = mx;
            rec[1] = denom;
        }
        for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
            float o = 0.0f;
            for (u32 w = 0; w < DECODE_WARPS; w++)
                if (m_s[w][g] != -KILN_INF) o += o_s[w][g][j] * __expf(m_s[w][g] - mx);
            if (rec)
                rec[2 + j] = o;
            else
                out[((size_t)row_q * hq + h) * d + j] = denom > 0.0f ? o / denom : 0.0f;
        }
    }
    // The next row of this sequence reuses the shared arrays.
    __syncthreads();
}

// A sequence's query rows are q_start[seq] .. q_start[seq + 1], the last ones of its context
// (one in a decode step); each row sees keys up to its own position. Split z of the grid
// takes keys z·chunk .. (z+1)·chunk; with one split, `part` is null and the block writes
// `out` itself.
template <typename KR, typename VR>
__device__ __forceinline__ void paged_decode(const float* q, KR kc, VR vc, const int* table,
                                             const int* seq_lens, const int* q_start, float* out, float* part,
                                             u32 t, u32 hq, u32 hkv, u32 d, u32 bs, u32 max_blocks,
                                             u32 n_blocks, float scale, float cap, u32 window, u32 chunk) {
    const u32 seq = blockIdx.x;
    // Rows and length are the caller's data: kept inside the t query rows and the block
    // table's capacity.
    const int r0 = min(max(q_start[seq], 0), (int)t);
    const int rows = min(max(q_start[seq + 1], r0), (int)t) - r0;
    const int len = min(seq_lens[seq], (int)(max_blocks * bs));
    const int kbeg = (int)(blockIdx.z * chunk), kend = kbeg + (int)chunk;
    for (int i = 0; i < rows; i++)
        paged_decode_row(q, kc, vc, table, out, part, seq, (u32)(r0 + i), len - rows + i, hq, hkv, d, bs,
                         max_blocks, n_blocks, scale, cap, window, kbeg, kend);
}

// @hot
extern "C" __global__ void __launch_bounds__(DECODE_WARPS * WARP)
paged_decode_f32(const float* q, const float* kc, const float* vc, const int* table, const int* seq_lens,
                 const int* q_start, float* out, float* part, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                 u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 chunk) {
    paged_decode(q, KvPlain<float>{kc, d}, KvPlain<float>{vc, d}, table, seq_lens, q_start, out, part, t, hq, hkv, d, bs, max_blocks, n_blocks,
                 scale, cap, window, chunk);
}

// @hot
extern "C" __global__ void __launch_bounds__(DECODE_WARPS * WARP)
paged_decode_f16(const float* q, const __half* kc, const __half* vc, const int* table, const int* seq_lens,
                 const int* q_start, float* out, float* part, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                 u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 chunk) {
    paged_decode(q, KvPlain<__half>{kc, d}, KvPlain<__half>{vc, d}, table, seq_lens, q_start, out, part, t, hq, hkv, d, bs, max_blocks, n_blocks,
                 scale, cap, window, chunk);
}

// Any other pair of cache formats (format codes in formats.cuh: bf16, q8_0, q4_0, the
// TurboQuant blocks, and mixed K/V types), decoded value by value.
// @hot
extern "C" __global__ void __launch_bounds__(DECODE_WARPS * WARP)
paged_decode_kv(const float* q, const u8* kc, const u8* vc, const int* table, const int* seq_lens,
                const int* q_start, float* out, float* part, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 chunk, u32 kfmt, u32 vfmt) {
    paged_decode(q, KvCoded{kc, kfmt, kv_row_bytes(kfmt, d)}, KvCoded{vc, vfmt, kv_row_bytes(vfmt, d)}, table,
                 seq_lens, q_start, out, part, t, hq, hkv, d, bs, max_blocks, n_blocks, scale, cap, window, chunk);
}

// Merges the splits of paged_decode: one block per (query row, head) of the `rows` rows,
// threads over the head dim. A row no split saw (no keys) gets zeros, as the CPU gives.
// @hot
extern "C" __global__ void paged_decode_combine(const float* part, float* out, u32 rows, u32 hq, u32 n_split,
                                                u32 d) {
    const u32 rh = blockIdx.x;
    if (rh >= rows * hq) return;
    const float* rec0 = part + (size_t)rh * n_split * (d + 2);
    float mx = -KILN_INF;
    for (u32 z = 0; z < n_split; z++) mx = fmaxf(mx, rec0[(size_t)z * (d + 2)]);
    float denom = 0.0f;
    for (u32 z = 0; z < n_split; z++) {
        const float* rec = rec0 + (size_t)z * (d + 2);
        if (rec[0] != -KILN_INF) denom += rec[1] * __expf(rec[0] - mx);
    }
    for (u32 j = threadIdx.x; j < d; j += blockDim.x) {
        float o = 0.0f;
        for (u32 z = 0; z < n_split; z++) {
            const float* rec = rec0 + (size_t)z * (d + 2);
            if (rec[0] != -KILN_INF) o += rec[2 + j] * __expf(rec[0] - mx);
        }
        out[(size_t)rh * d + j] = denom > 0.0f ? o / denom : 0.0f;
    }
}

// Prefill (and mixed batches) and contiguous attention: one warp per (query row, query head),
// an online softmax over the keys the row's mask lets it see. Masks arrive as two numbers:
// `window` (0: none) bounds the keys from below, `see_to` lets every row see at least the
// first `see_to` keys (0: causal; n: prefix-bidirectional over n positions; ~0u:
// bidirectional). Head dims up to 256 for K and V alike (8 values per lane).

// Key positions [lo, hi) a row at position `pos` sees out of `len` (Mask::key_range).
__device__ __forceinline__ void key_range(int pos, int len, u32 window, u32 see_to, int* lo, int* hi) {
    // The top bit: every row sees the last `window & 0x7fffffff` keys (Mask::Lookback).
    if (window & 0x80000000u) {
        *lo = max(0, len - (int)(window & 0x7fffffffu));
        *hi = len;
        return;
    }
    *lo = window > 0 ? max(0, pos + 1 - (int)window) : 0;
    const long long end = max((long long)pos + 1, (long long)see_to);
    *hi = (int)min(end, (long long)len);
}

// Where key position p's head row lies: through a block table (rows `(blk·bs + p%bs)·hkv +
// kvh`, skipped where the entry is outside the cache) or contiguously (`p·hkv + kvh`).
struct PagedRows {
    const int* table;
    u32 bs, hkv, kvh, n_blocks;
    __device__ __forceinline__ long long operator()(int p) const {
        const int blk = table[p / (int)bs];
        if (blk < 0 || (u32)blk >= n_blocks) return -1;
        return ((long long)blk * bs + p % (int)bs) * hkv + kvh;
    }
};

struct ContiguousRows {
    u32 hkv, kvh;
    __device__ __forceinline__ long long operator()(int p) const { return (long long)p * hkv + kvh; }
};

// One warp: the query row `qrow` [d] against keys lo..hi, writing `orow` [dv] (zeros when no
// key is seen, as the CPU gives).
template <typename KR, typename VR, typename Rows>
__device__ __forceinline__ void attend_warp(const float* qrow, KR kc, VR vc, Rows rows, int lo, int hi,
                                            u32 d, u32 dv, float scale, float cap, float* orow) {
    const u32 lane = threadIdx.x % WARP;
    float qv[8], acc[8];
#pragma unroll
    for (u32 i = 0; i < 8; i++) {
        const u32 j = lane + i * WARP;
        qv[i] = j < d ? qrow[j] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -KILN_INF, l = 0.0f;
    for (int p = lo; p < hi; p++) {
        const long long row = rows(p);
        if (row < 0) continue;
        float sc = 0.0f;
#pragma unroll
        for (u32 i = 0; i < 8; i++) {
            const u32 j = lane + i * WARP;
            if (j < d) sc += qv[i] * kc.at(row, j);
        }
        sc = warp_sum(sc) * scale;
        if (cap > 0.0f) sc = cap * tanhf(sc / cap);
        const float mn = fmaxf(m, sc);
        const float corr = __expf(m - mn), e = __expf(sc - mn);
        l = l * corr + e;
#pragma unroll
        for (u32 i = 0; i < 8; i++) {
            const u32 j = lane + i * WARP;
            acc[i] = acc[i] * corr + (j < dv ? e * vc.at(row, j) : 0.0f);
        }
        m = mn;
    }
#pragma unroll
    for (u32 i = 0; i < 8; i++) {
        const u32 j = lane + i * WARP;
        if (j < dv) orow[j] = l > 0.0f ? acc[i] / l : 0.0f;
    }
}

// A sequence's query rows are q_start[seq] .. q_start[seq + 1], the last ones of its context.
template <typename KR, typename VR>
__device__ __forceinline__ void paged_prefill(const float* q, KR kc, VR vc, const int* table,
                                              const int* seq_lens, const int* q_start, float* out, u32 n_seqs,
                                              u32 t, u32 hq, u32 hkv, u32 d, u32 bs, u32 max_blocks,
                                              u32 n_blocks, float scale, float cap, u32 window, u32 see_to,
                                              const int* key_end) {
    const u32 gw = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    if (gw >= t * hq) return;
    const u32 r = gw / hq, h = gw % hq, kvh = h / (hq / hkv);
    u32 s = 0;
    while (s + 1 < n_seqs && (u32)q_start[s + 1] <= r) s++;
    const int len = min(seq_lens[s], (int)(max_blocks * bs));
    const int q_len = q_start[s + 1] - q_start[s];
    const int pos = len - q_len + ((int)r - q_start[s]);
    int lo, hi;
    key_range(pos, len, window, see_to, &lo, &hi);
    // The row's key reach (an image's soft tokens see the whole image): at least the keys
    // before key_end[r], within the sequence.
    if (key_end != nullptr) hi = max(hi, min(max(key_end[r], 0), len));
    const PagedRows rows{table + (size_t)s * max_blocks, bs, hkv, kvh, n_blocks};
    attend_warp(q + ((size_t)r * hq + h) * d, kc, vc, rows, lo, hi, d, d, scale, cap,
                out + ((size_t)r * hq + h) * d);
}

extern "C" __global__ void paged_prefill_f32(const float* q, const float* kc, const float* vc,
                                             const int* table, const int* seq_lens, const int* q_start,
                                             float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d,
                                             u32 bs, u32 max_blocks, u32 n_blocks, float scale, float cap,
                                             u32 window, u32 see_to, const int* key_end) {
    paged_prefill(q, KvPlain<float>{kc, d}, KvPlain<float>{vc, d}, table, seq_lens, q_start, out, n_seqs, t, hq, hkv, d, bs, max_blocks, n_blocks,
                  scale, cap, window, see_to, key_end);
}

extern "C" __global__ void paged_prefill_f16(const float* q, const __half* kc, const __half* vc,
                                             const int* table, const int* seq_lens, const int* q_start,
                                             float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d,
                                             u32 bs, u32 max_blocks, u32 n_blocks, float scale, float cap,
                                             u32 window, u32 see_to, const int* key_end) {
    paged_prefill(q, KvPlain<__half>{kc, d}, KvPlain<__half>{vc, d}, table, seq_lens, q_start, out, n_seqs, t, hq, hkv, d, bs, max_blocks, n_blocks,
                  scale, cap, window, see_to, key_end);
}

extern "C" __global__ void paged_prefill_kv(const float* q, const u8* kc, const u8* vc, const int* table,
                                            const int* seq_lens, const int* q_start, float* out, u32 n_seqs, u32 t,
                                            u32 hq, u32 hkv, u32 d, u32 bs, u32 max_blocks, u32 n_blocks,
                                            float scale, float cap, u32 window, u32 see_to, u32 kfmt, u32 vfmt,
                                            const int* key_end) {
    paged_prefill(q, KvCoded{kc, kfmt, kv_row_bytes(kfmt, d)}, KvCoded{vc, vfmt, kv_row_bytes(vfmt, d)}, table,
                  seq_lens, q_start, out, n_seqs, t, hq, hkv, d, bs, max_blocks, n_blocks, scale, cap, window,
                  see_to, key_end);
}

// Attention over contiguous K/V: q [T, Hq, D], k [S, Hkv, D], v [S, Hkv, Dv] → [T, Hq, Dv];
// query row i is at position S - T + i.
extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* out, u32 t,
                                         u32 s, u32 hq, u32 hkv, u32 d, u32 dv, float scale, float cap,
                                         u32 window, u32 see_to) {
    const u32 gw = (blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    if (gw >= t * hq) return;
    const u32 r = gw / hq, h = gw % hq;
    const int pos = (int)s - (int)t + (int)r;
    int lo, hi;
    key_range(pos, (int)s, window, see_to, &lo, &hi);
    const ContiguousRows rows{hkv, h / (hq / hkv)};
    attend_warp(q + ((size_t)r * hq + h) * d, KvPlain<float>{k, d}, KvPlain<float>{v, dv}, rows, lo, hi, d, dv,
                scale, cap,
                out + ((size_t)r * hq + h) * dv);
}

// Tiled prefill: a block of PREFILL_WARPS warps takes `qr` consecutive query rows and every
// query head of one KV head's group (qr · group ≤ PREFILL_PAIRS (row, head) pairs, up to
// PAIRS_PER_WARP per warp, each with its query, running max, sum and weighted V in
// registers). When the rows share a sequence, K/V rows are staged in shared memory PREFILL_KT
// keys at a time (as f32) and each staged key serves every pair of the block, so a key row
// is read from the cache once per block instead of once per (row, head). A block whose rows
// span two sequences (the boundary of a mixed batch) runs each pair with attend_warp.

#define PREFILL_WARPS 4
#define PAIRS_PER_WARP 4
#define PREFILL_PAIRS (PREFILL_WARPS * PAIRS_PER_WARP)
#define PREFILL_KT 16

// Rows of a batch through a block table: a row's sequence, position and context length.
struct PagedBatch {
    const int *table, *seq_lens, *q_start;
    u32 n_seqs, max_blocks, bs, hkv, n_blocks;
    __device__ __forceinline__ void row(u32 r, u32* s, int* pos, int* len) const {
        u32 q = 0;
        while (q + 1 < n_seqs && (u32)q_start[q + 1] <= r) q++;
        *s = q;
        *len = min(seq_lens[q], (int)(max_blocks * bs));
        *pos = *len - (q_start[q + 1] - q_start[q]) + ((int)r - q_start[q]);
    }
    __device__ __forceinline__ PagedRows keys(u32 s, u32 kvh) const {
        return PagedRows{table + (size_t)s * max_blocks, bs, hkv, kvh, n_blocks};
    }
};

// Contiguous K/V [S, Hkv, D]: one sequence, query row i at position S - T + i.
struct ContiguousBatch {
    u32 t, s_len, hkv;
    __device__ __forceinline__ void row(u32 r, u32* s, int* pos, int* len) const {
        *s = 0;
        *len = (int)s_len;
        *pos = (int)s_len - (int)t + (int)r;
    }
    __device__ __forceinline__ ContiguousRows keys(u32, u32 kvh) const { return ContiguousRows{hkv, kvh}; }
};

// A block's (row, head) pairs one warp each (attend_warp), warp w taking pairs w, w + warps,
// ...: for a block whose rows span two sequences. Pair p is row r0 + p / group, head
// kvh · group + p % group, of the `pairs` the block has.
template <typename KR, typename VR, typename Batch>
__device__ __forceinline__ void attend_pairs_apart(const float* q, KR kc, VR vc, Batch batch, float* out, u32 t,
                                                   u32 hq, u32 d, u32 dv, float scale, float cap, u32 window,
                                                   u32 see_to, u32 r0, u32 pairs, u32 warps) {
    const u32 group = hq / batch.hkv, kvh = blockIdx.y;
    for (u32 p = threadIdx.x / WARP; p < pairs; p += warps) {
        const u32 r = r0 + p / group, h = kvh * group + p % group;
        if (r >= t) break;
        u32 s;
        int pos, l, lo, hi;
        batch.row(r, &s, &pos, &l);
        key_range(pos, l, window, see_to, &lo, &hi);
        attend_warp(q + ((size_t)r * hq + h) * d, kc, vc, batch.keys(s, kvh), lo, hi, d, dv, scale, cap,
                    out + ((size_t)r * hq + h) * dv);
    }
}

template <typename KR, typename VR, typename Batch>
__device__ __forceinline__ void attend_tiled(const float* q, KR kc, VR vc, Batch batch, float* out,
                                             u32 t, u32 hq, u32 hkv, u32 d, u32 dv, float scale, float cap,
                                             u32 window, u32 see_to, u32 qr) {
    __shared__ float ks[PREFILL_KT * MAX_D], vs[PREFILL_KT * MAX_D];
    __shared__ int skip[PREFILL_KT];
    const u32 warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const u32 group = hq / hkv, kvh = blockIdx.y;
    const u32 r0 = blockIdx.x * qr;
    // Every thread works out the same: whether the block's rows share one sequence.
    u32 s_first, s_last;
    int pos_first, pos_last, len, len_last;
    const u32 r_last = min(r0 + qr, t) - 1;
    batch.row(r0, &s_first, &pos_first, &len);
    batch.row(r_last, &s_last, &pos_last, &len_last);
    if (s_first != s_last) {
        attend_pairs_apart(q, kc, vc, batch, out, t, hq, d, dv, scale, cap, window, see_to, r0, qr * group,
                           PREFILL_WARPS);
        return;
    }
    const auto rows = batch.keys(s_first, kvh);
    int lo_all, hi_all, unused;
    key_range(pos_first, len, window, see_to, &lo_all, &unused);
    key_range(pos_last, len, window, see_to, &unused, &hi_all);
    // This warp's pairs: query, key range and online-softmax state.
    float qv[PAIRS_PER_WARP][8], acc[PAIRS_PER_WARP][8], m[PAIRS_PER_WARP], l[PAIRS_PER_WARP];
    int lo[PAIRS_PER_WARP], hi[PAIRS_PER_WARP];
#pragma unroll
    for (u32 i = 0; i < PAIRS_PER_WARP; i++) {
        const u32 p = warp + PREFILL_WARPS * i, r = r0 + p / group, h = kvh * group + p % group;
        const bool ok = p < qr * group && r < t;
        lo[i] = 0;
        hi[i] = 0;  // an unused pair sees no keys
        if (ok) key_range(pos_first + (int)(r - r0), len, window, see_to, &lo[i], &hi[i]);
        m[i] = -KILN_INF;
        l[i] = 0.0f;
#pragma unroll
        for (u32 c = 0; c < 8; c++) {
            const u32 j = lane + c * WARP;
            qv[i][c] = ok && j < d ? q[((size_t)r * hq + h) * d + j] : 0.0f;
            acc[i][c] = 0.0f;
        }
    }
    for (int k0 = lo_all; k0 < hi_all; k0 += PREFILL_KT) {
        // Stage keys k0 .. k0 + KT (those in range and in the cache).
        if (threadIdx.x < PREFILL_KT) {
            const int p = k0 + (int)threadIdx.x;
            skip[threadIdx.x] = p >= hi_all || rows(p) < 0;
        }
        for (u32 e = threadIdx.x; e < PREFILL_KT * max(d, dv); e += blockDim.x) {
            const u32 j = e / max(d, dv), c = e % max(d, dv);
            const int p = k0 + (int)j;
            const long long row = p < hi_all ? rows(p) : -1;
            if (c < d) ks[j * d + c] = row >= 0 ? kc.at(row, c) : 0.0f;
            if (c < dv) vs[j * dv + c] = row >= 0 ? vc.at(row, c) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (u32 i = 0; i < PAIRS_PER_WARP; i++) {
            for (u32 j = 0; j < PREFILL_KT; j++) {
                const int p = k0 + (int)j;
                if (p < lo[i] || p >= hi[i] || skip[j]) continue;  // uniform over the warp
                float sc = 0.0f;
#pragma unroll
                for (u32 c = 0; c < 8; c++) {
                    const u32 x = lane + c * WARP;
                    if (x < d) sc += qv[i][c] * ks[j * d + x];
                }
                sc = warp_sum(sc) * scale;
                if (cap > 0.0f) sc = cap * tanhf(sc / cap);
                const float mn = fmaxf(m[i], sc);
                const float corr = __expf(m[i] - mn), e = __expf(sc - mn);
                l[i] = l[i] * corr + e;
#pragma unroll
                for (u32 c = 0; c < 8; c++) {
                    const u32 x = lane + c * WARP;
                    acc[i][c] = acc[i][c] * corr + (x < dv ? e * vs[j * dv + x] : 0.0f);
                }
                m[i] = mn;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (u32 i = 0; i < PAIRS_PER_WARP; i++) {
        const u32 p = warp + PREFILL_WARPS * i, r = r0 + p / group, h = kvh * group + p % group;
        if (p >= qr * group || r >= t) continue;
#pragma unroll
        for (u32 c = 0; c < 8; c++) {
            const u32 x = lane + c * WARP;
            if (x < dv) out[((size_t)r * hq + h) * dv + x] = l[i] > 0.0f ? acc[i][c] / l[i] : 0.0f;
        }
    }
}

// @hot
extern "C" __global__ void __launch_bounds__(PREFILL_WARPS * WARP)
paged_prefill_tiled_f32(const float* q, const float* kc, const float* vc, const int* table, const int* seq_lens,
                        const int* q_start, float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                        u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 see_to, u32 qr) {
    const PagedBatch b{table, seq_lens, q_start, n_seqs, max_blocks, bs, hkv, n_blocks};
    attend_tiled(q, KvPlain<float>{kc, d}, KvPlain<float>{vc, d}, b, out, t, hq, hkv, d, d, scale, cap, window, see_to, qr);
}

// @hot
extern "C" __global__ void __launch_bounds__(PREFILL_WARPS * WARP)
paged_prefill_tiled_f16(const float* q, const __half* kc, const __half* vc, const int* table, const int* seq_lens,
                        const int* q_start, float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                        u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 see_to, u32 qr) {
    const PagedBatch b{table, seq_lens, q_start, n_seqs, max_blocks, bs, hkv, n_blocks};
    attend_tiled(q, KvPlain<__half>{kc, d}, KvPlain<__half>{vc, d}, b, out, t, hq, hkv, d, d, scale, cap, window, see_to, qr);
}

// @hot
extern "C" __global__ void __launch_bounds__(PREFILL_WARPS * WARP)
attention_tiled_f32(const float* q, const float* k, const float* v, float* out, u32 t, u32 s, u32 hq, u32 hkv,
                    u32 d, u32 dv, float scale, float cap, u32 window, u32 see_to, u32 qr) {
    attend_tiled(q, KvPlain<float>{k, d}, KvPlain<float>{v, dv}, ContiguousBatch{t, s, hkv}, out, t, hq, hkv, d, dv, scale, cap, window, see_to, qr);
}

// @hot
extern "C" __global__ void __launch_bounds__(PREFILL_WARPS * WARP)
paged_prefill_tiled_kv(const float* q, const u8* kc, const u8* vc, const int* table, const int* seq_lens,
                       const int* q_start, float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                       u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 see_to, u32 qr,
                       u32 kfmt, u32 vfmt) {
    const PagedBatch b{table, seq_lens, q_start, n_seqs, max_blocks, bs, hkv, n_blocks};
    attend_tiled(q, KvCoded{kc, kfmt, kv_row_bytes(kfmt, d)}, KvCoded{vc, vfmt, kv_row_bytes(vfmt, d)}, b, out, t,
                 hq, hkv, d, d, scale, cap, window, see_to, qr);
}

// Prefill on the tensor cores (planned with the FA_TC=1 knob): f16 caches, head dims of
// 16·n up to 64 (the `_64` kernel) or 128 (`_128`). Flash attention over
// mma.sync.m16n8k16 with f16 operands and f32 sums: a block of FA_WARPS warps takes the
// (row, head) pairs of `qr` consecutive query rows and every query head of one KV head's group
// (16 pairs a warp, the A rows of its mmas), and walks the keys FA_KEYS at a time, staged in
// shared memory as the cache holds them (f16, by cp.async). As exact as the f32 kernels:
// - a query row is scaled by a power of two that brings its largest element to [128, 256),
//   then split into two f16 (split_f16: to 2^-22 of each element), each multiplied by the
//   exact f16 keys; the score is the sum times 2^-shift · scale, one rounding as in the f32
//   kernels;
// - the weights p = e^(s - max) in [0, 1] are split the same way (to 2^-22 of p or 2^-25) and
//   multiplied by the exact f16 values.
// The online softmax (running max, correction, sum) runs in f32 on the score fragments, as in
// the FMA kernels; a block whose rows span two sequences runs each pair with attend_warp.

#define FA_WARPS 4
#define FA_PAIRS (FA_WARPS * 16)
#define FA_KEYS 64

// Two f16 of a row-major staged tile (row stride `w` words) as one mma word: rows k and k + 1
// of column c, row k's in the low half (the B fragment of P·V, whose k runs over keys).
__device__ __forceinline__ u32 fa_pair(const u32* tile, u32 w, u32 k, u32 c) {
    const unsigned short* h = (const unsigned short*)tile;
    return (u32)h[k * 2 * w + c] | ((u32)h[(k + 1) * 2 * w + c] << 16);
}

template <u32 D, typename Batch>
__device__ __forceinline__ void attend_tc(const float* q, const __half* kc, const __half* vc, Batch batch,
                                          float* out, u32 t, u32 hq, u32 hkv, u32 d, float scale, float cap,
                                          u32 window, u32 see_to, u32 qr) {
    constexpr u32 KS = D / 16, NT = FA_KEYS / 8, VT = D / 8;
    constexpr u32 W = D / 2 + 4;  // words a staged row: 4 of padding keep fragment loads conflict-free
    __shared__ uint4 ks_[FA_KEYS * W / 4], vs_[FA_KEYS * W / 4];
    __shared__ long long krow[FA_KEYS];
    u32* ks = (u32*)ks_;
    u32* vs = (u32*)vs_;
    const u32 warp = threadIdx.x / WARP, lane = threadIdx.x % WARP, g = lane / 4, tq = lane % 4;
    const u32 group = hq / hkv, kvh = blockIdx.y, r0 = blockIdx.x * qr;
    u32 s_first, s_last;
    int pos_first, pos_last, len, len_last;
    const u32 r_last = min(r0 + qr, t) - 1;
    batch.row(r0, &s_first, &pos_first, &len);
    batch.row(r_last, &s_last, &pos_last, &len_last);
    // Caches not 16-byte aligned (views: never the KV pool itself) take the same path.
    if (s_first != s_last || (((size_t)kc | (size_t)vc) & 15u) != 0) {
        attend_pairs_apart(q, KvPlain<__half>{kc, d}, KvPlain<__half>{vc, d}, batch, out, t, hq, d, d, scale, cap,
                           window, see_to, r0, qr * group, FA_WARPS);
        return;
    }
    const auto rows = batch.keys(s_first, kvh);
    int lo_all, hi_all, unused;
    key_range(pos_first, len, window, see_to, &lo_all, &unused);
    key_range(pos_last, len, window, see_to, &unused, &hi_all);
    // This lane's two pairs (A rows g and g + 8 of the warp's 16): key range, the query's
    // power-of-two scale folded into the score's, and the query's two f16 parts in fragment
    // order (word i of k-step k: a[i] of PTX's layout).
    int lo[2], hi[2];
    float unq[2];
    const bool q2 = ((size_t)q & 7u) == 0, o2 = ((size_t)out & 7u) == 0;  // float2 loads and stores
    u32 qa[KS][2][4];
#pragma unroll
    for (u32 i = 0; i < 2; i++) {
        const u32 m = warp * 16 + g + 8 * i, r = r0 + m / group, h = kvh * group + m % group;
        const bool ok = m < qr * group && r < t;
        lo[i] = 0;
        hi[i] = 0;  // an unused pair sees no keys
        if (ok) key_range(pos_first + (int)(r - r0), len, window, see_to, &lo[i], &hi[i]);
        const float* qrow = q + ((size_t)r * hq + h) * d;
        float2 qv[KS][2];
        float mx = 0.0f;
#pragma unroll
        for (u32 k = 0; k < KS; k++) {
#pragma unroll
            for (u32 hf = 0; hf < 2; hf++) {
                const u32 c = 16 * k + 8 * hf + 2 * tq;
                qv[k][hf] = make_float2(0.0f, 0.0f);
                if (ok && c < d) qv[k][hf] = q2 ? *(const float2*)(qrow + c) : make_float2(qrow[c], qrow[c + 1]);
                mx = fmaxf(mx, fmaxf(fabsf(qv[k][hf].x), fabsf(qv[k][hf].y)));
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        int ex = 8;
        if (mx > 0.0f && mx <= 3.0e38f) frexpf(mx, &ex);
        unq[i] = ldexpf(scale, ex - 8);
#pragma unroll
        for (u32 k = 0; k < KS; k++) {
#pragma unroll
            for (u32 hf = 0; hf < 2; hf++) {
                u32 h0, l0, h1, l1;
                split_f16(ldexpf(qv[k][hf].x, 8 - ex), h0, l0);
                split_f16(ldexpf(qv[k][hf].y, 8 - ex), h1, l1);
                qa[k][0][i + 2 * hf] = h0 | (h1 << 16);
                qa[k][1][i + 2 * hf] = l0 | (l1 << 16);
            }
        }
    }
    float o[VT][4], m_run[2] = {-KILN_INF, -KILN_INF}, l_run[2] = {0.0f, 0.0f};
#pragma unroll
    for (u32 n = 0; n < VT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int k0 = lo_all; k0 < hi_all; k0 += FA_KEYS) {
        if (threadIdx.x < FA_KEYS) {
            const int p = k0 + (int)threadIdx.x;
            krow[threadIdx.x] = p < hi_all ? rows(p) : -1;
        }
        __syncthreads();
        // Stage keys and values k0 .. k0 + FA_KEYS: 16 bytes a copy, a row's in a row of threads.
        for (u32 e = threadIdx.x; e < FA_KEYS * (D / 8); e += blockDim.x) {
            const u32 j = e / (D / 8), c = e % (D / 8) * 8;
            const long long row = krow[j];
            u32* kd = ks + j * W + c / 2;
            u32* vd = vs + j * W + c / 2;
            if (row >= 0 && c < d) {
                cp_async<16>(kd, kc + (size_t)row * d + c);
                cp_async<16>(vd, vc + (size_t)row * d + c);
            } else {
                *(uint4*)kd = make_uint4(0u, 0u, 0u, 0u);
                *(uint4*)vd = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        // Scores of the warp's 16 pairs against the tile's keys.
        float sc[NT][4];
#pragma unroll
        for (u32 n = 0; n < NT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
        for (u32 k = 0; k < KS; k++) {
            if (16 * k >= d) break;
#pragma unroll
            for (u32 n = 0; n < NT; n++) {
                const u32* kr = ks + (n * 8 + g) * W + 8 * k + tq;
                const u32 b[2] = {kr[0], kr[4]};
                mma_f16_16816(sc[n], qa[k][0], b);
                mma_f16_16816(sc[n], qa[k][1], b);
            }
        }
        // Scale, cap and mask; the rows' new maxima (over the quad that holds a row).
        float mx[2] = {m_run[0], m_run[1]};
#pragma unroll
        for (u32 n = 0; n < NT; n++) {
#pragma unroll
            for (u32 e = 0; e < 4; e++) {
                const u32 i = e / 2, j = n * 8 + 2 * tq + (e & 1);
                const int p = k0 + (int)j;
                float s = sc[n][e] * unq[i];
                if (cap > 0.0f) s = cap * tanhf(s / cap);
                if (p < lo[i] || p >= hi[i] || krow[j] < 0) s = -KILN_INF;
                sc[n][e] = s;
                mx[i] = fmaxf(mx[i], s);
            }
        }
        float corr[2];
#pragma unroll
        for (u32 i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            corr[i] = mx[i] == -KILN_INF ? 1.0f : __expf(m_run[i] - mx[i]);
            m_run[i] = mx[i];
            l_run[i] *= corr[i];
        }
#pragma unroll
        for (u32 n = 0; n < VT; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        // The weights, split in two f16 and laid out as A fragments (a k-step of 16 keys is
        // score tiles 2k and 2k + 1), times the values.
#pragma unroll
        for (u32 k = 0; k < FA_KEYS / 16; k++) {
            u32 pa[2][4];
#pragma unroll
            for (u32 w = 0; w < 4; w++) {
                const u32 n = 2 * k + w / 2, i = w & 1;
                u32 h0, l0, h1, l1;
                const float e0 = mx[i] == -KILN_INF ? 0.0f : __expf(sc[n][2 * i] - mx[i]);
                const float e1 = mx[i] == -KILN_INF ? 0.0f : __expf(sc[n][2 * i + 1] - mx[i]);
                l_run[i] += e0 + e1;
                split_f16(e0, h0, l0);
                split_f16(e1, h1, l1);
                pa[0][w] = h0 | (h1 << 16);
                pa[1][w] = l0 | (l1 << 16);
            }
#pragma unroll
            for (u32 n = 0; n < VT; n++) {
                if (8 * n >= d) break;
                const u32 b[2] = {fa_pair(vs, W, 16 * k + 2 * tq, 8 * n + g),
                                  fa_pair(vs, W, 16 * k + 2 * tq + 8, 8 * n + g)};
                mma_f16_16816(o[n], pa[0], b);
                mma_f16_16816(o[n], pa[1], b);
            }
        }
        __syncthreads();  // the tile is read before the next one is staged
    }
#pragma unroll
    for (u32 i = 0; i < 2; i++) {
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 1);
        l_run[i] += __shfl_xor_sync(0xffffffffu, l_run[i], 2);
        const u32 m = warp * 16 + g + 8 * i, r = r0 + m / group, h = kvh * group + m % group;
        if (m >= qr * group || r >= t) continue;
        float* orow = out + ((size_t)r * hq + h) * d;
#pragma unroll
        for (u32 n = 0; n < VT; n++) {
            const u32 c = 8 * n + 2 * tq;
            if (c >= d) break;
            const float inv = l_run[i] > 0.0f ? 1.0f / l_run[i] : 0.0f;
            if (o2) {
                *(float2*)(orow + c) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
            } else {
                orow[c] = o[n][2 * i] * inv;
                orow[c + 1] = o[n][2 * i + 1] * inv;
            }
        }
    }
}

// @hot
extern "C" __global__ void __launch_bounds__(FA_WARPS * WARP)
paged_prefill_tc_f16_64(const float* q, const __half* kc, const __half* vc, const int* table, const int* seq_lens,
                        const int* q_start, float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                        u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 see_to, u32 qr) {
    const PagedBatch b{table, seq_lens, q_start, n_seqs, max_blocks, bs, hkv, n_blocks};
    attend_tc<64>(q, kc, vc, b, out, t, hq, hkv, d, scale, cap, window, see_to, qr);
}

// @hot
extern "C" __global__ void __launch_bounds__(FA_WARPS * WARP)
paged_prefill_tc_f16_128(const float* q, const __half* kc, const __half* vc, const int* table, const int* seq_lens,
                         const int* q_start, float* out, u32 n_seqs, u32 t, u32 hq, u32 hkv, u32 d, u32 bs,
                         u32 max_blocks, u32 n_blocks, float scale, float cap, u32 window, u32 see_to, u32 qr) {
    const PagedBatch b{table, seq_lens, q_start, n_seqs, max_blocks, bs, hkv, n_blocks};
    attend_tc<128>(q, kc, vc, b, out, t, hq, hkv, d, scale, cap, window, see_to, qr);
}
