//! Contiguous attention, paged attention through random block tables, and the KV write.

use kiln_core::op::{AttentionOp, AttnParams, Mask, Op};
use kiln_core::validate::rng::Rng;
use kiln_core::DType::{self, *};

use super::harness::*;
use super::naive::{self, Attn, AttnDims, Visible};

fn visible(m: Mask) -> Visible {
    match m {
        Mask::Causal => Visible::Causal,
        Mask::SlidingWindow(w) => Visible::Window(w),
        Mask::Bidirectional => Visible::All,
        Mask::PrefixBidirectional(n) => Visible::Prefix(n),
        Mask::Lookback(n) => Visible::Last(n),
    }
}

fn oracle_params(p: &AttnParams) -> Attn {
    Attn {
        scale: p.scale as f64,
        cap: p.soft_cap,
        mask: visible(p.mask),
    }
}

/// Attention tolerance: the output is a convex combination of value rows (|v| ≲ 4 here), and
/// every score carries an f32 dot product's error (≤ D·u·Σ|q k|·scale ≈ 1e-6 at these sizes),
/// which moves the weights by that much relatively; the softmax and the weighted sum add a few
/// ulps. Observed errors stay under 5e-7·(1 + |o|): this leaves a 10x margin.
const ATOL: f64 = 5e-6;
const RTOL: f64 = 5e-6;

/// A vision tower's attention: many rows that all see every key (the CPU's tiled kernels: 4
/// rows × 64 keys of scores, 4 rows × 80 values of outputs), at head widths that are not whole
/// vectors, values wider than one output tile, GQA and a soft cap.
#[test]
fn attention_bidirectional_many_rows() {
    let kx = kiln();
    let mut rng = Rng::new(21);
    for (t, s, hq, hkv, d, dv) in [
        (37, 37, 2, 2, 72, 72),
        (70, 70, 4, 2, 40, 100),
        (17, 130, 3, 1, 16, 8),
    ] {
        for cap in [None, Some(2.0f32)] {
            let p = AttnParams {
                scale: 1.0 / (d as f32).sqrt(),
                soft_cap: cap,
                mask: Mask::Bidirectional,
            };
            let (q, qv) = kx.tensor(F32, &[t, hq, d], &normal(&mut rng, t * hq * d, 1.0));
            let (k, kv) = kx.tensor(F32, &[s, hkv, d], &normal(&mut rng, s * hkv * d, 1.0));
            let (v, vv) = kx.tensor(F32, &[s, hkv, dv], &normal(&mut rng, s * hkv * dv, 1.0));
            let y = kx.run(&Op::Attention(AttentionOp::Attention(p)), &[&q, &k, &v]);
            let dm = AttnDims { hq, hkv, d, dv };
            let want = naive::attention(&oracle_params(&p), &qv, &kv, &vv, t, s, dm);
            assert_close(
                &format!("attention t {t} s {s} hq {hq} hkv {hkv} d {d} dv {dv} cap {cap:?}"),
                &kx.f32(&y[0]),
                &want,
                F32,
                ATOL,
                RTOL,
            );
        }
    }
}

#[test]
fn attention_every_mask_gqa_soft_cap_and_dv() {
    let kx = kiln();
    let mut rng = Rng::new(20);
    let masks = [
        Mask::Causal,
        Mask::SlidingWindow(3),
        Mask::Bidirectional,
        Mask::PrefixBidirectional(4),
        Mask::Lookback(6),
    ];
    // (queries, keys): prefill from empty, prefill after context, decode.
    let lens = [(7, 7), (5, 9), (1, 11)];
    // (hq, hkv, d, dv): GQA with Dv != D, MHA, MQA.
    let heads = [(4, 2, 20, 12), (3, 3, 16, 16), (6, 1, 8, 24)];
    for mask in masks {
        for (t, s) in lens {
            for (hq, hkv, d, dv) in heads {
                for cap in [None, Some(2.0f32)] {
                    let p = AttnParams {
                        scale: 0.5,
                        soft_cap: cap,
                        mask,
                    };
                    let dt = if cap.is_some() && hq == 3 { F16 } else { F32 };
                    let (q, qv) = kx.tensor(dt, &[t, hq, d], &normal(&mut rng, t * hq * d, 1.0));
                    let (k, kv) = kx.tensor(dt, &[s, hkv, d], &normal(&mut rng, s * hkv * d, 1.0));
                    let (v, vv) =
                        kx.tensor(dt, &[s, hkv, dv], &normal(&mut rng, s * hkv * dv, 1.0));
                    let y = kx.run(&Op::Attention(AttentionOp::Attention(p)), &[&q, &k, &v]);
                    assert_eq!(y[0].shape().dims(), &[t, hq, dv]);
                    let dm = AttnDims { hq, hkv, d, dv };
                    let want = naive::attention(&oracle_params(&p), &qv, &kv, &vv, t, s, dm);
                    assert_close(
                        &format!("attention {dt} {mask:?} t {t} s {s} hq {hq} hkv {hkv} d {d} dv {dv} cap {cap:?}"),
                        &kx.f32(&y[0]),
                        &want,
                        dt,
                        ATOL,
                        RTOL,
                    );
                }
            }
        }
    }
}

/// One paged batch: sequences with context lengths `lens` whose last `qlens` positions are
/// this step's queries, caches of `cdt` in blocks of `bs` placed by a random permutation.
struct Paged {
    hq: usize,
    hkv: usize,
    d: usize,
    dv: usize,
    bs: usize,
    lens: Vec<usize>,
    qlens: Vec<usize>,
    kdt: DType,
    vdt: DType,
}

impl Paged {
    fn run(&self, rng: &mut Rng, p: AttnParams) {
        let kx = kiln();
        let Paged {
            hq, hkv, d, dv, bs, ..
        } = *self;
        let nseq = self.lens.len();
        let need: Vec<usize> = self.lens.iter().map(|l| l.div_ceil(bs)).collect();
        // One unused column, and spare blocks no sequence owns.
        let max_blocks = need.iter().max().unwrap() + 1;
        let nblocks = need.iter().sum::<usize>() + 3;
        let perm = rng.permutation(nblocks);
        let mut table = vec![-1i32; nseq * max_blocks];
        let mut next = 0;
        for s in 0..nseq {
            for b in 0..need[s] {
                table[s * max_blocks + b] = perm[next] as i32;
                next += 1;
            }
            // A sliding window lets the blocks wholly before the first query's window go.
            if let Mask::SlidingWindow(w) = p.mask {
                let first = self.lens[s] - self.qlens[s];
                let lo = (first + 1).saturating_sub(w);
                for b in 0..lo / bs {
                    table[s * max_blocks + b] = -1;
                }
            }
        }
        let t: usize = self.qlens.iter().sum();
        let mut q_start = vec![0i32];
        for &ql in &self.qlens {
            q_start.push(q_start.last().unwrap() + ql as i32);
        }
        let seq_lens: Vec<i32> = self.lens.iter().map(|&l| l as i32).collect();
        let (q, qv) = kx.tensor(F32, &[t, hq, d], &normal(rng, t * hq * d, 1.0));
        let kn = nblocks * bs * hkv * d;
        let vn = nblocks * bs * hkv * dv;
        let (kc, kcv) = kx.tensor(self.kdt, &[nblocks, bs, hkv, d], &normal(rng, kn, 1.0));
        let (vc, vcv) = kx.tensor(self.vdt, &[nblocks, bs, hkv, dv], &normal(rng, vn, 1.0));
        let tab = kx.ints(&[nseq, max_blocks], &table);
        let sl = kx.ints(&[nseq], &seq_lens);
        let qs = kx.ints(&[nseq + 1], &q_start);
        let y = kx.run(
            &Op::Attention(AttentionOp::PagedAttention(p)),
            &[&q, &kc, &vc, &tab, &sl, &qs],
        );
        let dm = AttnDims { hq, hkv, d, dv };
        let want = naive::paged_attention(
            &oracle_params(&p),
            &qv,
            &kcv,
            &vcv,
            bs,
            &table,
            max_blocks,
            &seq_lens,
            &q_start,
            dm,
        );
        assert_close(
            &format!(
                "paged_attention {}/{} {:?} lens {:?} qlens {:?} hq {hq} hkv {hkv} d {d} dv {dv} bs {bs} cap {:?}",
                self.kdt, self.vdt, p.mask, self.lens, self.qlens, p.soft_cap
            ),
            &kx.f32(&y[0]),
            &want,
            F32,
            ATOL,
            RTOL,
        );
    }
}

#[test]
fn paged_attention_decode_and_prefill_f16_and_q8_0_caches() {
    let mut rng = Rng::new(21);
    // (kdt, vdt, d, dv): q8_0 needs heads of whole 32-blocks.
    let caches = [
        (F16, F16, 40, 24),
        (Q8_0, Q8_0, 64, 32),
        (F32, F16, 24, 24),
        (Q4_0, TQ3, 32, 64),
        (TQ4, TQ2, 64, 32),
        (BF16, Q8_0, 32, 32),
    ];
    let batches = [
        // Decode: one query per sequence.
        (vec![13, 1, 30], vec![1, 1, 1]),
        // Prefill with prior context, a fresh prefill, and a decode in one batch.
        (vec![13, 7, 30], vec![5, 7, 1]),
    ];
    for (kdt, vdt, d, dv) in caches {
        for (lens, qlens) in &batches {
            for mask in [
                Mask::Causal,
                Mask::PrefixBidirectional(6),
                Mask::Bidirectional,
                Mask::Lookback(10),
            ] {
                for cap in [None, Some(3.0f32)] {
                    let case = Paged {
                        hq: 6,
                        hkv: 2,
                        d,
                        dv,
                        bs: 4,
                        lens: lens.clone(),
                        qlens: qlens.clone(),
                        kdt,
                        vdt,
                    };
                    let scale = 1.0 / (d as f32).sqrt();
                    case.run(
                        &mut rng,
                        AttnParams {
                            scale,
                            soft_cap: cap,
                            mask,
                        },
                    );
                }
            }
        }
    }
}

#[test]
fn paged_attention_sliding_window_with_released_blocks() {
    let mut rng = Rng::new(22);
    for (kdt, d) in [(F16, 40), (Q8_0, 32)] {
        for (lens, qlens) in [
            (vec![23, 9, 40], vec![1, 1, 1]),
            (vec![23, 9, 40], vec![3, 9, 2]),
        ] {
            for w in [1, 5, 8] {
                let case = Paged {
                    hq: 4,
                    hkv: 2,
                    d,
                    dv: 32,
                    bs: 4,
                    lens: lens.clone(),
                    qlens: qlens.clone(),
                    kdt,
                    vdt: kdt,
                };
                let p = AttnParams {
                    scale: 0.2,
                    soft_cap: None,
                    mask: Mask::SlidingWindow(w),
                };
                case.run(&mut rng, p);
            }
        }
    }
}

#[test]
fn kv_write_fills_slots_and_skips_negative_ones() {
    let kx = kiln();
    let mut rng = Rng::new(23);
    let (nb, bs, hkv, t) = (5, 4, 2, 6);
    for (cdt, d, dv) in [
        (F32, 12, 20),
        (F16, 24, 40),
        (BF16, 8, 8),
        (Q8_0, 32, 64),
        (Q4_0, 64, 32),
        (TQ4, 32, 64),
        (TQ3, 64, 32),
        (TQ2, 32, 32),
    ] {
        let (k, kv) = kx.tensor(F32, &[t, hkv, d], &normal(&mut rng, t * hkv * d, 1.0));
        let (v, vv) = kx.tensor(F32, &[t, hkv, dv], &normal(&mut rng, t * hkv * dv, 1.0));
        let mut slots: Vec<i32> = rng.permutation(nb * bs)[..t]
            .iter()
            .map(|&s| s as i32)
            .collect();
        slots[2] = -1;
        let st = kx.ints(&[t], &slots);
        let (kc, _) = kx.tensor(
            cdt,
            &[nb, bs, hkv, d],
            &normal(&mut rng, nb * bs * hkv * d, 1.0),
        );
        let (vc, _) = kx.tensor(
            cdt,
            &[nb, bs, hkv, dv],
            &normal(&mut rng, nb * bs * hkv * dv, 1.0),
        );
        let (k0, v0) = (kx.bytes(&kc), kx.bytes(&vc));
        kx.exec(
            &Op::Attention(AttentionOp::KvWrite),
            &[&k, &v, &st],
            &[&kc, &vc],
        )
        .unwrap();
        for (cache, before, src, width) in [(&kc, &k0, &kv, hkv * d), (&vc, &v0, &vv, hkv * dv)] {
            let after = kx.bytes(cache);
            let rb = cdt.bytes_for(width).unwrap();
            let vals = held(cdt, &after, nb * bs * width);
            for slot in 0..nb * bs {
                let what = format!("kv_write {cdt} slot {slot}");
                let row = &after[slot * rb..(slot + 1) * rb];
                match slots.iter().position(|&s| s == slot as i32) {
                    None => assert_eq!(row, &before[slot * rb..(slot + 1) * rb], "{what} changed"),
                    Some(ti) => {
                        let x = &src[ti * width..(ti + 1) * width];
                        let got: Vec<f32> = vals[slot * width..(slot + 1) * width]
                            .iter()
                            .map(|&v| v as f32)
                            .collect();
                        match cdt {
                            F32 => assert_exact(&what, &got, x),
                            F16 => assert_exact(
                                &what,
                                &got,
                                &x.iter().map(|&v| naive::round_f16(v)).collect::<Vec<_>>(),
                            ),
                            BF16 => assert_exact(
                                &what,
                                &got,
                                &x.iter().map(|&v| naive::round_bf16(v)).collect::<Vec<_>>(),
                            ),
                            _ => {
                                let xf: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                                let enc = kiln_core::quant::quantize(cdt, &xf).unwrap();
                                assert_eq!(row, &enc[..], "{what}: not the row's encoding");
                                let amax = x.iter().fold(0f64, |a, v| a.max(v.abs()));
                                match cdt {
                                    // Within one step (max|x|/127, max|x|/8) of the data.
                                    Q8_0 => assert_within(&what, &got, x, |_| amax / 127.0),
                                    Q4_0 => assert_within(&what, &got, x, |_| amax / 8.0),
                                    _ => tq_row_holds(&what, cdt, row, x),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A TurboQuant row: decoded bit by bit (the layout as documented) it gives what kiln's
/// dequantizer gives, and it is within the Lloyd–Max distortion of the data (normalised MSE
/// per 32-block under 1.5× the ideal 0.0095 / 0.0345 / 0.1175 for 4 / 3 / 2 bits, on average
/// over the row, which Gaussian data meet).
fn tq_row_holds(what: &str, cdt: DType, row: &[u8], x: &[f64]) {
    let (bits, ideal) = match cdt {
        TQ4 => (4, 0.0095),
        TQ3 => (3, 0.0345),
        _ => (2, 0.1175),
    };
    let book = kiln_core::quant::turbo::codebook(bits as u32);
    let mut slow = Vec::new();
    for b in row.chunks_exact(cdt.type_size()) {
        slow.extend(naive::dequant_tq_block(b, bits, &book));
    }
    let fast = held(cdt, row, x.len());
    assert_eq!(
        slow, fast,
        "{what}: decoding disagrees with the documented layout"
    );
    let err: f64 = slow.iter().zip(x).map(|(a, b)| (a - b).powi(2)).sum();
    let var: f64 = x.iter().map(|b| b * b).sum();
    assert!(
        err / var < 1.5 * ideal,
        "{what}: normalised MSE {} over {}",
        err / var,
        1.5 * ideal
    );
}
