//! The parts of a Hugging Face `config.json` the loader reads, and the GGUF metadata built
//! from them.

use std::path::Path;

use serde_json::Value as Json;

use crate::error::{Error, Result};
use crate::load::gguf::Value;

/// What the families declare that reading a config needs: the class defaults of a text
/// model type's fields, and whether a file's own `model_type` decides over its text
/// config's (a wrapper around another family's text model).
#[derive(Copy, Clone)]
pub(crate) struct Declared {
    pub defaults: fn(&str) -> &'static [crate::load::hf_defaults::Field],
    pub outer_decides: fn(&str) -> bool,
}

/// The parts of `config.json` the loader reads: the text model's settings.
pub(crate) struct Config {
    pub(crate) dir: String,
    pub(crate) text: Json,
    /// The whole file (a multimodal model's top-level settings beside `text_config`).
    pub(crate) root: Json,
    pub(crate) model_type: String,
}

impl Config {
    pub(crate) fn read(dir: &Path, declared: Declared) -> Result<Config> {
        let name = dir.display().to_string();
        let path = dir.join("config.json");
        let raw = std::fs::read(&path)
            .map_err(|e| Error::load(&name, format!("cannot read config.json: {e}")))?;
        let root: Json = serde_json::from_slice(&raw)
            .map_err(|e| Error::load(&name, format!("config.json is not JSON: {e}")))?;
        Self::from_json(name, root, declared)
    }

    /// A config from its parsed `config.json` (`name` names it in errors): absent fields take
    /// the class defaults of the text model's type, and nulls transformers refuses are errors
    /// (`hf_defaults`).
    pub(crate) fn from_json(name: String, root: Json, declared: Declared) -> Result<Config> {
        let mut text = match root.get("text_config") {
            Some(t) if t.is_object() => t.clone(),
            _ => root.clone(),
        };
        // A wrapper around another family's text config (Gemma 4's MTP assistant): the outer
        // type decides.
        let outer = root
            .get("model_type")
            .and_then(Json::as_str)
            .is_some_and(declared.outer_decides);
        let model_type = text
            .get("model_type")
            .filter(|_| !outer)
            .or_else(|| root.get("model_type"))
            .and_then(Json::as_str)
            .ok_or_else(|| Error::load(&name, "config.json has no model_type"))?
            .to_string();
        let text_type = text
            .get("model_type")
            .and_then(Json::as_str)
            .unwrap_or(&model_type)
            .to_string();
        crate::load::hf_defaults::apply(&text_type, (declared.defaults)(&text_type), &mut text)
            .map_err(|e| Error::load(&name, e))?;
        Ok(Config {
            dir: name,
            text,
            root,
            model_type,
        })
    }

    pub(crate) fn err(&self, msg: impl Into<String>) -> Error {
        Error::load(&self.dir, msg.into())
    }

    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        self.text.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn usize(&self, key: &str) -> Result<usize> {
        self.get(key)
            .and_then(Json::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| self.err(format!("config.json: {key} is missing or not a count")))
    }

    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.get(key) {
            None => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    pub(crate) fn f32(&self, key: &str) -> Result<f32> {
        self.get(key)
            .and_then(Json::as_f64)
            .map(|v| v as f32)
            .ok_or_else(|| self.err(format!("config.json: {key} is missing or not a number")))
    }

    /// The RoPE base: `rope_theta`, or transformers 5's `rope_parameters` (per layer type
    /// when `layer_type` names one).
    pub(crate) fn rope_theta(&self, layer_type: Option<&str>) -> Option<f32> {
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
    pub(crate) fn rope_scaling(&self, layer_type: Option<&str>) -> Result<(String, f32)> {
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
    pub(crate) fn layer_types(&self) -> Option<Vec<String>> {
        self.get("layer_types")?
            .as_array()?
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect()
    }
}

/// Metadata under construction.
pub(crate) struct Meta {
    pub(crate) arch: &'static str,
    pub(crate) kv: Vec<(String, Value)>,
}

impl Meta {
    pub(crate) fn set(&mut self, key: &str, v: Value) {
        self.kv.push((format!("{}.{key}", self.arch), v));
    }
    pub(crate) fn u(&mut self, key: &str, v: usize) {
        self.set(key, Value::U64(v as u64));
    }
    pub(crate) fn f(&mut self, key: &str, v: f32) {
        self.set(key, Value::F32(v));
    }
}
