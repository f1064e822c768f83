//! Tokenizers over a GGUF vocabulary (`tokenizer.ggml.*`), matching llama.cpp's `llama_vocab`:
//! gpt2-style byte-level BPE ("gpt2") and SentencePiece-style BPE ("llama", llama.cpp's SPM).
//!
//! What llama.cpp does and this module repeats:
//! - token attributes come from `token_type`, then a few tokens are marked CONTROL by their text
//!   (`<|im_end|>`, `<end_of_turn>`, FIM tokens, ...), and the end-of-generation set is built
//!   from the eos/eot/eom ids and a list of well-known texts;
//! - encoding first cuts the text at every CONTROL / USER_DEFINED / UNKNOWN token written in it
//!   (longest token first), then tokenizes the pieces between;
//! - SPM: spaces become ▁, an optional ▁ prefix, then symbols (UTF-8 chars) are merged pairwise,
//!   always the adjacent pair whose merged text is the vocabulary piece with the highest score;
//!   symbols that are not pieces fall back to `<0xXX>` byte tokens;
//! - BPE: the text is split into words by the pre-tokenizer regexes named by
//!   `tokenizer.ggml.pre`, each word is byte-level encoded, and pairs are merged by merge rank.

mod bpe;
mod load;
mod spm;

pub(crate) use load::EOG_TEXTS;

use super::unicode::{self, PreTokenizer};
use std::collections::HashMap;

// llama_token_attr bits
pub(crate) const ATTR_UNKNOWN: u32 = 1 << 0;
pub(crate) const ATTR_UNUSED: u32 = 1 << 1;
pub(crate) const ATTR_NORMAL: u32 = 1 << 2;
pub(crate) const ATTR_CONTROL: u32 = 1 << 3;
pub(crate) const ATTR_USER_DEFINED: u32 = 1 << 4;
pub(crate) const ATTR_BYTE: u32 = 1 << 5;
pub(crate) const ATTR_LSTRIP: u32 = 1 << 7;
pub(crate) const ATTR_RSTRIP: u32 = 1 << 8;

/// The tokenizer metadata of a GGUF file as plain data (the `tokenizer.ggml.*` keys).
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE), "llama" (SentencePiece-style), "gemma4".
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer name of BPE vocabularies.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub sep_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub mask_id: Option<u32>,
    pub fim_pre_id: Option<u32>,
    pub fim_suf_id: Option<u32>,
    pub fim_mid_id: Option<u32>,
    pub fim_pad_id: Option<u32>,
    pub fim_rep_id: Option<u32>,
    pub fim_sep_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    pub chat_template: Option<String>,
    /// `general.name`, `general.architecture`: a few per-model token attributes hang on these.
    pub model_name: Option<String>,
    pub architecture: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Spm,
    Bpe,
}

/// A loaded GGUF vocabulary with its tokenizer.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) kind: Kind,
    tokens: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u32>,
    token_to_id: HashMap<String, u32>,
    /// "left right" -> rank
    merges: HashMap<String, u32>,
    pre: Option<PreTokenizer>,
    byte_encode: bool,
    ignore_merges: bool,
    escape_whitespaces: bool,
    gemma4_newlines: bool,
    pub(crate) add_space_prefix: bool,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eog: Vec<u32>,
    /// Position of each CONTROL / USER_DEFINED / UNKNOWN token in llama.cpp's special-token
    /// cache (longest text first); u32::MAX for other tokens.
    special_rank: Vec<u32>,
    special_trie: Trie,
    /// `llama_token_to_piece(id, special = true)` for every token.
    pieces: Vec<Vec<u8>>,
    pub(crate) chat_template: Option<String>,
}

impl Vocab {
    pub(crate) fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub(crate) fn token_to_id(&self, s: &str) -> Option<u32> {
        self.token_to_id.get(s).copied()
    }

    pub(crate) fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|&a| a & ATTR_CONTROL != 0)
    }

    /// The bytes of a token (`llama_token_to_piece` with special = true).
    pub(crate) fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(|p| p.as_slice())
    }

    fn make_piece(&self, id: u32) -> Vec<u8> {
        let attr = self.attrs[id as usize];
        let text = &self.tokens[id as usize];
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if attr & ATTR_NORMAL != 0 {
            if self.kind == Kind::Spm || self.escape_whitespaces {
                return text.replace('\u{2581}', " ").into_bytes();
            }
            // byte-level: every char stands for a byte
            let mut out = Vec::with_capacity(text.len());
            for c in text.chars() {
                match unicode::char_to_byte(c) {
                    Some(b) => out.push(b),
                    None => {
                        // llama.cpp writes an [UNK_BYTE_..] marker for chars outside the alphabet
                        let mut buf = [0u8; 4];
                        out.extend_from_slice(b"[UNK_BYTE_0x");
                        for b in c.encode_utf8(&mut buf).bytes() {
                            out.extend_from_slice(format!("{b:02x}").as_bytes());
                        }
                        out.extend_from_slice(text.as_bytes());
                        out.push(b']');
                    }
                }
            }
            return out;
        }
        if attr & ATTR_BYTE != 0 {
            return parse_byte_token(text).map(|b| vec![b]).unwrap_or_default();
        }
        Vec::new()
    }

    fn byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        if let Some(&id) = self.token_to_id.get(hex.as_str()) {
            return Some(id);
        }
        if b < 0x80 {
            return self
                .token_to_id
                .get((b as char).encode_utf8(&mut [0; 4]) as &str)
                .copied();
        }
        None
    }

    // -----------------------------------------------------------------------------------------
    // encoding
    // -----------------------------------------------------------------------------------------

    pub(crate) fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        match self.kind {
            Kind::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[s..e]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            self.spm_tokenize(&escaped, &mut out);
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Kind::Bpe => {
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => {
                            if self.escape_whitespaces {
                                let t = text[s..e].replace(' ', "\u{2581}");
                                self.bpe_tokenize(&t, &mut out);
                            } else {
                                self.bpe_tokenize(&text[s..e], &mut out);
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        out
    }

    /// Cuts the text at the special tokens written in it, as llama.cpp's
    /// `tokenizer_st_partition`: token by token, longest first, every occurrence in every
    /// remaining piece of text, left to right.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = vec![Frag::Text(0, text.len())];
        // only the special tokens that occur somewhere in the text can cut it
        let mut found: Vec<u32> = Vec::new();
        let bytes = text.as_bytes();
        for i in 0..bytes.len() {
            self.special_trie.matches_at(&bytes[i..], &mut found);
        }
        if found.is_empty() {
            return frags;
        }
        found.sort_unstable_by_key(|&id| self.special_rank[id as usize]);
        found.dedup();
        for id in found {
            let attr = self.attrs[id as usize];
            if !parse_special && attr & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
                continue;
            }
            let tok = self.tokens[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(mut s, e) = f else {
                    next.push(f);
                    continue;
                };
                loop {
                    let Some(m) = text[s..e].find(tok).map(|p| p + s) else {
                        next.push(Frag::Text(s, e));
                        break;
                    };
                    if m > s {
                        let mut le = m;
                        if attr & ATTR_LSTRIP != 0 {
                            while le > s && is_c_space(bytes[le - 1]) {
                                le -= 1;
                            }
                        }
                        if le > s {
                            next.push(Frag::Text(s, le));
                        }
                    }
                    next.push(Frag::Token(id));
                    let mut rs = m + tok.len();
                    if rs >= e {
                        break;
                    }
                    if attr & ATTR_RSTRIP != 0 {
                        while rs < e && is_c_space(bytes[rs]) {
                            rs += 1;
                        }
                    }
                    if rs >= e {
                        break;
                    }
                    s = rs;
                }
            }
            frags = next;
        }
        frags
    }
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// `<0xAB>` -> 0xAB
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[derive(Debug, Clone, Copy)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}

#[derive(Debug, Clone, Copy)]
struct Sym {
    start: usize,
    n: usize,
    prev: isize,
    next: isize,
}

/// Merges symbol `right` into `left` (both BPE and SPM merge this way) when the pair is still
/// the `size` bytes it was queued with; returns the new neighbours `(prev, next)` of `left`,
/// or `None` for a stale pair.
fn merge_syms(syms: &mut [Sym], left: usize, right: usize, size: usize) -> Option<(isize, isize)> {
    let (ln, rn) = (syms[left].n, syms[right].n);
    if ln == 0 || rn == 0 || ln + rn != size {
        return None;
    }
    syms[left].n += rn;
    syms[right].n = 0;
    let rnext = syms[right].next;
    syms[left].next = rnext;
    if rnext >= 0 {
        syms[rnext as usize].prev = left as isize;
    }
    Some((syms[left].prev, rnext))
}

/// A byte trie over the special-token texts, to find which of them occur in a text.
#[derive(Debug, Default)]
struct Trie {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    value: Option<u32>,
}

impl Trie {
    fn insert(&mut self, key: &[u8], value: u32) {
        if self.nodes.is_empty() {
            self.nodes.push(TrieNode::default());
        }
        let mut node = 0usize;
        for &b in key {
            let found = self.nodes[node]
                .children
                .binary_search_by_key(&b, |&(c, _)| c);
            node = match found {
                Ok(i) => self.nodes[node].children[i].1 as usize,
                Err(i) => {
                    let new = self.nodes.len();
                    self.nodes.push(TrieNode::default());
                    self.nodes[node].children.insert(i, (b, new as u32));
                    new
                }
            };
        }
        self.nodes[node].value.get_or_insert(value);
    }

    /// Pushes every key that is a prefix of `s`.
    fn matches_at(&self, s: &[u8], out: &mut Vec<u32>) {
        if self.nodes.is_empty() {
            return;
        }
        let mut node = 0usize;
        for &b in s {
            match self.nodes[node]
                .children
                .binary_search_by_key(&b, |&(c, _)| c)
            {
                Ok(i) => node = self.nodes[node].children[i].1 as usize,
                Err(_) => return,
            }
            if let Some(v) = self.nodes[node].value {
                out.push(v);
            }
        }
    }
}
