// Fused decode-and-dot of one 32-element weight chunk with x (for the decode matvec): the
// including shader declares `w: array<u32>` and `x: array<f32>` and defines `x4(i)`, the four
// x values from i. Same decoding as dequant.wgsl (whose helpers these use), without arrays.

// Four 4-bit codes from the low (shift 0) or high (shift 4) nibbles of a word's bytes.
fn dt_nib4(wd: u32, shift: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(wd, wd >> 8u, wd >> 16u, wd >> 24u) >> vec4<u32>(shift)) & vec4<u32>(0xFu));
}

// Four signed bytes of a word.
fn dt_i8x4(wd: u32) -> vec4<f32> {
    let v = bitcast<vec4<i32>>(vec4<u32>(wd << 24u, wd << 16u, wd << 8u, wd)) >> vec4<u32>(24u);
    return vec4<f32>(v);
}

fn dot32_q4_1(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 20u * c;
    let d = w_f16(b);
    let m = w_f16(b + 2u);
    let qs = dq_load16(b + 4u);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s += dot(x4(xb + 4u * i), dt_nib4(qs[i], 0u) * d + m);
        s += dot(x4(xb + 16u + 4u * i), dt_nib4(qs[i], 4u) * d + m);
    }
    return s;
}

fn dot32_q8_0(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 34u * c;
    let d = w_f16(b);
    var s = 0.0;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(b + 2u + 16u * h);
        for (var i = 0u; i < 4u; i++) {
            s += dot(x4(xb + 16u * h + 4u * i), dt_i8x4(qs[i]) * d);
        }
    }
    return s;
}

// ---- helpers -----------------------------------------------------------------------------------

// The four bytes of a word.
fn dt_b4(wd: u32) -> vec4<u32> {
    return (vec4<u32>(wd) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
}

// Four 4-bit codes (as integers) from the low (shift 0) or high (shift 4) nibbles of a word's
// bytes.
fn dt_nib4u(wd: u32, shift: u32) -> vec4<u32> {
    return (dt_b4(wd) >> vec4<u32>(shift)) & vec4<u32>(0xFu);
}

// Bits `first` .. `first` + 4 of a word, one per component.
fn dt_bits4(wd: u32, first: u32) -> vec4<u32> {
    return (vec4<u32>(wd >> first) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u);
}

// dq_e2m1x2 of four codes (codes 0 and 8 both give +0.0, as there).
fn dt_e2m1x2(code: vec4<u32>) -> vec4<f32> {
    let mag = vec4<i32>((vec4<u32>(0xC8643210u) >> ((code & vec4<u32>(7u)) * 4u)) & vec4<u32>(0x0Fu));
    return vec4<f32>(select(mag, -mag, (code & vec4<u32>(8u)) != vec4<u32>(0u)));
}

// ---- floats ------------------------------------------------------------------------------------
// Whole chunks only (the caller runs these when K is a multiple of 32). f32 rows are 4-byte
// aligned (as for dq32_f32); f16/bf16 rows may start at any even address, so their 64-byte
// chunks are read through dq_load16, which takes any byte address.

fn dot32_f32(row: u32, c: u32, xb: u32) -> f32 {
    let i0 = (row >> 2u) + 32u * c;
    var s = 0.0;
    for (var i = 0u; i < 8u; i++) {
        let a = i0 + 4u * i;
        let wv = bitcast<vec4<f32>>(vec4<u32>(w[a], w[a + 1u], w[a + 2u], w[a + 3u]));
        s += dot(x4(xb + 4u * i), wv);
    }
    return s;
}

fn dot32_f16(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 64u * c;
    var s = 0.0;
    for (var h = 0u; h < 4u; h++) {
        let v = dq_load16(b + 16u * h);
        s += dot(x4(xb + 8u * h), vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)));
        s += dot(x4(xb + 8u * h + 4u), vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w)));
    }
    return s;
}

fn dot32_bf16(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 64u * c;
    let hi = vec4<u32>(0xFFFF0000u);
    var s = 0.0;
    for (var h = 0u; h < 4u; h++) {
        let v = dq_load16(b + 16u * h);
        // bf16 is the top half of an f32: the low half shifted up, the high half masked.
        let w0 = bitcast<vec4<f32>>(vec4<u32>(v.x << 16u, v.x, v.y << 16u, v.y) & hi);
        let w1 = bitcast<vec4<f32>>(vec4<u32>(v.z << 16u, v.z, v.w << 16u, v.w) & hi);
        s += dot(x4(xb + 8u * h), w0);
        s += dot(x4(xb + 8u * h + 4u), w1);
    }
    return s;
}

// ---- 32-element legacy formats -----------------------------------------------------------------
// Byte j of qs holds element j (low nibble) and j + 16 (high nibble): word i of the dq_load16
// run covers elements 4i .. 4i + 4 and 16 + 4i .. 16 + 4i + 4.

fn dot32_q4_0(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 18u * c;
    let d = w_f16(b);
    let qs = dq_load16(b + 2u);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        // f32(i32(q) - 8) is the exact small integer f32(q) - 8.
        s += dot(x4(xb + 4u * i), (dt_nib4(qs[i], 0u) - 8.0) * d);
        s += dot(x4(xb + 16u + 4u * i), (dt_nib4(qs[i], 4u) - 8.0) * d);
    }
    return s;
}

fn dot32_q5_0(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 22u * c;
    let d = w_f16(b);
    let qh = dq_u32(b + 2u);
    let qs = dq_load16(b + 6u);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let lo = dt_nib4u(qs[i], 0u) | (dt_bits4(qh, 4u * i) << vec4<u32>(4u));
        let hi = dt_nib4u(qs[i], 4u) | (dt_bits4(qh, 16u + 4u * i) << vec4<u32>(4u));
        s += dot(x4(xb + 4u * i), (vec4<f32>(lo) - 16.0) * d);
        s += dot(x4(xb + 16u + 4u * i), (vec4<f32>(hi) - 16.0) * d);
    }
    return s;
}

fn dot32_q5_1(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 24u * c;
    let d = w_f16(b);
    let m = w_f16(b + 2u);
    let qh = dq_u32(b + 4u);
    let qs = dq_load16(b + 8u);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let lo = dt_nib4u(qs[i], 0u) | (dt_bits4(qh, 4u * i) << vec4<u32>(4u));
        let hi = dt_nib4u(qs[i], 4u) | (dt_bits4(qh, 16u + 4u * i) << vec4<u32>(4u));
        s += dot(x4(xb + 4u * i), vec4<f32>(lo) * d + m);
        s += dot(x4(xb + 16u + 4u * i), vec4<f32>(hi) * d + m);
    }
    return s;
}

// ---- FP4 (E2M1) formats ------------------------------------------------------------------------

fn dot32_mxfp4(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 17u * c;
    let e = w_u8(b);
    let qs = dq_load16(b + 1u);
    var s = 0.0;
    if (e >= 2u) {
        let d = bitcast<f32>((e - 1u) << 23u);
        for (var i = 0u; i < 4u; i++) {
            s += dot(x4(xb + 4u * i), d * dt_e2m1x2(dt_nib4u(qs[i], 0u)));
            s += dot(x4(xb + 16u + 4u * i), d * dt_e2m1x2(dt_nib4u(qs[i], 4u)));
        }
    } else {
        // As dq32_mxfp4: the subnormal scale in two exact power-of-two steps.
        let d_hi = bitcast<f32>((e + 63u) << 23u);
        let d_lo = bitcast<f32>(63u << 23u);
        for (var i = 0u; i < 4u; i++) {
            s += dot(x4(xb + 4u * i), (dt_e2m1x2(dt_nib4u(qs[i], 0u)) * d_hi) * d_lo);
            s += dot(x4(xb + 16u + 4u * i), (dt_e2m1x2(dt_nib4u(qs[i], 4u)) * d_hi) * d_lo);
        }
    }
    return s;
}

// The IQ4 levels of four codes.
fn dt_iq4nl4(q: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(dq_iq4nl(q.x), dq_iq4nl(q.y), dq_iq4nl(q.z), dq_iq4nl(q.w));
}

// 16 bytes of IQ4 nibbles at byte address `q` times d, dotted with x from xb.
fn dt_iq4_run(q: u32, d: f32, xb: u32) -> f32 {
    let qs = dq_load16(q);
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s += dot(x4(xb + 4u * i), dt_iq4nl4(dt_nib4u(qs[i], 0u)) * d);
        s += dot(x4(xb + 16u + 4u * i), dt_iq4nl4(dt_nib4u(qs[i], 4u)) * d);
    }
    return s;
}

fn dot32_iq4_nl(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 18u * c;
    return dt_iq4_run(b + 2u, w_f16(b), xb);
}

fn dot32_iq4_xs(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 136u * (c / 8u);
    let g = c % 8u;
    return dt_iq4_run(b + 8u + 16u * g, dq_iq4_xs_scale(b, g), xb);
}

// Sub-block t of the chunk is words 2t, 2t + 1 of the run: word 2t + u holds elements
// 16t + 4u .. + 4 (low nibbles) and 16t + 8 + 4u .. + 4 (high nibbles).
fn dot32_nvfp4(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 36u * (c >> 1u);
    let h = c & 1u;
    let qs = dq_load16(b + 4u + 16u * h);
    var s = 0.0;
    for (var t = 0u; t < 2u; t++) {
        let d = dq_ue4m3_half(w_u8(b + 2u * h + t));
        for (var u = 0u; u < 2u; u++) {
            let wd = qs[2u * t + u];
            s += dot(x4(xb + 16u * t + 4u * u), d * dt_e2m1x2(dt_nib4u(wd, 0u)));
            s += dot(x4(xb + 16u * t + 8u + 4u * u), d * dt_e2m1x2(dt_nib4u(wd, 4u)));
        }
    }
    return s;
}

// ---- 256-element K-quants ----------------------------------------------------------------------
// Chunk c is elements 32 * (c % 8) .. + 32 of super-block c / 8; in each, the 16 elements
// 16k .. 16k + 16 come from one 16-byte run, word i giving elements 16k + 4i .. + 4.

fn dot32_q2_k(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 84u * (c >> 3u);
    let sub = c & 7u;
    let h = sub >> 2u;
    let s2 = 2u * (sub & 3u);
    let d = w_f16(b + 80u);
    let dmin = w_f16(b + 82u);
    let sc2 = w_u16(b + 2u * sub);
    var s = 0.0;
    for (var k = 0u; k < 2u; k++) {
        let sc = (sc2 >> (8u * k)) & 0xFFu;
        let dl = d * f32(sc & 0x0Fu);
        let ml = dmin * f32(sc >> 4u);
        let qs = dq_load16(b + 16u + 32u * h + 16u * k);
        for (var i = 0u; i < 4u; i++) {
            let q = (dt_b4(qs[i]) >> vec4<u32>(s2)) & vec4<u32>(3u);
            s += dot(x4(xb + 16u * k + 4u * i), dl * vec4<f32>(q) - ml);
        }
    }
    return s;
}

fn dot32_q3_k(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 110u * (c >> 3u);
    let sub = c & 7u;
    let h = sub >> 2u;
    let s2 = 2u * (sub & 3u);
    let bit = 4u * h + (sub & 3u);
    let d = w_f16(b + 108u);
    var s = 0.0;
    for (var k = 0u; k < 2u; k++) {
        let dl = d * dq_q3_k_scale(b + 96u, 2u * sub + k);
        let qs = dq_load16(b + 32u + 32u * h + 16u * k);
        let hm = dq_load16(b + 16u * k);
        for (var i = 0u; i < 4u; i++) {
            let low = (dt_b4(qs[i]) >> vec4<u32>(s2)) & vec4<u32>(3u);
            let hb = (dt_b4(hm[i]) >> vec4<u32>(bit)) & vec4<u32>(1u);
            // low - 4 * !bit = (low | bit << 2) - 4, exact small integers.
            let q = vec4<f32>(low | (hb << vec4<u32>(2u))) - 4.0;
            s += dot(x4(xb + 16u * k + 4u * i), dl * q);
        }
    }
    return s;
}

fn dot32_q4_k(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 144u * (c >> 3u);
    let g = c & 7u;
    let d = w_f16(b);
    let dmin = w_f16(b + 2u);
    let sm = dq_scale_min_k4(b + 4u, g);
    let d1 = d * f32(sm.x);
    let m1 = dmin * f32(sm.y);
    let shift = 4u * (g & 1u);
    var s = 0.0;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(b + 16u + 32u * (g >> 1u) + 16u * h);
        for (var i = 0u; i < 4u; i++) {
            s += dot(x4(xb + 16u * h + 4u * i), d1 * dt_nib4(qs[i], shift) - m1);
        }
    }
    return s;
}

fn dot32_q5_k(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 176u * (c >> 3u);
    let g = c & 7u;
    let d = w_f16(b);
    let dmin = w_f16(b + 2u);
    let sm = dq_scale_min_k4(b + 4u, g);
    let d1 = d * f32(sm.x);
    let m1 = dmin * f32(sm.y);
    let shift = 4u * (g & 1u);
    var s = 0.0;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(b + 48u + 32u * (g >> 1u) + 16u * h);
        let qh = dq_load16(b + 16u + 16u * h);
        for (var i = 0u; i < 4u; i++) {
            let hb = (dt_b4(qh[i]) >> vec4<u32>(g)) & vec4<u32>(1u);
            let v = dt_nib4u(qs[i], shift) | (hb << vec4<u32>(4u));
            s += dot(x4(xb + 16u * h + 4u * i), d1 * vec4<f32>(v) - m1);
        }
    }
    return s;
}

fn dot32_q6_k(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 210u * (c >> 3u);
    let sub = c & 7u;
    let h = sub >> 2u;
    let r = sub & 3u;
    let d = w_f16(b + 208u);
    let lshift = 4u * (r >> 1u);
    let hshift = 2u * r;
    var s = 0.0;
    for (var k = 0u; k < 2u; k++) {
        let sc = w_i8(b + 192u + 8u * h + 2u * r + k);
        let dsc = d * sc;
        let ql = dq_load16(b + 64u * h + 32u * (r & 1u) + 16u * k);
        let qh = dq_load16(b + 128u + 32u * h + 16u * k);
        for (var i = 0u; i < 4u; i++) {
            let q = dt_nib4u(ql[i], lshift) | (((dt_b4(qh[i]) >> vec4<u32>(hshift)) & vec4<u32>(3u)) << vec4<u32>(4u));
            // f32(i32(q) - 32) is the exact small integer f32(q) - 32.
            s += dot(x4(xb + 16u * k + 4u * i), dsc * (vec4<f32>(q) - 32.0));
        }
    }
    return s;
}

fn dot32_q8_k(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 292u * (c >> 3u);
    let d = bitcast<f32>(dq_u32(b));
    let q0 = b + 4u + 32u * (c & 7u);
    var s = 0.0;
    for (var h = 0u; h < 2u; h++) {
        let qs = dq_load16(q0 + 16u * h);
        for (var i = 0u; i < 4u; i++) {
            s += dot(x4(xb + 16u * h + 4u * i), d * dt_i8x4(qs[i]));
        }
    }
    return s;
}
