//! Tests of the attention kernels (`attention.rs`).

use super::Path;
use crate::exec::Executor;
use crate::op::{AttnParams, Mask};

/// The row-tiled path for bidirectional masks (CPUs without AVX-512) gives the
/// row-at-a-time path's bits: the same attention as a prefix-bidirectional mask that spans
/// every key (which runs row by row), over row counts that leave partial tiles, with GQA
/// and without. (The AVX-512 kernel sums scores in another order: the oracle tests bound
/// it against f64.)
#[test]
fn tiled_bidirectional_attention_is_the_row_path_bit_for_bit() {
    let ex = Executor::cpu();
    let mut rng = crate::rng::Rng::new(77);
    for (t, hq, hkv, d) in [
        (37usize, 4usize, 4usize, 24usize),
        (16, 6, 2, 72),
        (50, 2, 1, 8),
    ] {
        let mut r = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.normal()).collect() };
        let q = ex.upload_f32(&[t, hq, d], &r(t * hq * d)).unwrap();
        let k = ex.upload_f32(&[t, hkv, d], &r(t * hkv * d)).unwrap();
        let v = ex.upload_f32(&[t, hkv, d], &r(t * hkv * d)).unwrap();
        let run = |mask| {
            let p = AttnParams {
                scale: 0.3,
                soft_cap: None,
                mask,
            };
            let o = ex
                .run(&Op::Attention(AttentionOp::Attention(p)), &[&q, &k, &v])
                .unwrap();
            ex.download_f32(&o[0]).unwrap()
        };
        let p = AttnParams {
            scale: 0.3,
            soft_cap: None,
            mask: Mask::Bidirectional,
        };
        let (qv, kv, vv) = (
            ex.download_f32(&q).unwrap(),
            ex.download_f32(&k).unwrap(),
            ex.download_f32(&v).unwrap(),
        );
        let mut tiled = vec![0f32; t * hq * d];
        super::attention_tiled(&p, (&qv, &kv, &vv), (t, hq, d), (t, hkv, d), &mut tiled);
        let rows = run(Mask::PrefixBidirectional(t));
        assert!(
            tiled
                .iter()
                .zip(&rows)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "t={t} hq={hq} hkv={hkv} d={d}"
        );
    }
}

use crate::backend::Backend;
use crate::cpu::CpuBackend;
use crate::op::{AttentionOp, Op, RopeMode, RopeOp, RopeParams};
use crate::rng::Rng;
use crate::tensor::{DType, Tensor, TensorDesc};

/// The fused op is its three ops one after another: RoPE of q, RoPE of k, and the K/V
/// write of the rotated k and v (run here as separate ops, bit for bit), on random data
/// with a skipped slot, partial rotary and frequency factors, into an f16 cache.
#[test]
fn rope_kv_write_is_rope_rope_and_kv_write() {
    let cpu = CpuBackend::with_threads(1);
    let mut rng = Rng::new(7);
    let (t, hq, hkv, d) = (4usize, 4usize, 2usize, 32usize);
    let mut rand = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect() };
    let q = cpu.tensor_f32(&[t, hq, d], &rand(t * hq * d)).unwrap();
    let k = cpu.tensor_f32(&[t, hkv, d], &rand(t * hkv * d)).unwrap();
    let v = cpu.tensor_f32(&[t, hkv, d], &rand(t * hkv * d)).unwrap();
    let factors = cpu
        .tensor_f32(&[8], &rand(8).iter().map(|x| 1.5 + x).collect::<Vec<_>>())
        .unwrap();
    let pos = cpu.tensor_i32(&[t], &[3, 17, 900, 41]).unwrap();
    let slots = cpu.tensor_i32(&[t], &[5, -1, 0, 12]).unwrap();
    let mut p = RopeParams::new(RopeMode::Neox, 16, 10000.0);
    p.freq_scale = 0.5;
    let cache = |seed: f32| -> Tensor {
        let desc = TensorDesc::new(DType::F16, [4, 4, hkv, d]);
        let c = cpu.alloc(&desc).unwrap();
        let vals: Vec<f32> = (0..desc.numel()).map(|i| seed + i as f32 * 1e-3).collect();
        let bytes: Vec<u8> = vals
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect();
        cpu.upload(&c, &bytes).unwrap();
        c
    };
    // Fused.
    let (kc, vc) = (cache(0.25), cache(-0.5));
    let q_out = cpu.alloc(q.desc()).unwrap();
    cpu.execute(
        &Op::Attention(AttentionOp::RopeKvWrite(p)),
        &[&q, &k, &v, &pos, &slots, &factors],
        &[&q_out, &kc, &vc],
    )
    .unwrap();
    // Apart.
    let (kc2, vc2) = (cache(0.25), cache(-0.5));
    let rope = |x: &Tensor| {
        let y = cpu.alloc(x.desc()).unwrap();
        cpu.execute(&Op::Rope(RopeOp::Rope(p)), &[x, &pos, &factors], &[&y])
            .unwrap();
        y
    };
    let (q2, k2) = (rope(&q), rope(&k));
    cpu.execute(
        &Op::Attention(AttentionOp::KvWrite),
        &[&k2, &v, &slots],
        &[&kc2, &vc2],
    )
    .unwrap();
    for (a, b) in [(&q_out, &q2), (&kc, &kc2), (&vc, &vc2)] {
        assert_eq!(cpu.download(a).unwrap(), cpu.download(b).unwrap());
    }
    // And it did something: q turned, and the written rows changed.
    assert_ne!(cpu.download(&q_out).unwrap(), cpu.download(&q).unwrap());
    assert_ne!(
        cpu.download(&kc).unwrap(),
        cpu.download(&cache(0.25)).unwrap()
    );
}

/// The shared path of paged attention (a piece of query rows dequantizes its keys and
/// values once, and on AVX-512 scores tiles of tokens against blocks of keys) gives the
/// row path's bits: caches of block types and of a float type beside an f32 one read in
/// place, three sequences with their rows in one piece (one of 300 keys: three key blocks,
/// tiles of 16 tokens and a partial one), causal and sliding-window masks, soft-capped
/// scores, and rows whose key reach runs past their position.
#[test]
fn shared_decoding_is_the_row_path_bit_for_bit() {
    // Groups of 3 query heads on heads of 64; groups of 5 (past weighted_rows' 4 a pass) with
    // values of 80 (a masked last vector, two passes of 64), float caches.
    shared_matches_rows(
        6,
        64,
        &[
            (DType::Q8_0, DType::TQ3T),
            (DType::F16, DType::F32),
            (DType::TQ4, DType::Q4_0),
        ],
    );
    shared_matches_rows(
        10,
        80,
        &[(DType::F16, DType::F32), (DType::F32, DType::F32)],
    );
}

/// `values` quantized to a cache of `dt`, held as f32 words so an f32 cache is aligned and read
/// in place.
fn cache_words(dt: DType, values: &[f32]) -> Vec<f32> {
    let bytes = crate::quant::quantize(dt, values).unwrap();
    let mut w = vec![0f32; bytes.len().div_ceil(4)];
    bytemuck::cast_slice_mut::<f32, u8>(&mut w)[..bytes.len()].copy_from_slice(&bytes);
    w
}

fn shared_matches_rows(hq: usize, dv: usize, types: &[(DType, DType)]) {
    use crate::cpu::{In, Out};
    let mut rng = Rng::new(2911);
    let (hkv, d, bs, nblocks) = (2usize, 64usize, 16usize, 64usize);
    let (lens, qlens) = ([40usize, 57, 300], [12usize, 20, 37]);
    let t: usize = qlens.iter().sum();
    let maxb = 19;
    let perm = rng.permutation(nblocks);
    let table: Vec<i32> = (0..lens.len() * maxb).map(|i| perm[i] as i32).collect();
    let q: Vec<f32> = (0..t * hq * d).map(|_| rng.normal()).collect();
    let mut q_start = vec![0i32];
    for ql in qlens {
        q_start.push(q_start.last().copied().unwrap_or(0) + ql as i32);
    }
    let seq_lens: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
    // Rows 3..9 of the first sequence (positions 31..37) reach its end.
    let mut reach = vec![0i32; t];
    reach[3..9].fill(40);
    let i32s = |v: &[i32]| bytemuck::cast_slice::<i32, u8>(v).to_vec();
    for &(kt, vt) in types {
        let kvals: Vec<f32> = (0..nblocks * bs * hkv * d).map(|_| rng.normal()).collect();
        let vvals: Vec<f32> = (0..nblocks * bs * hkv * dv).map(|_| rng.normal()).collect();
        let (kw, vw) = (cache_words(kt, &kvals), cache_words(vt, &vvals));
        let kdesc = TensorDesc::new(kt, [nblocks, bs, hkv, d]);
        let vdesc = TensorDesc::new(vt, [nblocks, bs, hkv, dv]);
        let (kb, vb) = (
            &bytemuck::cast_slice::<f32, u8>(&kw)[..kdesc.nbytes().unwrap()],
            &bytemuck::cast_slice::<f32, u8>(&vw)[..vdesc.nbytes().unwrap()],
        );
        let qdesc = TensorDesc::new(DType::F32, [t, hq, d]);
        let odesc = TensorDesc::new(DType::F32, [t, hq, dv]);
        let tdesc = TensorDesc::new(DType::I32, [lens.len(), maxb]);
        let ldesc = TensorDesc::new(DType::I32, [lens.len()]);
        let sdesc = TensorDesc::new(DType::I32, [lens.len() + 1]);
        let rdesc = TensorDesc::new(DType::I32, [t]);
        let (tb, lb, sb, rb) = (i32s(&table), i32s(&seq_lens), i32s(&q_start), i32s(&reach));
        let qb = bytemuck::cast_slice::<f32, u8>(&q);
        for (mask, with_reach, soft_cap) in [
            (Mask::Causal, false, None),
            (Mask::SlidingWindow(10), false, None),
            (Mask::SlidingWindow(150), false, Some(2.0)),
            (Mask::Causal, true, None),
        ] {
            let p = AttnParams {
                scale: 0.125,
                soft_cap,
                mask,
            };
            let mut ins = vec![
                In::new(&qdesc, qb),
                In::new(&kdesc, kb),
                In::new(&vdesc, vb),
                In::new(&tdesc, &tb),
                In::new(&ldesc, &lb),
                In::new(&sdesc, &sb),
            ];
            if with_reach {
                ins.push(In::new(&rdesc, &rb));
            }
            let run = |path: Path| {
                let mut y = vec![0u8; t * hq * dv * 4];
                let mut o = [Out {
                    desc: &odesc,
                    bytes: &mut y,
                }];
                assert!(super::paged(&p, &ins, &mut o, path).is_ok());
                y
            };
            let (rows, shared) = (run(Path::Rows), run(Path::Shared));
            let label =
                format!("{hq} heads, dv {dv}, K {kt}, V {vt}, {mask:?}, reach {with_reach}");
            assert!(rows.iter().any(|&b| b != 0), "{label}: no output");
            assert!(rows == shared, "{label}: the paths differ");
        }
    }
}

/// Decode over a long context takes the split path (`attention_split.rs`: keys, softmax rows
/// and value columns shared among the threads), for a lone sequence, a batch of more
/// sequences than threads and one of several rows a sequence (a speculative step's), and
/// gives the row path's bits (one thread) and the shared path's: one KV head (Gemma 3's
/// shape, values of 256 too), three (SmolLM2's, a thread's value columns across heads) and four,
/// groups of more than four heads, f32 caches read in place and f16 and block-type caches
/// decoded (the value columns split either way), causal, windowed and soft-capped.
#[test]
fn split_decoding_is_the_row_path_bit_for_bit() {
    use crate::cpu::pool::{with_pool, Pool};
    use crate::cpu::{In, Out};
    let mut rng = Rng::new(4711);
    let pool = Pool::new(2);
    let (d, bs, nblocks, maxb) = (64usize, 16usize, 80usize, 64usize);
    let i32s = |v: &[i32]| bytemuck::cast_slice::<i32, u8>(v).to_vec();
    let mut split_runs = 0;
    for (hq, hkv, dv) in [
        (9usize, 3usize, 64usize),
        (4, 1, 64),
        (4, 1, 80),
        (6, 3, 32),
        (10, 1, 64),
        (4, 1, 256),
        (8, 4, 64),
    ] {
        let mut types = vec![
            (DType::F32, DType::F32),
            (DType::F16, DType::F32),
            (DType::TQ3, DType::F16),
        ];
        if dv % 32 == 0 {
            types.push((DType::Q8_0, DType::Q4_0));
            types.push((DType::F32, DType::TQ3));
        }
        for (kt, vt) in types {
            // One sequence decoding its 1001st token; three decoding together (more tokens
            // than threads); two checking three and two rows (a speculative step's).
            for (lens, qlens) in [
                (vec![1001usize], vec![1usize]),
                (vec![703, 650, 900], vec![1, 1, 1]),
                (vec![900, 703], vec![3, 2]),
            ] {
                let t: usize = qlens.iter().sum();
                let perm = rng.permutation(nblocks);
                let table: Vec<i32> = (0..lens.len() * maxb)
                    .map(|i| perm[i % nblocks] as i32)
                    .collect();
                let q: Vec<f32> = (0..t * hq * d).map(|_| rng.normal()).collect();
                let mut q_start = vec![0i32];
                for &ql in &qlens {
                    q_start.push(q_start.last().copied().unwrap_or(0) + ql as i32);
                }
                let seq_lens: Vec<i32> = lens.iter().map(|&l| l as i32).collect();
                let kvals: Vec<f32> = (0..nblocks * bs * hkv * d).map(|_| rng.normal()).collect();
                let vvals: Vec<f32> = (0..nblocks * bs * hkv * dv).map(|_| rng.normal()).collect();
                let (kw, vw) = (cache_words(kt, &kvals), cache_words(vt, &vvals));
                let kdesc = TensorDesc::new(kt, [nblocks, bs, hkv, d]);
                let vdesc = TensorDesc::new(vt, [nblocks, bs, hkv, dv]);
                let (kb, vb) = (
                    &bytemuck::cast_slice::<f32, u8>(&kw)[..kdesc.nbytes().unwrap()],
                    &bytemuck::cast_slice::<f32, u8>(&vw)[..vdesc.nbytes().unwrap()],
                );
                let qdesc = TensorDesc::new(DType::F32, [t, hq, d]);
                let odesc = TensorDesc::new(DType::F32, [t, hq, dv]);
                let tdesc = TensorDesc::new(DType::I32, [lens.len(), maxb]);
                let ldesc = TensorDesc::new(DType::I32, [lens.len()]);
                let sdesc = TensorDesc::new(DType::I32, [lens.len() + 1]);
                let (tb, lb, sb) = (i32s(&table), i32s(&seq_lens), i32s(&q_start));
                let qb = bytemuck::cast_slice::<f32, u8>(&q);
                for (mask, soft_cap) in [
                    (Mask::Causal, None),
                    (Mask::SlidingWindow(600), None),
                    (Mask::Causal, Some(3.0)),
                ] {
                    let p = AttnParams {
                        scale: 0.125,
                        soft_cap,
                        mask,
                    };
                    let ins = [
                        In::new(&qdesc, qb),
                        In::new(&kdesc, kb),
                        In::new(&vdesc, vb),
                        In::new(&tdesc, &tb),
                        In::new(&ldesc, &lb),
                        In::new(&sdesc, &sb),
                    ];
                    let run = |path: Path| {
                        let mut y = vec![0u8; t * hq * dv * 4];
                        let mut o = [Out {
                            desc: &odesc,
                            bytes: &mut y,
                        }];
                        assert!(super::paged(&p, &ins, &mut o, path).is_ok());
                        y
                    };
                    let label = format!(
                        "{hq}/{hkv} heads, dv {dv}, K {kt}, V {vt}, lens {lens:?}, {mask:?}, cap {soft_cap:?}"
                    );
                    let rows = run(Path::Rows);
                    let split = with_pool(&pool, || {
                        let before = super::split::CALLS.with(|c| c.get());
                        let y = run(Path::Decode);
                        let took = super::split::CALLS.with(|c| c.get()) > before;
                        assert_eq!(took, super::split::pays(t, hq, 600), "{label}");
                        split_runs += usize::from(took);
                        y
                    });
                    assert!(rows.iter().any(|&b| b != 0), "{label}: no output");
                    assert!(rows == split, "{label}: the split path differs");
                    assert!(
                        rows == run(Path::Shared),
                        "{label}: the shared path differs"
                    );
                    // One thread: every batch splits too (a lone sequence's into one task a
                    // step).
                    let (before, lone) = (super::split::CALLS.with(|c| c.get()), run(Path::Decode));
                    let took = super::split::CALLS.with(|c| c.get()) > before;
                    assert!(took, "{label}: one thread");
                    assert!(rows == lone, "{label}: the one-thread split differs");
                }
            }
        }
    }
    // Every run splits: 7 shapes × cache types (5, 3 at dv 80) × 3 batches × 3 masks.
    assert_eq!(split_runs, (6 * 5 + 3) * 3 * 3);
}
