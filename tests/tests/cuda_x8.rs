//! The CUDA decode path over int8 activation parts (`kernels/mat_mul_vec_x8.cu`: quantize_x8,
//! then mat_vec_x8_q4_k) in a whole model, on the emulated kernels: a random-weight Llama-shaped
//! Q4_K checkpoint with rows of whole 256s (`fixtures/hf/gguf/llama_q4_k.gguf`, where every
//! projection and the head take that path) decodes with the CPU reference's logits, its
//! replayed decode steps (the quantized activations' scratch inside the graph) equal the steps
//! run op by op bit for bit, and each of its decode matmuls is the two launches it should be.

use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::engine::{Logits, Runner, RunnerConfig};
use kiln_core::exec::Executor;
use kiln_core::load::open_model;
use kiln_core::model::build_from_gguf;
use kiln_tests::{fixtures, greedy_logits};

fn runner(ex: Executor) -> Runner {
    let path = fixtures().join("hf/gguf/llama_q4_k.gguf");
    let file = open_model(&path).expect("checkpoint opens");
    let model = build_from_gguf(&file, &ex).expect("model builds");
    let cfg = RunnerConfig {
        max_batch_tokens: 16,
        block_size: 4,
        max_seqs: 2,
        ..RunnerConfig::default()
    };
    Runner::new(ex, model, cfg).expect("runner")
}

#[test]
fn a_q4_k_model_decodes_over_int8_activations_as_the_cpu_does() {
    let Some(emu) = kiln_tests::cuda_emu() else {
        return;
    };
    decodes_as_the_cpu(emu);
}

/// The same with the tensor-core form of the Q4_K kernel (MVX_MMA=1: one activation scale a
/// 256-value block, mma.m16n8k32 over 16 rows, the scaled group sums added as integers). Its
/// checkpoint's random scales and mins (unlike the conformance suite's quantized normal
/// values, whose mins barely differ between groups) catch a min applied to the wrong group.
#[test]
fn the_tensor_core_form_decodes_as_the_cpu_does() {
    if kiln_tests::cuda_emu().is_none() {
        return;
    }
    let emu: Arc<dyn Backend> =
        kiln_backend_cuda::emu::EmuBackend::open_with(Some("MVX_MMA=1")).expect("emulator builds");
    decodes_as_the_cpu(emu);
}

fn decodes_as_the_cpu(emu: Arc<dyn Backend>) {
    let prompt = [259u32, 283, 81, 223, 89, 81, 84, 78, 70];
    let cpu: Arc<dyn Backend> = Arc::new(CpuBackend::with_threads(1));
    let want = greedy_logits(&mut runner(Executor::new(cpu)), &prompt, 6).1;

    // Against the CPU reference: the int8 parts carry f32's precision (the bound in the
    // kernel file), so the logits agree to f32 rounding of a different summation order.
    let mut graphs = runner(Executor::new(emu.clone()).strict(true));
    let got = greedy_logits(&mut graphs, &prompt, 6).1;
    let scale = want
        .iter()
        .flatten()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(1e-6);
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(&want) {
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs());
        }
    }
    println!("emulated CUDA vs CPU: max |Δ| {worst:.3e} of logits up to {scale:.3}");
    assert!(
        worst <= 1e-4 * scale,
        "max |Δ| {worst} (logits up to {scale})"
    );
    assert!(
        graphs.forward().graph_stats().replayed >= 5,
        "{:?}",
        graphs.forward().graph_stats()
    );

    // Replayed from graphs or run op by op: the same bits.
    let mut ops = runner(Executor::new(emu.clone()).strict(true));
    ops.set_graphs(false);
    assert_eq!(
        greedy_logits(&mut ops, &prompt, 6).1,
        got,
        "replayed steps differ from op by op"
    );
}

/// Each decode matmul is quantize_x8 and the mat-vec: a decode step launches one more kernel
/// for each of a layer's four matmul groups (Q/K/V, output, gate/up, down) and for the head
/// than the f32 kernels do (`MV_X8=0`), which take one launch each.
#[test]
fn each_q4_k_decode_matmul_is_a_quantize_and_a_mat_vec_launch() {
    let Some(default) = kiln_tests::cuda_emu() else {
        return;
    };
    let f32_kernels: Arc<dyn Backend> =
        kiln_backend_cuda::emu::EmuBackend::open_with(Some("MV_X8=0")).expect("emulator builds");
    let launches = |b: &Arc<dyn Backend>| {
        let mut run = runner(Executor::new(b.clone()).strict(true));
        run.set_graphs(false);
        run.feed(1, &[259, 283, 81], Logits::Last).expect("prefill");
        let before = b.submit_stats().expect("counted").launches;
        run.feed(1, &[223], Logits::Last).expect("decode");
        b.submit_stats().expect("counted").launches - before
    };
    let (x8, plain) = (launches(&default), launches(&f32_kernels));
    println!("a decode step: {x8} launches over int8 activations, {plain} with the f32 kernels");
    let layers = 2;
    assert_eq!(x8, plain + 4 * layers + 1);
}
