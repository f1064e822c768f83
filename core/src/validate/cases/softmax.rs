//! The softmax family: scales, soft caps and broadcast masks.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    let sm = |scale, cap| {
        Op::Softmax(SoftmaxOp::Softmax {
            scale,
            soft_cap: cap,
        })
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
