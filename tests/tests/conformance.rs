//! The conformance suite on every backend available here, against the CPU reference.

use std::collections::BTreeSet;
use std::sync::Arc;

use kiln_core::backend::Backend;
use kiln_core::cpu::CpuBackend;
use kiln_core::validate::{cases, run_all, tally, Status};
use kiln_tests::{optional_backend, FakeDevice};

fn check_backend(b: &dyn Backend) {
    let reference = CpuBackend::with_threads(1);
    let results = run_all(None, &reference, b, false, |_| {}).expect("case table builds");
    let (pass, fail, unsupported) = tally(&results);
    for r in &results {
        if let Status::Fail(m) = &r.status {
            eprintln!("FAIL {} {} on {}: {m}", r.op, r.case, r.backend);
        }
    }
    println!(
        "{}: {pass} passed, {fail} failed, {unsupported} not supported",
        b.name()
    );
    assert_eq!(fail, 0, "conformance failures on {}", b.name());
    // A backend that claims no case would pass by running nothing.
    assert!(
        pass > 0,
        "{} claims none of the {} conformance cases",
        b.name(),
        results.len()
    );
}

/// The suite fails a backend that claims nothing (so a broken `supports_op` cannot pass it).
#[test]
fn a_backend_that_claims_no_case_fails_the_suite() {
    let mute = FakeDevice::new("mute", |_| false);
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_backend(&mute)));
    assert!(outcome.is_err(), "a backend that ran nothing passed");
}

#[test]
fn the_case_table_covers_every_op_at_decode_and_prefill_sizes() {
    let all = cases().expect("case table builds");
    let names: BTreeSet<&str> = all.iter().map(|c| c.op.name()).collect();
    let expected = kiln_core::op::Op::names();
    for e in &expected {
        assert!(names.contains(e), "no conformance case for {e}");
    }
    assert_eq!(
        names.len(),
        expected.len(),
        "cases for ops Op::names() does not list: {names:?}"
    );
    // Every matmul weight type, at decode (m=1) and prefill (m>1).
    for w in kiln_core::DType::ALL.iter().filter(|d| !d.is_int()) {
        for phase in ["decode", "prefill"] {
            assert!(
                all.iter().any(
                    |c| c.op.name() == "mat_mul" && c.label.contains(&format!("x {w} {phase}"))
                ),
                "no {phase} mat_mul case for {w}"
            );
        }
    }
    // Every case is a valid call.
    for c in &all {
        c.desc()
            .check()
            .unwrap_or_else(|e| panic!("{} {}: {e}", c.op.name(), c.label));
    }
}

/// The CPU backend on several threads against the one-thread reference: splitting work across
/// threads must change nothing, and no output may be written out of bounds.
#[test]
fn cpu_multithreaded_matches_the_single_threaded_reference() {
    let b = CpuBackend::with_threads(3);
    check_backend(&b);
}

#[test]
fn wgpu_conformance() {
    if let Some(b) = optional_backend("wgpu", kiln_backend_wgpu::open) {
        check_backend(b.as_ref());
    }
}

#[test]
fn cuda_conformance() {
    if let Some(b) = optional_backend("cuda", kiln_backend_cuda::open_unchecked) {
        check_backend(b.as_ref());
    }
}

/// A backend that writes past its output is caught by the guard regions.
#[test]
fn guard_regions_catch_an_out_of_bounds_write() {
    use kiln_core::tensor::{Tensor, TensorDesc};

    /// Scribbles one element past the end of output 0.
    fn scribble(cpu: &CpuBackend, o: &[&Tensor]) -> kiln_core::Result<()> {
        let o0 = o[0];
        let wider = Tensor::new(
            o0.storage().clone(),
            o0.offset(),
            TensorDesc::new(o0.dtype(), [o0.numel() + 1]),
        )?;
        let mut bytes = cpu.download(&wider)?;
        let n = bytes.len();
        bytes[n - 1] ^= 0xFF;
        cpu.upload(&wider, &bytes)
    }
    let mut sloppy = FakeDevice::new("sloppy", |_| true);
    sloppy.after = Some(scribble);
    let reference = CpuBackend::with_threads(1);
    let sloppy: Arc<dyn Backend> = Arc::new(sloppy);
    let results =
        run_all(Some("rms_norm"), &reference, sloppy.as_ref(), false, |_| {}).expect("cases");
    assert!(!results.is_empty());
    for r in results {
        match r.status {
            Status::Fail(m) => assert!(m.contains("outside its bounds"), "{m}"),
            s => panic!("{} {}: expected a guard failure, got {s:?}", r.op, r.case),
        }
    }
}

/// An upload into a window that starts or ends inside a 32-bit word of its buffer (an f16 view
/// at an odd element) changes exactly the window's bytes: the WebGPU backend patches the words
/// on the device, since a browser cannot read them back first.
#[test]
fn wgpu_uploads_into_unaligned_windows_keep_the_bytes_around_them() {
    let Some(b) = optional_backend("wgpu", kiln_backend_wgpu::open) else {
        return;
    };
    use kiln_core::tensor::{DType, Tensor, TensorDesc};
    let mut rng = kiln_core::rng::Rng::new(41);
    let mut byte = || (rng.next_u64() & 0xFF) as u8;
    // An odd number of f16s: the buffer ends inside a word.
    let n = 1201;
    let whole = b.alloc(&TensorDesc::new(DType::F16, [n])).expect("alloc");
    let mut model: Vec<u8> = (0..2 * n).map(|_| byte()).collect();
    b.upload(&whole, &model).expect("upload");
    // f16 windows (first element, elements) starting or ending mid-word: inside one word,
    // across several, and over 256 words (more than one workgroup of the patch kernel).
    for (first, len) in [
        (1, 1),
        (3, 1),
        (1, 2),
        (1, 5),
        (2, 5),
        (5, 10),
        (7, 64),
        (3, 1031),
    ] {
        let t = Tensor::new(
            whole.storage().clone(),
            2 * first,
            TensorDesc::new(DType::F16, [len]),
        )
        .expect("a view");
        let bytes: Vec<u8> = (0..2 * len).map(|_| byte()).collect();
        b.upload(&t, &bytes).expect("upload into the window");
        model[2 * first..2 * (first + len)].copy_from_slice(&bytes);
        assert_eq!(
            b.download(&whole).expect("download"),
            model,
            "window {first}+{len}"
        );
    }
}
