//! Gemma 3 in GGUF (`gemma3`): interleaved sliding-window and full attention (every sixth layer
//! is global), QK-norm, embeddings scaled by sqrt(n_embd), post-attention and post-MLP norms,
//! GeGLU, and two RoPE bases (10k on local layers, the file's base on global ones).
//!
//! GGUF conversions fold Gemma's `1 + w` into the stored norm weights, so the norms here are
//! plain RMSNorms.

use super::decoder::{Decoder, DecoderSpec};
use super::llama::{base_info, f32_or, n_rot, rope_freq_scale};
use super::Model;
use crate::backend::Executor;
use crate::error::Result;
use crate::load::gguf::GgufFile;
use crate::op::{GluOp, RopeMode, RopeParams};

/// Every `SWA_PERIOD`-th layer (the last of each period) attends globally.
const SWA_PERIOD: usize = 6;
/// RoPE base of the sliding-window layers.
const LOCAL_ROPE_BASE: f32 = 10_000.0;

pub fn build(f: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    let info = base_info(f)?;
    let eps = f.get_f32(&f.arch_key("attention.layer_norm_rms_epsilon"))?;
    let window = f.get_u64(&f.arch_key("attention.sliding_window"))? as usize;
    let rot = n_rot(f, info.head_dim)?;
    let mut global = RopeParams::new(
        RopeMode::Neox,
        rot,
        f32_or(f, &f.arch_key("rope.freq_base"), 1_000_000.0)?,
    );
    global.freq_scale = rope_freq_scale(f)?;
    let local = RopeParams::new(RopeMode::Neox, rot, LOCAL_ROPE_BASE);
    let n = info.n_layer;
    let is_global = |l: usize| (l + 1) % SWA_PERIOD == 0;
    let spec = DecoderSpec {
        eps,
        embed_scale: Some((info.n_embd as f32).sqrt()),
        norm_one_plus: false,
        qk_norm: true,
        post_norms: true,
        act: GluOp::GeGlu,
        attn_scale: 1.0 / (info.head_dim as f32).sqrt(),
        attn_soft_cap: None,
        final_soft_cap: None,
        rope: (0..n)
            .map(|l| if is_global(l) { global } else { local })
            .collect(),
        window: (0..n)
            .map(|l| if is_global(l) { None } else { Some(window) })
            .collect(),
        rope_freqs: None,
        info,
    };
    Ok(Box::new(Decoder::load(f, ex, spec)?))
}
