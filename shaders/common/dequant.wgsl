// dequant.wgsl: decoders for kiln's float and GGUF/ggml block formats.
//
// Include this file in a shader that declares the weight buffer (WGSL resolves module-scope
// names in any order, so the declaration may come before or after this file):
//
//     @group(0) @binding(N) var<storage, read> w: array<u32>;
//
// Everything is addressed in bytes, little-endian, exactly as the GGUF file stores it. Blocks
// are not 4-byte aligned in general (Q4_0 is 18 bytes, MXFP4 17), so all reads go through the
// byte-addressed helpers below. Rows of blocks must start at an even byte address (GGUF aligns
// tensor data to 32 bytes and every format with an f16 field has an even block size), so the
// f16/u16 fields, which sit at even offsets inside every block, are at even addresses.
//
// Public functions:
//   w_u8, w_u16, w_f16, w_i8             raw reads at a byte address
//   dq1_f32, dq1_f16, dq1_bf16           element i of a float row
//   dq32_<fmt>(row, c)                   32 elements c*32 .. c*32+32 of a row of blocks, for
//       q4_0 q4_1 q5_0 q5_1 q8_0 mxfp4   (32-element blocks: chunk c is block c)
//       nvfp4                            (64-element blocks: chunk c is half c%2 of block c/2)
//       iq4_nl                           (32-element blocks)
//       iq4_xs                           (256-element blocks: chunk c is group c%8 of block c/8)
//       q2_k q3_k q4_k q5_k q6_k q8_k    (256-element blocks: chunk c is part c%8 of block c/8)
// Internal helpers are prefixed with `dq_`.
//
// The arithmetic is the CPU reference's (core/src/quant/*.rs) operation for operation: f16
// scales are converted to f32 first, then the same f32 products and sums are formed in the same
// order. For every format each product of a scale and a code is exact in f32 (at most 24
// significant bits), so the only rounding is the final subtraction of a minimum, and a compiler
// fusing `a * q - m` into an fma cannot change the result either.

// ---- raw reads ---------------------------------------------------------------------------------

// The byte at byte address `byte` of `w`.
fn w_u8(byte: u32) -> u32 {
    return (w[byte >> 2u] >> ((byte & 3u) * 8u)) & 0xFFu;
}

// The little-endian u16 at the even byte address `byte`.
fn w_u16(byte: u32) -> u32 {
    return (w[byte >> 2u] >> ((byte & 2u) * 8u)) & 0xFFFFu;
}

// The IEEE half at the even byte address `byte`, as f32.
fn w_f16(byte: u32) -> f32 {
    return unpack2x16float(w[byte >> 2u] >> ((byte & 2u) * 8u)).x;
}

// The signed byte at byte address `byte`, as f32.
fn w_i8(byte: u32) -> f32 {
    return f32(dq_sext8(w_u8(byte)));
}

// Sign-extends the low 8 bits of `b`.
fn dq_sext8(b: u32) -> i32 {
    return bitcast<i32>(b << 24u) >> 24u;
}

// The little-endian u32 at any byte address.
fn dq_u32(byte: u32) -> u32 {
    let i = byte >> 2u;
    let sh = (byte & 3u) * 8u;
    if (sh == 0u) {
        return w[i];
    }
    return (w[i] >> sh) | (w[i + 1u] << (32u - sh));
}

// The 16 bytes at any byte address, as four little-endian words (byte j of the run is byte
// j % 4 of component j / 4; see dq_byte).
fn dq_load16(byte: u32) -> vec4<u32> {
    let i = byte >> 2u;
    let v = vec4<u32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
    let sh = (byte & 3u) * 8u;
    if (sh == 0u) {
        return v;
    }
    let n = vec4<u32>(v.yzw, w[i + 4u]);
    return (v >> vec4<u32>(sh)) | (n << vec4<u32>(32u - sh));
}

// Byte j (0..16) of a run read by dq_load16.
fn dq_byte(v: vec4<u32>, j: u32) -> u32 {
    return (v[j >> 2u] >> ((j & 3u) * 8u)) & 0xFFu;
}

// ---- plain floats ------------------------------------------------------------------------------

// Element i of an f32 row starting at byte address byte_base (4-aligned in practice; any
// address works).
fn dq1_f32(byte_base: u32, i: u32) -> f32 {
    return bitcast<f32>(dq_u32(byte_base + 4u * i));
}

// Element i of an f16 row starting at the even byte address byte_base.
fn dq1_f16(byte_base: u32, i: u32) -> f32 {
    return w_f16(byte_base + 2u * i);
}

// Element i of a bf16 row starting at the even byte address byte_base. bf16 is the top half of
// an f32, so decoding is a shift (NaN payloads survive).
fn dq1_bf16(byte_base: u32, i: u32) -> f32 {
    return bitcast<f32>(w_u16(byte_base + 2u * i) << 16u);
}

// ---- 32-element legacy formats -----------------------------------------------------------------
// In the 4- and 5-bit formats byte j of qs holds element j in its low nibble and element j + 16
// in its high nibble; the 5-bit formats keep bit 4 of element j in bit j of the u32 qh.

// Q4_0, 18 bytes: f16 d @0, qs[16] @2.  y = (q - 8) * d
fn dq32_q4_0(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 18u * c;
    let d = w_f16(b);
    let qs = dq_load16(b + 2u);
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let q = dq_byte(qs, j);
        y[j] = f32(i32(q & 0x0Fu) - 8) * d;
        y[j + 16u] = f32(i32(q >> 4u) - 8) * d;
    }
    return y;
}

// Q4_1, 20 bytes: f16 d @0, f16 m @2, qs[16] @4.  y = q * d + m
fn dq32_q4_1(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 20u * c;
    let d = w_f16(b);
    let m = w_f16(b + 2u);
    let qs = dq_load16(b + 4u);
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let q = dq_byte(qs, j);
        y[j] = f32(q & 0x0Fu) * d + m;
        y[j + 16u] = f32(q >> 4u) * d + m;
    }
    return y;
}

// Q5_0, 22 bytes: f16 d @0, u32 qh @2 (not 4-aligned), qs[16] @6.  y = (q - 16) * d
fn dq32_q5_0(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 22u * c;
    let d = w_f16(b);
    let qh = dq_u32(b + 2u);
    let qs = dq_load16(b + 6u);
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let q = dq_byte(qs, j);
        let lo = (q & 0x0Fu) | (((qh >> j) & 1u) << 4u);
        let hi = (q >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
        y[j] = f32(i32(lo) - 16) * d;
        y[j + 16u] = f32(i32(hi) - 16) * d;
    }
    return y;
}

// Q5_1, 24 bytes: f16 d @0, f16 m @2, u32 qh @4, qs[16] @8.  y = q * d + m
fn dq32_q5_1(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 24u * c;
    let d = w_f16(b);
    let m = w_f16(b + 2u);
    let qh = dq_u32(b + 4u);
    let qs = dq_load16(b + 8u);
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let q = dq_byte(qs, j);
        let lo = (q & 0x0Fu) | (((qh >> j) & 1u) << 4u);
        let hi = (q >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
        y[j] = f32(lo) * d + m;
        y[j + 16u] = f32(hi) * d + m;
    }
    return y;
}

// Q8_0, 34 bytes: f16 d @0, i8 qs[32] @2.  y = q * d
fn dq32_q8_0(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 34u * c;
    let d = w_f16(b);
    var y: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(b + 2u + 16u * h);
        for (var j = 0u; j < 16u; j++) {
            y[16u * h + j] = f32(dq_sext8(dq_byte(qs, j))) * d;
        }
    }
    return y;
}

// ---- FP4 (E2M1) formats ------------------------------------------------------------------------
// 4-bit E2M1 codes: bit 3 is the sign, bits 0..3 index the magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
// As in the reference, the magnitudes are kept doubled (exact small integers) and the block
// scale is halved instead.

// E2M1 code times two: 0, 1, 2, 3, 4, 6, 8, 12, negated for codes 8..15 (codes 0 and 8 both
// give +0.0). The magnitudes are the nibbles of 0xC8643210.
fn dq_e2m1x2(code: u32) -> f32 {
    let mag = i32((0xC8643210u >> ((code & 7u) * 4u)) & 0x0Fu);
    return f32(select(mag, -mag, (code & 8u) != 0u));
}

// MXFP4, 17 bytes: u8 e (E8M0 scale 2^(e - 127)) @0, qs[16] @1; element j is the low nibble of
// qs[j], element j + 16 the high nibble.  y = 2^(e - 128) * (2 * e2m1)
// e = 255 gives 2^127 (E8M0's NaN code is not special-cased, as in ggml and the reference).
fn dq32_mxfp4(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 17u * c;
    let e = w_u8(b);
    let qs = dq_load16(b + 1u);
    var y: array<f32, 32>;
    if (e >= 2u) {
        // 2^(e - 128) is a normal f32: exponent field e - 1.
        let d = bitcast<f32>((e - 1u) << 23u);
        for (var j = 0u; j < 16u; j++) {
            let q = dq_byte(qs, j);
            y[j] = d * dq_e2m1x2(q & 0x0Fu);
            y[j + 16u] = d * dq_e2m1x2(q >> 4u);
        }
    } else {
        // For e = 0, 1 the reference's scale 2^(e - 128) is an f32 subnormal, which a GPU may
        // flush to zero. Apply it in two exact power-of-two steps, 2^(e - 64) then 2^-64: the
        // result is the same (every product here is exact), and it survives flushing whenever
        // it is itself a normal number.
        let d_hi = bitcast<f32>((e + 63u) << 23u);
        let d_lo = bitcast<f32>(63u << 23u);
        for (var j = 0u; j < 16u; j++) {
            let q = dq_byte(qs, j);
            y[j] = (dq_e2m1x2(q & 0x0Fu) * d_hi) * d_lo;
            y[j + 16u] = (dq_e2m1x2(q >> 4u) * d_hi) * d_lo;
        }
    }
    return y;
}

// ---- IQ4_NL, IQ4_XS --------------------------------------------------------------------------
// 4-bit codes indexing 16 non-uniform levels (-127, -104, .., 113), times the block's (IQ4_NL)
// or group's (IQ4_XS: d * (scale - 32)) scale. Every product is exact in f32 (at most 11 + 6 +
// 7 significant bits), so the reference's order does not matter.

// The level of a code: signed byte code % 4 of one of four packed words.
fn dq_iq4nl(code: u32) -> f32 {
    let lo = select(0xF6EADDCFu, 0xBFAD9881u, code < 4u);
    let hi = select(0x71594535u, 0x26190D01u, code < 12u);
    let wd = select(hi, lo, code < 8u);
    return f32(dq_sext8(wd >> ((code & 3u) * 8u)));
}

// 16 bytes of nibbles at byte address `q` (element j the low nibble of byte j, j + 16 the
// high one), each level times d.
fn dq_iq4_run(q: u32, d: f32) -> array<f32, 32> {
    let qs = dq_load16(q);
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let b = dq_byte(qs, j);
        y[j] = d * dq_iq4nl(b & 0x0Fu);
        y[j + 16u] = d * dq_iq4nl(b >> 4u);
    }
    return y;
}

// IQ4_NL, 18 bytes: f16 d @0, qs[16] @2.
fn dq32_iq4_nl(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 18u * c;
    return dq_iq4_run(b + 2u, w_f16(b));
}

// Group g's scale of an IQ4_XS block at b: d * (6-bit scale - 32), the low 4 bits in nibble
// g % 2 of byte 4 + g / 2, the high 2 in bits 2g of the u16 at 2.
fn dq_iq4_xs_scale(b: u32, g: u32) -> f32 {
    let lo = (w_u8(b + 4u + g / 2u) >> (4u * (g % 2u))) & 0x0Fu;
    let hi = (w_u16(b + 2u) >> (2u * g)) & 3u;
    return w_f16(b) * f32(i32(lo | (hi << 4u)) - 32);
}

// IQ4_XS, 136 bytes: f16 d @0, scales_h u16 @2, scales_l[4] @4, qs[128] @8 (16 bytes a group).
fn dq32_iq4_xs(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 136u * (c / 8u);
    let g = c % 8u;
    return dq_iq4_run(b + 8u + 16u * g, dq_iq4_xs_scale(b, g));
}

// Half of an unsigned E4M3 scale byte x (bias 7; bit 7 ignored except that only x == 0x7F, not
// 0xFF, is E4M3's NaN): 0x00 and 0x7F give 0; exponent 0 is subnormal, man * 2^-9. Every value
// is a normal f32 and every step below is exact.
fn dq_ue4m3_half(x: u32) -> f32 {
    if (x == 0u || x == 0x7Fu) {
        return 0.0;
    }
    let ex = (x >> 3u) & 0x0Fu;
    let man = f32(x & 7u);
    var raw: f32;
    if (ex == 0u) {
        raw = man * bitcast<f32>((127u - 9u) << 23u);
    } else {
        // man / 8 in the reference; the same exact value, without a GPU division.
        raw = (1.0 + man * 0.125) * bitcast<f32>((ex + 127u - 7u) << 23u);
    }
    return raw * 0.5;
}

// NVFP4, 36 bytes per 64 elements: u8 scales[4] (UE4M3) @0, qs[32] @4. Sub-block s (16
// elements) has scale byte s and codes qs[8s .. 8s + 8]: element i < 8 in the low nibble of
// byte i, element i + 8 in its high nibble. Chunk c is sub-blocks 2(c%2), 2(c%2) + 1 of block
// c/2.  y = ue4m3(scale) / 2 * (2 * e2m1)
fn dq32_nvfp4(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 36u * (c >> 1u);
    let h = c & 1u;
    let qs = dq_load16(b + 4u + 16u * h);
    var y: array<f32, 32>;
    for (var t = 0u; t < 2u; t++) {
        let d = dq_ue4m3_half(w_u8(b + 2u * h + t));
        for (var i = 0u; i < 8u; i++) {
            let q = dq_byte(qs, 8u * t + i);
            y[16u * t + i] = d * dq_e2m1x2(q & 0x0Fu);
            y[16u * t + i + 8u] = d * dq_e2m1x2(q >> 4u);
        }
    }
    return y;
}

// ---- 256-element K-quants ----------------------------------------------------------------------
// Chunk c is elements 32 * (c % 8) .. + 32 of super-block c / 8.

// Q2_K, 84 bytes: scales[16] @0 (scale | min << 4, one per group of 16), qs[64] @16, f16 d @80,
// f16 dmin @82. Element 128h + 32s + l (h < 2, s < 4, l < 32) is bits 2s..2s+2 of
// qs[32h + l]; its group is 8h + 2s + l / 16.  y = (d * sc) * q - dmin * m
fn dq32_q2_k(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 84u * (c >> 3u);
    let sub = c & 7u;
    let h = sub >> 2u;
    let s = sub & 3u;
    let d = w_f16(b + 80u);
    let dmin = w_f16(b + 82u);
    let sc2 = w_u16(b + 2u * sub); // scales of groups 2 * sub and 2 * sub + 1
    var y: array<f32, 32>;
    for (var k = 0u; k < 2u; k++) {
        let sc = (sc2 >> (8u * k)) & 0xFFu;
        let dl = d * f32(sc & 0x0Fu);
        let ml = dmin * f32(sc >> 4u);
        let qs = dq_load16(b + 16u + 32u * h + 16u * k);
        for (var l = 0u; l < 16u; l++) {
            y[16u * k + l] = dl * f32((dq_byte(qs, l) >> (2u * s)) & 3u) - ml;
        }
    }
    return y;
}

// Scale j (0..16) of Q3_K from its 12 packed bytes at byte address sb: low 4 bits in byte j % 8
// (low nibble for j < 8, high nibble otherwise), top 2 bits in byte 8 + j % 4 at bit 2 * (j / 4);
// stored with offset 32.
fn dq_q3_k_scale(sb: u32, j: u32) -> f32 {
    let lo = (w_u8(sb + (j & 7u)) >> (4u * (j >> 3u))) & 0x0Fu;
    let hi = (w_u8(sb + 8u + (j & 3u)) >> (2u * (j >> 2u))) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// Q3_K, 110 bytes: hmask[32] @0, qs[64] @32, scales[12] @96, f16 d @108. As Q2_K for the low
// 2 bits (qs[32h + l], shift 2s), with the third bit of element 128h + 32s + l in bit 4h + s of
// hmask[l]; a clear bit means "subtract 4".  y = (d * sc) * (q - 4 * !bit)
fn dq32_q3_k(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 110u * (c >> 3u);
    let sub = c & 7u;
    let h = sub >> 2u;
    let s = sub & 3u;
    let bit = 4u * h + s;
    let d = w_f16(b + 108u);
    var y: array<f32, 32>;
    for (var k = 0u; k < 2u; k++) {
        let dl = d * dq_q3_k_scale(b + 96u, 2u * sub + k);
        let qs = dq_load16(b + 32u + 32u * h + 16u * k);
        let hm = dq_load16(b + 16u * k);
        for (var l = 0u; l < 16u; l++) {
            let low = i32((dq_byte(qs, l) >> (2u * s)) & 3u);
            let sub4 = select(4, 0, ((dq_byte(hm, l) >> bit) & 1u) != 0u);
            y[16u * k + l] = dl * f32(low - sub4);
        }
    }
    return y;
}

// Scale and min j (0..8) of Q4_K/Q5_K, 6 bits each, from the 12 packed bytes at sb: for j < 4
// the low 6 bits of bytes j and j + 4; for j >= 4 a nibble of byte j + 4 plus the top 2 bits of
// bytes j - 4 and j as bits 4..6.
fn dq_scale_min_k4(sb: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(w_u8(sb + j) & 63u, w_u8(sb + j + 4u) & 63u);
    }
    let x = w_u8(sb + j + 4u);
    return vec2<u32>(
        (x & 0x0Fu) | ((w_u8(sb + j - 4u) >> 6u) << 4u),
        (x >> 4u) | ((w_u8(sb + j) >> 6u) << 4u),
    );
}

// Q4_K, 144 bytes: f16 d @0, f16 dmin @2, scales[12] @4, qs[128] @16. Group g (32 elements) is
// the low (g even) or high (g odd) nibbles of qs[32 * (g / 2) .. + 32].
// y = (d * sc) * q - dmin * m
fn dq32_q4_k(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 144u * (c >> 3u);
    let g = c & 7u;
    let d = w_f16(b);
    let dmin = w_f16(b + 2u);
    let sm = dq_scale_min_k4(b + 4u, g);
    let d1 = d * f32(sm.x);
    let m1 = dmin * f32(sm.y);
    let shift = 4u * (g & 1u);
    var y: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(b + 16u + 32u * (g >> 1u) + 16u * h);
        for (var l = 0u; l < 16u; l++) {
            y[16u * h + l] = d1 * f32((dq_byte(qs, l) >> shift) & 0x0Fu) - m1;
        }
    }
    return y;
}

// Q5_K, 176 bytes: f16 d @0, f16 dmin @2, scales[12] @4, qh[32] @16, qs[128] @48. As Q4_K, with
// bit 4 of group g's element l in bit g of qh[l].  y = (d * sc) * q - dmin * m
fn dq32_q5_k(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 176u * (c >> 3u);
    let g = c & 7u;
    let d = w_f16(b);
    let dmin = w_f16(b + 2u);
    let sm = dq_scale_min_k4(b + 4u, g);
    let d1 = d * f32(sm.x);
    let m1 = dmin * f32(sm.y);
    let shift = 4u * (g & 1u);
    var y: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(b + 48u + 32u * (g >> 1u) + 16u * h);
        let qh = dq_load16(b + 16u + 16u * h);
        for (var l = 0u; l < 16u; l++) {
            let v = ((dq_byte(qs, l) >> shift) & 0x0Fu) | (((dq_byte(qh, l) >> g) & 1u) << 4u);
            y[16u * h + l] = d1 * f32(v) - m1;
        }
    }
    return y;
}

// Q6_K, 210 bytes: ql[128] @0, qh[64] @128, i8 scales[16] @192, f16 d @208. Two halves of 128;
// element 128h + 32r + l (r < 4, l < 32) has its low 4 bits in the low (r < 2) or high (r >= 2)
// nibble of ql[64h + 32(r % 2) + l], its top 2 bits at shift 2r of qh[32h + l], and scale
// 8h + 2r + l / 16.  y = (d * sc) * (q - 32)
fn dq32_q6_k(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 210u * (c >> 3u);
    let sub = c & 7u;
    let h = sub >> 2u;
    let r = sub & 3u;
    let d = w_f16(b + 208u);
    let lshift = 4u * (r >> 1u);
    let hshift = 2u * r;
    var y: array<f32, 32>;
    for (var k = 0u; k < 2u; k++) {
        let sc = w_i8(b + 192u + 8u * h + 2u * r + k);
        let ql = dq_load16(b + 64u * h + 32u * (r & 1u) + 16u * k);
        let qh = dq_load16(b + 128u + 32u * h + 16u * k);
        for (var l = 0u; l < 16u; l++) {
            let q = ((dq_byte(ql, l) >> lshift) & 0x0Fu) | (((dq_byte(qh, l) >> hshift) & 3u) << 4u);
            y[16u * k + l] = d * sc * f32(i32(q) - 32);
        }
    }
    return y;
}

// Q8_K, 292 bytes: f32 d @0, i8 qs[256] @4, i16 bsums[16] @260 (unused here).  y = d * q
fn dq32_q8_k(row: u32, c: u32) -> array<f32, 32> {
    let b = row + 292u * (c >> 3u);
    let d = bitcast<f32>(dq_u32(b));
    let q0 = b + 4u + 32u * (c & 7u);
    var y: array<f32, 32>;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(q0 + 16u * h);
        for (var j = 0u; j < 16u; j++) {
            y[16u * h + j] = d * f32(dq_sext8(dq_byte(qs, j)));
        }
    }
    return y;
}
