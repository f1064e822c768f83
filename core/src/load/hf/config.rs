//! The parts of a Hugging Face `config.json` the loader reads, and the GGUF metadata built
//! from them.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::load::gguf::Value;

/// The parts of `config.json` the loader reads: the text model's settings.
pub(in crate::load) struct Config {
    pub(super) dir: String,
    pub(super) text: Json,
    /// The whole file (a multimodal model's top-level settings beside `text_config`).
    pub(super) root: Json,
    pub(super) model_type: String,
}

impl Config {
    pub(super) fn read(dir: &Path) -> Result<Config> {
        let name = dir.display().to_string();
        let path = dir.join("config.json");
        let raw = std::fs::read(&path)
            .map_err(|e| Error::load(&name, format!("cannot read config.json: {e}")))?;
        let root: Json = serde_json::from_slice(&raw)
            .map_err(|e| Error::load(&name, format!("config.json is not JSON: {e}")))?;
        Self::from_json(name, root)
    }

    /// A config from its parsed `config.json` (`name` names it in errors): absent fields take
    /// the class defaults of the text model's type, and nulls transformers refuses are errors
    /// (`hf_defaults`).
    pub(super) fn from_json(name: String, root: Json) -> Result<Config> {
        let mut text = match root.get("text_config") {
            Some(t) if t.is_object() => t.clone(),
            _ => root.clone(),
        };
        // Gemma 4's MTP assistant wraps a plain Gemma 4 text config: the outer type decides.
        let assistant = root.get("model_type").and_then(Json::as_str) == Some("gemma4_assistant");
        let model_type = text
            .get("model_type")
            .filter(|_| !assistant)
            .or_else(|| root.get("model_type"))
            .and_then(Json::as_str)
            .ok_or_else(|| Error::load(&name, "config.json has no model_type"))?
            .to_string();
        let text_type = text
            .get("model_type")
            .and_then(Json::as_str)
            .unwrap_or(&model_type)
            .to_string();
        crate::load::hf_defaults::apply(&text_type, &mut text)
            .map_err(|e| Error::load(&name, e))?;
        Ok(Config {
            dir: name,
            text,
            root,
            model_type,
        })
    }

    pub(super) fn err(&self, msg: impl Into<String>) -> Error {
        Error::load(&self.dir, msg.into())
    }

    pub(super) fn get(&self, key: &str) -> Option<&Json> {
        self.text.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn usize(&self, key: &str) -> Result<usize> {
        self.get(key)
            .and_then(Json::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| self.err(format!("config.json: {key} is missing or not a count")))
    }

    pub(super) fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    pub(super) fn f32(&self, key: &str) -> Result<f32> {
        self.get(key)
            .and_then(Json::as_f64)
            .map(|v| v as f32)
            .ok_or_else(|| self.err(format!("config.json: {key} is missing or not a number")))
    }

    /// The RoPE base: `rope_theta`, or transformers 5's `rope_parameters` (per layer type
    /// when `layer_type` names one).
    pub(super) fn rope_theta(&self, layer_type: Option<&str>) -> Option<f32> {
        let params = self.get("rope_parameters");
        let typed = layer_type.and_then(|t| params?.get(t));
        typed
            .or(params)
            .and_then(|p| p.get("rope_theta"))
            .or_else(|| self.get("rope_theta"))
            .and_then(Json::as_f64)
            .map(|v| v as f32)
    }

    /// The RoPE scaling of a layer type: ("none" | "linear", factor). Other kinds are refused.
    pub(super) fn rope_scaling(&self, layer_type: Option<&str>) -> Result<(String, f32)> {
        let params = self.get("rope_parameters");
        let typed = layer_type.and_then(|t| params?.get(t));
        let p = typed
            .or(params)
            .or_else(|| self.get("rope_scaling"))
            .filter(|p| p.is_object());
        let Some(p) = p else {
            return Ok(("none".into(), 1.0));
        };
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Json::as_str)
            .unwrap_or("default");
        let factor = p.get("factor").and_then(Json::as_f64).unwrap_or(1.0) as f32;
        match kind {
            "default" => Ok(("none".into(), 1.0)),
            "linear" => Ok(("linear".into(), factor)),
            other => Err(self.err(format!("RoPE scaling {other:?} is not supported yet"))),
        }
    }

    /// `layer_types` (one "full_attention" / "sliding_attention" / … per layer), if given.
    pub(super) fn layer_types(&self) -> Option<Vec<String>> {
        self.get("layer_types")?
            .as_array()?
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect()
    }
}

/// Metadata under construction.
pub(super) struct Meta {
    pub(super) arch: &'static str,
    pub(super) kv: Vec<(String, Value)>,
}

impl Meta {
    pub(super) fn set(&mut self, key: &str, v: Value) {
        self.kv.push((format!("{}.{key}", self.arch), v));
    }
    pub(super) fn u(&mut self, key: &str, v: usize) {
        self.set(key, Value::U64(v as u64));
    }
    pub(super) fn f(&mut self, key: &str, v: f32) {
        self.set(key, Value::F32(v));
    }
}
