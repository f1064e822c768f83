// Paged attention: queries attend to K/V read through the block table by index, in place.
// With `paged = 0` the same kernel serves the contiguous Attention op (one sequence).
// Template: KFMT and VFMT are the K and V cache format codes (common/turbo.wgsl: f32, f16,
// bf16, q8_0, q4_0, tq4, tq3, tq2, tq4p, tq3p, tq3t, tq2t); ENTRY names the entry point.
// Cache offsets are in bytes; a row (one token slot of one KV head) starts at a 4-byte (f32)
// or 2-byte boundary, which every format's row size keeps. Block formats are decoded 4 or 8 values at a time (the
// block's scale read once, the codes a word at a time) with the CPU's arithmetic (scale as
// f32 times the code's value), so each K and V value is the CPU's bit for bit.
//
// paged_attention_*: one workgroup of 64 threads per (tile of query rows of one sequence,
// pack of up to 4 query heads that read the same KV head, split of the key range). A
// workgroup scores its "slots" (row, head) together, up to 16 in 4 banks of 4: decode (one
// query row per sequence) takes one row and many splits so long contexts spread over the
// device; prefill takes as many rows as fit (`rtile`) and one split, so each K and V value
// is decoded once for all of them rather than once per row. Keys are scored 64 at a time
// (a key per thread, all of D, 8 values at a time), folded into a running max and sum per
// slot (online softmax). The weighted V sum: each thread keeps 4 dims of one bank's 4 slots
// over the keys of its key group, merged at the end. Each split writes (max, sum, acc[Dv])
// per slot to a scratch buffer; paged_attention_combine merges the splits.

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
    mask: u32,       // 0 causal, 1 sliding window, 2 bidirectional, 3 prefix-bidirectional,
                     // 4 lookback (the last mask_n keys of the sequence)
    mask_n: u32,     // window, prefix or lookback length
    paged: u32,      // 0: contiguous K/V [S, Hkv, D] of one sequence (the Attention op)
    s_len: u32,      // contiguous: S
    nx: u32,
    pack: u32,       // query heads per workgroup (1..4; divides the heads per KV head)
    rtile: u32,      // query rows per workgroup (1 in decode); rtile * pack slots
    banks: u32,      // ceil(slots / 4): rtile * pack <= 4 * banks, 4 * banks * d <= 1024,
                     // banks * ceil(dv / 4) <= 64
    ke_off: u32,     // per-row key reach (paged attention's key_end, read through seq_lens's
                     // binding at this index); 0xffffffff: none
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
// Whether either cache carries tq4p/tq3p sketches, or tq3t/tq2t trellis codes: constants, so
// the plain TurboQuant formats' decoders hold no sketch or trellis code at all.
const SKETCH: bool = KF == 8u || KF == 9u || VF == 8u || VF == 9u;
const TRELLIS: bool = KF >= 10u || VF >= 10u;
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

// The sketch of the tq4p/tq3p block at byte `blk` (codes of `bits` bits): its signs, and
// its rho as the bits of an f32.
fn qjl_sketch(v: bool, blk: u32, bits: u32) -> vec2<u32> {
    let cb = blk + 2u + 4u * bits;
    return vec2<u32>(c_word(v, cb), bitcast<u32>(c_f16(v, cb + 4u)));
}

// The trellis state before code i (0..32) of the tq3t/tq2t block at byte `blk`: the branch
// bits of codes i-3, i-2, i-1 (bits 2, 1, 0; codes before the block's start count as 0).
fn tcq_state(v: bool, blk: u32, bits: u32, i: u32) -> u32 {
    let first = max(i, 3u) - 3u;
    let bit = first * bits;
    let w = c_word(v, blk + 2u + bit / 8u) >> (bit % 8u);
    var t = 0u;
    for (var k = 0u; k < i - first; k++) {
        t = tcq_next(t, w >> (k * bits));
    }
    return t;
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
            let blk = base + (i / 32u) * select(2u + 4u * bits, tq_block_bytes(f), SKETCH);
            let bit = (i % 32u) * bits;
            let at = blk + 2u + bit / 8u;
            let two = c_u8(v, at) | (c_u8(v, at + 1u) << 8u);
            let code = (two >> (bit % 8u)) & ((1u << bits) - 1u);
            if (TRELLIS && f >= 10u) {
                let t = tcq_state(v, blk, bits, i % 32u);
                return c_f16(v, blk) * tcq_point(bits, code, tcq_parity(t));
            }
            var y = c_f16(v, blk) * tq_point(bits, code);
            if (SKETCH && tq_sketched(f)) {
                let sk = qjl_sketch(v, blk, bits);
                y += bitcast<f32>(sk.y) * qjl_factor(i % 32u, sk.x);
            }
            return y;
        }
    }
}

// Elements e..e+7 of the row at byte `base` (e a multiple of 8, e + 8 at most the row's
// length): the same values as c_elem, with the block's scale read once and the codes read a
// word at a time (the 8 codes of a TurboQuant group are `bits` whole bytes).
fn c_elems8(v: bool, f: u32, base: u32, e: u32) -> array<f32, 8> {
    var r: array<f32, 8>;
    switch f {
        case 0u, 1u, 2u: {
            let lo = c_elems4(v, f, base, e);
            let hi = c_elems4(v, f, base, e + 4u);
            for (var k = 0u; k < 4u; k++) {
                r[k] = lo[k];
                r[k + 4u] = hi[k];
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
            let blk = base + (e / 32u) * select(2u + 4u * bits, tq_block_bytes(f), SKETCH);
            let d = c_f16(v, blk);
            let w = c_word(v, blk + 2u + (e % 32u) / 8u * bits);
            let mask = (1u << bits) - 1u;
            if (TRELLIS && f >= 10u) {
                var t = tcq_state(v, blk, bits, e % 32u);
                for (var k = 0u; k < 8u; k++) {
                    let code = (w >> (k * bits)) & mask;
                    r[k] = d * tcq_point(bits, code, tcq_parity(t));
                    t = tcq_next(t, code);
                }
                return r;
            }
            for (var k = 0u; k < 8u; k++) {
                r[k] = d * tq_point(bits, (w >> (k * bits)) & mask);
            }
            if (SKETCH && tq_sketched(f)) {
                let sk = qjl_sketch(v, blk, bits);
                for (var k = 0u; k < 8u; k++) {
                    r[k] += bitcast<f32>(sk.y) * qjl_factor(e % 32u + k, sk.x);
                }
            }
        }
    }
    return r;
}

// Elements e..e+3 (e a multiple of 4, e + 4 at most the row's length), as c_elems8 reads them.
fn c_elems4(v: bool, f: u32, base: u32, e: u32) -> vec4<f32> {
    var r: vec4<f32>;
    switch f {
        case 0u: {
            for (var k = 0u; k < 4u; k++) {
                r[k] = bitcast<f32>(c_u32(v, base + 4u * (e + k)));
            }
        }
        case 1u, 2u: {
            for (var k = 0u; k < 2u; k++) {
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
            let w = c_word(v, blk + 2u + e % 32u);
            for (var k = 0u; k < 4u; k++) {
                r[k] = f32(i32(w << (24u - 8u * k)) >> 24u) * d;
            }
        }
        case 4u: {
            let blk = base + (e / 32u) * 18u;
            let d = c_f16(v, blk);
            let j = e % 32u;
            let w = c_word(v, blk + 2u + j % 16u) >> select(0u, 4u, j >= 16u);
            for (var k = 0u; k < 4u; k++) {
                r[k] = f32(i32((w >> (8u * k)) & 15u) - 8) * d;
            }
        }
        default: {
            let bits = tq_bits(f);
            let blk = base + (e / 32u) * select(2u + 4u * bits, tq_block_bytes(f), SKETCH);
            let d = c_f16(v, blk);
            let bit = (e % 32u) * bits;
            let w = c_word(v, blk + 2u + bit / 8u) >> (bit % 8u);
            let mask = (1u << bits) - 1u;
            if (TRELLIS && f >= 10u) {
                var t = tcq_state(v, blk, bits, e % 32u);
                for (var k = 0u; k < 4u; k++) {
                    let code = (w >> (k * bits)) & mask;
                    r[k] = d * tcq_point(bits, code, tcq_parity(t));
                    t = tcq_next(t, code);
                }
                return r;
            }
            for (var k = 0u; k < 4u; k++) {
                r[k] = d * tq_point(bits, (w >> (k * bits)) & mask);
            }
            if (SKETCH && tq_sketched(f)) {
                let sk = qjl_sketch(v, blk, bits);
                for (var k = 0u; k < 4u; k++) {
                    r[k] += bitcast<f32>(sk.y) * qjl_factor(e % 32u + k, sk.x);
                }
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

// Query row `row`'s key reach (the op's key_end, within the sequence's `len` keys): the keys
// before it are seen whatever the mask says past `pos` (an image's soft tokens see each
// other both ways). 0 when the op has none.
fn reach(row: u32, len: u32) -> u32 {
    if (p.ke_off == 0xffffffffu) {
        return 0u;
    }
    return min(u32(max(seq_lens[p.ke_off + row], 0)), len);
}

// The keys [lo, hi) that a query at position `pos` of a sequence of `len` keys sees.
fn key_range(pos: u32, len: u32) -> vec2<u32> {
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
    return vec2<u32>(lo, hi);
}

const BANKS: u32 = 4u;
const SLOTS: u32 = 16u;
var<workgroup> qv: array<f32, 1024>;   // the slots' query rows, slot-major (zeros past them)
var<workgroup> sc: array<f32, 1024>;   // a tile's scores, then weights: [slot][key]
var<workgroup> vrow: array<u32, 64>;   // a tile's V row byte addresses
var<workgroup> mx: array<f32, 16>;     // each slot's running max
var<workgroup> cor: array<f32, 16>;    // each slot's rescale of this tile
// The key groups' partial weighted V sums, [key group][bank][dim quad][dim][slot of bank].
var<workgroup> red: array<f32, 1024>;

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let packs = p.hq / p.pack;
    let tp = wid.x + wid.z * p.nx;   // tile * packs + pack
    let split = wid.y;
    let h0 = (tp % packs) * p.pack;  // the pack's first head
    let g = h0 / (p.hq / p.hkv);
    // The tile's sequence, first row and rows; the sequence's length and end row.
    var tile = tp / packs;
    var s = 0u;
    var r0 = 0u;
    var nr = 0u;
    var len = p.s_len;
    var q_end = p.t;
    if (p.paged != 0u) {
        for (; s < p.n_seqs; s++) {
            let qa = max(q_start[p.qs_off + s], 0);
            let qb = max(q_start[p.qs_off + s + 1u], qa);
            let tiles_s = (u32(qb - qa) + p.rtile - 1u) / p.rtile;
            if (tile < tiles_s) {
                r0 = u32(qa) + tile * p.rtile;
                nr = min(p.rtile, u32(qb) - r0);
                q_end = u32(qb);
                break;
            }
            tile -= tiles_s;
        }
        if (nr == 0u) {
            return;
        }
        len = u32(seq_lens[p.lens_off + s]);
    } else {
        r0 = tile * p.rtile;
        if (r0 >= p.t) {
            return;
        }
        nr = min(p.rtile, p.t - r0);
    }
    if (r0 + nr > p.t || q_end - r0 > len) {
        return;
    }
    let pos0 = len - (q_end - r0);   // the first row's position
    let nslots = nr * p.pack;
    // Every row's keys lie in [first row's lo, last row's hi): both grow with the position.
    var hi = key_range(pos0 + nr - 1u, len).y;
    for (var r = 0u; r < nr; r++) {
        hi = max(hi, reach(r0 + r, len));
    }
    let a = key_range(pos0, len).x + split * p.split_len;
    let b = min(hi, a + p.split_len);

    for (var i = li; i < 4u * p.banks * p.d; i += 64u) {
        let sl = i / p.d;
        var x = 0.0;
        if (sl < nslots) {
            let rh = (r0 + sl / p.pack) * p.hq + h0 + sl % p.pack;
            x = q[p.q_off + rh * p.d + i % p.d];
        }
        qv[i] = x;
    }
    if (li < SLOTS) {
        mx[li] = NEG_BIG;
        cor[li] = 1.0;
    }
    workgroupBarrier();

    // V lanes: dim quad dq of bank sb over the keys of key group kg (every kgs-th key).
    let nq = (p.dv + 3u) / 4u;
    let kgs = 64u / (nq * p.banks);
    let dq = li % nq;
    let sb = (li / nq) % p.banks;
    let kg = li / (nq * p.banks);
    let d8 = p.d / 8u * 8u;
    var l = vec4<f32>(0.0);          // this thread's keys' share of its bank's weight sums
    var acc: array<vec4<f32>, 4>;    // acc[k][c]: dim 4 dq + k of slot 4 sb + c
    var j0 = a;
    // Every thread runs the same number of tiles, so the barriers stay uniform.
    let tiles = select(0u, (b - a + 63u) / 64u, b > a);
    for (var t = 0u; t < tiles; t++) {
        let j = j0 + li;
        // Zeroed explicitly each tile: a browser's compiler left the declaration's implicit
        // zero to the first tile, so later tiles added to the previous tile's scores.
        var dot = array<vec4<f32>, BANKS>();
        if (j < b) {
            let kb = p.k_off + slot_row(s, j, g) * kvf_row_bytes(KF, p.d);
            for (var i = 0u; i < d8; i += 8u) {
                let kv = c_elems8(false, KF, kb, i);
                for (var k = 0u; k < 8u; k++) {
                    let x = i + k;
                    for (var bk = 0u; bk < BANKS; bk++) {
                        if (bk < p.banks) {
                            let o = 4u * bk * p.d + x;
                            dot[bk] += vec4<f32>(qv[o], qv[o + p.d], qv[o + 2u * p.d], qv[o + 3u * p.d]) * kv[k];
                        }
                    }
                }
            }
            for (var x = d8; x < p.d; x++) {
                let kv = c_elem(false, KF, kb, x);
                for (var bk = 0u; bk < BANKS; bk++) {
                    if (bk < p.banks) {
                        let o = 4u * bk * p.d + x;
                        dot[bk] += vec4<f32>(qv[o], qv[o + p.d], qv[o + 2u * p.d], qv[o + 3u * p.d]) * kv;
                    }
                }
            }
            // This key's V row, looked up once for the whole workgroup.
            vrow[li] = p.v_off + slot_row(s, j, g) * kvf_row_bytes(VF, p.dv);
        }
        for (var sl = 0u; sl < 4u * p.banks; sl++) {
            var score = NEG_BIG;
            var r = key_range(pos0 + sl / p.pack, len);
            r.y = max(r.y, reach(r0 + sl / p.pack, len));
            if (j < b && sl < nslots && j >= r.x && j < r.y) {
                score = dot[sl / 4u][sl % 4u] * p.scale;
                if (p.soft_cap != 0.0) {
                    score = p.soft_cap * tanh(clamp(score / p.soft_cap, -15.0, 15.0));
                }
            }
            sc[sl * 64u + li] = score;
        }
        workgroupBarrier();
        let n = min(64u, b - j0);
        if (li < nslots) {
            var tm = mx[li];
            for (var x = 0u; x < n; x++) {
                tm = max(tm, sc[li * 64u + x]);
            }
            cor[li] = exp(mx[li] - tm);
            mx[li] = tm;
        }
        workgroupBarrier();
        // Each thread turns its own key's scores into weights (0 where the slot does not see
        // the key).
        if (li < n) {
            for (var sl = 0u; sl < 4u * p.banks; sl++) {
                let x = sc[sl * 64u + li];
                sc[sl * 64u + li] = select(0.0, exp(x - mx[sl]), x > NEG_BIG);
            }
        }
        workgroupBarrier();
        if (kg < kgs) {
            let c0 = 4u * sb;
            let corr = vec4<f32>(cor[c0], cor[c0 + 1u], cor[c0 + 2u], cor[c0 + 3u]);
            l *= corr;
            for (var k = 0u; k < 4u; k++) {
                acc[k] *= corr;
            }
            let e = 4u * dq;
            for (var x = kg; x < n; x += kgs) {
                let w = vec4<f32>(sc[c0 * 64u + x], sc[(c0 + 1u) * 64u + x], sc[(c0 + 2u) * 64u + x],
                                  sc[(c0 + 3u) * 64u + x]);
                l += w;
                let vb = vrow[x];
                if (e + 4u <= p.dv) {
                    let vv = c_elems4(true, VF, vb, e);
                    for (var k = 0u; k < 4u; k++) {
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
    // Merge the key groups through workgroup memory (the weight sums in sc, now free).
    if (kg < kgs) {
        let at = ((kg * p.banks + sb) * nq + dq) * 16u;
        for (var k = 0u; k < 4u; k++) {
            for (var c = 0u; c < 4u; c++) {
                red[at + 4u * k + c] = acc[k][c];
            }
        }
        if (dq == 0u) {
            for (var c = 0u; c < 4u; c++) {
                sc[(kg * p.banks + sb) * 4u + c] = l[c];
            }
        }
    }
    workgroupBarrier();
    for (var o = li; o < nslots * p.dv; o += 64u) {
        let sl = o / p.dv;
        let dd = o % p.dv;
        let bk = sl / 4u;
        let c = sl % 4u;
        var sum = 0.0;
        var lsum = 0.0;
        for (var x = 0u; x < kgs; x++) {
            sum += red[((x * p.banks + bk) * nq + dd / 4u) * 16u + 4u * (dd % 4u) + c];
            lsum += sc[(x * p.banks + bk) * 4u + c];
        }
        let rh = (r0 + sl / p.pack) * p.hq + h0 + sl % p.pack;
        let base = (rh * p.splits + split) * (p.dv + 2u);
        if (dd == 0u) {
            part[base] = mx[sl];
            part[base + 1u] = lsum;
        }
        part[base + 2u + dd] = sum;
    }
}
