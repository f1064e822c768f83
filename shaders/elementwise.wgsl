// Elementwise ops on f32: binary ops with row broadcast, scale, activations, gated linear
// units, and word copies. One thread per element; the grid is folded over x and y.

struct Params {
    n: u32,        // output elements
    a_off: u32,
    b_off: u32,
    y_off: u32,
    b_n: u32,      // elements of b; b[i % b_n] pairs with a[i] (row broadcast)
    scale: f32,
    nx: u32,       // workgroups along x
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> p: Params;

fn index(wid: vec3<u32>, li: u32) -> u32 {
    return (wid.x + wid.y * p.nx) * 256u + li;
}

fn sigmoid(v: f32) -> f32 {
    return 1.0 / (1.0 + exp(-v));
}

// tanh saturates to +-1 in f32 beyond |v| = 10; clamping keeps exp-based implementations
// from computing inf/inf.
fn tanh_safe(v: f32) -> f32 {
    return tanh(clamp(v, -15.0, 15.0));
}

fn gelu_tanh(v: f32) -> f32 {
    return 0.5 * v * (1.0 + tanh_safe(0.7978846 * (v + 0.044715 * v * v * v)));
}

// erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7), odd in v.
fn erf_as(v: f32) -> f32 {
    let z = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * z);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return sign(v) * (1.0 - poly * exp(-z * z));
}

fn gelu_erf(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_as(v * 0.70710678));
}

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

@compute @workgroup_size(256)
fn add_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        y[p.y_off + i] = a[p.a_off + i] + b[p.b_off + i % p.b_n];
    }
}

@compute @workgroup_size(256)
fn mul_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        y[p.y_off + i] = a[p.a_off + i] * b[p.b_off + i % p.b_n];
    }
}

@compute @workgroup_size(256)
fn scale_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        y[p.y_off + i] = a[p.a_off + i] * p.scale;
    }
}

// The activations, by code (one entry point each below).
const SILU: u32 = 0u;
const GELU_TANH: u32 = 1u;
const GELU_ERF: u32 = 7u;
const SIGMOID: u32 = 2u;
const SOFTPLUS: u32 = 3u;
const EXP: u32 = 4u;
const NEG: u32 = 5u;
const TANH: u32 = 6u;

fn activation(code: u32, v: f32) -> f32 {
    switch code {
        case SILU: { return v * sigmoid(v); }
        case GELU_TANH: { return gelu_tanh(v); }
        case GELU_ERF: { return gelu_erf(v); }
        case SIGMOID: { return sigmoid(v); }
        case SOFTPLUS: { return softplus(v); }
        case EXP: { return exp(v); }
        case NEG: { return -v; }
        case TANH, default: { return tanh_safe(v); }
    }
}

// y = activation(a), one element per thread.
fn unary(wid: vec3<u32>, li: u32, code: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        y[p.y_off + i] = activation(code, a[p.a_off + i]);
    }
}

@compute @workgroup_size(256)
fn silu_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, SILU);
}

@compute @workgroup_size(256)
fn gelu_tanh_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, GELU_TANH);
}

@compute @workgroup_size(256)
fn sigmoid_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, SIGMOID);
}

@compute @workgroup_size(256)
fn softplus_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, SOFTPLUS);
}

@compute @workgroup_size(256)
fn exp_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, EXP);
}

@compute @workgroup_size(256)
fn neg_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, NEG);
}

@compute @workgroup_size(256)
fn tanh_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, TANH);
}

@compute @workgroup_size(256)
fn gelu_erf_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    unary(wid, li, GELU_ERF);
}

// Gated linear units: a is the gate, b the up projection (same shape).
@compute @workgroup_size(256)
fn swiglu_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        let g = a[p.a_off + i];
        y[p.y_off + i] = g * sigmoid(g) * b[p.b_off + i];
    }
}

@compute @workgroup_size(256)
fn geglu_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        y[p.y_off + i] = gelu_tanh(a[p.a_off + i]) * b[p.b_off + i];
    }
}
