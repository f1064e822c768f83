// Writes k [T, Hkv*D] and v [T, Hkv*Dv] into the paged caches at slots [T] (negative slots,
// and slots past the cache, are skipped): one launch per cache. Template: FMT is the cache
// format code (common/turbo.wgsl), ENTRY the entry point.
//
// f32, f16, bf16: one thread per cache word (an f32, or a pair of halves: even row widths,
// checked by the launcher). Block formats (q8_0, q4_0, the TurboQuant ones): one workgroup per
// token row; each thread quantizes whole 32-element blocks with the CPU reference's
// arithmetic (core/src/quant: q8_0 and q4_0 as ggml does, the TurboQuant blocks as
// quant/turbo.rs documents), OR-ing the bytes into the row's words in workgroup memory; then
// the row is stored a word at a time (rows are whole words, checked by the launcher).

struct Params {
    t: u32,
    width: u32,     // elements per token row
    x_off: u32,
    slots_off: u32,
    c_off: u32,     // cache offset in words
    n_slots: u32,   // slots in the cache; larger ones are skipped
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> slots: array<i32>;
@group(0) @binding(2) var<storage, read_write> cache: array<u32>;
@group(0) @binding(3) var<storage, read> p: Params;

const FMT: u32 = FMT_CODE;
// The longest row of blocks a workgroup assembles, in words (9216 bytes: 8192 q8_0 values).
const ROW_WORDS: u32 = 2304u;

var<workgroup> row: array<atomic<u32>, ROW_WORDS>;

// f32 -> bf16 bits: round to nearest even on the dropped 16 bits; a NaN keeps its top bits
// and is made quiet (the CPU's `half::bf16::from_f32`).
fn to_bf16(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7fffffffu) > 0x7f800000u) {
        return (b >> 16u) | 0x40u;
    }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

fn f16_bits(v: f32) -> u32 {
    return pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;
}

fn put_u8(at: u32, b: u32) {
    atomicOr(&row[at >> 2u], (b & 0xffu) << ((at & 3u) * 8u));
}

fn put_u16(at: u32, h: u32) {
    put_u8(at, h);
    put_u8(at + 1u, h >> 8u);
}

// 1 / d, or 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    return select(1.0 / d, 0.0, d == 0.0);
}

// 1 / the root mean square of the 32 values at x[xb] (summed in order, as the CPU sums), or 0
// for a zero, NaN or infinite block: the TurboQuant writers leave those all zero (scale 0).
fn inverse_rms(xb: u32) -> f32 {
    var sumsq = 0.0;
    for (var j = 0u; j < 32u; j++) {
        sumsq += x[xb + j] * x[xb + j];
    }
    let sigma = sqrt(sumsq / 32.0);
    if (!(sigma > 0.0) || sigma > 3.0e38) {
        return 0.0;
    }
    return 1.0 / sigma;
}

// Block b of the row whose elements start at x[xb], encoded at byte `at` of `row`.
fn quant_block(xb: u32, at: u32) {
    if (FMT == 3u) {
        // q8_0: d = max|x| / 127, codes round(x / d), halves away from zero.
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {
            amax = max(amax, abs(x[xb + j]));
        }
        let d = amax / 127.0;
        let id = inverse(d);
        put_u16(at, f16_bits(d));
        for (var j = 0u; j < 32u; j++) {
            let v = x[xb + j] * id;
            let q = i32(sign(v) * floor(abs(v) + 0.5));
            put_u8(at + 2u + j, u32(clamp(q, -128, 127)) & 0xffu);
        }
    } else if (FMT == 4u) {
        // q4_0: the first element of largest magnitude maps to -8; codes trunc(x / d + 8.5),
        // capped at 15; byte j holds elements j (low nibble) and j + 16 (high).
        var mx = x[xb];
        var amax = abs(mx);
        for (var j = 1u; j < 32u; j++) {
            let v = x[xb + j];
            if (abs(v) > amax) {
                amax = abs(v);
                mx = v;
            }
        }
        let d = mx / -8.0;
        let id = inverse(d);
        put_u16(at, f16_bits(d));
        for (var j = 0u; j < 16u; j++) {
            let lo = u32(clamp(x[xb + j] * id + 8.5, 0.0, 15.0));
            let hi = u32(clamp(x[xb + j + 16u] * id + 8.5, 0.0, 15.0));
            put_u8(at + 2u + j, lo | (hi << 4u));
        }
    } else if (FMT >= 10u) {
        trellis_block(xb, at);
    } else {
        // TurboQuant: sigma = the block's RMS; each element's nearest point of sigma * C
        // (ties low); then the least-squares scale for those codes, stored as f16.
        let bits = tq_bits(FMT);
        let n = 1u << (bits - 1u);
        let inv = inverse_rms(xb);
        if (inv == 0.0) {
            return;
        }
        var num = 0.0;
        var den = 0.0;
        for (var j = 0u; j < 32u; j++) {
            let v = x[xb + j];
            let a = abs(v * inv);
            var k = 0u;
            while (k + 1u < n && a > 0.5 * (tq_half(bits, k) + tq_half(bits, k + 1u))) {
                k += 1u;
            }
            var code = n + k;
            var pt = tq_half(bits, k);
            if (v < 0.0) {
                code = n - 1u - k;
                pt = -pt;
            }
            num += v * pt;
            den += pt * pt;
            let bit = j * bits;
            let c = code << (bit % 8u);
            put_u8(at + 2u + bit / 8u, c);
            if ((c >> 8u) != 0u) {
                put_u8(at + 3u + bit / 8u, c >> 8u);
            }
        }
        let sh = f16_bits(select(0.0, num / den, den > 0.0));
        put_u16(at, sh);
        if (tq_sketched(FMT)) {
            sketch_block(xb, at, bits, unpack2x16float(sh).x);
        }
    }
}

// A tq3t/tq2t block (turbo.rs's trellis quantizer, in its order): the Viterbi search over
// the 8 states for the path of least squared error against x / sigma (ties: the lower state,
// then the lower branch, then the lower point), then the least-squares scale for its points.
fn trellis_block(xb: u32, at: u32) {
    let bits = tq_bits(FMT);
    let per = 1u << (bits - 1u);
    let inv = inverse_rms(xb);
    if (inv == 0.0) {
        return;
    }
    // cost[t]: the least error of a path ending in state t (`live` bit t: such a path exists).
    // A step into state nt came by branch bit nt & 1 from state (nt >> 1) | (top << 2); back[i]
    // keeps, per state, that top bit and the point j within the subset (4 bits a state).
    var cost: array<f32, 8>;
    var live = 1u;
    var back: array<u32, 32>;
    for (var i = 0u; i < 32u; i++) {
        let z = x[xb + i] * inv;
        var next: array<f32, 8>;
        var nlive = 0u;
        var f = 0u;
        for (var t = 0u; t < 8u; t++) {
            if ((live & (1u << t)) == 0u) {
                continue;
            }
            for (var u = 0u; u < 2u; u++) {
                let k = 2u * u + tcq_parity(t);
                var bj = 0u;
                var bd = 0.0;
                for (var j = 0u; j < per; j++) {
                    let e = z - 0.9 * tq_point(bits + 1u, 4u * j + k);
                    let d = e * e;
                    if (j == 0u || d < bd) {
                        bj = j;
                        bd = d;
                    }
                }
                let nt = (2u * t + u) & 7u;
                let c = cost[t] + bd;
                if ((nlive & (1u << nt)) == 0u || c < next[nt]) {
                    next[nt] = c;
                    nlive |= 1u << nt;
                    f = (f & ~(15u << (4u * nt))) | (((t >> 2u) | (bj << 1u)) << (4u * nt));
                }
            }
        }
        cost = next;
        live = nlive;
        back[i] = f;
    }
    var t = 0u;
    for (var s = 1u; s < 8u; s++) {
        if (cost[s] < cost[t]) {
            t = s;
        }
    }
    var codes: array<u32, 32>;
    for (var n = 0u; n < 32u; n++) {
        let i = 31u - n;
        let f = (back[i] >> (4u * t)) & 15u;
        codes[i] = (t & 1u) | ((f >> 1u) << 1u);
        t = (t >> 1u) | ((f & 1u) << 2u);
    }
    var num = 0.0;
    var den = 0.0;
    t = 0u;
    for (var i = 0u; i < 32u; i++) {
        let code = codes[i];
        let pt = tcq_point(bits, code, tcq_parity(t));
        num += x[xb + i] * pt;
        den += pt * pt;
        t = tcq_next(t, code);
        let bit = i * bits;
        let c = code << (bit % 8u);
        put_u8(at + 2u + bit / 8u, c);
        if ((c >> 8u) != 0u) {
            put_u8(at + 3u + bit / 8u, c >> 8u);
        }
    }
    put_u16(at, f16_bits(select(0.0, num / den, den > 0.0)));
}

// The residual sketch of a tq4p/tq3p block at byte `at` whose codes (`bits` each) and f16
// scale `s` are written: r = x - the codes' values, y = H32 * D * r (turbo.rs's butterflies,
// in its order), the signs of y and rho = |r|^2 / sum |y| after the codes.
fn sketch_block(xb: u32, at: u32, bits: u32, s: f32) {
    var r: array<f32, 32>;
    var norm2 = 0.0;
    let mask = (1u << bits) - 1u;
    for (var j = 0u; j < 32u; j++) {
        let bit = j * bits;
        let a = at + 2u + bit / 8u;
        let two = (atomicLoad(&row[a >> 2u]) >> ((a & 3u) * 8u)) & 0xffu;
        let a1 = a + 1u;
        let two1 = (atomicLoad(&row[a1 >> 2u]) >> ((a1 & 3u) * 8u)) & 0xffu;
        let code = ((two | (two1 << 8u)) >> (bit % 8u)) & mask;
        let v = x[xb + j] - s * tq_point(bits, code);
        norm2 += v * v;
        r[j] = select(v, -v, ((QJL_SIGNS >> j) & 1u) != 0u);
    }
    for (var h = 1u; h < 32u; h *= 2u) {
        for (var i = 0u; i < 32u; i += 2u * h) {
            for (var j = i; j < i + h; j++) {
                let a = r[j];
                let c = r[j + h];
                r[j] = a + c;
                r[j + h] = a - c;
            }
        }
    }
    var sigma = 0u;
    var l1 = 0.0;
    for (var j = 0u; j < 32u; j++) {
        sigma |= select(0u, 1u << j, r[j] < 0.0);
        l1 += abs(r[j]);
    }
    let cb = at + 2u + 4u * bits;
    put_u16(cb, sigma & 0xffffu);
    put_u16(cb + 2u, sigma >> 16u);
    put_u16(cb + 4u, f16_bits(select(0.0, norm2 / l1, l1 > 0.0)));
}

// f32, f16, bf16: one thread per cache word.
fn write_words(wid: vec3<u32>, li: u32) {
    let per = select(2u, 1u, FMT == 0u);
    let words = p.width / per;
    let g = (wid.x + wid.y * p.nx) * 64u + li;
    if (g >= p.t * words) {
        return;
    }
    let tok = g / words;
    let e = g % words;
    let slot = slots[p.slots_off + tok];
    if (slot < 0 || u32(slot) >= p.n_slots) {
        return;
    }
    let xi = p.x_off + tok * p.width + per * e;
    var w = bitcast<u32>(x[xi]);
    if (FMT == 1u) {
        w = pack2x16float(vec2<f32>(x[xi], x[xi + 1u]));
    } else if (FMT == 2u) {
        w = to_bf16(x[xi]) | (to_bf16(x[xi + 1u]) << 16u);
    }
    cache[p.c_off + u32(slot) * words + e] = w;
}

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    if (FMT <= 2u) {
        write_words(wid, li);
        return;
    }
    // One workgroup per token row (the grid has exactly t workgroups, so `tok` is uniform).
    let tok = wid.x + wid.y * p.nx;
    let slot = slots[p.slots_off + min(tok, p.t - 1u)];
    let live = tok < p.t && slot >= 0 && u32(slot) < p.n_slots;
    let nblk = p.width / 32u;
    let words = kvf_row_bytes(FMT, p.width) / 4u;
    for (var w = li; w < words; w += 64u) {
        atomicStore(&row[w], 0u);
    }
    workgroupBarrier();
    if (live) {
        let bb = kvf_row_bytes(FMT, 32u);
        for (var b = li; b < nblk; b += 64u) {
            quant_block(p.x_off + tok * p.width + b * 32u, b * bb);
        }
    }
    workgroupBarrier();
    if (live) {
        let base = p.c_off + u32(slot) * words;
        for (var w = li; w < words; w += 64u) {
            cache[base + w] = atomicLoad(&row[w]);
        }
    }
}
