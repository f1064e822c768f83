//! gpt2-style byte-level BPE: llama.cpp's pre-tokenizer table and its merge-rank tokenizer.

use super::{merge_syms, Sym, Vocab};
use crate::tokenizer::unicode::{self, RE_GPT2, RE_LLAMA3, RE_QWEN2, RE_QWEN35};
use crate::{Error, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(super) struct PreCfg {
    pub(super) regexes: &'static [&'static str],
    pub(super) ignore_merges: bool,
    pub(super) add_bos: bool,
    pub(super) clean_spaces: bool,
    pub(super) byte_encode: bool,
    pub(super) escape_whitespaces: bool,
    pub(super) no_bos: bool,
}

const RE_DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const RE_TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_BAILING: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const RE_BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// llama.cpp's pre-tokenizer table: `tokenizer.ggml.pre` -> regexes and flags.
pub(super) fn bpe_pre_config(pre: &str) -> Result<PreCfg> {
    let cfg = |regexes: &'static [&'static str]| PreCfg {
        regexes,
        ignore_merges: false,
        add_bos: false,
        clean_spaces: true,
        byte_encode: true,
        escape_whitespaces: false,
        no_bos: false,
    };
    let c = match pre {
        "" | "default" => cfg(&[
            r"[\p{P}\$\+<=>\^~\|]+",
            RE_GPT2,
            r"\p{N}+",
            "[0-9][0-9][0-9]",
        ]),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => {
            let mut c = cfg(&[RE_LLAMA3]);
            c.ignore_merges = true;
            c.add_bos = true;
            c
        }
        "dbrx" | "smaug-bpe" => cfg(&[RE_LLAMA3]),
        "glm4" | "chatglm-bpe" => {
            let mut c = cfg(&[RE_LLAMA3]);
            c.no_bos = true;
            c
        }
        "deepseek-coder" => {
            let mut c = cfg(&[
                "[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ]);
            c.clean_spaces = false;
            c
        }
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            let mut c = cfg(&[r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", RE_DEEPSEEK3]);
            c.clean_spaces = false;
            c
        }
        "falcon" => cfg(&[r"[\p{P}\$\+<=>\^~\|`]+", RE_GPT2, "[0-9][0-9][0-9]"]),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
            cfg(&[r"\p{N}", RE_GPT2])
        }
        "command-r" | "smollm" => {
            let mut c = cfg(&[r"\p{N}", RE_GPT2]);
            c.clean_spaces = false;
            c
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe"
        | "mpt" | "olmo" | "jais" | "exaone4" => cfg(&[RE_GPT2]),
        "trillion" | "granite-docling" => {
            let mut c = cfg(&[RE_GPT2]);
            c.clean_spaces = false;
            c
        }
        "stablelm2" | "megrez" => cfg(&[RE_QWEN2]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
        | "grok-2" => {
            let mut c = cfg(&[RE_QWEN2]);
            c.clean_spaces = false;
            c
        }
        "qwen35" => {
            let mut c = cfg(&[RE_QWEN35]);
            c.clean_spaces = false;
            c
        }
        "poro-chat" => {
            let mut c = cfg(&[RE_BLOOM]);
            c.clean_spaces = false;
            c
        }
        "bloom" | "gpt3-finnish" => cfg(&[RE_BLOOM]),
        "viking" => {
            let mut c = cfg(&[RE_BLOOM, r"\p{N}"]);
            c.clean_spaces = false;
            c
        }
        "tekken" => {
            let mut c = cfg(&[RE_TEKKEN]);
            c.clean_spaces = false;
            c.ignore_merges = true;
            c.add_bos = true;
            c
        }
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
            let mut c = cfg(&[RE_GPT4O]);
            c.clean_spaces = false;
            c
        }
        "seed-coder" => {
            let mut c = cfg(&[RE_SEED_CODER]);
            c.clean_spaces = false;
            c
        }
        "bailingmoe" | "bailingmoe2" | "llada-moe" => {
            let mut c = cfg(&[RE_BAILING]);
            c.clean_spaces = false;
            c
        }
        "gemma4" => {
            let mut c = cfg(&["[^\\n]+|[\\n]+"]);
            c.byte_encode = false;
            c.escape_whitespaces = true;
            c.add_bos = true;
            c
        }
        other => {
            return Err(Error::Tokenizer(format!(
                "unsupported pre-tokenizer type {other:?} (tokenizer.ggml.pre)"
            )))
        }
    };
    Ok(c)
}

impl Vocab {
    /// llama.cpp's BPE tokenizer over one piece of text.
    pub(super) fn bpe_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let pre = self
            .pre
            .as_ref()
            .expect("BPE vocabulary has a pre-tokenizer");
        let mut key = String::new();
        let mut syms: Vec<Sym> = Vec::new();
        let mut heap: BinaryHeap<Reverse<BpeBigram>> = BinaryHeap::new();
        for word in pre.split(text) {
            let encoded;
            let word: &str = if self.byte_encode {
                encoded = unicode::byte_encode(word);
                &encoded
            } else {
                word
            };
            if self.ignore_merges {
                if let Some(&id) = self.token_to_id.get(word) {
                    out.push(id);
                    continue;
                }
            }
            if self.gemma4_newlines && word.bytes().all(|b| b == b'\n') {
                if let Some(&id) = self.token_to_id.get(word) {
                    out.push(id);
                    continue;
                }
            }
            syms.clear();
            heap.clear();
            let nchars = word.chars().count();
            for (i, (pos, c)) in word.char_indices().enumerate() {
                syms.push(Sym {
                    start: pos,
                    n: c.len_utf8(),
                    prev: i as isize - 1,
                    next: if i + 1 == nchars { -1 } else { i as isize + 1 },
                });
            }
            let add = |syms: &[Sym],
                       heap: &mut BinaryHeap<Reverse<BpeBigram>>,
                       key: &mut String,
                       l: isize,
                       r: isize| {
                if l < 0 || r < 0 {
                    return;
                }
                let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
                key.clear();
                key.push_str(&word[ls.start..ls.start + ls.n]);
                key.push(' ');
                key.push_str(&word[rs.start..rs.start + rs.n]);
                if let Some(&rank) = self.merges.get(key.as_str()) {
                    heap.push(Reverse(BpeBigram {
                        rank,
                        left: l as usize,
                        right: r as usize,
                        size: ls.n + rs.n,
                    }));
                }
            };
            for i in 1..syms.len() {
                add(&syms, &mut heap, &mut key, i as isize - 1, i as isize);
            }
            while let Some(Reverse(b)) = heap.pop() {
                let Some((lprev, rnext)) = merge_syms(&mut syms, b.left, b.right, b.size) else {
                    continue;
                };
                add(&syms, &mut heap, &mut key, lprev, b.left as isize);
                add(&syms, &mut heap, &mut key, b.left as isize, rnext);
            }
            for s in syms.iter().filter(|s| s.n > 0) {
                let piece = &word[s.start..s.start + s.n];
                match self.token_to_id.get(piece) {
                    Some(&id) => out.push(id),
                    None => {
                        for &b in piece.as_bytes() {
                            let id = if self.byte_encode {
                                if b < 0x80 {
                                    self.token_to_id
                                        .get((b as char).encode_utf8(&mut [0; 4]) as &str)
                                        .copied()
                                } else {
                                    None
                                }
                            } else {
                                self.token_to_id
                                    .get(format!("<0x{b:02X}>").as_str())
                                    .copied()
                            };
                            if let Some(id) = id {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Min order (used through `Reverse`): lowest rank first, then the leftmost pair.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct BpeBigram {
    rank: u32,
    left: usize,
    right: usize,
    size: usize,
}
