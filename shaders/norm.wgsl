// Row norms on f32: one workgroup of 256 threads per row; the sum of squares is reduced in
// workgroup memory.
//   rms_norm: y = x / sqrt(mean(x^2) + eps) * w   (or * (1 + w) when one_plus)
//   l2_norm:  y = x / sqrt(sum(x^2) + eps)

struct Params {
    rows: u32,
    d: u32,
    x_off: u32,
    w_off: u32,
    y_off: u32,
    eps: f32,
    one_plus: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> p: Params;

var<workgroup> red: array<f32, 256>;

fn sum_squares(base: u32, li: u32) -> f32 {
    var s = 0.0;
    for (var j = li; j < p.d; j += 256u) {
        let v = x[base + j];
        s += v * v;
    }
    red[li] = s;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if (li < step) {
            red[li] += red[li + step];
        }
        workgroupBarrier();
    }
    return red[0];
}

@compute @workgroup_size(256)
fn rms_norm_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    let base = p.x_off + r * p.d;
    let ss = sum_squares(base, li);
    let inv = 1.0 / sqrt(ss / f32(p.d) + p.eps);
    for (var j = li; j < p.d; j += 256u) {
        var g = w[p.w_off + j];
        if (p.one_plus != 0u) {
            g = 1.0 + g;
        }
        y[p.y_off + r * p.d + j] = x[base + j] * inv * g;
    }
}

@compute @workgroup_size(256)
fn l2_norm_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    let base = p.x_off + r * p.d;
    let ss = sum_squares(base, li);
    let inv = 1.0 / sqrt(ss + p.eps);
    for (var j = li; j < p.d; j += 256u) {
        y[p.y_off + r * p.d + j] = x[base + j] * inv;
    }
}
