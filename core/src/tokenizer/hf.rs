//! A Hugging Face `tokenizer.json` through the `tokenizers` crate, with the bos/eos/add_bos and
//! chat template of a `tokenizer_config.json` beside it when there is one.

use super::unicode;
use super::vocab::{parse_byte_token, EOG_TEXTS};
use crate::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug)]
pub(crate) struct HfTokenizer {
    pub(crate) tok: tokenizers::Tokenizer,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    /// Whether the tokenizers post-processor already adds BOS / EOS.
    post_adds_bos: bool,
    post_adds_eos: bool,
    pub(crate) eog: Vec<u32>,
    special: HashMap<u32, String>,
    added: HashMap<u32, String>,
    byte_level: bool,
    pub(crate) chat_template: Option<String>,
    vocab_size: usize,
}

fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// A token entry in tokenizer_config.json: a string, or an AddedToken object with "content".
fn token_str(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

impl HfTokenizer {
    pub(crate) fn from_file(path: &Path) -> Result<HfTokenizer> {
        let bytes = std::fs::read(path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        // Well-formed JSON first: the tokenizers crate panics on some malformed files (its
        // decoder deserializer unwraps), and a panic must not be what a bad file gets.
        serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| Error::Tokenizer(format!("{}: not JSON: {e}", path.display())))?;
        let parsed = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(&bytes));
        let tok = match parsed {
            Ok(t) => t.map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?,
            Err(_) => {
                return Err(Error::Tokenizer(format!(
                    "{}: the tokenizers library could not read this file",
                    path.display()
                )))
            }
        };

        // tokenizer_config.json beside it
        let mut config = serde_json::Value::Null;
        if let Some(dir) = path.parent() {
            let cfg_path = dir.join("tokenizer_config.json");
            if cfg_path.is_file() {
                let text = std::fs::read_to_string(&cfg_path)
                    .map_err(|e| Error::Tokenizer(format!("{}: {e}", cfg_path.display())))?;
                config = serde_json::from_str(&text)
                    .map_err(|e| Error::Tokenizer(format!("{}: {e}", cfg_path.display())))?;
            }
        }
        let cfg_token = |key: &str| -> Option<u32> {
            token_str(config.get(key)?).and_then(|s| tok.token_to_id(&s))
        };
        let cfg_bool = |key: &str| config.get(key).and_then(|v| v.as_bool());
        let chat_template = match config.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(list)) => {
                let named = |name: &str| {
                    list.iter().find_map(|t| {
                        (t.get("name")?.as_str()? == name)
                            .then(|| t.get("template")?.as_str().map(String::from))
                            .flatten()
                    })
                };
                named("default").or_else(|| {
                    list.first()
                        .and_then(|t| t.get("template")?.as_str().map(String::from))
                })
            }
            _ => None,
        };
        // Newer checkpoints keep the template in its own file.
        let chat_template = chat_template.or_else(|| {
            let f = path.parent()?.join("chat_template.jinja");
            std::fs::read_to_string(f).ok()
        });

        // what the post-processor adds around a plain text
        let with = tok.encode("a", true).map_err(tk_err)?;
        let without = tok.encode("a", false).map_err(tk_err)?;
        let (w, wo) = (with.get_ids(), without.get_ids());
        let mut post_first = None;
        let mut post_last = None;
        if w.len() > wo.len() {
            if let Some(p) = w.windows(wo.len().max(1)).position(|win| win == wo) {
                if p > 0 {
                    post_first = Some(w[0]);
                }
                if p + wo.len() < w.len() {
                    post_last = w.last().copied();
                }
            }
        }

        let bos = cfg_token("bos_token").or(post_first);
        let eos = cfg_token("eos_token").or(post_last);
        let post_adds_bos = post_first.is_some() && post_first == bos;
        let post_adds_eos = post_last.is_some() && post_last == eos;
        // the post-processor wins (as in transformers' fast tokenizers); the config can only add
        let add_bos = post_adds_bos || (cfg_bool("add_bos_token") == Some(true) && bos.is_some());
        let add_eos = post_adds_eos || (cfg_bool("add_eos_token") == Some(true) && eos.is_some());

        let mut special = HashMap::new();
        let mut added = HashMap::new();
        for (id, t) in tok.get_added_tokens_decoder() {
            if t.special {
                special.insert(id, t.content.clone());
            }
            added.insert(id, t.content);
        }
        let mut eog: Vec<u32> = eos.into_iter().collect();
        for t in EOG_TEXTS {
            if let Some(id) = tok.token_to_id(t) {
                eog.push(id);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        let byte_level = tok
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|s| s.contains("\"ByteLevel\""));
        let vocab_size = tok.get_vocab_size(true);

        Ok(HfTokenizer {
            tok,
            bos,
            eos,
            add_bos,
            add_eos,
            post_adds_bos,
            post_adds_eos,
            eog,
            special,
            added,
            byte_level,
            chat_template,
            vocab_size,
        })
    }

    pub(crate) fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub(crate) fn is_special(&self, id: u32) -> bool {
        self.special.contains_key(&id)
    }

    pub(crate) fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self.tok.encode(text, add_special).map_err(tk_err)?;
        let mut ids = enc.get_ids().to_vec();
        if add_special {
            if self.add_bos && !self.post_adds_bos {
                ids.insert(0, self.bos.unwrap());
            }
            if self.add_eos && !self.post_adds_eos {
                ids.push(self.eos.unwrap());
            }
        }
        Ok(ids)
    }

    pub(crate) fn decode(&self, ids: &[u32]) -> String {
        match self.tok.decode(ids, false) {
            Ok(s) => s,
            Err(_) => {
                // fall back to the raw bytes of the tokens
                let mut bytes = Vec::new();
                for &id in ids {
                    if let Some(b) = self.token_bytes(id) {
                        bytes.extend_from_slice(&b);
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }

    pub(crate) fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        if let Some(s) = self.added.get(&id) {
            return Some(s.as_bytes().to_vec());
        }
        let t = self.tok.id_to_token(id)?;
        if let Some(b) = parse_byte_token(&t) {
            return Some(vec![b]);
        }
        if self.byte_level {
            let bytes: Option<Vec<u8>> = t.chars().map(unicode::char_to_byte).collect();
            if let Some(b) = bytes {
                return Some(b);
            }
        }
        Some(t.replace('\u{2581}', " ").into_bytes())
    }
}
