//! The vision tower of a Hugging Face image-and-text checkpoint, read into the view an mmproj
//! GGUF gives (llama.cpp's `clip` architecture: `clip.vision.*` metadata, `v.*` and `mm.*`
//! tensors), so one builder serves both. The conversions are the ones llama.cpp's converter
//! makes: the projector's soft-embedding norm, stored as `w` for `x·(1+w)`, gets 1 added.
//!
//! What a family's `config.json` says of its tower is the family's own
//! ([`super::family::HfFamily::vision`], in its file); the tensor names here are SigLIP's
//! and Gemma 4's.

use std::path::Path;

use serde_json::Value as Json;

use super::super::gguf::{Bytes, GgufFile, TensorInfo, Value};
use super::super::safetensors::SafetensorsFile;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// Whether `dir`'s `config.json` describes a vision tower (a `vision_config`).
pub fn has_vision(dir: &Path) -> bool {
    std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Json>(&b).ok())
        .is_some_and(|c| c.get("vision_config").is_some_and(Json::is_object))
}

/// llama.cpp's mmproj name for a checkpoint's vision or projector tensor (`None`: not one,
/// or one the encoder does not use, such as SigLIP's pooling head).
fn mmproj_name(hf: &str) -> Option<String> {
    let tower = [
        "model.visual.",
        "visual.",
        "model.vision_tower.vision_model.",
        "vision_tower.vision_model.",
        "model.vision_tower.",
        "vision_tower.",
    ];
    if let Some(rest) = tower.iter().find_map(|p| hf.strip_prefix(p)) {
        let fixed = match rest {
            // Gemma 4's (its patch matmul is permuted to a convolution's layout on reading).
            "patch_embedder.input_proj.weight" => Some("v.patch_embd.weight"),
            "patch_embedder.position_embedding_table" => Some("v.position_embd.weight"),
            "std_bias" => Some("v.std_bias"),
            "std_scale" => Some("v.std_scale"),
            "embeddings.patch_embedding.weight" => Some("v.patch_embd.weight"),
            "embeddings.patch_embedding.bias" => Some("v.patch_embd.bias"),
            "embeddings.position_embedding.weight" => Some("v.position_embd.weight"),
            "post_layernorm.weight" => Some("v.post_ln.weight"),
            "post_layernorm.bias" => Some("v.post_ln.bias"),
            // Qwen3.5's (its 3-D patch kernel is split in time on reading).
            "patch_embed.proj.weight" => Some("v.patch_embd.weight"),
            "patch_embed.proj.bias" => Some("v.patch_embd.bias"),
            "pos_embed.weight" => Some("v.position_embd.weight"),
            "merger.norm.weight" => Some("v.post_ln.weight"),
            "merger.norm.bias" => Some("v.post_ln.bias"),
            "merger.linear_fc1.weight" => Some("mm.0.weight"),
            "merger.linear_fc1.bias" => Some("mm.0.bias"),
            "merger.linear_fc2.weight" => Some("mm.2.weight"),
            "merger.linear_fc2.bias" => Some("mm.2.bias"),
            _ => None,
        };
        if let Some(f) = fixed {
            return Some(f.into());
        }
        let rest = rest
            .strip_prefix("encoder.layers.")
            .or_else(|| rest.strip_prefix("blocks."))?;
        let (l, part) = rest.split_once('.')?;
        let l: usize = l.parse().ok()?;
        let (stem, kind) = part.rsplit_once('.')?;
        let name = match stem {
            // Gemma 4's layers.
            "input_layernorm" => "ln1",
            "self_attn.q_proj.linear" => "attn_q",
            "self_attn.k_proj.linear" => "attn_k",
            "self_attn.v_proj.linear" => "attn_v",
            "self_attn.o_proj.linear" => "attn_out",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "post_attention_layernorm" => "attn_post_norm",
            "pre_feedforward_layernorm" => "ln2",
            "post_feedforward_layernorm" => "ffn_post_norm",
            "mlp.gate_proj.linear" => "ffn_gate",
            "mlp.up_proj.linear" => "ffn_up",
            "mlp.down_proj.linear" => "ffn_down",
            // SigLIP's.
            "layer_norm1" => "ln1",
            "layer_norm2" => "ln2",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.out_proj" => "attn_out",
            "mlp.fc1" => "ffn_up",
            "mlp.fc2" => "ffn_down",
            // Qwen3.5's.
            "norm1" => "ln1",
            "norm2" => "ln2",
            "attn.qkv" => "attn_qkv",
            "attn.proj" => "attn_out",
            "mlp.linear_fc1" => "ffn_up",
            "mlp.linear_fc2" => "ffn_down",
            _ => return None,
        };
        return Some(format!("v.blk.{l}.{name}.{kind}"));
    }
    let rest = [
        "model.multi_modal_projector.",
        "multi_modal_projector.",
        "model.embed_vision.",
    ]
    .iter()
    .find_map(|p| hf.strip_prefix(p))?;
    Some(
        match rest {
            "embedding_projection.weight" => "mm.input_projection.weight",
            "mm_input_projection_weight" => "mm.input_projection.weight",
            "mm_soft_emb_norm.weight" => "mm.soft_emb_norm.weight",
            _ => return None,
        }
        .into(),
    )
}

/// The vision tower of the checkpoint in `dir` as an mmproj view, or `None` when its config
/// has no vision tower. A tower kiln cannot run is an error naming it.
pub fn open_vision_dir(dir: &Path) -> Result<Option<GgufFile>> {
    let name = dir.display().to_string();
    let err = |m: String| Error::load(&name, m);
    let raw = std::fs::read(dir.join("config.json"))
        .map_err(|e| err(format!("cannot read config.json: {e}")))?;
    let c: Json =
        serde_json::from_slice(&raw).map_err(|e| err(format!("config.json is not JSON: {e}")))?;
    if !c.get("vision_config").is_some_and(Json::is_object) {
        return Ok(None);
    }
    let model_type = c.get("model_type").and_then(Json::as_str).unwrap_or("");
    let mapper = crate::model::registry::hf_families()
        .find(|f| f.model_types.iter().any(|(t, _)| *t == model_type))
        .and_then(|f| f.vision)
        .ok_or_else(|| {
            err(format!(
                "the vision tower of model_type {model_type:?} is not supported yet"
            ))
        })?;
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::Str("clip".into())),
        ("general.name".into(), Value::Str(name.clone())),
        ("kiln.source".into(), Value::Str("huggingface".into())),
        ("clip.has_vision_encoder".into(), Value::Bool(true)),
    ];
    meta.extend(mapper(&c).map_err(|m| err(format!("config.json: {m}")))?);
    let mut blobs: Vec<Bytes> = Vec::new();
    let mut tensors: Vec<(TensorInfo, usize)> = Vec::new();
    let mut owned: Vec<u8> = Vec::new();
    let mut owned_tensors: Vec<TensorInfo> = Vec::new();
    for path in super::shard_paths(dir)? {
        let f = SafetensorsFile::open(&path)?;
        let b = blobs.len();
        for e in &f.entries {
            let Some(gname) = mmproj_name(&e.name) else {
                continue;
            };
            let info = TensorInfo {
                name: gname,
                dtype: e.dtype,
                shape: e.shape.clone(),
                offset: e.offset,
                nbytes: e.nbytes,
            };
            if info.name == "v.patch_embd.weight" && e.shape.len() == 5 {
                // Qwen3.5's 3-D patch kernel `[hidden, 3, t, p, p]` over two copies of an
                // image in time: its two slices, as llama.cpp's converter stores them.
                let (hidden, c, t, ph, pw) =
                    (e.shape[0], e.shape[1], e.shape[2], e.shape[3], e.shape[4]);
                if t != 2 || c != 3 {
                    return Err(err(format!(
                        "{}: a {c}-channel kernel {t} deep in time is not supported (3 and 2 are)",
                        e.name
                    )));
                }
                let n = info.n_elements();
                let mut w = vec![0f32; n];
                crate::quant::dequantize(info.dtype, f.data(e), &mut w)?;
                let plane = ph * pw;
                for (s, name) in ["v.patch_embd.weight", "v.patch_embd.weight.1"]
                    .into_iter()
                    .enumerate()
                {
                    let at = owned.len();
                    for oc in 0..hidden * c {
                        let from = (oc * t + s) * plane;
                        owned.extend(w[from..from + plane].iter().flat_map(|x| x.to_le_bytes()));
                    }
                    owned_tensors.push(TensorInfo {
                        name: name.into(),
                        dtype: DType::F32,
                        shape: vec![hidden, c, ph, pw],
                        offset: at,
                        nbytes: n / t * 4,
                    });
                }
            } else if info.name == "v.patch_embd.weight" && e.shape.len() == 2 {
                // Gemma 4's patch matmul, `[hidden, p·p·3]` over (row, column, channel):
                // permuted to the convolution's `[hidden, 3, p, p]`, as llama.cpp's converter
                // stores it.
                let (hidden, pp3) = (e.shape[0], e.shape[1]);
                let p = ((pp3 / 3) as f64).sqrt().round() as usize;
                if p == 0 || 3 * p * p != pp3 {
                    return Err(err(format!(
                        "{}: {pp3} values a patch is not 3 channels of a square patch",
                        e.name
                    )));
                }
                let mut w = vec![0f32; hidden * pp3];
                crate::quant::dequantize(info.dtype, f.data(e), &mut w)?;
                let at = owned.len();
                for o in 0..hidden {
                    let row = &w[o * pp3..(o + 1) * pp3];
                    for c in 0..3 {
                        for y in 0..p {
                            for x in 0..p {
                                owned.extend(row[(y * p + x) * 3 + c].to_le_bytes());
                            }
                        }
                    }
                }
                owned_tensors.push(TensorInfo {
                    dtype: DType::F32,
                    shape: vec![hidden, 3, p, p],
                    offset: at,
                    nbytes: hidden * pp3 * 4,
                    ..info
                });
            } else if info.name == "mm.soft_emb_norm.weight" {
                // Stored for `x·(1+w)`: add the 1 (in f32), as llama.cpp's converter does.
                let n = info.n_elements();
                let mut w = vec![0f32; n];
                crate::quant::dequantize(info.dtype, f.data(e), &mut w)?;
                let at = owned.len();
                owned.extend(w.iter().flat_map(|x| (x + 1.0).to_le_bytes()));
                owned_tensors.push(TensorInfo {
                    dtype: DType::F32,
                    offset: at,
                    nbytes: n * 4,
                    ..info
                });
            } else {
                tensors.push((info, b));
            }
        }
        blobs.push(f.bytes);
    }
    if !owned_tensors.is_empty() {
        let b = blobs.len();
        tensors.extend(owned_tensors.into_iter().map(|t| (t, b)));
        blobs.push(Bytes::Owned(owned));
    }
    GgufFile::from_parts(name, meta, tensors, blobs).map(Some)
}

#[cfg(test)]
mod tests {
    use super::mmproj_name;

    #[test]
    fn names_follow_llama_cpps_mmproj_layout() {
        let n = |s: &str| mmproj_name(s);
        assert_eq!(
            n("vision_tower.vision_model.encoder.layers.3.self_attn.out_proj.bias").as_deref(),
            Some("v.blk.3.attn_out.bias")
        );
        assert_eq!(
            n("model.vision_tower.encoder.layers.0.mlp.fc1.weight").as_deref(),
            Some("v.blk.0.ffn_up.weight")
        );
        assert_eq!(
            n("multi_modal_projector.mm_input_projection_weight").as_deref(),
            Some("mm.input_projection.weight")
        );
        assert_eq!(n("vision_tower.vision_model.head.mlp.fc1.weight"), None);
        assert_eq!(n("language_model.model.layers.0.mlp.up_proj.weight"), None);
    }
}
