//! The matmul family: every weight dtype at decode and prefill sizes, rows of many chunks of
//! the GPU decode kernels, operands off their alignment, and the fusions (norm, GLU, residual).

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    for w in DType::ALL.into_iter().filter(|d| !d.is_int()) {
        let k = width(w);
        // 40 tokens: past the point where a GPU backend may switch to a tiled prefill kernel
        // (float rows of 100 leave a ragged last 32-element chunk).
        for (m, phase) in [(1, "decode"), (7, "prefill"), (40, "prefill")] {
            c.push(Case::new(
                Op::MatMul(MatMulOp::MatMul),
                format!("f32 x {w} {phase} m={m} k={k} n=67"),
                vec![n(F32, &[m, k]), n(w, &[67, k])],
            )?);
        }
    }
    // A row of 73 blocks: several 256-value chunks per warp of CUDA's decode kernel and a
    // partial last one.
    c.push(Case::new(
        Op::MatMul(MatMulOp::MatMul),
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
            Op::MatMul(MatMulOp::MatMul),
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
                Op::MatMul(MatMulOp::MatMul),
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
            Op::MatMul(MatMulOp::MatMul),
            format!("{a} x {w} prefill m=5 k={k} n=33"),
            vec![n(a, &[5, k]), n(w, &[33, k])],
        )?);
    }
    // Prefill over several output tiles in both directions with ragged edges (the CUDA GEMM
    // tiles 64×64 and steps K by 32; float rows of a multiple of 32 take the same tile).
    for (w, k) in [
        (Q4_1, 320),
        (Q4_K, 512),
        (NVFP4, 256),
        (Q6_K, 256),
        (BF16, 256),
        (F16, 160),
        (F32, 128),
    ] {
        c.push(Case::new(
            Op::MatMul(MatMulOp::MatMul),
            format!("f32 x {w} prefill m=70 k={k} n=130"),
            vec![n(F32, &[70, k]), n(w, &[130, k])],
        )?);
    }
    // Rank-3 activations, more output rows than one task holds.
    c.push(Case::new(
        Op::MatMul(MatMulOp::MatMul),
        "f32 x q6_K [2,3,512] n=129",
        vec![n(F32, &[2, 3, 512]), n(Q6_K, &[129, 512])],
    )?);
    for (w, one_plus) in [(Q4_0, false), (Q6_K, true), (F16, false)] {
        let k = width(w);
        for m in [1usize, 6] {
            c.push(Case::new(
                Op::MatMul(MatMulOp::RmsNormMatMul {
                    eps: 1e-6,
                    one_plus,
                }),
                format!("{w} m={m} k={k} n=45 one_plus={one_plus}"),
                vec![n(F32, &[m, k]), n(F32, &[k]), n(w, &[45, k])],
            )?);
        }
    }
    // Decode-sized float weights with rows a multiple of 8 (the kernels' vector width), and a
    // GLU row of many 256-value chunks per warp of CUDA's decode kernel.
    c.push(Case::new(
        Op::MatMul(MatMulOp::RmsNormMatMul {
            eps: 1e-5,
            one_plus: false,
        }),
        "bf16 m=1 k=256 n=45 one_plus=false",
        vec![n(F32, &[1, 256]), n(F32, &[256]), n(BF16, &[45, 256])],
    )?);
    c.push(Case::new(
        Op::MatMul(MatMulOp::GluMatMul(GluOp::SwiGlu)),
        "q8_0 m=1 f=2304 n=37",
        vec![n(F32, &[1, 2304]), n(F32, &[1, 2304]), n(Q8_0, &[37, 2304])],
    )?);
    c.push(Case::new(
        Op::MatMul(MatMulOp::GluMatMul(GluOp::GeGlu)),
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
                Op::MatMul(MatMulOp::GluMatMul(g)),
                format!("{w} m={m} f={f} n=37"),
                vec![n(F32, &[m, f]), n(F32, &[m, f]), n(w, &[37, f])],
            )?);
        }
    }
    // Both fusions over rows of many chunks of CUDA's staged decode kernel.
    c.push(Case::new(
        Op::MatMul(MatMulOp::RmsNormMatMul {
            eps: 1e-6,
            one_plus: false,
        }),
        "q4_K m=1 k=9216 n=11 one_plus=false",
        vec![n(F32, &[1, 9216]), n(F32, &[9216]), n(Q4_K, &[11, 9216])],
    )?);
    c.push(Case::new(
        Op::MatMul(MatMulOp::GluMatMul(GluOp::SwiGlu)),
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
            Op::MatMul(MatMulOp::RmsNormMatMul {
                eps: 1e-6,
                one_plus: true,
            }),
            "q8_0 m=1 k=1024 n=21 one_plus=true",
            vec![n(F32, &[1, 1024]), n(F32, &[1024]), n(Q8_0, &[21, 1024])],
        )?
        .offset_inputs(),
    );
    c.push(
        Case::new(
            Op::MatMul(MatMulOp::GluMatMul(GluOp::SwiGlu)),
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
            Op::MatMul(MatMulOp::MatMulAdd),
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
            Op::MatMul(MatMulOp::GluMatMul(g)),
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
            Op::MatMul(MatMulOp::MatMulAdd),
            "q8_0 m=1 k=1024 n=21",
            vec![n(F32, &[1, 1024]), n(Q8_0, &[21, 1024]), n(F32, &[1, 21])],
        )?
        .offset_inputs(),
    );
    c.push(
        Case::new(
            Op::MatMul(MatMulOp::GluMatMul(GluOp::SwiGlu)),
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
            Op::MatMul(MatMulOp::RmsNormMatMul {
                eps: 1e-6,
                one_plus: m == 2,
            }),
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
            Op::MatMul(MatMulOp::RmsNormMatMul {
                eps: 1e-5,
                one_plus: false,
            }),
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
    Ok(())
}
