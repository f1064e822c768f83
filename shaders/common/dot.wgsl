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
