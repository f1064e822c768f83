//! Hugging Face model directories: `config.json` and `*.safetensors` (one file, or shards
//! listed in `model.safetensors.index.json`), read into the same [`GgufFile`] view the GGUF
//! loader gives, under llama.cpp's architecture, metadata and tensor names. The model builders
//! then treat both sources alike.
//!
//! This file is the machinery; what differs by family (the `model_type`s it reads, its
//! metadata, its tensor names, which conversions its checkpoints need) is declared in the
//! family's own file as a [`family::HfFamily`] and gathered by the model registry. The
//! conversions, as llama.cpp's converter does them: RMSNorm weights stored as `w` for
//! `x·(1+w)` (Gemma 3, Qwen3.5) get 1 added (in f32); q/k projections in the rotate-half RoPE
//! layout (Llama) have their rows permuted to the interleaved layout the `llama` architecture
//! uses. Both `*ForCausalLM` layouts (`model.*`) and multimodal
//! `*ForConditionalGeneration` ones (`model.language_model.*`, with `text_config`) are read;
//! vision and audio towers are skipped and named in `kiln.skipped`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;

use super::gguf::{Bytes, GgufFile, TensorInfo, Value};
use super::safetensors::SafetensorsFile;
use crate::error::{Error, Result};
use convert::{expert_part, neg_exp, one_plus, stack_experts, unrotate_half, Expert};

pub(crate) mod config;
mod convert;
pub(crate) mod family;
pub mod vision;
use crate::model::registry::hf_families;
use config::{Config, Meta};
use family::HfFamily;

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

/// The family that reads `c` and the GGUF architecture it becomes: one that claims the
/// config whatever its type, else the one that lists its `model_type`.
fn family(c: &Config) -> Option<(&'static HfFamily, &'static str)> {
    for f in hf_families() {
        if let Some(arch) = f.claims.and_then(|claim| claim(c)) {
            return Some((f, arch));
        }
    }
    hf_families().find_map(|f| {
        let (_, arch) = f.model_types.iter().find(|(t, _)| *t == c.model_type)?;
        Some((f, *arch))
    })
}

/// The class defaults of a text model type's fields, as its family declares them (none for a
/// type no family lists).
pub(crate) fn class_defaults(text_type: &str) -> &'static [family::Field] {
    hf_families()
        .flat_map(|f| f.defaults.iter())
        .find(|(t, _)| *t == text_type)
        .map_or(&[], |(_, fields)| *fields)
}

/// Whether `model_type` is a wrapper family's (its own type decides over its text config's).
fn outer_decides(model_type: &str) -> bool {
    hf_families().any(|f| f.wraps_text && f.model_types.iter().any(|(t, _)| *t == model_type))
}

/// What the families declare that reading a config needs.
const DECLARED: config::Declared = config::Declared {
    defaults: class_defaults,
    outer_decides,
};

/// Every `model_type` kiln reads.
pub fn model_types() -> Vec<&'static str> {
    hf_families()
        .flat_map(|f| f.model_types.iter().map(|(t, _)| *t))
        .collect()
}

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

/// llama.cpp's name for a Hugging Face tensor name (prefix already stripped): the family's
/// own names first, then those every family shares; None when neither knows it.
fn gguf_name(fam: &HfFamily, hf: &str) -> Option<String> {
    if let Some(n) = (fam.names)(hf) {
        return Some(n);
    }
    let top = match hf {
        "embed_tokens.weight" => Some("token_embd.weight"),
        "norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(t.into());
    }
    family::layer_weight(hf, |suffix| {
        Some(match suffix {
            "input_layernorm.weight" => "attn_norm",
            "self_attn.q_proj.weight" => "attn_q",
            "self_attn.k_proj.weight" => "attn_k",
            "self_attn.v_proj.weight" => "attn_v",
            "self_attn.o_proj.weight" => "attn_output",
            "self_attn.q_norm.weight" => "attn_q_norm",
            "self_attn.k_norm.weight" => "attn_k_norm",
            "mlp.gate_proj.weight" => "ffn_gate",
            "mlp.up_proj.weight" => "ffn_up",
            "mlp.down_proj.weight" => "ffn_down",
            "post_attention_layernorm.weight" => "ffn_norm",
            _ => return None,
        })
    })
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
    let c = Config::from_json(name.to_string(), root, DECLARED)?;
    let (_, meta) = read_meta(&c, name)?;
    Ok(meta.kv)
}

/// The family and metadata of a config.
fn read_meta(c: &Config, name: &str) -> Result<(&'static HfFamily, Meta)> {
    let (fam, arch) = family(c).ok_or_else(|| {
        c.err(format!(
            "model_type {:?} is not supported from Hugging Face checkpoints; kiln reads: {}",
            c.model_type,
            model_types().join(", ")
        ))
    })?;
    let mut meta = Meta {
        arch,
        kv: vec![
            ("general.architecture".into(), Value::Str(arch.into())),
            ("general.name".into(), Value::Str(name.to_string())),
            ("kiln.source".into(), Value::Str("huggingface".into())),
        ],
    };
    dense_meta(c, &mut meta)?;
    (fam.meta)(c, &mut meta)?;
    Ok((fam, meta))
}

/// Reads a Hugging Face model directory as a GGUF-like model view.
pub fn open_dir(dir: &Path) -> Result<GgufFile> {
    let c = Config::read(dir, DECLARED)?;
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
            let e = match fam.encoder_copies.then(|| encoder(&e.name)).flatten() {
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
            let name = strip_prefix(&e.name)
                .and_then(|n| gguf_name(fam, n))
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
            let one_centred = fam
                .one_centred_norms
                .is_some_and(|except| !except.iter().any(|x| info.name.ends_with(x)));
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
            } else if fam.rotate_half_qk && info.name.ends_with("attn_q.weight") {
                pending.push((info.clone(), unrotate_half(&c, &info, f.data(e), heads)?));
            } else if fam.rotate_half_qk && info.name.ends_with("attn_k.weight") {
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
