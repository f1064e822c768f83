//! One Tokenizer type over GGUF vocabularies (gpt2-style BPE, SentencePiece-style) and HF tokenizer.json.
//!
//! GGUF vocabularies are tokenized the way llama.cpp does it (same pre-tokenizer regexes, same
//! merge order, same special-token parsing, same byte fallback), so that token ids match
//! `llama-tokenize` exactly. `tokenizer.json` files go through the `tokenizers` crate.
//!
//! Special-token strings written in the text (`<|im_start|>`, `<start_of_turn>`, ...) are parsed
//! as those single tokens, as llama.cpp does by default (`parse_special = true`).
//!
//! Decoding renders every token as its bytes ([`Tokenizer::token_bytes`]): control tokens as
//! their text, byte tokens `<0xAB>` as that byte, GPT-2 byte-level characters as the bytes they
//! stand for, SentencePiece's ▁ as a space. Like llama.cpp's `llama_detokenize`, a vocabulary
//! with `add_space_prefix` drops one leading space of the first token. llama.cpp's optional
//! "clean spaces" pass (" ." -> ".", only some old BPE vocabularies) is not applied, so that
//! [`StreamDecoder`] and [`Tokenizer::decode`] always agree.

mod hf;
mod unicode;
#[allow(clippy::all, dead_code)]
mod unicode_data;
mod vocab;

pub use vocab::GgufVocab;

use crate::load::gguf::{GgufFile, Value};
use crate::{Error, Result};
use hf::HfTokenizer;
use vocab::Vocab;

/// A tokenizer: a GGUF vocabulary or a Hugging Face `tokenizer.json`.
pub struct Tokenizer {
    inner: Inner,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.inner {
            Inner::Gguf(v) => match v.kind {
                vocab::Kind::Spm => "gguf-spm",
                vocab::Kind::Bpe => "gguf-bpe",
            },
            Inner::Hf(_) => "tokenizer.json",
        };
        f.debug_struct("Tokenizer")
            .field("kind", &kind)
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos())
            .field("eos", &self.eos())
            .field("add_bos", &self.add_bos())
            .field("eog", &self.eog_ids())
            .finish()
    }
}

enum Inner {
    Gguf(Box<Vocab>),
    Hf(Box<HfTokenizer>),
}

impl GgufVocab {
    /// Reads the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<GgufVocab> {
        let err = |key: &str, e: Error| Error::Tokenizer(format!("{}: {key}: {e}", file.path()));
        let id = |key: &str| -> Option<u32> {
            file.get(key)
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok())
        };
        let flag = |key: &str| file.get(key).and_then(Value::as_bool);
        let string = |key: &str| file.get(key).and_then(Value::as_str).map(String::from);

        let model = file
            .get_str("tokenizer.ggml.model")
            .map_err(|e| err("tokenizer.ggml.model", e))?
            .to_string();
        let tokens = file
            .get_str_array("tokenizer.ggml.tokens")
            .map_err(|e| err("tokenizer.ggml.tokens", e))?
            .into_iter()
            .map(String::from)
            .collect();
        let scores = match file.get("tokenizer.ggml.scores") {
            Some(_) => Some(
                file.get_f32_array("tokenizer.ggml.scores")
                    .map_err(|e| err("tokenizer.ggml.scores", e))?,
            ),
            None => None,
        };
        let token_types = match file.get("tokenizer.ggml.token_type") {
            Some(_) => Some(
                file.get_i64_array("tokenizer.ggml.token_type")
                    .map_err(|e| err("tokenizer.ggml.token_type", e))?
                    .into_iter()
                    .map(|t| t as i32)
                    .collect(),
            ),
            None => None,
        };
        let merges = match file.get("tokenizer.ggml.merges") {
            Some(_) => Some(
                file.get_str_array("tokenizer.ggml.merges")
                    .map_err(|e| err("tokenizer.ggml.merges", e))?
                    .into_iter()
                    .map(String::from)
                    .collect(),
            ),
            None => None,
        };
        Ok(GgufVocab {
            model,
            pre: string("tokenizer.ggml.pre"),
            tokens,
            scores,
            token_types,
            merges,
            bos_id: id("tokenizer.ggml.bos_token_id"),
            eos_id: id("tokenizer.ggml.eos_token_id"),
            eot_id: id("tokenizer.ggml.eot_token_id"),
            eom_id: id("tokenizer.ggml.eom_token_id"),
            unk_id: id("tokenizer.ggml.unknown_token_id"),
            sep_id: id("tokenizer.ggml.seperator_token_id"),
            pad_id: id("tokenizer.ggml.padding_token_id"),
            mask_id: id("tokenizer.ggml.mask_token_id"),
            fim_pre_id: id("tokenizer.ggml.fim_pre_token_id")
                .or_else(|| id("tokenizer.ggml.prefix_token_id")),
            fim_suf_id: id("tokenizer.ggml.fim_suf_token_id")
                .or_else(|| id("tokenizer.ggml.suffix_token_id")),
            fim_mid_id: id("tokenizer.ggml.fim_mid_token_id")
                .or_else(|| id("tokenizer.ggml.middle_token_id")),
            fim_pad_id: id("tokenizer.ggml.fim_pad_token_id"),
            fim_rep_id: id("tokenizer.ggml.fim_rep_token_id"),
            fim_sep_id: id("tokenizer.ggml.fim_sep_token_id"),
            add_bos: flag("tokenizer.ggml.add_bos_token"),
            add_eos: flag("tokenizer.ggml.add_eos_token"),
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix"),
            chat_template: string("tokenizer.chat_template"),
            model_name: string("general.name"),
            architecture: string("general.architecture"),
        })
    }
}

impl Tokenizer {
    /// The tokenizer of a GGUF file (`tokenizer.ggml.*` metadata).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        Self::from_gguf_vocab(GgufVocab::from_gguf(file)?)
    }

    /// A tokenizer over GGUF vocabulary data.
    pub fn from_gguf_vocab(vocab: GgufVocab) -> Result<Tokenizer> {
        Ok(Tokenizer {
            inner: Inner::Gguf(Box::new(Vocab::new(vocab)?)),
        })
    }

    /// A Hugging Face `tokenizer.json`, with `tokenizer_config.json` beside it (if present) for
    /// bos/eos tokens, add_bos/add_eos and the chat template.
    pub fn from_hf_file(path: &std::path::Path) -> Result<Tokenizer> {
        Ok(Tokenizer {
            inner: Inner::Hf(Box::new(HfTokenizer::from_file(path)?)),
        })
    }

    /// Token ids of a prompt rendered by the model's chat template: the model's own leading
    /// special tokens (BOS where the tokenizer adds one) unless the template already wrote its
    /// BOS, never twice. `kiln chat`, `kiln bench` and the server's chat endpoints all
    /// tokenize through this one rule, so one conversation gives one list of ids (llama.cpp's
    /// server does the same in effect; transformers' `apply_chat_template` leaves BOS to the
    /// template, which every template whose model wants one writes).
    /// Never EOS: a tokenizer that appends one to what it encodes would end the prompt there.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>> {
        let written = self
            .bos()
            .map(|b| self.decode(&[b]))
            .is_some_and(|b| !b.is_empty() && rendered.starts_with(&b));
        let mut ids = self.encode(rendered, false)?;
        match self.bos() {
            Some(b) if self.add_bos() && !written => ids.insert(0, b),
            _ => {}
        }
        Ok(ids)
    }

    /// Token ids of `text`. With `add_special`, BOS / EOS are added as the model's add_bos /
    /// add_eos flags say. Special-token strings in the text become those tokens.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        match &self.inner {
            Inner::Gguf(v) => Ok(v.encode(text, add_special, true)),
            Inner::Hf(h) => h.encode(text, add_special),
        }
    }

    /// The text of a token sequence (lossy UTF-8; special tokens rendered as their text).
    pub fn decode(&self, ids: &[u32]) -> String {
        match &self.inner {
            Inner::Gguf(v) => {
                let mut bytes = Vec::with_capacity(ids.len() * 4);
                for (i, &id) in ids.iter().enumerate() {
                    if let Some(p) = v.piece(id) {
                        bytes.extend_from_slice(strip_first_space(v, i == 0, p));
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Inner::Hf(h) => h.decode(ids),
        }
    }

    /// The raw bytes a token stands for (None for an id outside the vocabulary).
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        match &self.inner {
            Inner::Gguf(v) => v.piece(id).map(<[u8]>::to_vec),
            Inner::Hf(h) => h.token_bytes(id),
        }
    }

    pub fn vocab_size(&self) -> usize {
        match &self.inner {
            Inner::Gguf(v) => v.n_tokens(),
            Inner::Hf(h) => h.vocab_size(),
        }
    }

    pub fn bos(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(v) => v.bos,
            Inner::Hf(h) => h.bos,
        }
    }

    pub fn eos(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(v) => v.eos,
            Inner::Hf(h) => h.eos,
        }
    }

    /// The end-of-turn token (`tokenizer.ggml.eot_token_id`, or found by its text).
    pub fn eot(&self) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(v) => v.eot,
            Inner::Hf(_) => None,
        }
    }

    /// Whether `encode(.., add_special = true)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        match &self.inner {
            Inner::Gguf(v) => v.add_bos && v.bos.is_some(),
            Inner::Hf(h) => h.add_bos,
        }
    }

    /// Whether `encode(.., add_special = true)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        match &self.inner {
            Inner::Gguf(v) => v.add_eos && v.eos.is_some(),
            Inner::Hf(h) => h.add_eos,
        }
    }

    /// End-of-generation ids, sorted: eos, eot, and tokens such as `<|im_end|>`,
    /// `<end_of_turn>`, `<|endoftext|>` present in the vocabulary (llama.cpp's list).
    pub fn eog_ids(&self) -> &[u32] {
        match &self.inner {
            Inner::Gguf(v) => &v.eog,
            Inner::Hf(h) => &h.eog,
        }
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog_ids().binary_search(&id).is_ok()
    }

    /// Control tokens (GGUF token type CONTROL, plus those llama.cpp marks so by their text;
    /// for tokenizer.json: added tokens flagged special).
    pub fn is_special(&self, id: u32) -> bool {
        match &self.inner {
            Inner::Gguf(v) => v.is_control(id),
            Inner::Hf(h) => h.is_special(id),
        }
    }

    /// `tokenizer.chat_template` (GGUF) or `chat_template` of tokenizer_config.json.
    pub fn chat_template(&self) -> Option<&str> {
        match &self.inner {
            Inner::Gguf(v) => v.chat_template.as_deref(),
            Inner::Hf(h) => h.chat_template.as_deref(),
        }
    }

    /// The id of a token given its vocabulary text (e.g. `"<|im_end|>"`, `"▁the"`, `"Ġthe"`).
    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        match &self.inner {
            Inner::Gguf(v) => v.token_to_id(s),
            Inner::Hf(h) => h.tok.token_to_id(s),
        }
    }
}

/// llama.cpp drops one leading space of the first token when the vocabulary adds a space prefix.
fn strip_first_space<'a>(v: &Vocab, first: bool, piece: &'a [u8]) -> &'a [u8] {
    if first && v.add_space_prefix && piece.first() == Some(&b' ') {
        &piece[1..]
    } else {
        piece
    }
}

/// Streaming detokenizer: feed generated tokens one at a time, get the text that became
/// complete. Partial UTF-8 characters are held back until they complete, so no U+FFFD appears
/// mid-stream; the concatenated outputs (with [`StreamDecoder::finish`]) equal
/// [`Tokenizer::decode`] of all the tokens.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// GGUF: bytes not yet emitted (an incomplete UTF-8 sequence).
    pending: Vec<u8>,
    /// Tokens pushed so far (GGUF: only whether any was).
    n_pushed: usize,
    /// tokenizer.json: the ids since `prefix_offset`, decoded through the tokenizer.
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// tokenizer.json: decoded text not yet emitted (it ended in an incomplete character).
    held: String,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one token; returns the newly complete text (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let first = self.n_pushed == 0;
        self.n_pushed += 1;
        match &tok.inner {
            Inner::Gguf(v) => {
                if let Some(p) = v.piece(id) {
                    self.pending
                        .extend_from_slice(strip_first_space(v, first, p));
                }
                self.drain_complete()
            }
            Inner::Hf(h) => {
                self.ids.push(id);
                let prefix = h.decode(&self.ids[self.prefix_offset..self.read_offset]);
                let full = h.decode(&self.ids[self.prefix_offset..]);
                if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
                    let out = tail_after(&full, &prefix);
                    self.held.clear();
                    self.prefix_offset = self.read_offset;
                    self.read_offset = self.ids.len();
                    if self.prefix_offset > 0 {
                        self.ids.drain(..self.prefix_offset);
                        self.read_offset -= self.prefix_offset;
                        self.prefix_offset = 0;
                    }
                    out
                } else {
                    self.held = tail_after(&full, &prefix);
                    String::new()
                }
            }
        }
    }

    /// Flushes what is left (an incomplete UTF-8 sequence becomes U+FFFD) and resets.
    pub fn finish(&mut self) -> String {
        let mut out = String::from_utf8_lossy(&self.pending).into_owned();
        out.push_str(&self.held);
        *self = Self::default();
        out
    }

    fn drain_complete(&mut self) -> String {
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[start..start + valid]).unwrap());
                    start += valid;
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            start += n;
                        }
                        None => break, // incomplete: wait for more bytes
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }
}

/// The part of `full` after `prefix` (by length when `full` does not start with it).
fn tail_after(full: &str, prefix: &str) -> String {
    if let Some(t) = full.strip_prefix(prefix) {
        return t.to_string();
    }
    let mut cut = prefix.len().min(full.len());
    while !full.is_char_boundary(cut) {
        cut += 1;
    }
    full[cut..].to_string()
}

/// The tokenizer of a model opened with [`crate::load::open_model`]: the GGUF file's own, or
/// the directory's `tokenizer.json` (with `tokenizer_config.json` and `chat_template.jinja`).
pub fn open_tokenizer(path: &std::path::Path, file: &GgufFile) -> Result<Tokenizer> {
    if crate::load::hf::is_model_dir(path) {
        Tokenizer::from_hf_file(&path.join("tokenizer.json"))
    } else {
        Tokenizer::from_gguf(file)
    }
}

#[cfg(test)]
mod tests;
