// Row softmax of x * scale, soft-capped, plus an optional additive mask [R', N] (row r uses
// mask row r % R'). One workgroup of 256 threads per row; a row that is all -inf gives
// zeros, as the CPU reference does.

struct Params {
    rows: u32,
    n: u32,
    x_off: u32,
    m_off: u32,
    m_rows: u32,     // 0: no mask
    y_off: u32,
    scale: f32,
    soft_cap: f32,   // 0: none
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> mask: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> p: Params;

var<workgroup> red: array<f32, 256>;
var<workgroup> finite: atomic<u32>;

fn logit(r: u32, j: u32) -> f32 {
    var v = x[p.x_off + r * p.n + j] * p.scale;
    if (p.soft_cap != 0.0) {
        v = p.soft_cap * tanh(clamp(v / p.soft_cap, -15.0, 15.0));
    }
    if (p.m_rows != 0u) {
        v += mask[p.m_off + (r % p.m_rows) * p.n + j];
    }
    return v;
}

@compute @workgroup_size(256)
fn softmax_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * p.nx;
    if (r >= p.rows) {
        return;
    }
    if (li == 0u) {
        atomicStore(&finite, 0u);
    }
    workgroupBarrier();
    var mx = -0x1.fffffep+127f;
    for (var j = li; j < p.n; j += 256u) {
        let v = logit(r, j);
        if (v >= -0x1.fffffep+127f) {
            atomicStore(&finite, 1u);
            mx = max(mx, v);
        }
    }
    red[li] = mx;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if (li < step) {
            red[li] = max(red[li], red[li + step]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var j = li; j < p.n; j += 256u) {
        s += exp(logit(r, j) - m);
    }
    red[li] = s;
    workgroupBarrier();
    for (var step = 128u; step > 0u; step >>= 1u) {
        if (li < step) {
            red[li] += red[li + step];
        }
        workgroupBarrier();
    }
    let total = red[0];
    let all_masked = atomicLoad(&finite) == 0u;
    for (var j = li; j < p.n; j += 256u) {
        var v = 0.0;
        if (!all_masked) {
            v = exp(logit(r, j) - m) * (1.0 / total);
        }
        y[p.y_off + r * p.n + j] = v;
    }
}
