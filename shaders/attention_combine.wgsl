// Merges the splits of paged attention: out[row, head, :] = sum_s e^(m_s - M) acc_s / sum_s
// e^(m_s - M) l_s. A row that sees no key gets zeros, as the CPU reference gives.

struct Params {
    rows: u32,      // query rows x heads
    dv: u32,
    splits: u32,
    y_off: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> p: Params;

@compute @workgroup_size(64)
fn paged_attention_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = (wid.x + wid.y * p.nx) * 64u + li;
    if (g >= p.rows * p.dv) {
        return;
    }
    let rh = g / p.dv;
    let dd = g % p.dv;
    let stride = p.dv + 2u;
    var mx = -3.0e38;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, part[(rh * p.splits + s) * stride]);
    }
    var l = 0.0;
    var acc = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let base = (rh * p.splits + s) * stride;
        let w = exp(part[base] - mx);
        l += w * part[base + 1u];
        acc += w * part[base + 2u + dd];
    }
    var out = 0.0;
    if (l > 0.0) {
        out = acc / l;
    }
    y[p.y_off + g] = out;
}
