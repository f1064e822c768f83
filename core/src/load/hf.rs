//! Hugging Face model directories: `config.json` and `*.safetensors` (one file, or shards
//! listed in `model.safetensors.index.json`), read into the same [`GgufFile`] view the GGUF
//! loader gives, under llama.cpp's architecture, metadata and tensor names. The model builders
//! then treat both sources alike.
//!
//! What the conversion changes, as llama.cpp's converter does: Gemma's RMSNorm weights are
//! stored as `w` for `x·(1+w)`, so 1 is added (in f32); Llama's q/k projections are in the
//! rotate-half RoPE layout, so their rows are permuted to the interleaved layout the `llama`
//! architecture uses. Both `*ForCausalLM` layouts (`model.*`) and multimodal
//! `*ForConditionalGeneration` ones (`model.language_model.*`, with `text_config`) are read;
//! vision and audio towers are skipped and named in `kiln.skipped`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;

use super::gguf::{Bytes, GgufFile, TensorInfo, Value};
use super::safetensors::SafetensorsFile;
use crate::error::{Error, Result};
use convert::{expert_part, neg_exp, one_plus, stack_experts, unrotate_half, Expert};

mod config;
mod convert;
mod families;
use config::{Config, Meta};
use families::{dflash_meta, gemma4_meta};

/// Prefixes of towers the text model does not use.
const TOWERS: &[&str] = &[
    "model.vision_tower.",
    "model.visual.",
    "model.audio_tower.",
    "model.multi_modal_projector.",
    "model.embed_vision.",
    "model.embed_audio.",
    "vision_tower.",
    "multi_modal_projector.",
    "audio_tower.",
    "mtp.",
    "model.encoder.vision_tower.",
    "model.encoder.embed_vision.",
];

/// Whether `path` looks like a Hugging Face model directory.
pub fn is_model_dir(path: &Path) -> bool {
    path.is_dir() && path.join("config.json").is_file()
}

/// How one architecture's checkpoint maps onto llama.cpp's names.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Family {
    Llama,
    Qwen3,
    Gemma3,
    /// Qwen3.5 / 3.6 dense: Gated DeltaNet and gated full attention.
    Qwen35,
    Gemma4,
    /// DiffusionGemma: Gemma 4 layers run as a causal encoder and a bidirectional canvas
    /// decoder (the same weights), with self-conditioning.
    DiffusionGemma,
    /// Gemma 4's MTP assistant: Gemma 4 layers that all read the target's K/V.
    Gemma4Assistant,
    /// A DFlash block-diffusion drafter (z-lab/dflash): Qwen3-style layers over the
    /// target's hidden states and a masked block, with no embeddings or head of its own.
    DFlash,
}

fn family(model_type: &str) -> Option<(Family, &'static str)> {
    match model_type {
        "llama" | "mistral" => Some((Family::Llama, "llama")),
        "qwen3" => Some((Family::Qwen3, "qwen3")),
        "gemma3" | "gemma3_text" => Some((Family::Gemma3, "gemma3")),
        "qwen3_5" | "qwen3_5_text" => Some((Family::Qwen35, "qwen35")),
        "qwen3_5_moe" | "qwen3_5_moe_text" => Some((Family::Qwen35, "qwen35moe")),
        "gemma4" | "gemma4_text" => Some((Family::Gemma4, "gemma4")),
        "diffusion_gemma" | "diffusion_gemma_text" => {
            Some((Family::DiffusionGemma, "diffusion-gemma"))
        }
        "gemma4_assistant" => Some((Family::Gemma4Assistant, "gemma4-assistant")),
        _ => None,
    }
}

/// Supported `model_type`s.
pub const MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen3",
    "gemma3",
    "gemma3_text",
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "gemma4",
    "gemma4_text",
    "diffusion_gemma",
    "gemma4_assistant",
];

/// The dense-transformer metadata every family shares.
fn dense_meta(c: &Config, m: &mut Meta) -> Result<()> {
    let e = c.usize("hidden_size")?;
    let nh = c.usize("num_attention_heads")?;
    let layers = c.usize("num_hidden_layers")?;
    if nh == 0 || layers == 0 {
        return Err(c.err("config.json: no attention heads or no layers"));
    }
    m.u("block_count", layers);
    m.u("embedding_length", e);
    let ff = match c.get("intermediate_size") {
        Some(_) => c.usize("intermediate_size")?,
        None => c.usize("moe_intermediate_size")?,
    };
    m.u("feed_forward_length", ff);
    if c.get("num_experts").is_some() && c.get("enable_moe_block") != Some(&Json::Bool(false)) {
        m.u("expert_count", c.usize("num_experts")?);
        let used = match c.get("top_k_experts") {
            Some(_) => c.usize("top_k_experts")?,
            None => c.usize("num_experts_per_tok")?,
        };
        m.u("expert_used_count", used);
        m.u(
            "expert_feed_forward_length",
            c.usize("moe_intermediate_size")?,
        );
        m.u(
            "expert_shared_feed_forward_length",
            c.usize_or("shared_expert_intermediate_size", 0)?,
        );
    }
    m.u("attention.head_count", nh);
    m.u(
        "attention.head_count_kv",
        c.usize_or("num_key_value_heads", nh)?,
    );
    m.u("attention.key_length", c.usize_or("head_dim", e / nh)?);
    m.u(
        "context_length",
        c.usize_or("max_position_embeddings", 4096)?,
    );
    m.f("attention.layer_norm_rms_epsilon", c.f32("rms_norm_eps")?);
    Ok(())
}

fn family_meta(c: &Config, fam: Family, m: &mut Meta) -> Result<()> {
    dense_meta(c, m)?;
    match fam {
        Family::Llama | Family::Qwen3 => {
            m.f("rope.freq_base", c.rope_theta(None).unwrap_or(10_000.0));
            let (kind, factor) = c.rope_scaling(None)?;
            m.set("rope.scaling.type", Value::Str(kind));
            m.f("rope.scaling.factor", factor);
        }
        Family::Qwen35 => {
            m.f("rope.freq_base", c.rope_theta(None).unwrap_or(10_000.0));
            let (kind, _) = c.rope_scaling(None)?;
            if kind != "none" {
                return Err(c.err("Qwen3.5 RoPE scaling is not supported yet"));
            }
            let nh = c.usize("num_attention_heads")?;
            let hd = c.usize_or("head_dim", c.usize("hidden_size")? / nh)?;
            let partial = c
                .get("rope_parameters")
                .and_then(|p| p.get("partial_rotary_factor"))
                .or_else(|| c.get("partial_rotary_factor"))
                .and_then(Json::as_f64)
                // The class default: a quarter of each head rotates.
                .unwrap_or(0.25);
            m.u("rope.dimension_count", (hd as f64 * partial) as usize);
            m.u("ssm.conv_kernel", c.usize("linear_conv_kernel_dim")?);
            m.u("ssm.state_size", c.usize("linear_key_head_dim")?);
            m.u("ssm.group_count", c.usize("linear_num_key_heads")?);
            m.u("ssm.time_step_rank", c.usize("linear_num_value_heads")?);
            m.u(
                "ssm.inner_size",
                c.usize("linear_value_head_dim")? * c.usize("linear_num_value_heads")?,
            );
            let layers = c.usize("num_hidden_layers")?;
            let types = match c.layer_types() {
                Some(t) => t,
                None => {
                    let every = c.usize_or("full_attention_interval", 4)?.max(1);
                    (0..layers)
                        .map(|l| {
                            if (l + 1) % every == 0 {
                                "full_attention".to_string()
                            } else {
                                "linear_attention".to_string()
                            }
                        })
                        .collect()
                }
            };
            if types.len() != layers {
                return Err(c.err("config.json: layer_types must list every layer"));
            }
            let linear = types.iter().map(|t| Value::Bool(t != "full_attention"));
            m.set("attention.recurrent_layers", Value::Array(linear.collect()));
        }
        Family::Gemma4 => gemma4_meta(c, m)?,
        Family::DFlash => dflash_meta(c, m)?,
        Family::Gemma4Assistant => {
            gemma4_meta(c, m)?;
            // The assistant's head is not soft-capped.
            m.kv.retain(|(k, _)| !k.ends_with(".final_logit_softcapping"));
            let root = |k: &str| c.root.get(k);
            let backbone = root("backbone_hidden_size")
                .and_then(Json::as_u64)
                .ok_or_else(|| c.err("config.json: no backbone_hidden_size"))?;
            m.u("assistant.backbone_length", backbone as usize);
            let ordered = root("use_ordered_embeddings")
                .and_then(Json::as_bool)
                .unwrap_or(false);
            m.set("assistant.ordered_embeddings", Value::Bool(ordered));
            if ordered {
                let n = |k: &str, d: u64| root(k).and_then(Json::as_u64).unwrap_or(d) as usize;
                m.u("assistant.centroid_count", n("num_centroids", 2048));
                m.u(
                    "assistant.centroid_top_k",
                    n("centroid_intermediate_top_k", 32),
                );
            }
        }
        Family::DiffusionGemma => {
            gemma4_meta(c, m)?;
            // The text config drops `attention_k_eq_v`; transformers then takes K as V on the
            // full layers (they have no V projection).
            m.kv.retain(|(k, _)| !k.ends_with(".attention.k_eq_v"));
            m.set("attention.k_eq_v", Value::Bool(true));
            let canvas = c
                .root
                .get("canvas_length")
                .and_then(Json::as_u64)
                .unwrap_or(256) as usize;
            if canvas == 0 || canvas > 65_536 {
                return Err(c.err(format!("canvas_length {canvas} is out of range")));
            }
            m.u("diffusion.canvas_length", canvas);
        }
        Family::Gemma3 => {
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
        }
    }
    Ok(())
}

/// llama.cpp's name for a Hugging Face tensor name (prefix already stripped), or None when the
/// family does not know it.
fn gguf_name(fam: Family, hf: &str) -> Option<String> {
    match hf {
        "embed_tokens.weight" => return Some("token_embd.weight".into()),
        "embed_tokens_per_layer.weight" => return Some("per_layer_token_embd.weight".into()),
        "per_layer_model_projection.weight" => return Some("per_layer_model_proj.weight".into()),
        "per_layer_projection_norm.weight" => return Some("per_layer_proj_norm.weight".into()),
        "norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        "self_conditioning.pre_norm.weight" => return Some("self_cond.norm.weight".into()),
        "self_conditioning.gate_proj.weight" => return Some("self_cond.gate.weight".into()),
        "self_conditioning.up_proj.weight" => return Some("self_cond.up.weight".into()),
        "self_conditioning.down_proj.weight" => return Some("self_cond.down.weight".into()),
        "pre_projection.weight" => return Some("mtp.pre_proj.weight".into()),
        "post_projection.weight" => return Some("mtp.post_proj.weight".into()),
        "masked_embedding.centroids.weight" => return Some("mtp.centroids.weight".into()),
        "masked_embedding.token_ordering" => return Some("mtp.token_ordering".into()),
        "fc.weight" => return Some("dflash.fc.weight".into()),
        "hidden_norm.weight" => return Some("dflash.hidden_norm.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("layers.")?;
    let (l, suffix) = rest.split_once('.')?;
    let l: usize = l.parse().ok()?;
    let ours = match (suffix, fam) {
        ("input_layernorm.weight", _) => "attn_norm",
        ("self_attn.q_proj.weight", _) => "attn_q",
        ("self_attn.k_proj.weight", _) => "attn_k",
        ("self_attn.v_proj.weight", _) => "attn_v",
        ("self_attn.o_proj.weight", _) => "attn_output",
        ("self_attn.q_norm.weight", _) => "attn_q_norm",
        ("self_attn.k_norm.weight", _) => "attn_k_norm",
        ("mlp.gate_proj.weight", _) => "ffn_gate",
        ("mlp.up_proj.weight", _) => "ffn_up",
        ("mlp.down_proj.weight", _) => "ffn_down",
        (
            "post_attention_layernorm.weight",
            Family::Gemma3 | Family::Gemma4 | Family::DiffusionGemma,
        ) => "post_attention_norm",
        ("pre_feedforward_layernorm.weight", Family::Gemma4 | Family::DiffusionGemma) => "ffn_norm",
        ("post_feedforward_layernorm.weight", Family::Gemma4 | Family::DiffusionGemma) => {
            "post_ffw_norm"
        }
        ("post_feedforward_layernorm_1.weight", Family::Gemma4 | Family::DiffusionGemma) => {
            "post_ffw_norm_1"
        }
        ("post_feedforward_layernorm_2.weight", Family::Gemma4 | Family::DiffusionGemma) => {
            "post_ffw_norm_2"
        }
        ("pre_feedforward_layernorm_2.weight", Family::Gemma4 | Family::DiffusionGemma) => {
            "pre_ffw_norm_2"
        }
        ("per_layer_input_gate.weight", Family::Gemma4) => "inp_gate",
        ("per_layer_projection.weight", Family::Gemma4) => "proj",
        ("post_per_layer_input_norm.weight", Family::Gemma4) => "post_norm",
        ("router.proj.weight", Family::Gemma4 | Family::DiffusionGemma) => "ffn_gate_inp",
        ("layer_scalar", Family::Gemma4 | Family::DiffusionGemma) => {
            return Some(format!("blk.{l}.layer_output_scale"))
        }
        ("router.scale", Family::Gemma4 | Family::DiffusionGemma) => {
            return Some(format!("blk.{l}.ffn_gate_inp.scale"))
        }
        ("router.per_expert_scale", Family::Gemma4 | Family::DiffusionGemma) => {
            return Some(format!("blk.{l}.ffn_down_exps.scale"))
        }
        ("linear_attn.in_proj_qkv.weight", Family::Qwen35) => "attn_qkv",
        ("mlp.gate.weight", Family::Qwen35) => "ffn_gate_inp",
        ("mlp.shared_expert.gate_proj.weight", Family::Qwen35) => "ffn_gate_shexp",
        ("mlp.shared_expert.up_proj.weight", Family::Qwen35) => "ffn_up_shexp",
        ("mlp.shared_expert.down_proj.weight", Family::Qwen35) => "ffn_down_shexp",
        ("mlp.shared_expert_gate.weight", Family::Qwen35) => "ffn_gate_inp_shexp",
        ("linear_attn.in_proj_z.weight", Family::Qwen35) => "attn_gate",
        ("linear_attn.in_proj_b.weight", Family::Qwen35) => "ssm_beta",
        ("linear_attn.in_proj_a.weight", Family::Qwen35) => "ssm_alpha",
        ("linear_attn.conv1d.weight", Family::Qwen35) => "ssm_conv1d",
        ("linear_attn.norm.weight", Family::Qwen35) => "ssm_norm",
        ("linear_attn.out_proj.weight", Family::Qwen35) => "ssm_out",
        ("linear_attn.A_log", Family::Qwen35) => return Some(format!("blk.{l}.ssm_a")),
        ("linear_attn.dt_bias", Family::Qwen35) => return Some(format!("blk.{l}.ssm_dt.bias")),
        ("post_attention_layernorm.weight", Family::Qwen35) => "post_attention_norm",
        ("post_attention_layernorm.weight", _) => "ffn_norm",
        ("pre_feedforward_layernorm.weight", Family::Gemma3) => "ffn_norm",
        ("post_feedforward_layernorm.weight", Family::Gemma3) => "post_ffw_norm",
        _ => return None,
    };
    Some(format!("blk.{l}.{ours}.weight"))
}

/// The text model's name for a checkpoint tensor: `Ok(None)` for a skipped tower.
fn strip_prefix(hf: &str) -> Option<&str> {
    for p in [
        "model.language_model.",
        "language_model.model.",
        // DiffusionGemma: the decoder holds the weights the encoder shares.
        "model.decoder.",
        "model.",
    ] {
        if let Some(rest) = hf.strip_prefix(p) {
            return Some(rest);
        }
    }
    if hf == "lm_head.weight" || hf == "language_model.lm_head.weight" {
        return Some("lm_head.weight");
    }
    // Gemma 4's MTP assistant: its projections and centroid head; a DFlash drafter's
    // layers and projections (saved without a prefix).
    if hf.starts_with("pre_projection.")
        || hf.starts_with("post_projection.")
        || hf.starts_with("masked_embedding.")
        || hf.starts_with("layers.")
        || matches!(hf, "norm.weight" | "fc.weight" | "hidden_norm.weight")
    {
        return Some(hf);
    }
    None
}

/// The safetensors files of `dir`: those the index names, or every `*.safetensors`.
fn shard_paths(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let name = dir.display().to_string();
    let index = dir.join("model.safetensors.index.json");
    let mut files: Vec<std::path::PathBuf> = if index.is_file() {
        let raw = std::fs::read(&index)
            .map_err(|e| Error::load(&name, format!("cannot read {}: {e}", index.display())))?;
        let v: Json = serde_json::from_slice(&raw)
            .map_err(|e| Error::load(&name, format!("the safetensors index is not JSON: {e}")))?;
        let map = v
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| Error::load(&name, "the safetensors index has no weight_map"))?;
        let mut names: Vec<&str> = map.values().filter_map(Json::as_str).collect();
        names.sort();
        names.dedup();
        if names.iter().any(|n| n.contains('/') || n.contains("..")) {
            return Err(Error::load(
                &name,
                "the safetensors index names a file outside the directory",
            ));
        }
        names.into_iter().map(|n| dir.join(n)).collect()
    } else {
        let rd = std::fs::read_dir(dir)
            .map_err(|e| Error::load(&name, format!("cannot list the directory: {e}")))?;
        rd.filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect()
    };
    files.sort();
    if files.is_empty() {
        return Err(Error::load(&name, "no *.safetensors files"));
    }
    Ok(files)
}

/// The metadata (llama.cpp's keys under the architecture's name) that a parsed `config.json`
/// gives, as [`open_dir`] reads it: what kiln makes of each field, absent and null included
/// (checked against transformers by `tests/tests/hf_config_defaults.rs`).
pub fn config_metadata(name: &str, root: Json) -> Result<Vec<(String, Value)>> {
    let c = Config::from_json(name.to_string(), root)?;
    let (_, meta) = read_meta(&c, name)?;
    Ok(meta.kv)
}

/// The family and metadata of a config.
fn read_meta(c: &Config, name: &str) -> Result<(Family, Meta)> {
    let (fam, arch) = family(&c.model_type).ok_or_else(|| {
        c.err(format!(
            "model_type {:?} is not supported from Hugging Face checkpoints; kiln reads: {}",
            c.model_type,
            MODEL_TYPES.join(", ")
        ))
    })?;
    // A DFlash drafter is a Qwen3 config with its own section.
    let (fam, arch) = match c.root.get("dflash_config") {
        Some(_) => (Family::DFlash, "dflash"),
        None => (fam, arch),
    };
    let mut meta = Meta {
        arch,
        kv: vec![
            ("general.architecture".into(), Value::Str(arch.into())),
            ("general.name".into(), Value::Str(name.to_string())),
            ("kiln.source".into(), Value::Str("huggingface".into())),
        ],
    };
    family_meta(c, fam, &mut meta)?;
    Ok((fam, meta))
}

/// Reads a Hugging Face model directory as a GGUF-like model view.
pub fn open_dir(dir: &Path) -> Result<GgufFile> {
    let c = Config::read(dir)?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let (fam, mut meta) = read_meta(&c, &name)?;

    let mut blobs: Vec<Bytes> = Vec::new();
    let mut tensors: Vec<(TensorInfo, usize)> = Vec::new();
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut pending: Vec<(TensorInfo, Vec<u8>)> = Vec::new();
    let mut experts: BTreeMap<(usize, &'static str), Vec<Expert>> = BTreeMap::new();
    let heads = c.usize("num_attention_heads")?;
    let kv_heads = c.usize_or("num_key_value_heads", heads)?;
    let files = shard_paths(dir)?
        .into_iter()
        .map(|p| SafetensorsFile::open(&p).map(|f| (p, f)))
        .collect::<Result<Vec<_>>>()?;
    let names: std::collections::HashSet<String> = files
        .iter()
        .flat_map(|(_, f)| f.entries.iter().map(|e| e.name.clone()))
        .collect();
    // DiffusionGemma's encoder shares the decoder's weights (a checkpoint may hold either
    // copy or both) but keeps its own per-layer output scalars.
    let encoder = |name: &str| -> Option<String> {
        let rest = name.strip_prefix("model.encoder.language_model.")?;
        if let Some(l) = rest
            .strip_prefix("layers.")
            .and_then(|r| r.strip_suffix(".layer_scalar"))
        {
            return Some(format!("enc:{l}"));
        }
        match names.contains(&format!("model.decoder.{rest}")) {
            true => Some(String::new()),
            false => Some(format!("model.decoder.{rest}")),
        }
    };
    for (path, f) in files {
        let b = blobs.len();
        for e in &f.entries {
            let renamed;
            let e = match (fam == Family::DiffusionGemma)
                .then(|| encoder(&e.name))
                .flatten()
            {
                // A tied copy of a decoder tensor.
                Some(r) if r.is_empty() => continue,
                Some(r) if r.starts_with("enc:") => {
                    let info = TensorInfo {
                        name: format!("blk.{}.enc_output_scale", &r[4..]),
                        dtype: e.dtype,
                        shape: e.shape.clone(),
                        offset: e.offset,
                        nbytes: e.nbytes,
                    };
                    tensors.push((info, b));
                    continue;
                }
                Some(r) => {
                    renamed = super::safetensors::Entry {
                        name: r,
                        ..e.clone()
                    };
                    &renamed
                }
                None => e,
            };
            if let Some(t) = TOWERS.iter().find(|t| e.name.starts_with(**t)) {
                *skipped
                    .entry(t.trim_end_matches('.').to_string())
                    .or_insert(0) += 1;
                continue;
            }
            if let Some((l, part, expert)) = strip_prefix(&e.name).and_then(expert_part) {
                let data = f.data(e).to_vec();
                experts.entry((l, part)).or_default().push((
                    expert,
                    e.dtype,
                    e.shape.clone(),
                    data,
                ));
                continue;
            }
            // The assistant's layers are Gemma 4's.
            let names_as = match fam {
                Family::Gemma4Assistant => Family::Gemma4,
                Family::DFlash => Family::Qwen3,
                f => f,
            };
            let name = strip_prefix(&e.name)
                .and_then(|n| gguf_name(names_as, n))
                .ok_or_else(|| {
                    c.err(format!(
                        "{}: tensor {} is not part of a {} model kiln knows",
                        path.display(),
                        e.name,
                        c.model_type
                    ))
                })?;
            let info = TensorInfo {
                name,
                dtype: e.dtype,
                shape: e.shape.clone(),
                offset: e.offset,
                nbytes: e.nbytes,
            };
            // Conversions that change the bytes go to an owned buffer.
            let is_norm = info.name.ends_with("norm.weight");
            let one_centred = matches!(fam, Family::Gemma3 | Family::Qwen35)
                && !info.name.ends_with("ssm_norm.weight");
            if e.wide {
                let narrow = super::safetensors::narrow_i64(f.data(e))
                    .ok_or_else(|| c.err(format!("{}: a value does not fit 32 bits", e.name)))?;
                pending.push((info, narrow));
            } else if is_norm && one_centred {
                pending.push(one_plus(&c, &info, f.data(e))?);
            } else if info.name.ends_with("ssm_a") {
                // Stored as -exp(A_log), the decay rate itself (as llama.cpp does).
                pending.push(neg_exp(&c, &info, f.data(e))?);
            } else if info.name.ends_with("ssm_conv1d.weight") {
                // [C, 1, K] → [C, K]: the same bytes.
                let mut info = info;
                if info.shape.len() == 3 && info.shape[1] == 1 {
                    info.shape.remove(1);
                }
                tensors.push((info, b));
            } else if fam == Family::Llama && info.name.ends_with("attn_q.weight") {
                pending.push((info.clone(), unrotate_half(&c, &info, f.data(e), heads)?));
            } else if fam == Family::Llama && info.name.ends_with("attn_k.weight") {
                pending.push((info.clone(), unrotate_half(&c, &info, f.data(e), kv_heads)?));
            } else {
                tensors.push((info, b));
            }
        }
        blobs.push(f.bytes);
    }
    for ((l, part), list) in experts {
        pending.extend(stack_experts(&c, l, part, list)?);
    }
    if !pending.is_empty() {
        let b = blobs.len();
        let mut owned = Vec::new();
        for (mut info, bytes) in pending {
            info.offset = owned.len();
            info.nbytes = bytes.len();
            owned.extend_from_slice(&bytes);
            tensors.push((info, b));
        }
        blobs.push(Bytes::Owned(owned));
    }
    if !skipped.is_empty() {
        let list = skipped
            .iter()
            .map(|(k, n)| Value::Str(format!("{k} ({n} tensors)")))
            .collect();
        meta.kv.push(("kiln.skipped".into(), Value::Array(list)));
    }
    GgufFile::from_parts(c.dir.clone(), meta.kv, tensors, blobs)
}
