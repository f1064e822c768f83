//! The elementwise family: broadcasts, every activation and GLU, casts and copies.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    for op in [
        Op::Elementwise(ElementwiseOp::Add),
        Op::Elementwise(ElementwiseOp::Mul),
    ] {
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
        Op::Elementwise(ElementwiseOp::Scale(0.37)),
        "f32 [3,1000]",
        vec![n(F32, &[3, 1000])],
    )?);
    c.push(Case::new(
        Op::Elementwise(ElementwiseOp::Scale(-2.5)),
        "bf16 [1,77]",
        vec![n(BF16, &[1, 77])],
    )?);
    for u in UnaryOp::ALL {
        c.push(Case::new(
            Op::Elementwise(ElementwiseOp::Unary(u)),
            "f32 [5,301]",
            vec![Input::normal(F32, &[5, 301])],
        )?);
        c.push(Case::new(
            Op::Elementwise(ElementwiseOp::Unary(u)),
            "f16 [1,64]",
            vec![n(F16, &[1, 64])],
        )?);
    }
    // Softplus's linear branch.
    c.push(Case::new(
        Op::Elementwise(ElementwiseOp::Unary(UnaryOp::Softplus)),
        "f32 wide range",
        vec![Input::uniform(F32, &[4, 50], -30.0, 30.0)],
    )?);
    for g in [GluOp::SwiGlu, GluOp::GeGlu] {
        c.push(Case::new(
            Op::Elementwise(ElementwiseOp::Glu(g)),
            "f32 [1,1536]",
            vec![n(F32, &[1, 1536]), n(F32, &[1, 1536])],
        )?);
        c.push(Case::new(
            Op::Elementwise(ElementwiseOp::Glu(g)),
            "f32 [7,257]",
            vec![n(F32, &[7, 257]), n(F32, &[7, 257])],
        )?);
    }
    for (from, to) in [(F32, F16), (F16, F32), (F32, BF16), (BF16, F16), (F32, F32)] {
        let mut cs = Case::new(
            Op::Elementwise(ElementwiseOp::Cast),
            format!("{from} -> {to} [3,71]"),
            vec![n(from, &[3, 71])],
        )?;
        cs.outputs[0].dtype = to;
        c.push(cs);
    }
    c.push(Case::new(
        Op::Elementwise(ElementwiseOp::Copy),
        "f32 [5,41]",
        vec![n(F32, &[5, 41])],
    )?);
    c.push(Case::new(
        Op::Elementwise(ElementwiseOp::Copy),
        "q4_K [3,512]",
        vec![n(Q4_K, &[3, 512])],
    )?);
    Ok(())
}
