// y[m, n] = sum_k x[m, k] * w[n, k] for many tokens (prefill), w in any block format
// (template: DQ32 is the format's chunk decoder, ENTRY the entry point name).
//
// Tiled through workgroup memory: a workgroup of 64 threads owns a tile of BM = 64 tokens by
// BN = 64 output features and walks the inner dimension one 32-element chunk at a time. Per
// chunk, thread t decodes feature t's chunk once (each weight chunk is decoded once per 64
// tokens) and the threads copy the 64 x 32 activation tile in together; then each thread
// accumulates 8 tokens x 8 features from the two tiles, two 4-token vector multiply-adds per
// feature and inner index. Workgroup memory: 8 KiB of weights + 8 KiB of activations, the
// 16 KiB every WebGPU device offers. Values past the inner dimension (float rows whose length
// is not a multiple of 32) and tokens or features past the edges are zeros in the tiles and
// are not written.

// Params and the bindings: common/mat_mul_io.wgsl.

const BM: u32 = 64u;
const BN: u32 = 64u;
// ws[kk * BN + n]: the decoded weight chunks, inner index major. Thread t writes column t and
// thread t reads columns t % 8 + 8q, so neighbouring threads touch neighbouring words.
var<workgroup> ws: array<f32, 2048>;
// xs[kk * BM/4 + m/4][m % 4]: the activation tile, inner index major; the 8 threads that share
// a token group read the same vector.
var<workgroup> xs: array<vec4<f32>, 512>;

@compute @workgroup_size(64)
fn ENTRY(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n0 = (wid.x + wid.z * p.nx) * BN;
    let m0 = wid.y * BM;
    // This thread's outputs: tokens ty*4 .. +4 and 32+ty*4 .. +4 of the tile, features tx + 8q
    // (q < 8).
    let tx = li % 8u;
    let ty = li / 8u;
    var acc: array<vec4<f32>, 8>; // acc[q]: feature tx + 8q for tokens ty*4 .. +4
    var acc2: array<vec4<f32>, 8>; // the same for tokens 32 + ty*4 .. +4
    let chunks = (p.k + 31u) / 32u;
    let n_dec = n0 + li;
    let row = p.w_off + n_dec * p.w_row;
    for (var c = 0u; c < chunks; c++) {
        let kc = c * 32u;
        // Weight tile: feature n0+li's chunk c.
        if (n_dec < p.n) {
            let wv = DQ32(row, c);
            for (var j = 0u; j < 32u; j++) {
                var v = wv[j];
                if (kc + j >= p.k) {
                    v = 0.0;
                }
                ws[j * BN + li] = v;
            }
        } else {
            for (var j = 0u; j < 32u; j++) {
                ws[j * BN + li] = 0.0;
            }
        }
        // Activation tile: 32 consecutive threads read one token's 32 values (coalesced).
        let kk = li & 31u;
        for (var i = 0u; i < 32u; i++) {
            let mt = (li >> 5u) + 2u * i;
            var v = 0.0;
            if (m0 + mt < p.m && kc + kk < p.k) {
                v = x[p.x_off + (m0 + mt) * p.k + kc + kk];
            }
            xs[kk * 16u + (mt >> 2u)][mt & 3u] = v;
        }
        workgroupBarrier();
        for (var j = 0u; j < 32u; j++) {
            let a = xs[j * 16u + ty];
            let a2 = xs[j * 16u + 8u + ty];
            let b = j * BN + tx;
            for (var q = 0u; q < 8u; q++) {
                let wq = ws[b + 8u * q];
                acc[q] += a * wq;
                acc2[q] += a2 * wq;
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let m = m0 + ty * 4u + i;
        let m2 = m + 32u;
        for (var q = 0u; q < 8u; q++) {
            let n = n0 + tx + 8u * q;
            if (n < p.n) {
                if (m < p.m) {
                    y[p.y_off + m * p.y_stride + p.y_col0 + n] = acc[q][i];
                }
                if (m2 < p.m) {
                    y[p.y_off + m2 * p.y_stride + p.y_col0 + n] = acc2[q][i];
                }
            }
        }
    }
}
