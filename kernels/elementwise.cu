// Elementwise ops on f32: add and mul with row broadcast (b repeats every nb elements), scale,
// the unary activations (op codes as in kiln's UnaryOp order), GLU, and float casts.

extern "C" __global__ void add_f32(const float* a, const float* b, float* y, u32 n, u32 nb) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] + b[i % nb];
}

extern "C" __global__ void mul_f32(const float* a, const float* b, float* y, u32 n, u32 nb) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a[i] * b[i % nb];
}

extern "C" __global__ void scale_f32(const float* x, float* y, u32 n, float s) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s;
}

// op: 0 silu, 1 gelu_tanh, 2 sigmoid, 3 softplus, 4 exp, 5 neg, 6 tanh, 7 gelu_erf.
extern "C" __global__ void unary_f32(const float* x, float* y, u32 n, u32 op) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = x[i];
    float r;
    switch (op) {
        case 0: r = silu(v); break;
        case 1: r = gelu_tanh(v); break;
        case 2: r = 1.0f / (1.0f + __expf(-v)); break;
        case 3: r = softplus(v); break;
        case 4: r = __expf(v); break;
        case 5: r = -v; break;
        case 6: r = tanhf(v); break;
        default: r = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;
    }
    y[i] = r;
}

// act(gate) * up; act 0 silu (SwiGLU), 1 gelu_tanh (GeGLU).
extern "C" __global__ void glu_f32(const float* gate, const float* up, float* y, u32 n, u32 act) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    y[i] = (act == 0 ? silu(g) : gelu_tanh(g)) * up[i];
}

extern "C" __global__ void cast_f32_f16(const float* x, __half* y, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half_rn(x[i]);
}

extern "C" __global__ void cast_f32_bf16(const float* x, __nv_bfloat16* y, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

extern "C" __global__ void cast_f16_f32(const __half* x, float* y, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]);
}

extern "C" __global__ void cast_bf16_f32(const __nv_bfloat16* x, float* y, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __bfloat162float(x[i]);
}
