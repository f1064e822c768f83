//! The rotary embedding family: both pair layouts, partial rotary, frequency factors.

use super::*;

pub(super) fn cases(c: &mut Vec<Case>) -> Result<()> {
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
                Op::Rope(RopeOp::Rope(p)),
                label.clone(),
                vec![n(F32, &[t, 3, d]), pos(&label, t)],
            )?);
        }
        let mut p = RopeParams::new(mode, 64, 500000.0);
        p.freq_scale = 0.25;
        p.attn_factor = 1.1;
        let label = format!("{mode:?} scaled + freq_factors T=4");
        c.push(Case::new(
            Op::Rope(RopeOp::Rope(p)),
            label.clone(),
            vec![
                n(F32, &[4, 2, 64]),
                pos(&label, 4),
                Input::uniform(F32, &[32], 1.0, 8.0),
            ],
        )?);
        // Masked pairs (an infinite factor: no turn) beside plain and scaled ones, as M-RoPE
        // and the Qwen3.5 vision tower's 2-D RoPE turn some pairs by one position and the rest
        // by another (factors at most 1/2 of a turn's speed up: no angle past those of the
        // plain cases, where GPUs' sin and cos lose their accuracy).
        let label = format!("{mode:?} masked freq_factors T=7");
        let f: Vec<f32> = (0..16)
            .map(|j| match j % 3 {
                0 => f32::INFINITY,
                1 => 1.0,
                _ => 2.0,
            })
            .collect();
        c.push(Case::new(
            Op::Rope(RopeOp::Rope(RopeParams::new(mode, 32, 1e8))),
            label.clone(),
            vec![
                n(F32, &[7, 3, 48]),
                pos(&label, 7),
                Input {
                    desc: TensorDesc::new(F32, [16]),
                    gen: Gen::Values(f),
                },
            ],
        )?);
        let label = format!("{mode:?} f16 T=6");
        c.push(Case::new(
            Op::Rope(RopeOp::Rope(RopeParams::new(mode, 64, 10000.0))),
            label.clone(),
            vec![n(F16, &[6, 2, 64]), pos(&label, 6)],
        )?);
    }

    Ok(())
}
