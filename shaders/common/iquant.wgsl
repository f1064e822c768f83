// iquant.wgsl: decoders of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S,
// IQ1_M) and the ternary formats (TQ1_0, TQ2_0), after dequant.wgsl. The grids are one table
// in memory at binding 15 (kiln_core::quant::iq_grid_words, uploaded once per device; the
// launcher binds it to every kernel that declares it): a WGSL constant array indexed at run
// time is copied into a local variable at every access. All are 256-element blocks with an
// f16 d; chunk c of a row is group c % 8 of block c / 8, and each 8 values of a group are one
// point: iq8_<fmt>(b, g, l) decodes point l of group g of the block at byte b, iq8(code, ..)
// that of the format coded `code` (the codes at iq8). Public: dq32_<fmt>(row, c), as
// dequant.wgsl's.
//
// The values are the CPU reference's (core/src/quant/iquants.rs) bits: (scale · coordinate)
// negated by a sign bit, or scale · (coordinate ± 1/8) for IQ1, or d · (trit - 1), each one
// rounding in f32 after exact steps, so no reordering or fma can change them.

@group(0) @binding(15) var<storage, read> iq_grid: array<u32>;

// Each grid's first word in iq_grid (kiln_core::quant::IQ_GRID_OFFSETS); a point of 8
// coordinates is two words, of 4 one.
const IQ2XXS_AT = 0u;
const IQ2XS_AT = 512u;
const IQ2S_AT = 1536u;
const IQ3XXS_AT = 3584u;
const IQ3S_AT = 3840u;
const IQ1S_AT = 4352u;

// A point's 8 values.
struct Iq8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// The four bytes of a word, unsigned and signed.
fn iq_b4(wd: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(wd) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu));
}
fn iq_i4(wd: u32) -> vec4<f32> {
    return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(wd << 24u, wd << 16u, wd << 8u, wd)) >> vec4<u32>(24u));
}

// t negated where sign bits first .. first + 4 are set.
fn iq_sign4(t: vec4<f32>, signs: u32, first: u32) -> vec4<f32> {
    let neg = ((vec4<u32>(signs >> first) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u)) == vec4<u32>(1u);
    return select(t, -t, neg);
}

// The 8 signs of a 7-bit sign index; bit 7 makes the count of set bits even.
fn iq_ksigns(i: u32) -> u32 {
    let j = i & 0x7Fu;
    return j | ((countOneBits(j) & 1u) << 7u);
}

// An IQ2 point (two grid words) times db, signed.
fn iq_point8(db: f32, lo: u32, hi: u32, signs: u32) -> Iq8 {
    return Iq8(iq_sign4(db * iq_b4(lo), signs, 0u), iq_sign4(db * iq_b4(hi), signs, 4u));
}

// An IQ2 group's half scale: d · (0.5 + 4-bit scale l < 2 ? low : high) · 0.25.
fn iq2_db(b: u32, sc: u32, l: u32) -> f32 {
    return w_f16(b) * (0.5 + f32(select(sc >> 4u, sc & 0xFu, l < 2u))) * 0.25;
}

// IQ2_XXS, 66 bytes: d, then per group 4 grid indices and a word of four 7-bit sign indices
// under a 4-bit scale.
fn iq8_iq2_xxs(b: u32, g: u32, l: u32) -> Iq8 {
    let aux = dq_u32(b + 6u + 8u * g);
    let db = w_f16(b) * (0.5 + f32(aux >> 28u)) * 0.25;
    let p = 2u * w_u8(b + 2u + 8u * g + l);
    return iq_point8(db, iq_grid[IQ2XXS_AT + p], iq_grid[IQ2XXS_AT + p + 1u], iq_ksigns(aux >> (7u * l)));
}

// IQ2_XS, 74 bytes: d, 32 u16 (9-bit index, 7-bit sign index), 8 bytes of two 4-bit scales.
fn iq8_iq2_xs(b: u32, g: u32, l: u32) -> Iq8 {
    let q = w_u16(b + 2u + 2u * (4u * g + l));
    let p = 2u * (q & 511u);
    return iq_point8(iq2_db(b, w_u8(b + 66u + g), l), iq_grid[IQ2XS_AT + p], iq_grid[IQ2XS_AT + p + 1u], iq_ksigns(q >> 9u));
}

// IQ2_S, 82 bytes: d, 32 low index bytes, 32 sign bytes, 8 bytes of 2 high index bits a point,
// 8 bytes of two 4-bit scales.
fn iq8_iq2_s(b: u32, g: u32, l: u32) -> Iq8 {
    let idx = w_u8(b + 2u + 4u * g + l) | (((w_u8(b + 66u + g) >> (2u * l)) & 3u) << 8u);
    let p = 2u * idx;
    return iq_point8(iq2_db(b, w_u8(b + 74u + g), l), iq_grid[IQ2S_AT + p], iq_grid[IQ2S_AT + p + 1u], w_u8(b + 34u + 4u * g + l));
}

// IQ3_XXS, 98 bytes: d, 64 grid indices of 4 coordinates, a word per group as IQ2_XXS's.
fn iq8_iq3_xxs(b: u32, g: u32, l: u32) -> Iq8 {
    let aux = dq_u32(b + 66u + 4u * g);
    let db = w_f16(b) * (0.5 + f32(aux >> 28u)) * 0.5;
    let s = iq_ksigns(aux >> (7u * l));
    let q = b + 2u + 8u * g + 2u * l;
    return Iq8(iq_sign4(db * iq_b4(iq_grid[IQ3XXS_AT + w_u8(q)]), s, 0u), iq_sign4(db * iq_b4(iq_grid[IQ3XXS_AT + w_u8(q + 1u)]), s, 4u));
}

// IQ3_S, 110 bytes: d, 64 low index bytes, 8 bytes of 9th bits, 32 sign bytes, 4 bytes of two
// 4-bit scales; db = d · (1 + 2 · scale).
fn iq8_iq3_s(b: u32, g: u32, l: u32) -> Iq8 {
    let sc = (w_u8(b + 106u + g / 2u) >> (4u * (g % 2u))) & 0xFu;
    let db = w_f16(b) * f32(1u + 2u * sc);
    let s = w_u8(b + 74u + 4u * g + l);
    let qh = w_u8(b + 66u + g);
    let i0 = 8u * g + 2u * l;
    let i_lo = w_u8(b + 2u + i0) | (((qh >> (2u * l)) & 1u) << 8u);
    let i_hi = w_u8(b + 3u + i0) | (((qh >> (2u * l + 1u)) & 1u) << 8u);
    return Iq8(iq_sign4(db * iq_b4(iq_grid[IQ3S_AT + i_lo]), s, 0u), iq_sign4(db * iq_b4(iq_grid[IQ3S_AT + i_hi]), s, 4u));
}

// An IQ1 point: dl · (coordinate + delta), coordinates -1, 0, 1 as signed bytes.
fn iq_point1(dl: f32, idx: u32, delta: f32) -> Iq8 {
    return Iq8(dl * (iq_i4(iq_grid[IQ1S_AT + 2u * idx]) + delta), dl * (iq_i4(iq_grid[IQ1S_AT + 2u * idx + 1u]) + delta));
}

// IQ1_S, 50 bytes: d, 32 low index bytes, a u16 a group (3 high index bits a point, a 3-bit
// scale, delta's sign on top).
fn iq8_iq1_s(b: u32, g: u32, l: u32) -> Iq8 {
    let qh = w_u16(b + 34u + 2u * g);
    let dl = w_f16(b) * f32(2u * ((qh >> 12u) & 7u) + 1u);
    let delta = select(0.125, -0.125, (qh & 0x8000u) != 0u);
    return iq_point1(dl, w_u8(b + 2u + 4u * g + l) | (((qh >> (3u * l)) & 7u) << 8u), delta);
}

// IQ1_M, 56 bytes: 32 low index bytes, 16 bytes of a nibble a point (3 high index bits, delta's
// sign), four u16 of 3-bit scales whose top nibbles make the f16 d.
fn iq8_iq1_m(b: u32, g: u32, l: u32) -> Iq8 {
    let i = 4u * g + l;
    let k = i / 2u;
    let bits = (w_u16(b + 48u) >> 12u) | ((w_u16(b + 50u) >> 8u) & 0xF0u) | ((w_u16(b + 52u) >> 4u) & 0xF00u)
        | (w_u16(b + 54u) & 0xF000u);
    let sk = w_u16(b + 48u + 2u * (k / 4u));
    let dl = unpack2x16float(bits).x * f32(2u * ((sk >> (3u * (k % 4u))) & 7u) + 1u);
    let nib = (w_u8(b + 32u + i / 2u) >> (4u * (i % 2u))) & 0xFu;
    let delta = select(0.125, -0.125, (nib & 8u) != 0u);
    return iq_point1(dl, w_u8(b + i) | ((nib & 7u) << 8u), delta);
}

// d · (trit - 1) of four TQ1_0 bytes' trit (byte · p mod 256 · 3) >> 8, p = 3^n.
fn tq1_4(wd: u32, p: u32, d: f32) -> vec4<f32> {
    let bytes = (vec4<u32>(wd) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xFFu);
    let t = (((bytes * p) & vec4<u32>(0xFFu)) * 3u) >> vec4<u32>(8u);
    return d * (vec4<f32>(t) - 1.0);
}

// TQ1_0, 54 bytes: 48 bytes of 5 trits (values 32n + m from byte m; 160 + 16n + m from byte
// 32 + m), 4 bytes of 4 (240 + 4n + m from byte 48 + m), d last.
fn iq8_tq1_0(b: u32, g: u32, l: u32) -> Iq8 {
    let e = 32u * g + 8u * l;
    let d = w_f16(b + 52u);
    if (e < 240u) {
        let off = select(32u + (e - 160u) % 16u, e % 32u, e < 160u);
        let n = select((e - 160u) / 16u, e / 32u, e < 160u);
        let p = array<u32, 5>(1u, 3u, 9u, 27u, 81u)[n];
        return Iq8(tq1_4(dq_u32(b + off), p, d), tq1_4(dq_u32(b + off + 4u), p, d));
    }
    let n = (e - 240u) / 4u;
    let p = select(9u, 1u, n == 0u);
    let wd = dq_u32(b + 48u);
    return Iq8(tq1_4(wd, p, d), tq1_4(wd, 3u * p, d));
}

// d · (code - 1) of four 2-bit codes (bits `shift` of each byte of a word).
fn tq2_4(wd: u32, shift: u32, d: f32) -> vec4<f32> {
    let q = (vec4<u32>(wd) >> vec4<u32>(shift, shift + 8u, shift + 16u, shift + 24u)) & vec4<u32>(3u);
    return d * (vec4<f32>(q) - 1.0);
}

// TQ2_0, 66 bytes: 64 bytes of 2-bit codes (value 128h + 32l + m: bits 2l of byte 32h + m), d
// last.
fn iq8_tq2_0(b: u32, g: u32, l: u32) -> Iq8 {
    let d = w_f16(b + 64u);
    let q = b + 32u * (g / 4u) + 8u * l;
    let shift = 2u * (g % 4u);
    return Iq8(tq2_4(dq_u32(q), shift, d), tq2_4(dq_u32(q + 4u), shift, d));
}

// Point l's 8 values into y[8l ..].
fn iq_put(y: ptr<function, array<f32, 32>>, l: u32, p: Iq8) {
    for (var j = 0u; j < 4u; j++) {
        (*y)[8u * l + j] = p.lo[j];
        (*y)[8u * l + 4u + j] = p.hi[j];
    }
}

// Point l of group g of the block at b, in the format of code `fmt`: 0 IQ2_XXS, 1 IQ2_XS,
// 2 IQ2_S, 3 IQ3_XXS, 4 IQ3_S, 5 IQ1_S, 6 IQ1_M, 7 TQ1_0, 8 TQ2_0 (a constant at every call, so
// the compiler keeps one branch).
fn iq8(fmt: u32, b: u32, g: u32, l: u32) -> Iq8 {
    switch fmt {
        case 0u: {
            return iq8_iq2_xxs(b, g, l);
        }
        case 1u: {
            return iq8_iq2_xs(b, g, l);
        }
        case 2u: {
            return iq8_iq2_s(b, g, l);
        }
        case 3u: {
            return iq8_iq3_xxs(b, g, l);
        }
        case 4u: {
            return iq8_iq3_s(b, g, l);
        }
        case 5u: {
            return iq8_iq1_s(b, g, l);
        }
        case 6u: {
            return iq8_iq1_m(b, g, l);
        }
        case 7u: {
            return iq8_tq1_0(b, g, l);
        }
        default: {
            return iq8_tq2_0(b, g, l);
        }
    }
}

// Chunk c of a row of `bytes`-byte blocks of format `fmt`.
fn iq_dq32(fmt: u32, bytes: u32, row: u32, c: u32) -> array<f32, 32> {
    let b = row + bytes * (c / 8u);
    var y: array<f32, 32>;
    for (var l = 0u; l < 4u; l++) {
        iq_put(&y, l, iq8(fmt, b, c % 8u, l));
    }
    return y;
}

fn dq32_iq2_xxs(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(0u, 66u, row, c);
}
fn dq32_iq2_xs(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(1u, 74u, row, c);
}
fn dq32_iq2_s(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(2u, 82u, row, c);
}
fn dq32_iq3_xxs(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(3u, 98u, row, c);
}
fn dq32_iq3_s(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(4u, 110u, row, c);
}
fn dq32_iq1_s(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(5u, 50u, row, c);
}
fn dq32_iq1_m(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(6u, 56u, row, c);
}
fn dq32_tq1_0(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(7u, 54u, row, c);
}
fn dq32_tq2_0(row: u32, c: u32) -> array<f32, 32> {
    return iq_dq32(8u, 66u, row, c);
}
