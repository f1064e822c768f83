//! The metadata of the families whose configs need more than the shared dense fields: Gemma 4
//! (and the models built on its layers) and DFlash drafters.

use serde_json::Value as Json;

use super::config::{Config, Meta};
use crate::error::Result;
use crate::load::gguf::Value;

/// Gemma 4: per-layer head sizes (sliding and full layers differ), the window, both RoPEs,
/// K = V on full layers, KV sharing, per-layer embeddings, soft-capping.
pub(super) fn gemma4_meta(c: &Config, m: &mut Meta) -> Result<()> {
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

/// A DFlash drafter's settings: Qwen3's RoPE, the block, the mask token, the target's
/// layers it reads (its own list, or the reference code's default spread).
pub(super) fn dflash_meta(c: &Config, m: &mut Meta) -> Result<()> {
    m.f("rope.freq_base", c.rope_theta(None).unwrap_or(10_000.0));
    let (kind, _) = c.rope_scaling(None)?;
    if kind != "none" {
        return Err(c.err("DFlash RoPE scaling is not supported yet"));
    }
    if let Some(types) = c.layer_types() {
        if types.iter().any(|t| t != "full_attention") {
            return Err(c.err("DFlash drafters with sliding-window layers are not supported yet"));
        }
    }
    let root = |k: &str| c.root.get(k).filter(|v| !v.is_null());
    let dc = root("dflash_config").cloned().unwrap_or(Json::Null);
    let block = root("block_size")
        .or_else(|| dc.get("block_size"))
        .and_then(Json::as_u64)
        .ok_or_else(|| c.err("config.json: a DFlash drafter needs block_size"))?;
    let mask = dc
        .get("mask_token_id")
        .and_then(Json::as_u64)
        .ok_or_else(|| c.err("config.json: dflash_config needs mask_token_id"))?;
    let drafts = c.usize("num_hidden_layers")?;
    let layers: Vec<u64> = match dc.get("target_layer_ids").and_then(Json::as_array) {
        Some(ids) => ids
            .iter()
            .map(Json::as_u64)
            .collect::<Option<_>>()
            .ok_or_else(|| c.err("config.json: target_layer_ids must be layer numbers"))?,
        None => {
            let n = root("num_target_layers")
                .and_then(Json::as_u64)
                .ok_or_else(|| c.err("config.json: no target_layer_ids nor num_target_layers"))?;
            spread_layers(n as usize, drafts)
        }
    };
    if block < 2 || block > 256 || layers.is_empty() || layers.len() > 64 {
        return Err(c.err(format!(
            "a DFlash block of {block} over {} target layers",
            layers.len()
        )));
    }
    m.u("block_size", block as usize);
    m.u("mask_token_id", mask as usize);
    m.set(
        "target_layers",
        Value::Array(layers.into_iter().map(Value::U64).collect()),
    );
    Ok(())
}

/// The reference code's default choice of target layers for `drafts` draft layers: one
/// in the middle, or an even spread from layer 1 to the fourth from last.
fn spread_layers(target: usize, drafts: usize) -> Vec<u64> {
    if drafts <= 1 {
        return vec![(target / 2) as u64];
    }
    let (start, end) = (1f64, target as f64 - 3.0);
    (0..drafts)
        .map(|i| {
            (start + i as f64 * (end - start) / (drafts - 1) as f64)
                .round()
                .max(0.0) as u64
        })
        .collect()
}
