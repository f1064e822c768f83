//! The case table: every op, at decode and prefill sizes, with odd sizes that are not
//! multiples of block or workgroup sizes.

use super::rng::Rng;
use super::{Case, Gen, Input};
use crate::error::Result;
use crate::op::{GluOp, MoeGating, Op, RopeMode, RopeParams, UnaryOp};
use crate::tensor::{DType, TensorDesc};

use DType::*;

mod attention;
mod diffusion;

/// A row width that is a whole number of blocks of `d` but not a power of two where possible.
fn width(d: DType) -> usize {
    match d.block_size() {
        1 => 100,
        32 => 96,
        64 => 192,
        _ => 512,
    }
}

fn n(d: DType, s: &[usize]) -> Input {
    Input::normal(d, s)
}

fn ids(s: &[usize], v: Vec<i32>) -> Input {
    Input::ints(s, v)
}

/// Deterministic "random" ids in `0..hi`.
fn rand_ids(seed: &str, count: usize, hi: usize) -> Vec<i32> {
    let mut r = Rng::from_label(seed);
    (0..count).map(|_| r.below(hi) as i32).collect()
}

pub fn cases() -> Result<Vec<Case>> {
    let mut c = Vec::new();
    matmul(&mut c)?;
    embed_and_elementwise(&mut c)?;
    norm_rope_softmax(&mut c)?;
    attention::attention(&mut c)?;
    reduce_and_moe(&mut c)?;
    recurrent(&mut c)?;
    fused(&mut c)?;
    diffusion::soft_embedding(&mut c)?;
    diffusion::canvas(&mut c)?;
    Ok(c)
}

fn matmul(c: &mut Vec<Case>) -> Result<()> {
    for w in DType::ALL.into_iter().filter(|d| !d.is_int()) {
        let k = width(w);
        // 40 tokens: past the point where a GPU backend may switch to a tiled prefill kernel
        // (float rows of 100 leave a ragged last 32-element chunk).
        for (m, phase) in [(1, "decode"), (7, "prefill"), (40, "prefill")] {
            c.push(Case::new(
                Op::MatMul,
                format!("f32 x {w} {phase} m={m} k={k} n=67"),
                vec![n(F32, &[m, k]), n(w, &[67, k])],
            )?);
        }
    }
    // A row of 73 blocks: several 256-value chunks per warp of CUDA's decode kernel and a
    // partial last one.
    c.push(Case::new(
        Op::MatMul,
        "f32 x q8_0 decode m=1 k=2336 n=13",
        vec![n(F32, &[1, 2336]), n(Q8_0, &[13, 2336])],
    )?);
    // Rows of many chunks of CUDA's staged decode kernel (a warp's chunk: 1024 values of Q4_K,
    // Q6_K and Q8_0, 256 of the other 32- and 64-value formats and floats), more chunks a warp
    // than its ring holds and a partial last one, in each copy unit the rows' bytes allow.
    for (w, k, m) in [
        (Q4_K, 12544, 1),
        (Q4_K, 4608, 2),
        (Q6_K, 14336, 1),
        (Q6_K, 13312, 1),
        (Q8_0, 8448, 1),
        (BF16, 4104, 1),
        (F16, 3000, 1),
        (F32, 2056, 1),
        (F32, 1280, 1),
        (F16, 3072, 1),
        (BF16, 2048, 2),
        (Q4_0, 4160, 1),
        (NVFP4, 2240, 1),
    ] {
        c.push(Case::new(
            Op::MatMul,
            format!("f32 x {w} decode m={m} k={k} n=13"),
            vec![n(F32, &[m, k]), n(w, &[13, k])],
        )?);
    }
    // Decode with the activations and the weight starting off an allocation's alignment (a
    // GPU kernel that loads wide where operands are aligned takes its other path).
    for w in [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K, NVFP4, MXFP4] {
        let k = if w.block_size() == 1 { 128 } else { width(w) };
        c.push(
            Case::new(
                Op::MatMul,
                format!("f32 x {w} decode m=1 k={k} n=67"),
                vec![n(F32, &[1, k]), n(w, &[67, k])],
            )?
            .offset_inputs(),
        );
    }
    for (a, w) in [
        (F16, F16),
        (BF16, BF16),
        (F16, Q4_0),
        (BF16, Q4_K),
        (F16, Q8_0),
    ] {
        let k = width(w);
        c.push(Case::new(
            Op::MatMul,
            format!("{a} x {w} prefill m=5 k={k} n=33"),
            vec![n(a, &[5, k]), n(w, &[33, k])],
        )?);
    }
    // Prefill over several output tiles in both directions with ragged edges (the CUDA GEMM
    // tiles 64×64 and steps K by 32).
    for (w, k) in [(Q4_1, 320), (Q4_K, 512), (NVFP4, 256), (Q6_K, 256)] {
        c.push(Case::new(
            Op::MatMul,
            format!("f32 x {w} prefill m=70 k={k} n=130"),
            vec![n(F32, &[70, k]), n(w, &[130, k])],
        )?);
    }
    // Rank-3 activations, more output rows than one task holds.
    c.push(Case::new(
        Op::MatMul,
        "f32 x q6_K [2,3,512] n=129",
        vec![n(F32, &[2, 3, 512]), n(Q6_K, &[129, 512])],
    )?);
    // MatMulId.
    for w in [F32, Q4_K, Q8_0, MXFP4] {
        let k = width(w);
        for (t, shared) in [(1, true), (5, false)] {
            let xs: Vec<usize> = if shared { vec![t, k] } else { vec![t, 2, k] };
            let label = format!(
                "{w} E=4 T={t} k=2 n=19 {}",
                if shared { "shared x" } else { "x per slot" }
            );
            c.push(Case::new(
                Op::MatMulId,
                label.clone(),
                vec![
                    n(F32, &xs),
                    n(w, &[4, 19, k]),
                    ids(&[t, 2], rand_ids(&label, t * 2, 4)),
                ],
            )?);
        }
    }
    // [T, 1, K] activations with k = 2: each token's row serves both of its slots.
    let label = "q8_0 E=3 T=40 k=2 n=70 x [T,1,K]";
    c.push(Case::new(
        Op::MatMulId,
        label,
        vec![
            n(F32, &[40, 1, 96]),
            n(Q8_0, &[3, 70, 96]),
            ids(&[40, 2], rand_ids(label, 80, 3)),
        ],
    )?);
    // Prefill with many slots per expert: several 64-slot tiles per expert, two column tiles.
    for (w, shared) in [(Q4_K, true), (Q5_0, false)] {
        let (t, kd) = (200, width(w));
        let xs: Vec<usize> = if shared { vec![t, kd] } else { vec![t, 2, kd] };
        let label = format!(
            "{w} E=3 T={t} k=2 n=70 {}",
            if shared { "shared x" } else { "x per slot" }
        );
        c.push(Case::new(
            Op::MatMulId,
            label.clone(),
            vec![
                n(F32, &xs),
                n(w, &[3, 70, kd]),
                ids(&[t, 2], rand_ids(&label, t * 2, 3)),
            ],
        )?);
    }
    Ok(())
}

fn embed_and_elementwise(c: &mut Vec<Case>) -> Result<()> {
    for t in [F32, F16, BF16, Q8_0, Q4_K, Q6_K, Q5_0] {
        let d = width(t);
        let label = format!("{t} V=37 D={d} n=6");
        c.push(Case::new(
            Op::GetRows,
            label.clone(),
            vec![n(t, &[37, d]), ids(&[6], rand_ids(&label, 6, 37))],
        )?);
    }
    for op in [Op::Add, Op::Mul] {
        c.push(Case::new(
            op.clone(),
            "f32 [7,100] + [7,100]",
            vec![n(F32, &[7, 100]), n(F32, &[7, 100])],
        )?);
        c.push(Case::new(
            op.clone(),
            "f32 [1,576] + [576]",
            vec![n(F32, &[1, 576]), n(F32, &[576])],
        )?);
        c.push(Case::new(
            op.clone(),
            "f32 [6,5,33] + [5,33]",
            vec![n(F32, &[6, 5, 33]), n(F32, &[5, 33])],
        )?);
        c.push(Case::new(
            op.clone(),
            "f16 [9,64] + f32 [64]",
            vec![n(F16, &[9, 64]), n(F32, &[64])],
        )?);
    }
    c.push(Case::new(
        Op::Scale(0.37),
        "f32 [3,1000]",
        vec![n(F32, &[3, 1000])],
    )?);
    c.push(Case::new(
        Op::Scale(-2.5),
        "bf16 [1,77]",
        vec![n(BF16, &[1, 77])],
    )?);
    for u in UnaryOp::ALL {
        c.push(Case::new(
            Op::Unary(u),
            "f32 [5,301]",
            vec![Input::normal(F32, &[5, 301])],
        )?);
        c.push(Case::new(
            Op::Unary(u),
            "f16 [1,64]",
            vec![n(F16, &[1, 64])],
        )?);
    }
    // Softplus's linear branch.
    c.push(Case::new(
        Op::Unary(UnaryOp::Softplus),
        "f32 wide range",
        vec![Input::uniform(F32, &[4, 50], -30.0, 30.0)],
    )?);
    for g in [GluOp::SwiGlu, GluOp::GeGlu] {
        c.push(Case::new(
            Op::Glu(g),
            "f32 [1,1536]",
            vec![n(F32, &[1, 1536]), n(F32, &[1, 1536])],
        )?);
        c.push(Case::new(
            Op::Glu(g),
            "f32 [7,257]",
            vec![n(F32, &[7, 257]), n(F32, &[7, 257])],
        )?);
    }
    for (from, to) in [(F32, F16), (F16, F32), (F32, BF16), (BF16, F16), (F32, F32)] {
        let mut cs = Case::new(
            Op::Cast,
            format!("{from} -> {to} [3,71]"),
            vec![n(from, &[3, 71])],
        )?;
        cs.outputs[0].dtype = to;
        c.push(cs);
    }
    c.push(Case::new(Op::Copy, "f32 [5,41]", vec![n(F32, &[5, 41])])?);
    c.push(Case::new(
        Op::Copy,
        "q4_K [3,512]",
        vec![n(Q4_K, &[3, 512])],
    )?);
    Ok(())
}

fn norm_rope_softmax(c: &mut Vec<Case>) -> Result<()> {
    for one_plus in [false, true] {
        let op = Op::RmsNorm {
            eps: 1e-6,
            one_plus,
        };
        let tag = if one_plus { "(1+w)" } else { "w" };
        c.push(Case::new(
            op.clone(),
            format!("{tag} decode [1,576]"),
            vec![n(F32, &[1, 576]), n(F32, &[576])],
        )?);
        c.push(Case::new(
            op.clone(),
            format!("{tag} prefill [9,640]"),
            vec![n(F32, &[9, 640]), n(F32, &[640])],
        )?);
        c.push(Case::new(
            op.clone(),
            format!("{tag} per head [5,4,64]"),
            vec![n(F32, &[5, 4, 64]), n(F32, &[64])],
        )?);
        c.push(Case::new(
            op,
            format!("{tag} f16 [3,100]"),
            vec![n(F16, &[3, 100]), n(F32, &[100])],
        )?);
    }
    c.push(Case::new(
        Op::L2Norm { eps: 1e-6 },
        "decode [1,4,128]",
        vec![n(F32, &[1, 4, 128])],
    )?);
    c.push(Case::new(
        Op::L2Norm { eps: 1e-6 },
        "prefill [9,3,37]",
        vec![n(F32, &[9, 3, 37])],
    )?);

    let pos = |label: &str, t: usize| ids(&[t], rand_ids(label, t, 4096));
    for mode in [RopeMode::Normal, RopeMode::Neox] {
        for (t, d, n_rot) in [
            (1usize, 64usize, 64usize),
            (9, 64, 64),
            (5, 128, 32),
            (3, 80, 40),
        ] {
            let p = RopeParams::new(mode, n_rot, 10000.0);
            let label = format!("{mode:?} T={t} H=3 D={d} n_rot={n_rot}");
            c.push(Case::new(
                Op::Rope(p),
                label.clone(),
                vec![n(F32, &[t, 3, d]), pos(&label, t)],
            )?);
        }
        let mut p = RopeParams::new(mode, 64, 500000.0);
        p.freq_scale = 0.25;
        p.attn_factor = 1.1;
        let label = format!("{mode:?} scaled + freq_factors T=4");
        c.push(Case::new(
            Op::Rope(p),
            label.clone(),
            vec![
                n(F32, &[4, 2, 64]),
                pos(&label, 4),
                Input::uniform(F32, &[32], 1.0, 8.0),
            ],
        )?);
        let label = format!("{mode:?} f16 T=6");
        c.push(Case::new(
            Op::Rope(RopeParams::new(mode, 64, 10000.0)),
            label.clone(),
            vec![n(F16, &[6, 2, 64]), pos(&label, 6)],
        )?);
    }

    let sm = |scale, cap| Op::Softmax {
        scale,
        soft_cap: cap,
    };
    c.push(Case::new(
        sm(1.0, None),
        "[1,32000]",
        vec![n(F32, &[1, 32000])],
    )?);
    c.push(Case::new(
        sm(0.125, None),
        "[7,33]",
        vec![n(F32, &[7, 33])],
    )?);
    c.push(Case::new(
        sm(1.0, Some(30.0)),
        "soft cap 30 [4,100]",
        vec![Input::uniform(F32, &[4, 100], -80.0, 80.0)],
    )?);
    // Mask broadcast over 3 heads of 5 queries, with -inf entries (causal pattern).
    let mut mask = vec![0f32; 5 * 9];
    for q in 0..5 {
        for k in 0..9 {
            if k > q + 4 {
                mask[q * 9 + k] = f32::NEG_INFINITY;
            }
        }
    }
    let mi = Input {
        desc: TensorDesc::new(F32, [5, 9]),
        gen: Gen::Values(mask),
    };
    let cs = Case::new(
        sm(0.5, None),
        "masked [3,5,9] mask [5,9]",
        vec![n(F32, &[3, 5, 9]), mi],
    )?;
    c.push(cs);
    Ok(())
}

fn reduce_and_moe(c: &mut Vec<Case>) -> Result<()> {
    c.push(Case::new(
        Op::Argmax,
        "[1,49152]",
        vec![n(F32, &[1, 49152])],
    )?);
    c.push(Case::new(Op::Argmax, "[7,1001]", vec![n(F32, &[7, 1001])])?);
    c.push(Case::new(
        Op::TopK(1),
        "k=1 [3,100]",
        vec![n(F32, &[3, 100])],
    )?);
    c.push(Case::new(
        Op::TopK(40),
        "k=40 [2,32000]",
        vec![n(F32, &[2, 32000])],
    )?);
    // Rows of small integers: many ties, which go to the lower index.
    for (op, label) in [
        (Op::Argmax, "ties [3,300]"),
        (Op::TopK(9), "k=9 ties [3,300]"),
    ] {
        c.push(Case::new(
            op,
            label,
            vec![Input {
                desc: TensorDesc::new(F32, [3, 300]),
                gen: Gen::Ints(rand_ids(label, 900, 6)),
            }],
        )?);
    }
    c.push(Case::new(
        Op::TopK(5),
        "k=5 f16 [4,77]",
        vec![n(F16, &[4, 77])],
    )?);
    for (t, k, nn) in [(1usize, 1usize, 64usize), (7, 4, 96), (3, 8, 2050)] {
        c.push(Case::new(
            Op::MoeSum,
            format!("T={t} k={k} N={nn}"),
            vec![n(F32, &[t, k, nn]), n(F32, &[t, k])],
        )?);
    }
    for (gating, normalize) in [
        (MoeGating::Softmax, true),
        (MoeGating::Softmax, false),
        (MoeGating::Sigmoid, true),
    ] {
        for (t, e, k) in [(1usize, 8usize, 2usize), (6, 64, 8)] {
            let op = Op::MoeRoute {
                k,
                gating,
                normalize,
            };
            c.push(Case::new(
                op,
                format!("{gating:?} norm={normalize} T={t} E={e} k={k}"),
                vec![n(F32, &[t, e])],
            )?);
        }
    }
    Ok(())
}

fn recurrent(c: &mut Vec<Case>) -> Result<()> {
    // Conv1d: two sequences of 5 and 1 tokens, K=4, C=67.
    for silu in [false, true] {
        c.push(Case::new(
            Op::Conv1d { silu },
            format!("silu={silu} seqs 5+1 K=4 C=67"),
            vec![
                n(F32, &[6, 67]),
                n(F32, &[67, 4]),
                n(F32, &[2, 3, 67]),
                ids(&[3], vec![0, 5, 6]),
            ],
        )?);
    }
    c.push(Case::new(
        Op::Conv1d { silu: true },
        "prefill 1 seq 33 K=4 C=128",
        vec![
            n(F32, &[33, 128]),
            n(F32, &[128, 4]),
            n(F32, &[1, 3, 128]),
            ids(&[2], vec![0, 33]),
        ],
    )?);

    // DeltaNet: log decays g < 0, β in (0, 1), q/k of unit scale as after the L2 norm.
    let dn = |t: usize, seqs: Vec<i32>, hk: usize, hv: usize, dk: usize, dv: usize| {
        let s = seqs.len() - 1;
        vec![
            Input::uniform(F32, &[t, hk, dk], -0.3, 0.3),
            Input::uniform(F32, &[t, hk, dk], -0.3, 0.3),
            n(F32, &[t, hv, dv]),
            Input::uniform(F32, &[t, hv], -1.0, -0.01),
            Input::uniform(F32, &[t, hv], 0.05, 0.95),
            Input::uniform(F32, &[s, hv, dk, dv], -0.5, 0.5),
            ids(&[s + 1], seqs),
        ]
    };
    for chunk in [None, Some(4), Some(64)] {
        let op = Op::DeltaNet { scale: 0.25, chunk };
        let tag = chunk.map_or("recurrent".to_string(), |c| format!("chunk {c}"));
        c.push(Case::new(
            op.clone(),
            format!("{tag} decode 3 seqs Hk=2 Hv=4 Dk=16 Dv=24"),
            dn(3, vec![0, 1, 2, 3], 2, 4, 16, 24),
        )?);
        c.push(Case::new(
            op,
            format!("{tag} prefill seqs 11+6 Hk=1 Hv=2 Dk=32 Dv=32"),
            dn(17, vec![0, 11, 17], 1, 2, 32, 32),
        )?);
    }
    Ok(())
}

fn fused(c: &mut Vec<Case>) -> Result<()> {
    for (w, one_plus) in [(Q4_0, false), (Q6_K, true), (F16, false)] {
        let k = width(w);
        for m in [1usize, 6] {
            c.push(Case::new(
                Op::RmsNormMatMul {
                    eps: 1e-6,
                    one_plus,
                },
                format!("{w} m={m} k={k} n=45 one_plus={one_plus}"),
                vec![n(F32, &[m, k]), n(F32, &[k]), n(w, &[45, k])],
            )?);
        }
    }
    // Decode-sized float weights with rows a multiple of 8 (the kernels' vector width), and a
    // GLU row of many 256-value chunks per warp of CUDA's decode kernel.
    c.push(Case::new(
        Op::RmsNormMatMul {
            eps: 1e-5,
            one_plus: false,
        },
        "bf16 m=1 k=256 n=45 one_plus=false",
        vec![n(F32, &[1, 256]), n(F32, &[256]), n(BF16, &[45, 256])],
    )?);
    c.push(Case::new(
        Op::GluMatMul(GluOp::SwiGlu),
        "q8_0 m=1 f=2304 n=37",
        vec![n(F32, &[1, 2304]), n(F32, &[1, 2304]), n(Q8_0, &[37, 2304])],
    )?);
    c.push(Case::new(
        Op::GluMatMul(GluOp::GeGlu),
        "f32 m=2 f=264 n=70",
        vec![n(F32, &[2, 264]), n(F32, &[2, 264]), n(F32, &[70, 264])],
    )?);
    for (g, w) in [
        (GluOp::SwiGlu, Q4_K),
        (GluOp::GeGlu, F16),
        (GluOp::SwiGlu, MXFP4),
    ] {
        let f = width(w);
        for m in [1usize, 5] {
            c.push(Case::new(
                Op::GluMatMul(g),
                format!("{w} m={m} f={f} n=37"),
                vec![n(F32, &[m, f]), n(F32, &[m, f]), n(w, &[37, f])],
            )?);
        }
    }
    // Both fusions over rows of many chunks of CUDA's staged decode kernel.
    c.push(Case::new(
        Op::RmsNormMatMul {
            eps: 1e-6,
            one_plus: false,
        },
        "q4_K m=1 k=9216 n=11 one_plus=false",
        vec![n(F32, &[1, 9216]), n(F32, &[9216]), n(Q4_K, &[11, 9216])],
    )?);
    c.push(Case::new(
        Op::GluMatMul(GluOp::SwiGlu),
        "q6_K m=1 f=10240 n=9",
        vec![
            n(F32, &[1, 10240]),
            n(F32, &[1, 10240]),
            n(Q6_K, &[9, 10240]),
        ],
    )?);
    // Both fusions with every operand off an allocation's alignment.
    c.push(
        Case::new(
            Op::RmsNormMatMul {
                eps: 1e-6,
                one_plus: true,
            },
            "q8_0 m=1 k=1024 n=21 one_plus=true",
            vec![n(F32, &[1, 1024]), n(F32, &[1024]), n(Q8_0, &[21, 1024])],
        )?
        .offset_inputs(),
    );
    c.push(
        Case::new(
            Op::GluMatMul(GluOp::SwiGlu),
            "q4_K m=1 f=1536 n=19",
            vec![n(F32, &[1, 1536]), n(F32, &[1, 1536]), n(Q4_K, &[19, 1536])],
        )?
        .offset_inputs(),
    );
    // The residual add as the projection's epilogue: decode and prefill rows, float and block
    // weights, rows of outputs not a multiple of 4, and operands off their alignment.
    for (w, m, k, rows) in [
        (Q4_K, 1usize, 512usize, 45usize),
        (Q6_K, 3, 512, 13),
        (BF16, 1, 256, 70),
        (F32, 2, 100, 9),
        (Q8_0, 6, 96, 37),
    ] {
        c.push(Case::new(
            Op::MatMulAdd,
            format!("{w} m={m} k={k} n={rows}"),
            vec![n(F32, &[m, k]), n(w, &[rows, k]), n(F32, &[m, rows])],
        )?);
    }
    for (g, w, m, f, rows) in [
        (GluOp::SwiGlu, Q4_K, 1usize, 512usize, 37usize),
        (GluOp::GeGlu, F16, 2, 256, 19),
        (GluOp::SwiGlu, Q4_0, 6, 96, 21),
    ] {
        c.push(Case::new(
            Op::GluMatMul(g),
            format!("{w} m={m} f={f} n={rows} + residual"),
            vec![
                n(F32, &[m, f]),
                n(F32, &[m, f]),
                n(w, &[rows, f]),
                n(F32, &[m, rows]),
            ],
        )?);
    }
    c.push(
        Case::new(
            Op::MatMulAdd,
            "q8_0 m=1 k=1024 n=21",
            vec![n(F32, &[1, 1024]), n(Q8_0, &[21, 1024]), n(F32, &[1, 21])],
        )?
        .offset_inputs(),
    );
    c.push(
        Case::new(
            Op::GluMatMul(GluOp::SwiGlu),
            "q4_K m=1 f=1536 n=19 + residual",
            vec![
                n(F32, &[1, 1536]),
                n(F32, &[1, 1536]),
                n(Q4_K, &[19, 1536]),
                n(F32, &[1, 19]),
            ],
        )?
        .offset_inputs(),
    );
    // One norm shared by several projections (Q, K, V; gate, up): one launch where the weights
    // share a type, rows of the small ones not a multiple of the kernels' 4 a block, a mixed
    // set (which CUDA declines: the composed path), decode and prefill rows, and every operand
    // off its allocation's alignment.
    let shared: [(DType, &[usize], usize, DType); 5] = [
        (Q4_K, &[45, 13, 13], 1, Q4_K),
        (Q4_K, &[45, 13, 13], 3, Q6_K),
        (F16, &[7, 9, 4], 2, F16),
        (Q8_0, &[37, 37], 1, Q8_0),
        (BF16, &[70, 6], 6, BF16),
    ];
    for (w, rows, m, last) in shared {
        let k = if w.block_size() == 256 { 512 } else { 256 };
        let mut ins = vec![n(F32, &[m, k]), n(F32, &[k])];
        for (j, &r) in rows.iter().enumerate() {
            ins.push(n(if j + 1 == rows.len() { last } else { w }, &[r, k]));
        }
        let names: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
        let tail = if last == w {
            String::new()
        } else {
            format!(", last {last}")
        };
        c.push(Case::new(
            Op::RmsNormMatMul {
                eps: 1e-6,
                one_plus: m == 2,
            },
            format!(
                "{w} x{} m={m} k={k} n={}{tail}",
                rows.len(),
                names.join("+")
            ),
            ins,
        )?);
    }
    c.push(
        Case::new(
            Op::RmsNormMatMul {
                eps: 1e-5,
                one_plus: false,
            },
            "q4_0 x3 m=1 k=1024 n=21+8+8",
            vec![
                n(F32, &[1, 1024]),
                n(F32, &[1024]),
                n(Q4_0, &[21, 1024]),
                n(Q4_0, &[8, 1024]),
                n(Q4_0, &[8, 1024]),
            ],
        )?
        .offset_inputs(),
    );
    for l2 in [None, Some(1e-6)] {
        let (s, hk, hv, dk, dv, pool) = (3usize, 2usize, 4usize, 16usize, 24usize, 5usize);
        c.push(Case::in_place(
            Op::DeltaNetDecode {
                scale: 0.25,
                qk_l2norm: l2,
            },
            format!("l2norm={} S={s} pool={pool} Hk={hk} Hv={hv}", l2.is_some()),
            vec![
                Input::uniform(F32, &[s, hk, dk], -0.3, 0.3),
                Input::uniform(F32, &[s, hk, dk], -0.3, 0.3),
                n(F32, &[s, hv, dv]),
                Input::uniform(F32, &[s, hv], -1.0, -0.01),
                Input::uniform(F32, &[s, hv], 0.05, 0.95),
                ids(&[s], vec![4, 0, 2]),
            ],
            vec![
                (TensorDesc::new(F32, [s, hv, dv]), Gen::Normal(1.0)),
                (
                    TensorDesc::new(F32, [pool, hv, dk, dv]),
                    Gen::Uniform(-0.5, 0.5),
                ),
            ],
        ));
    }
    for silu in [false, true] {
        c.push(Case::in_place(
            Op::Conv1dDecode { silu },
            format!("silu={silu} S=3 pool=4 K=4 C=67"),
            vec![n(F32, &[3, 67]), n(F32, &[67, 4]), ids(&[3], vec![3, 1, 0])],
            vec![
                (TensorDesc::new(F32, [3, 67]), Gen::Normal(1.0)),
                (TensorDesc::new(F32, [4, 3, 67]), Gen::Normal(1.0)),
            ],
        ));
    }
    Ok(())
}
