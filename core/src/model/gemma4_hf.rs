//! Gemma 4's `config.json` read into the GGUF view's metadata (per-layer head sizes and KV
//! heads, the layer pattern, RoPE, K = V, KV sharing, per-layer embeddings, the MoE block, the
//! image mask); the family's declaration and tensor names are in `gemma4.rs`.

use crate::error::Result;
use crate::load::gguf::Value;
use crate::load::hf::config::{Config, Meta};
use serde_json::Value as Json;

/// Gemma 4: per-layer head sizes (sliding and full layers differ), the window, both RoPEs,
/// K = V on full layers, KV sharing, per-layer embeddings, soft-capping.
pub(crate) fn hf_meta(c: &Config, m: &mut Meta) -> Result<()> {
    let layers = c.usize("num_hidden_layers")?;
    // Absent or null: five sliding layers to one full (transformers' default pattern). The
    // last layer attends fully whatever the list says (transformers forces it, with a
    // warning).
    let mut types = match (c.get("layer_types"), c.layer_types()) {
        (_, Some(t)) if t.len() == layers => t,
        (Some(_), _) => return Err(c.err("config.json: layer_types must list every layer")),
        (None, _) => (0..layers)
            .map(|l| match (l + 1) % 6 {
                0 => "full_attention".to_string(),
                _ => "sliding_attention".to_string(),
            })
            .collect(),
    };
    if let Some(last) = types.last_mut() {
        *last = "full_attention".to_string();
    }
    let hd = c.usize("head_dim")?;
    let nkv = c.usize("num_key_value_heads")?;
    // Per-layer sizes as transformers makes them: a `per_layer_config` is taken as it is
    // (layers it does not list keep the shared sizes); without one, full layers take
    // `global_head_dim` (512 when absent) and, where K = V (or the model type has no such
    // switch: DiffusionGemma), `num_global_key_value_heads`.
    let per_layer = c.get("per_layer_config");
    let global_hd = c
        .get("global_head_dim")
        .and_then(Json::as_u64)
        .map_or(512, |v| v as usize);
    let k_eq_v_gate = c
        .get("attention_k_eq_v")
        .and_then(Json::as_bool)
        .unwrap_or(true);
    let global_kv = c
        .get("num_global_key_value_heads")
        .and_then(Json::as_u64)
        .filter(|_| k_eq_v_gate)
        .map(|v| v as usize);
    let (mut dims, mut kvs) = (Vec::new(), Vec::new());
    for (l, t) in types.iter().enumerate() {
        let full = t == "full_attention";
        let (head, heads) = match per_layer {
            Some(p) => {
                let over = p.get(l.to_string());
                let size = |k: &str, dflt: usize| {
                    over.and_then(|o| o.get(k))
                        .and_then(Json::as_u64)
                        .map_or(dflt, |v| v as usize)
                };
                (size("head_dim", hd), size("num_key_value_heads", nkv))
            }
            None if full => (global_hd, global_kv.unwrap_or(nkv)),
            None => (hd, nkv),
        };
        dims.push(Value::U64(head as u64));
        kvs.push(Value::U64(heads as u64));
    }
    m.set("attention.layer_key_length", Value::Array(dims));
    m.set("attention.layer_head_count_kv", Value::Array(kvs));
    let sliding = types.iter().map(|t| Value::Bool(t == "sliding_attention"));
    m.set("attention.sliding_layers", Value::Array(sliding.collect()));
    m.u("attention.sliding_window", c.usize("sliding_window")?);
    m.u(
        "attention.shared_kv_layers",
        c.usize_or("num_kv_shared_layers", 0)?,
    );
    let k_eq_v = c
        .get("attention_k_eq_v")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    m.set("attention.k_eq_v", Value::Bool(k_eq_v));
    // transformers' `use_bidirectional_attention`: "vision" lets an image's soft tokens see
    // each other both ways on the sliding layers.
    let bidir = c.get("use_bidirectional_attention").and_then(Json::as_str) == Some("vision");
    m.set("attention.images_bidirectional", Value::Bool(bidir));
    m.u(
        "embedding_length_per_layer_input",
        c.usize_or("hidden_size_per_layer_input", 0)?,
    );
    if let Some(cap) = c.get("final_logit_softcapping").and_then(Json::as_f64) {
        m.f("final_logit_softcapping", cap as f32);
    }
    let rope = |t: &str| c.get("rope_parameters").and_then(|p| p.get(t)).cloned();
    let local = rope("sliding_attention").unwrap_or(Json::Null);
    m.f(
        "rope.local_freq_base",
        local
            .get("rope_theta")
            .and_then(Json::as_f64)
            .unwrap_or(10_000.0) as f32,
    );
    let full = rope("full_attention").unwrap_or(Json::Null);
    m.f(
        "rope.freq_base",
        full.get("rope_theta")
            .and_then(Json::as_f64)
            .unwrap_or(1_000_000.0) as f32,
    );
    for (p, name) in [(&local, "sliding"), (&full, "full")] {
        let kind = p
            .get("rope_type")
            .and_then(Json::as_str)
            .unwrap_or("default");
        if !matches!(kind, "default" | "proportional") {
            return Err(c.err(format!("{name} RoPE type {kind:?} is not supported yet")));
        }
    }
    let kind = full
        .get("rope_type")
        .and_then(Json::as_str)
        .unwrap_or("default");
    let partial = full.get("partial_rotary_factor").and_then(Json::as_f64);
    let partial = if kind == "proportional" {
        partial.unwrap_or(1.0)
    } else {
        1.0
    };
    m.f("rope.full_partial", partial as f32);
    m.f(
        "rope.full_factor",
        full.get("factor").and_then(Json::as_f64).unwrap_or(1.0) as f32,
    );
    Ok(())
}
