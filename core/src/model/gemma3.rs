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
use crate::load::hf::config::{Config, Meta};
use crate::load::hf::family::{f, layer_weight, none, Field, HfFamily};
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
        images_bidirectional: true,
    };
    Ok(Box::new(Decoder::load(f, ex, spec)?))
}

// ---- Hugging Face checkpoints ----

/// What absent and null fields mean (transformers' class defaults).
const GEMMA3: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    // Null: sliding layers with no window (they still take the local RoPE).
    f("sliding_window", "4096", false),
    f("query_pre_attn_scalar", "256", true),
    f("head_dim", "256", true),
    f("num_key_value_heads", "4", true),
    none("final_logit_softcapping"),
];

/// Gemma 3's image text: its chat template writes `<start_of_image>` for an image, its
/// processor makes that the soft tokens wrapped in blank lines and the image's start and end.
pub const IMAGE_TEXT: super::tower::ImageText = super::tower::ImageText {
    marker: "<start_of_image>",
    soft_token: "<image_soft_token>",
    before: "\n\n<start_of_image>",
    after: "<end_of_image>\n\n",
};

/// Gemma 3 checkpoints: norms stored for `x·(1+w)`, the window, both RoPE bases, the query
/// scale, the layer pattern; the multimodal ones' SigLIP tower.
pub const HF: HfFamily = HfFamily {
    one_centred_norms: Some(&[]),
    defaults: &[("gemma3", GEMMA3), ("gemma3_text", GEMMA3)],
    vision: Some(hf_vision),
    ..HfFamily::new(
        &[("gemma3", "gemma3"), ("gemma3_text", "gemma3")],
        hf_meta,
        hf_names,
    )
};

/// The GGUF architecture of this file and its checkpoints.
pub const FAMILY: super::Family = super::Family {
    archs: &[("gemma3", build)],
    hf: &[&HF],
};

fn hf_meta(c: &Config, m: &mut Meta) -> Result<()> {
    use serde_json::Value as Json;
    // A null window (transformers: None) bounds nothing: the whole context.
    let window = match c.get("sliding_window") {
        Some(_) => c.usize("sliding_window")?,
        None => c.usize("max_position_embeddings")?,
    };
    m.u("attention.sliding_window", window);
    let full = Some("full_attention");
    m.f("rope.freq_base", c.rope_theta(full).unwrap_or(1_000_000.0));
    let (kind, factor) = c.rope_scaling(full)?;
    m.set("rope.scaling.type", Value::Str(kind));
    m.f("rope.scaling.factor", factor);
    let local = c
        .rope_theta(Some("sliding_attention"))
        .filter(|_| c.get("rope_parameters").is_some())
        .or_else(|| {
            c.get("rope_local_base_freq")
                .and_then(Json::as_f64)
                .map(|v| v as f32)
        });
    if let Some(b) = local {
        m.f("rope.local_freq_base", b);
    }
    if let Some(s) = c.get("query_pre_attn_scalar").and_then(Json::as_f64) {
        m.f("attention.scale", 1.0 / (s as f32).sqrt());
    }
    if let Some(types) = c.layer_types() {
        let sliding = types.iter().map(|t| Value::Bool(t == "sliding_attention"));
        m.set("attention.sliding_layers", Value::Array(sliding.collect()));
    }
    Ok(())
}

/// The projector type of Gemma 3's mmproj files (llama.cpp's `clip.projector_type`): a
/// SigLIP tower pooled to the soft tokens (`super::siglip`).
pub const PROJECTOR: &str = "gemma3";

/// A `Gemma3ForConditionalGeneration` config's tower as mmproj metadata: SigLIP's sizes
/// (transformers' class defaults where absent), and the pooling that makes
/// `mm_tokens_per_image` soft tokens.
fn hf_vision(c: &serde_json::Value) -> std::result::Result<Vec<(String, Value)>, String> {
    use serde_json::Value as Json;
    let vc = c.get("vision_config").unwrap_or(&Json::Null);
    let vision_type = vc.get("model_type").and_then(Json::as_str).unwrap_or("");
    if vision_type != "siglip_vision_model" {
        return Err(format!(
            "a {vision_type:?} vision tower is not supported (SigLIP is)"
        ));
    }
    let u = super::tower::config_u32;
    let image = u(vc, "image_size", Some(224))?;
    let patch = u(vc, "patch_size", Some(16))?;
    let tokens = u(c, "mm_tokens_per_image", Some(256))?;
    let side = (tokens as f64).sqrt() as u32;
    if patch > image || image % patch != 0 || side * side != tokens || (image / patch) % side != 0 {
        return Err(format!(
            "{image}-pixel images in {patch}-pixel patches do not pool to {tokens} soft tokens"
        ));
    }
    let text = c.get("text_config").unwrap_or(&Json::Null);
    let eps = vc
        .get("layer_norm_eps")
        .and_then(Json::as_f64)
        .unwrap_or(1e-6);
    let kv = |k: &str, v: Value| (format!("clip.{k}"), v);
    let mut meta = vec![
        kv("projector_type", Value::Str(PROJECTOR.into())),
        kv("vision.image_size", Value::U32(image)),
        kv("vision.patch_size", Value::U32(patch)),
        kv(
            "vision.projector.scale_factor",
            Value::U32((image / patch) / side),
        ),
        kv(
            "vision.attention.layer_norm_epsilon",
            Value::F32(eps as f32),
        ),
    ];
    meta.extend(super::tower::tower_meta(vc, text, 12)?);
    Ok(meta)
}

fn hf_names(hf: &str) -> Option<String> {
    layer_weight(hf, |suffix| {
        Some(match suffix {
            "post_attention_layernorm.weight" => "post_attention_norm",
            "pre_feedforward_layernorm.weight" => "ffn_norm",
            "post_feedforward_layernorm.weight" => "post_ffw_norm",
            _ => return None,
        })
    })
}
