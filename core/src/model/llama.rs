//! The Llama family in GGUF (`llama`: Llama 2/3, SmolLM2, Mistral-style dense models), and
//! Qwen3 (`qwen3`), the same block with QK-norm.

use super::decoder::{Decoder, DecoderSpec};
use super::{Model, ModelInfo};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::load::hf::config::{Config, Meta};
use crate::load::hf::family::{f, no_names, none, Field, HfFamily};
use crate::op::{GluOp, RopeMode, RopeParams};

/// Sizes every dense family reads the same way from `{arch}.*` metadata.
pub(crate) fn base_info(f: &GgufFile) -> Result<ModelInfo> {
    let arch = f.architecture()?.to_string();
    let u = |k: &str| -> Result<usize> { Ok(f.get_u64(&f.arch_key(k))? as usize) };
    let n_embd = u("embedding_length")?;
    let n_head = u("attention.head_count")?;
    let n_head_kv = match f.get(&f.arch_key("attention.head_count_kv")) {
        // Per layer (Gemma 4): the most any layer has.
        Some(crate::load::gguf::Value::Array(v)) => v
            .iter()
            .filter_map(|x| x.as_u64())
            .max()
            .unwrap_or(n_head as u64) as usize,
        Some(_) => u("attention.head_count_kv")?,
        None => n_head,
    };
    let head_dim = match f.get(&f.arch_key("attention.key_length")) {
        Some(_) => u("attention.key_length")?,
        None if n_head > 0 => n_embd / n_head,
        None => 0,
    };
    let tok = f.tensor("token_embd.weight")?;
    let vocab = tok.shape.first().copied().unwrap_or(0);
    let n_layer = u("block_count")?;
    // MoE-only models have no dense FFN width: the experts' width stands in.
    let n_ff = u("feed_forward_length").or_else(|_| u("expert_feed_forward_length"))?;
    // Sizes from a file are bounded before any shape is computed from them (products of two
    // then fit in a usize, and nothing overflows on the way to a shape check).
    for (what, v, most) in [
        ("block_count", n_layer, 1 << 16),
        ("embedding_length", n_embd, 1 << 22),
        ("attention.head_count", n_head, 1 << 16),
        ("attention.head_count_kv", n_head_kv, 1 << 16),
        ("attention.key_length", head_dim, 1 << 16),
        ("vocabulary", vocab, 1 << 24),
        ("feed_forward_length", n_ff, 1 << 22),
    ] {
        if v > most {
            return Err(crate::Error::load(
                f.path(),
                format!("{what} = {v} is beyond any model kiln runs (at most {most})"),
            ));
        }
    }
    Ok(ModelInfo {
        name: f
            .get("general.name")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        n_layer,
        n_embd,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        vocab,
        context_length: u("context_length")?,
        architecture: arch,
        n_params: 0,
        dtypes: Vec::new(),
    })
}

/// `{arch}.rope.dimension_count`, defaulting to the head dim.
pub(crate) fn n_rot(f: &GgufFile, head_dim: usize) -> Result<usize> {
    match f.get(&f.arch_key("rope.dimension_count")) {
        Some(_) => Ok(f.get_u64(&f.arch_key("rope.dimension_count"))? as usize),
        None => Ok(head_dim),
    }
}

pub(crate) fn f32_or(f: &GgufFile, key: &str, default: f32) -> Result<f32> {
    match f.get(key) {
        Some(_) => f.get_f32(key),
        None => Ok(default),
    }
}

/// Linear RoPE scaling from `{arch}.rope.scaling.*` (YaRN and others are refused, not ignored).
pub(crate) fn rope_freq_scale(f: &GgufFile) -> Result<f32> {
    let ty = f
        .get(&f.arch_key("rope.scaling.type"))
        .and_then(|v| v.as_str())
        .unwrap_or("none");
    let factor = f32_or(f, &f.arch_key("rope.scaling.factor"), 1.0)?;
    match ty {
        "none" => Ok(1.0),
        "linear" if factor > 0.0 => Ok(1.0 / factor),
        other => Err(Error::load(
            f.path(),
            format!("RoPE scaling type {other:?} (factor {factor}) is not supported yet"),
        )),
    }
}

pub fn build(f: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    build_dense(f, ex, false)
}

/// Qwen3 (`qwen3`): the Llama block with per-head RMSNorm of q and k, and rotate-half RoPE.
pub fn build_qwen3(f: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    build_dense(f, ex, true)
}

fn build_dense(f: &GgufFile, ex: &Executor, qwen3: bool) -> Result<Box<dyn Model>> {
    let info = base_info(f)?;
    let eps = f.get_f32(&f.arch_key("attention.layer_norm_rms_epsilon"))?;
    let base = f32_or(f, &f.arch_key("rope.freq_base"), 10000.0)?;
    let mode = if qwen3 {
        RopeMode::Neox
    } else {
        RopeMode::Normal
    };
    let mut rope = RopeParams::new(mode, n_rot(f, info.head_dim)?, base);
    rope.freq_scale = rope_freq_scale(f)?;
    let rope_freqs = match f.tensors().iter().find(|t| t.name == "rope_freqs.weight") {
        Some(_) => {
            let (t, bytes) = f.data("rope_freqs.weight")?;
            let mut v = vec![0f32; t.shape.iter().product()];
            crate::quant::dequantize(t.dtype, &bytes, &mut v)?;
            Some(v)
        }
        None => None,
    };
    let n = info.n_layer;
    let spec = DecoderSpec {
        eps,
        embed_scale: None,
        norm_one_plus: false,
        qk_norm: qwen3,
        post_norms: false,
        act: GluOp::SwiGlu,
        attn_scale: 1.0 / (info.head_dim as f32).sqrt(),
        attn_soft_cap: None,
        final_soft_cap: None,
        rope: vec![rope; n],
        window: vec![None; n],
        rope_freqs,
        info,
        images_bidirectional: false,
    };
    Ok(Box::new(Decoder::load(f, ex, spec)?))
}

// ---- Hugging Face checkpoints ----

/// What absent and null fields mean (transformers' class defaults).
const LLAMA: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "2048", true),
    none("head_dim"),
    none("num_key_value_heads"),
];

const MISTRAL: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    none("head_dim"),
    f("num_key_value_heads", "8", false),
];

const QWEN3: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "32768", true),
    f("head_dim", "128", true),
    // A null count of KV heads is the count of heads (the class's own `None` handling).
    f("num_key_value_heads", "32", false),
];

/// Llama (and Mistral) checkpoints: the RoPE base and scaling; Q and K rows in the
/// rotate-half layout.
pub const HF_LLAMA: HfFamily = HfFamily {
    rotate_half_qk: true,
    defaults: &[("llama", LLAMA), ("mistral", MISTRAL)],
    ..HfFamily::new(
        &[("llama", "llama"), ("mistral", "llama")],
        rope_meta,
        no_names,
    )
};

/// Qwen3 checkpoints (its rotate-half RoPE is the `qwen3` architecture's own).
pub const HF_QWEN3: HfFamily = HfFamily {
    defaults: &[("qwen3", QWEN3)],
    ..HfFamily::new(&[("qwen3", "qwen3")], rope_meta, no_names)
};

/// The GGUF architectures of this file and its checkpoints.
pub const FAMILY: super::Family = super::Family {
    archs: &[("llama", build), ("qwen3", build_qwen3)],
    hf: &[&HF_LLAMA, &HF_QWEN3],
};

/// The RoPE base and scaling of a Llama-style config.
fn rope_meta(c: &Config, m: &mut Meta) -> Result<()> {
    m.f("rope.freq_base", c.rope_theta(None).unwrap_or(10_000.0));
    let (kind, factor) = c.rope_scaling(None)?;
    m.set("rope.scaling.type", crate::load::gguf::Value::Str(kind));
    m.f("rope.scaling.factor", factor);
    Ok(())
}
