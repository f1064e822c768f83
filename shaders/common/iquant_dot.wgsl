// iquant_dot.wgsl: dot32_<fmt> of the formats of iquant.wgsl (after it and dot.wgsl): a chunk's
// 8-value points, each dotted with x as it is decoded.

// Chunk c of a row of `bytes`-byte blocks of format `fmt` (iquant.wgsl's codes) dotted with x
// from xb.
fn iq_dot32(fmt: u32, bytes: u32, row: u32, c: u32, xb: u32) -> f32 {
    let b = row + bytes * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8(fmt, b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq2_xxs(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(0u, 66u, row, c, xb);
}
fn dot32_iq2_xs(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(1u, 74u, row, c, xb);
}
fn dot32_iq2_s(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(2u, 82u, row, c, xb);
}
fn dot32_iq3_xxs(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(3u, 98u, row, c, xb);
}
fn dot32_iq3_s(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(4u, 110u, row, c, xb);
}
fn dot32_iq1_s(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(5u, 50u, row, c, xb);
}
fn dot32_iq1_m(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(6u, 56u, row, c, xb);
}
fn dot32_tq1_0(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(7u, 54u, row, c, xb);
}
fn dot32_tq2_0(row: u32, c: u32, xb: u32) -> f32 {
    return iq_dot32(8u, 66u, row, c, xb);
}
