// LayerNorm on f32, one workgroup of 256 threads per row, in two passes over the row (the
// mean, then the variance about it, each reduced in workgroup memory):
//   y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * w + b

struct Params {
    rows: u32,
    d: u32,
    x_off: u32,
    w_off: u32,
    b_off: u32,
    y_off: u32,
    eps: f32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> p: Params;

var<workgroup> red: array<f32, 256>;

// The sum of `s` over the workgroup.
fn workgroup_sum(s: f32, li: u32) -> f32 {
    red[li] = s;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if (li < step) {
            red[li] += red[li + step];
        }
        workgroupBarrier();
    }
    let total = red[0];
    // Every thread has read the total before the next reduction overwrites it.
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(256)
fn layer_norm_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    let base = p.x_off + r * p.d;
    var s = 0.0;
    for (var j = li; j < p.d; j += 256u) {
        s += x[base + j];
    }
    let mean = workgroup_sum(s, li) / f32(p.d);
    var v = 0.0;
    for (var j = li; j < p.d; j += 256u) {
        let c = x[base + j] - mean;
        v += c * c;
    }
    let inv = 1.0 / sqrt(workgroup_sum(v, li) / f32(p.d) + p.eps);
    for (var j = li; j < p.d; j += 256u) {
        y[p.y_off + r * p.d + j] = (x[base + j] - mean) * inv * w[p.w_off + j] + b[p.b_off + j];
    }
}
