// Float weight rows read as 32-element chunks, for the dtype-templated kernels (mat_mul,
// get_rows, mat_mul_id). The including shader declares `w: array<u32>`; `row` is the byte
// address of the row's first element. Chunks past the row's end are not read by callers
// (they stop at `lim`), so reads stay within the row.

fn fr_f32(byte: u32) -> f32 {
    return bitcast<f32>(w[byte >> 2u]);
}

fn fr_half_bits(byte: u32) -> u32 {
    return (w[byte >> 2u] >> ((byte & 2u) * 8u)) & 0xFFFFu;
}

fn dq32_f32(row: u32, c: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        out[j] = fr_f32(row + (c * 32u + j) * 4u);
    }
    return out;
}

fn dq32_f16(row: u32, c: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        out[j] = unpack2x16float(fr_half_bits(row + (c * 32u + j) * 2u)).x;
    }
    return out;
}

fn dq32_bf16(row: u32, c: u32) -> array<f32, 32> {
    var out: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        out[j] = bitcast<f32>(fr_half_bits(row + (c * 32u + j) * 2u) << 16u);
    }
    return out;
}
