//! Attention's cases: contiguous attention under every mask, and paged attention through the
//! block table at decode and prefill shapes over every KV cache type.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    let masks = [
        ("causal", Mask::Causal),
        ("sliding 5", Mask::SlidingWindow(5)),
        ("bidirectional", Mask::Bidirectional),
        ("prefix 6", Mask::PrefixBidirectional(6)),
        ("lookback 12", Mask::Lookback(12)),
    ];
    for (mname, mask) in masks {
        for (t, s, hq, hkv, d, dv) in [
            (1usize, 37usize, 4usize, 2usize, 64usize, 64usize),
            (9, 9, 4, 1, 32, 48),
            (5, 23, 6, 6, 40, 40),
            // Head dims that are not whole groups of 8 (the kernels' tails).
            (4, 19, 4, 2, 20, 12),
        ] {
            let p = AttnParams {
                scale: 1.0 / (d as f32).sqrt(),
                soft_cap: None,
                mask,
            };
            let label = format!("{mname} T={t} S={s} Hq={hq} Hkv={hkv} D={d} Dv={dv}");
            c.push(Case::new(
                Op::Attention(AttentionOp::Attention(p)),
                label,
                vec![
                    n(F32, &[t, hq, d]),
                    n(F32, &[s, hkv, d]),
                    n(F32, &[s, hkv, dv]),
                ],
            )?);
        }
    }
    let p = AttnParams {
        scale: 0.3,
        soft_cap: Some(20.0),
        mask: Mask::Causal,
    };
    c.push(Case::new(
        Op::Attention(AttentionOp::Attention(p)),
        "soft cap 20 T=6 S=11",
        vec![
            n(F32, &[6, 2, 32]),
            n(F32, &[11, 2, 32]),
            n(F32, &[11, 2, 32]),
        ],
    )?);
    // Six query heads on one KV head: more heads than one pass of the CPU's score kernel.
    c.push(Case::new(
        Op::Attention(AttentionOp::Attention(p)),
        "soft cap 20 T=5 S=13 Hq=6 Hkv=1",
        vec![
            n(F32, &[5, 6, 32]),
            n(F32, &[13, 1, 32]),
            n(F32, &[13, 1, 32]),
        ],
    )?);
    let p = AttnParams {
        scale: 0.125,
        soft_cap: None,
        mask: Mask::Causal,
    };
    c.push(Case::new(
        Op::Attention(AttentionOp::Attention(p)),
        "f16 q/k/v T=3 S=20",
        vec![
            n(F16, &[3, 4, 64]),
            n(F16, &[20, 2, 64]),
            n(F16, &[20, 2, 64]),
        ],
    )?);

    // Paged: a pool of 24 blocks of 16, block tables drawn from a permutation.
    let bs = 16usize;
    let nb = 24usize;
    let mut paged = |label: &str,
                     mask: Mask,
                     seq_lens: &[usize],
                     q_lens: &[usize],
                     (kt, vt): (DType, DType),
                     hq: usize,
                     hkv: usize,
                     d: usize,
                     null_out_of_window: bool|
     -> Result<()> {
        let mut r = Rng::from_label(label);
        let perm = r.permutation(nb);
        let maxb = seq_lens
            .iter()
            .map(|l| l.div_ceil(bs))
            .max()
            .unwrap_or(1)
            .max(1);
        let mut table = vec![-1i32; seq_lens.len() * maxb];
        let mut next = 0;
        for (s, &len) in seq_lens.iter().enumerate() {
            for b in 0..len.div_ceil(bs) {
                table[s * maxb + b] = perm[next] as i32;
                next += 1;
            }
            // Blocks wholly before the keys of the sequence's first query are released.
            let first_q = len - q_lens[s];
            let lo = match (null_out_of_window, mask) {
                (true, Mask::SlidingWindow(w)) => (first_q + 1).saturating_sub(w),
                (true, Mask::Lookback(n)) => len.saturating_sub(n),
                _ => 0,
            };
            for b in 0..lo / bs {
                table[s * maxb + b] = -1;
            }
        }
        let t: usize = q_lens.iter().sum();
        let mut qs = vec![0i32];
        for &q in q_lens {
            qs.push(qs.last().copied().unwrap_or(0) + q as i32);
        }
        let p = AttnParams {
            scale: 1.0 / (d as f32).sqrt(),
            soft_cap: None,
            mask,
        };
        c.push(Case::new(
            Op::Attention(AttentionOp::PagedAttention(p)),
            label,
            vec![
                n(F32, &[t, hq, d]),
                n(kt, &[nb, bs, hkv, d]),
                n(vt, &[nb, bs, hkv, d]),
                ids(&[seq_lens.len(), maxb], table),
                ids(
                    &[seq_lens.len()],
                    seq_lens.iter().map(|&l| l as i32).collect(),
                ),
                ids(&[seq_lens.len() + 1], qs),
            ],
        )?);
        Ok(())
    };
    paged(
        "decode f32 3 seqs 37/1/70",
        Mask::Causal,
        &[37, 1, 70],
        &[1, 1, 1],
        (F32, F32),
        8,
        2,
        64,
        false,
    )?;
    paged(
        "decode f16 cache 2 seqs",
        Mask::Causal,
        &[50, 129],
        &[1, 1],
        (F16, F16),
        4,
        4,
        64,
        false,
    )?;
    paged(
        "decode q8_0 cache",
        Mask::Causal,
        &[45, 17],
        &[1, 1],
        (Q8_0, Q8_0),
        4,
        2,
        64,
        false,
    )?;
    paged(
        "decode sliding 20, released blocks",
        Mask::SlidingWindow(20),
        &[90, 33],
        &[1, 1],
        (F32, F32),
        4,
        2,
        32,
        true,
    )?;
    // Long contexts with few sequences: backends that split the keys over several blocks
    // (CUDA's decode) take that path here.
    paged(
        "decode long context 300/45, D=128",
        Mask::Causal,
        &[300, 45],
        &[1, 1],
        (F32, F32),
        8,
        2,
        128,
        false,
    )?;
    paged(
        "decode sliding 100 at 350, released blocks, f16 cache",
        Mask::SlidingWindow(100),
        &[350],
        &[1],
        (F16, F16),
        4,
        1,
        64,
        true,
    )?;
    paged(
        "decode-shaped, 2 rows for one sequence and none for the other",
        Mask::Causal,
        &[200, 30],
        &[2, 0],
        (F32, F32),
        4,
        2,
        32,
        false,
    )?;
    paged(
        "prefill 2 seqs q 5/7 after context",
        Mask::Causal,
        &[21, 7],
        &[5, 7],
        (F32, F32),
        6,
        3,
        32,
        false,
    )?;
    // DiffusionGemma's decoder: a canvas of 8 sees the whole context (full layers), or the
    // last 7 keys before it and itself (sliding layers, window 8).
    paged(
        "canvas 8 bidirectional 2 seqs",
        Mask::Bidirectional,
        &[44, 20],
        &[8, 8],
        (F32, F32),
        4,
        1,
        32,
        false,
    )?;
    paged(
        "canvas 8 lookback 15, released blocks",
        Mask::Lookback(15),
        &[60, 12],
        &[8, 8],
        (F32, F32),
        4,
        2,
        16,
        true,
    )?;
    paged(
        "prefill sliding 8",
        Mask::SlidingWindow(8),
        &[40],
        &[13],
        (F32, F32),
        2,
        1,
        64,
        false,
    )?;
    paged(
        "prefill bidirectional",
        Mask::Bidirectional,
        &[19],
        &[19],
        (F32, F32),
        2,
        2,
        32,
        false,
    )?;
    paged(
        "prefill prefix 10 f16 cache",
        Mask::PrefixBidirectional(10),
        &[25],
        &[25],
        (F16, F16),
        4,
        2,
        64,
        false,
    )?;
    // Prefill over f16 caches at the shapes of CUDA's tensor-core kernels (FA_TC=1: 64 (row,
    // head) pairs a block, keys 64 at a time, head dims of 16·n up to 128): two sequences
    // whose rows share a block, GQA groups of 4 and 3 (a block's last pair unused), a head dim
    // short of the kernel's (96 of 128), a window over released blocks, a soft cap.
    paged(
        "prefill f16 cache 2 seqs 150/90, GQA 4, D=128",
        Mask::Causal,
        &[150, 90],
        &[70, 90],
        (F16, F16),
        8,
        2,
        128,
        false,
    )?;
    paged(
        "prefill f16 cache sliding 40, released blocks",
        Mask::SlidingWindow(40),
        &[130],
        &[100],
        (F16, F16),
        4,
        1,
        64,
        true,
    )?;
    paged(
        "prefill f16 cache GQA 3, D=96",
        Mask::Causal,
        &[70],
        &[70],
        (F16, F16),
        6,
        2,
        96,
        false,
    )?;
    const CAPPED: &str = "prefill f16 cache, soft cap 2";
    paged(
        CAPPED,
        Mask::Causal,
        &[90, 33],
        &[60, 33],
        (F16, F16),
        4,
        2,
        64,
        false,
    )?;

    // Block caches: the q4_0 and TurboQuant blocks (read as stored: the rotation is the
    // executor's, outside the op), and K and V of different types.
    for (label, types, d, seqs, qs) in [
        (
            "decode q4_0 cache",
            (Q4_0, Q4_0),
            64,
            &[45usize, 17][..],
            &[1usize, 1][..],
        ),
        ("decode tq4 cache", (TQ4, TQ4), 64, &[45, 17], &[1, 1]),
        (
            "decode tq3 cache, D=128",
            (TQ3, TQ3),
            128,
            &[300, 20],
            &[1, 1],
        ),
        ("decode tq2 cache", (TQ2, TQ2), 64, &[33, 70], &[1, 1]),
        ("decode K q8_0, V tq3", (Q8_0, TQ3), 64, &[45, 17], &[1, 1]),
        ("decode K f16, V q4_0", (F16, Q4_0), 64, &[60], &[1]),
        ("decode K bf16, V bf16", (BF16, BF16), 64, &[50, 3], &[1, 1]),
        (
            "decode K f16, V bf16, D=20",
            (F16, BF16),
            20,
            &[40, 9],
            &[1, 1],
        ),
        ("prefill K tq3, V q8_0", (TQ3, Q8_0), 64, &[21, 7], &[5, 7]),
        ("prefill K tq4, V tq2, D=256", (TQ4, TQ2), 256, &[19], &[6]),
        ("decode K tq3p, V tq3", (TQ3P, TQ3), 64, &[45, 17], &[1, 1]),
        ("prefill K tq4p, V f16", (TQ4P, F16), 64, &[21, 7], &[5, 7]),
        (
            "decode K tq3t, V tq2t",
            (TQ3T, TQ2T),
            64,
            &[45, 17],
            &[1, 1],
        ),
        (
            "prefill K tq2t, V tq3t, D=128",
            (TQ2T, TQ3T),
            128,
            &[21, 7],
            &[5, 7],
        ),
    ] {
        paged(label, Mask::Causal, seqs, qs, types, 4, 2, d, false)?;
    }
    // An image's soft tokens see each other both ways: rows whose key reach (the optional
    // key_end input) runs past their own position. Sequence 0's rows 3..12 (positions
    // 23..32) reach 32, sequence 1's rows 2..6 (positions 2..6) reach 6.
    const REACH: &str = "prefill key reach (image rows)";
    for mask in [Mask::Causal, Mask::SlidingWindow(8)] {
        let label = format!("{REACH}, {mask:?}");
        paged(
            &label,
            mask,
            &[40, 7],
            &[20, 7],
            (F32, F32),
            4,
            2,
            64,
            false,
        )?;
    }
    let mut reach = vec![0i32; 27];
    reach[3..12].fill(32);
    reach[22..26].fill(6);
    for case in c.iter_mut().filter(|k| k.label.starts_with(REACH)) {
        case.inputs.push(ids(&[27], reach.clone()));
    }
    for case in c.iter_mut().filter(|k| k.label == CAPPED) {
        case.op = Op::Attention(AttentionOp::PagedAttention(AttnParams {
            scale: 0.125,
            soft_cap: Some(2.0),
            mask: Mask::Causal,
        }));
    }

    // KV write.
    for (kv, label) in [
        (F32, "f32 cache"),
        (F16, "f16 cache"),
        (BF16, "bf16 cache"),
        (Q8_0, "q8_0 cache"),
        (Q4_0, "q4_0 cache"),
        (TQ4, "tq4 cache"),
        (TQ3, "tq3 cache"),
        (TQ2, "tq2 cache"),
        (TQ4P, "tq4p cache"),
        (TQ3P, "tq3p cache"),
        (TQ3T, "tq3t cache"),
        (TQ2T, "tq2t cache"),
    ] {
        let (t, hkv, d) = (5usize, 2usize, 64usize);
        let mut r = Rng::from_label(label);
        let perm = r.permutation(8 * 16);
        let mut slots: Vec<i32> = perm[..t].iter().map(|&s| s as i32).collect();
        slots[2] = -1; // padding row: skipped
        c.push(Case::in_place(
            Op::Attention(AttentionOp::KvWrite),
            format!("{label} T={t} Hkv={hkv} D={d}"),
            vec![n(F32, &[t, hkv, d]), n(F32, &[t, hkv, d]), ids(&[t], slots)],
            vec![
                (TensorDesc::new(kv, [8, 16, hkv, d]), Gen::Normal(1.0)),
                (TensorDesc::new(kv, [8, 16, hkv, d]), Gen::Normal(1.0)),
            ],
        ));
    }

    // RoPE of q and k with the K/V write: both pair layouts, partial rotary (with and without
    // frequency factors), GQA, f32 and f16 caches. q_out starts as NaN, so an element left
    // unwritten fails the case.
    for (mode, kv, n_rot, factors, label) in [
        (RopeMode::Normal, F32, 64, false, "normal, f32 cache"),
        (RopeMode::Neox, F16, 64, false, "neox, f16 cache"),
        (
            RopeMode::Neox,
            F32,
            32,
            true,
            "neox partial + freq_factors, f32 cache",
        ),
        (
            RopeMode::Normal,
            F16,
            48,
            false,
            "normal partial, f16 cache",
        ),
    ] {
        let (t, hq, hkv, d) = (5usize, 6usize, 2usize, 64usize);
        let mut r = Rng::from_label(label);
        let perm = r.permutation(8 * 16);
        let mut slots: Vec<i32> = perm[..t].iter().map(|&s| s as i32).collect();
        slots[3] = -1; // padding row: q rotated, nothing written
        let positions = rand_ids(label, t, 4096);
        let mut p = RopeParams::new(mode, n_rot, 10000.0);
        let mut inputs = vec![
            n(F32, &[t, hq, d]),
            n(F32, &[t, hkv, d]),
            n(F32, &[t, hkv, d]),
            ids(&[t], positions),
            ids(&[t], slots),
        ];
        if factors {
            p.freq_scale = 0.5;
            inputs.push(Input::uniform(F32, &[n_rot / 2], 1.0, 8.0));
        }
        c.push(Case::in_place(
            Op::Attention(AttentionOp::RopeKvWrite(p)),
            format!("{label} T={t} Hq={hq} Hkv={hkv} D={d} n_rot={n_rot}"),
            inputs,
            vec![
                (
                    TensorDesc::new(F32, [t, hq, d]),
                    Gen::Values(vec![f32::NAN; t * hq * d]),
                ),
                (TensorDesc::new(kv, [8, 16, hkv, d]), Gen::Normal(1.0)),
                (TensorDesc::new(kv, [8, 16, hkv, d]), Gen::Normal(1.0)),
            ],
        ));
    }
    Ok(())
}
