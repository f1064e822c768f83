//! The normalisation family.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    for one_plus in [false, true] {
        let op = Op::Norm(NormOp::RmsNorm {
            eps: 1e-6,
            one_plus,
        });
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
        Op::Norm(NormOp::L2Norm { eps: 1e-6 }),
        "decode [1,4,128]",
        vec![n(F32, &[1, 4, 128])],
    )?);
    c.push(Case::new(
        Op::Norm(NormOp::L2Norm { eps: 1e-6 }),
        "prefill [9,3,37]",
        vec![n(F32, &[9, 3, 37])],
    )?);
    // LayerNorm: rows far from zero mean (the variance is taken about the mean, not the
    // origin), a row wider than a workgroup, decode and per-head shapes, f16 activations.
    let ln = Op::Norm(NormOp::LayerNorm { eps: 1e-6 });
    for (label, x) in [
        ("decode [1,1152]", n(F32, &[1, 1152])),
        (
            "prefill [7,300] mean 4",
            Input::uniform(F32, &[7, 300], 3.0, 5.0),
        ),
        ("per head [5,4,64]", n(F32, &[5, 4, 64])),
        ("f16 [3,100]", n(F16, &[3, 100])),
    ] {
        let d = *x.desc.shape.0.last().unwrap_or(&1);
        c.push(Case::new(
            ln.clone(),
            label,
            vec![x, n(F32, &[d]), n(F32, &[d])],
        )?);
    }
    Ok(())
}
