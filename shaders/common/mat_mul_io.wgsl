// The parameter block and bindings of the prefill matmul kernels (mat_mul.wgsl's row kernel
// and mat_mul_tiled.wgsl): one layout, so the host launches either alike.

struct Params {
    m: u32,          // tokens
    n: u32,          // output features in this launch
    k: u32,          // inner dimension
    x_off: u32,      // x's first element
    w_off: u32,      // w's first byte
    w_row: u32,      // bytes per weight row
    y_off: u32,      // y's first element
    y_stride: u32,   // elements per y row
    y_col0: u32,     // y column of this launch's first feature
    nx: u32,         // workgroups along x (for the fold)
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> p: Params;
