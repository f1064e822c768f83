// iquant_dot.wgsl: dot32_<fmt> of the formats of iquant.wgsl (after it and dot.wgsl): a chunk's
// 8-value points, each dotted with x as it is decoded.

fn dot32_iq2_xxs(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 66u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq2_xxs(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq2_xs(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 74u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq2_xs(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq2_s(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 82u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq2_s(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq3_xxs(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 98u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq3_xxs(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq3_s(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 110u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq3_s(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq1_s(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 50u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq1_s(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_iq1_m(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 56u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_iq1_m(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_tq1_0(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 54u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_tq1_0(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}

fn dot32_tq2_0(row: u32, c: u32, xb: u32) -> f32 {
    let b = row + 66u * (c / 8u);
    var s = 0.0;
    for (var l = 0u; l < 4u; l++) {
        let p = iq8_tq2_0(b, c % 8u, l);
        s += dot(x4(xb + 8u * l), p.lo) + dot(x4(xb + 8u * l + 4u), p.hi);
    }
    return s;
}
