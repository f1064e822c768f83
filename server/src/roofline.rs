//! The decode roofline: a decode token must read the model's weights once, so the weight bytes
//! per token over the device's memory bandwidth bound the decode rate. `kiln bench` prints
//! the bound next to the measured rate, and their ratio says how close decode runs to it.

use std::time::Instant;

use kiln_core::exec::Executor;
use kiln_core::load::gguf::GgufFile;
use kiln_core::op::{ElementwiseOp, Op};
use kiln_core::tensor::{DType, TensorDesc};
use kiln_core::Result;

/// Weight bytes one decode token reads: every tensor once, except lookup tables (the token
/// embedding, unless the output head is tied to it; Gemma's per-layer embeddings), with MoE
/// expert tensors counted for the experts a token uses. KV cache reads are not included
/// (they grow with the context; bench's short generations keep them small).
pub fn decode_bytes(file: &GgufFile) -> u64 {
    let count = |k: &str| file.get_u64(&file.arch_key(k)).ok();
    let experts = count("expert_count").zip(count("expert_used_count"));
    let tensors: Vec<(&str, u64)> = file
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.nbytes as u64))
        .collect();
    weight_bytes(&tensors, experts)
}

/// [`decode_bytes`] over `(name, bytes)` of each tensor and `(experts, used per token)`.
fn weight_bytes(tensors: &[(&str, u64)], experts: Option<(u64, u64)>) -> u64 {
    let tied = !tensors.iter().any(|t| t.0 == "output.weight");
    tensors
        .iter()
        .map(|&(name, bytes)| {
            if name.starts_with("per_layer_token_embd") || (name == "token_embd.weight" && !tied) {
                0
            } else if name.contains("_exps") {
                match experts {
                    Some((e, used)) if e > 0 => {
                        (bytes as u128 * used.min(e) as u128 / e as u128) as u64
                    }
                    _ => bytes,
                }
            } else {
                bytes
            }
        })
        .sum()
}

/// The backend's memory bandwidth as a device-to-device copy sees it: bytes read plus bytes
/// written per second, the best of several rounds of `COPIES` copies of 64 MiB.
pub fn copy_bandwidth(ex: &Executor) -> Result<f64> {
    const BYTES: usize = 64 << 20;
    const COPIES: usize = 8;
    let desc = TensorDesc::new(DType::F32, [BYTES / 4]);
    let src = ex.backend().alloc(&desc)?;
    let dst = ex.backend().alloc(&desc)?;
    let mut rng = kiln_core::rng::Rng::new(7);
    let data: Vec<u8> = (0..BYTES / 4)
        .flat_map(|_| rng.normal().to_le_bytes())
        .collect();
    ex.backend().upload(&src, &data)?;
    ex.exec(&Op::Elementwise(ElementwiseOp::Copy), &[&src], &[&dst])?;
    ex.backend().synchronize()?;
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        for _ in 0..COPIES {
            ex.exec(&Op::Elementwise(ElementwiseOp::Copy), &[&src], &[&dst])?;
        }
        ex.backend().synchronize()?;
        let secs = t0.elapsed().as_secs_f64();
        best = best.max((2 * BYTES * COPIES) as f64 / secs.max(1e-9));
    }
    Ok(best)
}

/// The host's memory read bandwidth with `threads` threads: bytes per second that the threads,
/// each summing its share of a 256 MiB buffer (far past the caches), read together; the best
/// of three rounds. Decode on a CPU only reads its weights, and a read streams faster than a
/// copy (which also writes, and reads the destination before writing it), so this is the
/// CPU's decode bound.
pub fn host_read_bandwidth(threads: usize) -> f64 {
    const WORDS: usize = (256 << 20) / 8;
    let threads = threads.clamp(1, 256);
    // Distinct values, so that no page is the shared zero page.
    let buf: Vec<u64> = (0..WORDS as u64).collect();
    let share = WORDS.div_ceil(threads);
    let mut best = 0f64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let total = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(share)
                .map(|c| {
                    s.spawn(move || {
                        // Eight independent sums: the loop is not one chain of additions.
                        let mut acc = [0u64; 8];
                        for w in c.chunks_exact(8) {
                            for (a, v) in acc.iter_mut().zip(w) {
                                *a = a.wrapping_add(*v);
                            }
                        }
                        acc.iter().fold(0u64, |a, v| a.wrapping_add(*v))
                    })
                })
                .collect();
            parts
                .into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        let secs = t0.elapsed().as_secs_f64();
        best = best.max((WORDS * 8) as f64 / secs.max(1e-9));
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_tables_are_left_out_and_experts_count_for_the_ones_used() {
        let body = [
            ("blk.0.attn_q.weight", 4_352),
            ("blk.0.ffn_gate_exps.weight", 36_864),
            ("per_layer_token_embd.weight", 99_999),
        ];
        let untied = [
            &body[..],
            &[("token_embd.weight", 6_800), ("output.weight", 12_800)],
        ]
        .concat();
        assert_eq!(
            weight_bytes(&untied, Some((8, 2))),
            4_352 + 36_864 / 4 + 12_800
        );
        // Tied: the embedding is the head, read whole; no expert counts: experts read whole.
        let tied = [&body[..], &[("token_embd.weight", 6_800)]].concat();
        assert_eq!(weight_bytes(&tied, None), 4_352 + 36_864 + 6_800);
    }

    #[test]
    fn the_host_read_bandwidth_is_measured() {
        let bw = host_read_bandwidth(2);
        // Any real machine reads faster than 10 MB/s and slower than 10 TB/s.
        assert!(bw > 1e7 && bw < 1e13, "{bw}");
    }

    #[test]
    fn the_cpu_copy_bandwidth_is_measured() {
        let bw = copy_bandwidth(&Executor::cpu()).expect("copies");
        // Any real machine copies faster than 10 MB/s and slower than 10 TB/s.
        assert!(bw > 1e7 && bw < 1e13, "{bw}");
    }
}
