//! The canvas family: block diffusion's denoising step.

use super::*;

/// The draw over logits at a canvas's temperatures (including near-zero, where the draw is
/// the argmax, rows of integers with ties, and Gemma's vocabulary of 262,144), and the
/// acceptance with stable and unstable histories, canvases longer than one thread's share, and
/// the longest canvas.
pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
    for (t, v, temp) in [
        (8usize, 320usize, 0.8f32),
        (8, 1001, 0.4),
        (5, 777, 1e-4),
        (4, 262_144, 0.6),
    ] {
        c.push(Case::new(
            Op::Canvas(CanvasOp::CanvasDraw {
                scale: 1.0 / temp,
                seed: 0x5eed_0000_0000_0001 ^ v as u64,
            }),
            format!("T={t} V={v} t={temp}"),
            vec![Input::normal(F32, &[t, v])],
        )?);
    }
    let label = "ties T=3 V=300 t=0.5";
    c.push(Case::new(
        Op::Canvas(CanvasOp::CanvasDraw {
            scale: 2.0,
            seed: 99,
        }),
        label,
        vec![Input {
            desc: TensorDesc::new(F32, [3, 300]),
            gen: Gen::Ints(rand_ids(label, 900, 6)),
        }],
    )?);
    // (T, stability, history equal to the argmax, entropy range, bound, confidence).
    for (t, s, same, hi, bound, conf) in [
        (8usize, 2usize, false, 0.4f32, 0.3f32, 0.005f32),
        (40, 1, true, 0.001, 0.01, 0.005),
        (40, 1, true, 0.5, 2.0, 0.005),
        (300, 0, false, 0.1, 1.0, 0.2),
        (1024, 3, true, 0.05, 5.0, 0.01),
    ] {
        let label = format!(
            "T={t} S={s} history {} H<{hi} bound={bound}",
            match same {
                true => "= argmax",
                false => "random",
            }
        );
        let vocab = 5000;
        let argmax = rand_ids(&format!("{label} argmax"), t, vocab);
        let rows = s.max(1);
        let history = match same {
            true => argmax.iter().cycle().take(rows * t).copied().collect(),
            false => rand_ids(&format!("{label} history"), rows * t, vocab),
        };
        c.push(Case::in_place(
            Op::Canvas(CanvasOp::CanvasAccept {
                entropy_bound: bound,
                confidence: conf,
                stability: s,
                vocab,
                seed: 0xacce_0000 + t as u64,
            }),
            label.clone(),
            vec![
                ids(&[t], argmax),
                ids(&[t], rand_ids(&format!("{label} drawn"), t, vocab)),
                Input::uniform(F32, &[t], 0.0, hi),
            ],
            vec![
                (
                    TensorDesc::new(I32, [t]),
                    Gen::Ints(rand_ids(&format!("{label} canvas"), t, vocab)),
                ),
                (TensorDesc::new(I32, [rows, t]), Gen::Ints(history)),
                (TensorDesc::new(I32, [2]), Gen::Ints(vec![-5, -5])),
            ],
        ));
    }
    Ok(())
}
