// Paged attention: queries attend to K/V read through the block table by index, in place.
// With `paged = 0` the same kernel serves the contiguous Attention op (one sequence).
// Template: KFMT and VFMT are the K and V cache format codes (common/turbo.wgsl: f32, f16,
// bf16, q8_0, q4_0, tq4, tq3, tq2); ENTRY names the entry point. Cache offsets are in bytes;
// a row (one token slot of one KV head) starts at a 4-byte (f32) or 2-byte boundary, which
// every format's row size keeps. Block formats are decoded element by element with the CPU's
// arithmetic (scale as f32 times the code's value), so each K and V value is the CPU's bit
// for bit.
//
// paged_attention_*: one workgroup of 64 threads per (query row, pack of up to 4 query heads
// that read the same KV head, split of the key range). Keys are scored 64 at a time (one per thread), folded into a running max and
// sum (online softmax), and each thread accumulates up to 4 output dims. Each split writes
// (max, sum, acc[Dv]) to a scratch buffer; paged_attention_combine merges the splits. Decode
// (one query per sequence) uses many splits so long contexts spread over the device; prefill
// uses one.

struct Params {
    t: u32,          // query rows
    hq: u32,
    hkv: u32,
    d: u32,
    dv: u32,
    bs: u32,         // block size (token slots per block)
    max_blocks: u32, // block table width
    n_seqs: u32,
    q_off: u32,
    k_off: u32,      // caches: offsets in bytes
    v_off: u32,
    table_off: u32,
    lens_off: u32,
    qs_off: u32,
    splits: u32,
    split_len: u32,
    scale: f32,
    soft_cap: f32,   // 0: none
    mask: u32,       // 0 causal, 1 sliding window, 2 bidirectional, 3 prefix-bidirectional
    mask_n: u32,     // window or prefix length
    paged: u32,      // 0: contiguous K/V [S, Hkv, D] of one sequence (the Attention op)
    s_len: u32,      // contiguous: S
    nx: u32,
    pack: u32,       // query heads per workgroup (1..4; divides the heads per KV head)
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> kc: array<u32>;
@group(0) @binding(2) var<storage, read> vc: array<u32>;
@group(0) @binding(3) var<storage, read> table: array<i32>;
@group(0) @binding(4) var<storage, read> seq_lens: array<i32>;
@group(0) @binding(5) var<storage, read> q_start: array<i32>;
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
@group(0) @binding(7) var<storage, read> p: Params;

const KF: u32 = KFMT;
const VF: u32 = VFMT;
const NEG_BIG: f32 = -3.0e38;

// Raw reads at a byte address of the K (`v` false) or V (`v` true) cache.
fn c_u32(v: bool, b: u32) -> u32 {
    if (v) {
        return vc[b >> 2u];
    }
    return kc[b >> 2u];
}
fn c_u8(v: bool, b: u32) -> u32 {
    return (c_u32(v, b) >> ((b & 3u) * 8u)) & 0xffu;
}
fn c_u16(v: bool, b: u32) -> u32 {
    // Even addresses only.
    return (c_u32(v, b) >> ((b & 2u) * 8u)) & 0xffffu;
}
fn c_f16(v: bool, b: u32) -> f32 {
    return unpack2x16float(c_u16(v, b)).x;
}

// The 4 bytes at byte address b (any alignment) of a cache, little-endian.
fn c_word(v: bool, b: u32) -> u32 {
    let w0 = c_u32(v, b);
    let sh = (b & 3u) * 8u;
    if (sh == 0u) {
        return w0;
    }
    return (w0 >> sh) | (c_u32(v, b + 4u) << (32u - sh));
}

// Element i of the row at byte `base` of a cache in format f.
fn c_elem(v: bool, f: u32, base: u32, i: u32) -> f32 {
    switch f {
        case 0u: {
            return bitcast<f32>(c_u32(v, base + 4u * i));
        }
        case 1u: {
            return c_f16(v, base + 2u * i);
        }
        case 2u: {
            return bitcast<f32>(c_u16(v, base + 2u * i) << 16u);
        }
        case 3u: {
            let blk = base + (i / 32u) * 34u;
            let q = i32(c_u8(v, blk + 2u + i % 32u) << 24u) >> 24u;
            return f32(q) * c_f16(v, blk);
        }
        case 4u: {
            let blk = base + (i / 32u) * 18u;
            let j = i % 32u;
            let byte = c_u8(v, blk + 2u + j % 16u);
            let q = select(byte & 15u, byte >> 4u, j >= 16u);
            return f32(i32(q) - 8) * c_f16(v, blk);
        }
        default: {
            let bits = tq_bits(f);
            let blk = base + (i / 32u) * (2u + 4u * bits);
            let bit = (i % 32u) * bits;
            let at = blk + 2u + bit / 8u;
            let two = c_u8(v, at) | (c_u8(v, at + 1u) << 8u);
            let code = (two >> (bit % 8u)) & ((1u << bits) - 1u);
            return c_f16(v, blk) * tq_point(bits, code);
        }
    }
}

// Elements e..e+7 of the row at byte `base` (e a multiple of 8, e + 8 at most the row's
// length): the same values as c_elem, with the block's scale read once and the codes read a
// word at a time (the 8 codes of a TurboQuant group are `bits` whole bytes).
fn c_elems8(v: bool, f: u32, base: u32, e: u32) -> array<f32, 8> {
    var r: array<f32, 8>;
    switch f {
        case 0u: {
            for (var k = 0u; k < 8u; k++) {
                r[k] = bitcast<f32>(c_u32(v, base + 4u * (e + k)));
            }
        }
        case 1u, 2u: {
            for (var k = 0u; k < 4u; k++) {
                let w = c_word(v, base + 2u * (e + 2u * k));
                if (f == 1u) {
                    let h = unpack2x16float(w);
                    r[2u * k] = h.x;
                    r[2u * k + 1u] = h.y;
                } else {
                    r[2u * k] = bitcast<f32>(w << 16u);
                    r[2u * k + 1u] = bitcast<f32>(w & 0xffff0000u);
                }
            }
        }
        case 3u: {
            let blk = base + (e / 32u) * 34u;
            let d = c_f16(v, blk);
            let at = blk + 2u + e % 32u;
            let w = array<u32, 2>(c_word(v, at), c_word(v, at + 4u));
            for (var k = 0u; k < 8u; k++) {
                let q = i32(w[k / 4u] << (24u - 8u * (k % 4u))) >> 24u;
                r[k] = f32(q) * d;
            }
        }
        case 4u: {
            let blk = base + (e / 32u) * 18u;
            let d = c_f16(v, blk);
            let j = e % 32u;
            // Values j < 16 are the low nibbles of bytes j, values j >= 16 the high nibbles of
            // bytes j - 16.
            let at = blk + 2u + j % 16u;
            let sh = select(0u, 4u, j >= 16u);
            let w = array<u32, 2>(c_word(v, at), c_word(v, at + 4u));
            for (var k = 0u; k < 8u; k++) {
                let q = (w[k / 4u] >> (8u * (k % 4u) + sh)) & 15u;
                r[k] = f32(i32(q) - 8) * d;
            }
        }
        default: {
            let bits = tq_bits(f);
            let blk = base + (e / 32u) * (2u + 4u * bits);
            let d = c_f16(v, blk);
            let w = c_word(v, blk + 2u + (e % 32u) / 8u * bits);
            let mask = (1u << bits) - 1u;
            for (var k = 0u; k < 8u; k++) {
                r[k] = d * tq_point(bits, (w >> (k * bits)) & mask);
            }
        }
    }
    return r;
}

// Cache row (token slot, kv head) of key position j of sequence s.
fn slot_row(s: u32, j: u32, g: u32) -> u32 {
    if (p.paged == 0u) {
        return j * p.hkv + g;
    }
    let blk = u32(table[p.table_off + s * p.max_blocks + j / p.bs]);
    return (blk * p.bs + j % p.bs) * p.hkv + g;
}

// Up to PACK query heads of one KV head share a workgroup: each K and V element is read
// once for all of them.
const PACK: u32 = 4u;
var<workgroup> qv: array<f32, 1024>;  // the pack's query rows, head-major
var<workgroup> sc: array<f32, 256>;   // a tile's scores, then weights: [head][key]
var<workgroup> vrow: array<u32, 64>;  // a tile's V row byte addresses
// The key groups' partial weighted V sums, [key group][dim][head], merged at the end.
var<workgroup> red: array<f32, 2048>;

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let packs = p.hq / p.pack;
    let rp = wid.x + wid.z * p.nx;   // row * packs + pack
    let split = wid.y;
    if (rp >= p.t * packs) {
        return;
    }
    let row = rp / packs;
    let h0 = (rp % packs) * p.pack;  // the pack's first head
    let g = h0 / (p.hq / p.hkv);
    // The query row's sequence and absolute position.
    var s = 0u;
    var len = p.s_len;
    var q_end = p.t;
    if (p.paged != 0u) {
        while (s + 1u < p.n_seqs && u32(q_start[p.qs_off + s + 1u]) <= row) {
            s += 1u;
        }
        len = u32(seq_lens[p.lens_off + s]);
        q_end = u32(q_start[p.qs_off + s + 1u]);
    }
    let pos = len - (q_end - row);
    var lo = 0u;
    var hi = min(pos + 1u, len);
    if (p.mask == 1u) {
        lo = select(0u, pos + 1u - p.mask_n, pos + 1u > p.mask_n);
    } else if (p.mask == 2u) {
        hi = len;
    } else if (p.mask == 3u) {
        hi = min(max(pos + 1u, p.mask_n), len);
    } else if (p.mask == 4u) {
        lo = select(0u, len - p.mask_n, len > p.mask_n);
        hi = len;
    }
    let a = lo + split * p.split_len;
    let b = min(hi, a + p.split_len);

    // The pack's query rows; the heads past the pack read zeros.
    let rh0 = row * p.hq + h0;       // the pack's first (row, head)
    for (var i = li; i < PACK * p.d; i += 64u) {
        qv[i] = select(0.0, q[p.q_off + rh0 * p.d + i], i < p.pack * p.d);
    }
    workgroupBarrier();

    // Scores: each thread takes one key of a 64-key tile over all of D. Weighted V: each
    // thread sums 8 consecutive dims (dim group `dg`) over the tile's keys of its key group
    // `kg` (every kgs-th key); the key groups are merged at the end.
    let dgs = (p.dv + 7u) / 8u;
    let kgs = 64u / dgs;
    let kg = li / dgs;
    let dg = li % dgs;
    let d8 = p.d / 8u * 8u;
    var m = vec4<f32>(NEG_BIG);
    var l = vec4<f32>(0.0);          // this thread's keys' share of the weights' sum
    var acc: array<vec4<f32>, 8>;    // acc[k][hh]: dim 8 dg + k of head h0 + hh
    var j0 = a;
    // Every thread runs the same number of tiles, so the barriers stay uniform.
    let tiles = select(0u, (b - a + 63u) / 64u, b > a);
    for (var tile = 0u; tile < tiles; tile++) {
        let j = j0 + li;
        var score = vec4<f32>(NEG_BIG);
        if (j < b) {
            let kb = p.k_off + slot_row(s, j, g) * kvf_row_bytes(KF, p.d);
            var dot = vec4<f32>(0.0);
            for (var i = 0u; i < d8; i += 8u) {
                let kv = c_elems8(false, KF, kb, i);
                for (var k = 0u; k < 8u; k++) {
                    let x = i + k;
                    dot += vec4<f32>(qv[x], qv[p.d + x], qv[2u * p.d + x], qv[3u * p.d + x]) * kv[k];
                }
            }
            for (var x = d8; x < p.d; x++) {
                dot += vec4<f32>(qv[x], qv[p.d + x], qv[2u * p.d + x], qv[3u * p.d + x]) * c_elem(false, KF, kb, x);
            }
            score = dot * p.scale;
            if (p.soft_cap != 0.0) {
                score = p.soft_cap * tanh(clamp(score / p.soft_cap, vec4<f32>(-15.0), vec4<f32>(15.0)));
            }
            // This key's V row, looked up once for the whole workgroup.
            vrow[li] = p.v_off + slot_row(s, j, g) * kvf_row_bytes(VF, p.dv);
        }
        for (var hh = 0u; hh < PACK; hh++) {
            sc[hh * 64u + li] = score[hh];
        }
        workgroupBarrier();
        let n = min(64u, b - j0);
        var tmax = m;
        for (var hh = 0u; hh < PACK; hh++) {
            if (hh < p.pack) {
                for (var x = 0u; x < n; x++) {
                    tmax[hh] = max(tmax[hh], sc[hh * 64u + x]);
                }
            }
        }
        workgroupBarrier();
        // Each thread turns its own key's scores into its weights, once.
        if (li < n) {
            for (var hh = 0u; hh < PACK; hh++) {
                sc[hh * 64u + li] = exp(score[hh] - tmax[hh]);
            }
        }
        workgroupBarrier();
        let corr = exp(m - tmax);
        l *= corr;
        for (var k = 0u; k < 8u; k++) {
            acc[k] *= corr;
        }
        m = tmax;
        if (kg < kgs) {
            let e = 8u * dg;
            for (var x = kg; x < n; x += kgs) {
                let w = vec4<f32>(sc[x], sc[64u + x], sc[128u + x], sc[192u + x]);
                l += w;
                let vb = vrow[x];
                if (e + 8u <= p.dv) {
                    let vv = c_elems8(true, VF, vb, e);
                    for (var k = 0u; k < 8u; k++) {
                        acc[k] += w * vv[k];
                    }
                } else {
                    for (var k = 0u; e + k < p.dv; k++) {
                        acc[k] += w * c_elem(true, VF, vb, e + k);
                    }
                }
            }
        }
        j0 += 64u;
        workgroupBarrier();
    }
    // Merge the key groups: their partial sums through workgroup memory (the weights' sums
    // in sc, now free).
    let width = dgs * 8u;
    if (kg < kgs) {
        for (var k = 0u; k < 8u; k++) {
            let at = (kg * width + 8u * dg + k) * PACK;
            for (var hh = 0u; hh < PACK; hh++) {
                red[at + hh] = acc[k][hh];
            }
        }
        if (dg == 0u) {
            for (var hh = 0u; hh < PACK; hh++) {
                sc[kg * PACK + hh] = l[hh];
            }
        }
    }
    workgroupBarrier();
    for (var o = li; o < p.pack * p.dv; o += 64u) {
        let hh = o / p.dv;
        let dd = o % p.dv;
        var sum = 0.0;
        var lsum = 0.0;
        for (var x = 0u; x < kgs; x++) {
            sum += red[(x * width + dd) * PACK + hh];
            lsum += sc[x * PACK + hh];
        }
        let base = ((rh0 + hh) * p.splits + split) * (p.dv + 2u);
        if (dd == 0u) {
            part[base] = m[hh];
            part[base + 1u] = lsum;
        }
        part[base + 2u + dd] = sum;
    }
}
