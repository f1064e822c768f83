// y[m, n] = sum_k x[m, k] * w[n, k], with w in any block format (template: DQ32 is the
// format's chunk decoder, ENTRY the entry point name).
//
// A workgroup of 64 threads computes ROWS = 4 output features for up to TM = 8 tokens: 16
// lanes per feature stride over the row's 32-element chunks, each chunk decoded once and
// dotted with all TM token rows, then the lanes are summed in workgroup memory. Workgroups
// are folded over x and z when there are more than the grid allows.

// Params and the bindings: common/mat_mul_io.wgsl.

const LANES: u32 = 16u;
const ROWS: u32 = 4u;
const TM: u32 = 8u;
// The reduction gives token t of a feature to lane t.
const_assert LANES >= TM;

var<workgroup> partial: array<f32, 512>; // 64 threads x TM

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let lane = li % LANES;
    let n = (wid.x + wid.z * p.nx) * ROWS + li / LANES;
    let m0 = wid.y * TM;
    var acc: array<f32, 8>;
    if (n < p.n) {
        let row = p.w_off + n * p.w_row;
        let chunks = (p.k + 31u) / 32u;
        let tm = min(TM, p.m - m0);
        for (var c = lane; c < chunks; c += LANES) {
            let wv = DQ32(row, c);
            let full = c * 32u + 32u <= p.k;
            for (var t = 0u; t < tm; t++) {
                let xb = p.x_off + (m0 + t) * p.k + c * 32u;
                var s = 0.0;
                if (full) {
                    // Constant bounds: the compiler unrolls this into vector dots.
                    for (var j = 0u; j < 32u; j += 4u) {
                        let xv = vec4<f32>(x[xb + j], x[xb + j + 1u], x[xb + j + 2u], x[xb + j + 3u]);
                        s += dot(xv, vec4<f32>(wv[j], wv[j + 1u], wv[j + 2u], wv[j + 3u]));
                    }
                } else {
                    for (var j = 0u; j < p.k - c * 32u; j++) {
                        s += x[xb + j] * wv[j];
                    }
                }
                acc[t] += s;
            }
        }
    }
    for (var t = 0u; t < TM; t++) {
        partial[li * TM + t] = acc[t];
    }
    workgroupBarrier();
    if (lane < TM && n < p.n) {
        let t = lane;
        if (m0 + t < p.m) {
            let base = (li - lane) * TM;
            var s = 0.0;
            for (var l = 0u; l < LANES; l++) {
                s += partial[base + l * TM + t];
            }
            y[p.y_off + (m0 + t) * p.y_stride + p.y_col0 + n] = s;
        }
    }
}
