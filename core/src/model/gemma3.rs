//! Gemma 3 in GGUF (`gemma3`): interleaved sliding-window and full attention (every sixth layer
//! is global), QK-norm, embeddings scaled by sqrt(n_embd), post-attention and post-MLP norms,
//! GeGLU, and two RoPE bases (10k on local layers, the file's base on global ones).
//!
//! GGUF conversions fold Gemma's `1 + w` into the stored norm weights, so the norms here are
//! plain RMSNorms.

use super::decoder::{Decoder, DecoderSpec};
use super::llama::{base_info, f32_or, n_rot, rope_freq_scale};
use super::Model;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::{GgufFile, Value};
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
    let local = RopeParams::new(
        RopeMode::Neox,
        rot,
        f32_or(f, &f.arch_key("rope.local_freq_base"), LOCAL_ROPE_BASE)?,
    );
    let n = info.n_layer;
    // Which layers slide: listed (Hugging Face's `layer_types`), or the fixed period.
    let sliding: Vec<bool> = match f.get(&f.arch_key("attention.sliding_layers")) {
        Some(Value::Array(v)) if v.len() == n => {
            v.iter().map(|x| matches!(x, Value::Bool(true))).collect()
        }
        Some(_) => {
            return Err(Error::load(
                f.path(),
                format!(
                    "{} must list one flag per layer",
                    f.arch_key("attention.sliding_layers")
                ),
            ))
        }
        None => (0..n).map(|l| (l + 1) % SWA_PERIOD != 0).collect(),
    };
    let is_global = |l: usize| !sliding[l];
    let attn_scale = f32_or(
        f,
        &f.arch_key("attention.scale"),
        1.0 / (info.head_dim as f32).sqrt(),
    )?;
    let spec = DecoderSpec {
        eps,
        embed_scale: Some((info.n_embd as f32).sqrt()),
        norm_one_plus: false,
        qk_norm: true,
        post_norms: true,
        act: GluOp::GeGlu,
        attn_scale,
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
