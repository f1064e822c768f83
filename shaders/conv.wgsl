// Causal depthwise conv1d with carried state over a batch of sequences.
// x [T, C], w [C, K], state [S, K-1, C], seq_start [S+1] -> y [T, C], state_out [S, K-1, C].
// Sequence s's window is its state (the K-1 inputs before it) followed by its tokens.
//   conv1d_f32:       one thread per (token, channel)
//   conv1d_state_f32: one thread per (sequence, state row, channel): the last K-1 window rows

struct Params {
    t: u32,
    c: u32,
    kw: u32,
    n_seqs: u32,
    x_off: u32,
    w_off: u32,
    st_off: u32,
    ss_off: u32,
    y_off: u32,
    silu: u32,
    nx: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<f32>;
@group(0) @binding(2) var<storage, read> state: array<f32>;
@group(0) @binding(3) var<storage, read> seq_start: array<i32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> p: Params;

// Row r of sequence s's window (state rows first), channel ch.
fn window(s: u32, a: u32, r: u32, ch: u32) -> f32 {
    let keep = p.kw - 1u;
    if (r < keep) {
        return state[p.st_off + (s * keep + r) * p.c + ch];
    }
    return x[p.x_off + (a + r - keep) * p.c + ch];
}

@compute @workgroup_size(256)
fn conv1d_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = (wid.x + wid.y * p.nx) * 256u + li;
    if (g >= p.t * p.c) {
        return;
    }
    let tok = g / p.c;
    let ch = g % p.c;
    var s = 0u;
    while (s + 1u < p.n_seqs && u32(seq_start[p.ss_off + s + 1u]) <= tok) {
        s += 1u;
    }
    let a = u32(seq_start[p.ss_off + s]);
    var acc = 0.0;
    for (var k = 0u; k < p.kw; k++) {
        acc += w[p.w_off + ch * p.kw + k] * window(s, a, tok - a + k, ch);
    }
    if (p.silu != 0u) {
        acc = acc / (1.0 + exp(-acc));
    }
    y[p.y_off + g] = acc;
}

@compute @workgroup_size(256)
fn conv1d_state_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let keep = p.kw - 1u;
    let g = (wid.x + wid.y * p.nx) * 256u + li;
    if (g >= p.n_seqs * keep * p.c) {
        return;
    }
    let s = g / (keep * p.c);
    let r = (g / p.c) % keep;
    let ch = g % p.c;
    let a = u32(seq_start[p.ss_off + s]);
    let len = u32(seq_start[p.ss_off + s + 1u]) - a;
    y[p.y_off + g] = window(s, a, len + r, ch);
}
