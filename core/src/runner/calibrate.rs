//! The key calibration pass (`kv_center_keys`, `kv_fit_keys`).

use super::*;

impl Runner {
    /// For lossy K caches with `kv_center_keys` or `kv_fit_keys`: one pass over the
    /// calibration tokens (`kv_calibration`, else fixed pseudo-random ones;
    /// [`CALIBRATION_FIT_TOKENS`] of them for a map, else [`CALIBRATION_TEXT_TOKENS`] of a
    /// text or [`CALIBRATION_TOKENS`] random ones) measures each layer's mean key over the
    /// context's positions, which every later key has subtracted, and the map fitted to its
    /// queries, which every later key goes through (centered first), before it is quantized
    /// ([`KvCaches::keys_to_write`]: attention is unchanged, the quantization error shrinks or
    /// moves where the queries do not look). The calibration sequence is released at once;
    /// its blocks are never cached.
    pub(super) fn calibrate_keys(&mut self) -> Result<()> {
        let f = &self.fwd;
        let lossy = f.model.kv_groups().iter().any(|g| {
            g.layers
                .iter()
                .any(|&l| !f.cfg.kv_types.of_layer(l).0.is_float())
        });
        if !lossy || !(f.cfg.kv_center_keys || f.cfg.kv_fit_keys) {
            return Ok(());
        }
        let vocab = f.model.info().vocab.max(1);
        // A fitted map takes [`CALIBRATION_FIT_TOKENS`] (the text repeated as needed): the
        // layers' statistics are taken before RoPE and averaged over the context's positions
        // ([`crate::kv::rope_moments`]), so the pass need not cover the context. A mean alone
        // takes fewer (it is averaged over the context's positions the same way).
        let n = if f.cfg.kv_fit_keys {
            CALIBRATION_FIT_TOKENS.min(f.cfg.ctx)
        } else if f.cfg.kv_calibration.is_empty() {
            CALIBRATION_TOKENS.min(f.cfg.ctx)
        } else {
            CALIBRATION_TEXT_TOKENS.min(f.cfg.ctx)
        };
        let text: Vec<u32> = f
            .cfg
            .kv_calibration
            .iter()
            .copied()
            .filter(|&t| (t as usize) < vocab)
            .collect();
        let toks: Vec<u32> = if text.is_empty() {
            let mut rng = crate::rng::Rng::new(0x6b69_6c6e_6b65_7973);
            (0..n).map(|_| rng.below(vocab) as u32).collect()
        } else {
            text.iter().copied().cycle().take(n).collect()
        };
        if toks.is_empty() {
            return Ok(());
        }
        let center = f.cfg.kv_center_keys;
        if self.key_cal.is_none() {
            self.fwd
                .caches
                .begin_calibration(f.cfg.kv_fit_keys, f.cfg.ctx);
            let r = self.feed(CALIBRATION_SEQ, &toks, Logits::None);
            self.release(CALIBRATION_SEQ)?;
            let cal = self.fwd.caches.finish_calibration();
            r.map_err(|e| {
                Error::Model(format!(
                    "calibrating the keys over {} tokens: {e}",
                    toks.len()
                ))
            })?;
            self.key_cal = Some(cal);
        }
        match &self.key_cal {
            Some(cal) => self.fwd.caches.install(&self.fwd.ex, cal, center),
            None => Ok(()),
        }
    }
}
