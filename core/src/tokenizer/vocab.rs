//! Tokenizers over a GGUF vocabulary (`tokenizer.ggml.*`), matching llama.cpp's `llama_vocab`:
//! gpt2-style byte-level BPE ("gpt2") and SentencePiece-style BPE ("llama", llama.cpp's SPM).
//!
//! What llama.cpp does and this file repeats:
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

use super::unicode::{self, PreTokenizer, RE_GPT2, RE_LLAMA3, RE_QWEN2, RE_QWEN35};
use crate::{Error, Result};
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

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

// ---------------------------------------------------------------------------------------------
// loading
// ---------------------------------------------------------------------------------------------

struct PreCfg {
    regexes: &'static [&'static str],
    ignore_merges: bool,
    add_bos: bool,
    clean_spaces: bool,
    byte_encode: bool,
    escape_whitespaces: bool,
    no_bos: bool,
}

const RE_DEEPSEEK3: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;
const RE_TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_SEED_CODER: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";
const RE_BAILING: &str = r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";
const RE_BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// llama.cpp's pre-tokenizer table: `tokenizer.ggml.pre` -> regexes and flags.
fn bpe_pre_config(pre: &str) -> Result<PreCfg> {
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

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Texts of tokens that end generation (llama.cpp's list).
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn type_to_attr(t: i32) -> u32 {
    match t {
        1 => ATTR_NORMAL,
        2 => ATTR_UNKNOWN,
        3 => ATTR_CONTROL,
        4 => ATTR_USER_DEFINED,
        5 => ATTR_UNUSED,
        6 => ATTR_BYTE,
        _ => 0, // undefined
    }
}

impl Vocab {
    pub(crate) fn new(v: GgufVocab) -> Result<Vocab> {
        let GgufVocab {
            model,
            pre,
            tokens,
            scores,
            token_types,
            merges,
            bos_id,
            eos_id,
            eot_id,
            eom_id,
            unk_id,
            sep_id: _,
            pad_id: _,
            mask_id: _,
            fim_pre_id,
            fim_suf_id,
            fim_mid_id,
            fim_pad_id,
            fim_rep_id,
            fim_sep_id,
            add_bos: meta_add_bos,
            add_eos: meta_add_eos,
            add_space_prefix: meta_add_space_prefix,
            chat_template,
            model_name,
            architecture,
        } = v;
        let n = tokens.len();
        if n == 0 {
            return Err(Error::Tokenizer("empty vocabulary".into()));
        }
        let n32 = u32::try_from(n).map_err(|_| Error::Tokenizer("vocabulary too large".into()))?;

        // vocabulary type and its defaults
        let mut pre_name = pre.clone().unwrap_or_default();
        let kind;
        let (mut bos, mut eos, mut unk): (Option<u32>, Option<u32>, Option<u32>);
        let mut add_space_prefix = false;
        let mut add_bos;
        let mut add_eos = false;
        let mut cfg = None;
        match model.as_str() {
            "llama" => {
                kind = Kind::Spm;
                (bos, eos, unk) = (Some(1), Some(2), Some(0));
                add_space_prefix = true;
                add_bos = true;
            }
            "gpt2" | "gemma4" => {
                kind = Kind::Bpe;
                if model == "gemma4" {
                    (bos, eos, unk) = (None, None, None);
                    pre_name = "gemma4".into();
                } else {
                    (bos, eos, unk) = (Some(11), Some(11), None);
                }
                let c = bpe_pre_config(&pre_name)?;
                add_bos = c.add_bos;
                if c.no_bos {
                    bos = None;
                }
                cfg = Some(c);
            }
            other => {
                return Err(Error::Tokenizer(format!(
                    "unsupported tokenizer model {other:?} (tokenizer.ggml.model); \
                     supported: gpt2, llama, gemma4"
                )))
            }
        }
        if let Some(p) = meta_add_space_prefix {
            add_space_prefix = p;
        }

        // tokens
        let mut token_to_id = HashMap::with_capacity(n);
        let mut tokens = tokens;
        for (i, t) in tokens.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
            if token_to_id.insert(t.clone(), i as u32).is_some() {
                return Err(Error::Tokenizer(format!(
                    "duplicate token in vocabulary: {t:?}"
                )));
            }
        }
        let scores = match scores {
            Some(s) if s.len() >= n => s[..n].to_vec(),
            Some(s) => {
                return Err(Error::Tokenizer(format!(
                    "{} scores for {n} tokens",
                    s.len()
                )))
            }
            None => vec![0.0; n],
        };
        let mut attrs = match token_types {
            Some(t) if t.len() >= n => t[..n].iter().map(|&x| type_to_attr(x)).collect(),
            Some(t) => {
                return Err(Error::Tokenizer(format!(
                    "{} token types for {n} tokens",
                    t.len()
                )))
            }
            None => vec![ATTR_NORMAL; n],
        };

        // merges
        let mut merge_map = HashMap::new();
        if kind == Kind::Bpe {
            let m =
                merges.ok_or_else(|| Error::Tokenizer("BPE vocabulary without merges".into()))?;
            merge_map.reserve(m.len());
            for (i, line) in m.into_iter().enumerate() {
                merge_map.entry(line).or_insert(i as u32);
            }
        }

        // special ids from the metadata
        let in_range = |id: Option<u32>| id.filter(|&i| i < n32);
        let pick = |meta: Option<u32>, default: Option<u32>| match meta {
            Some(i) if i < n32 => Some(i),
            _ => in_range(default),
        };
        bos = pick(bos_id, bos);
        eos = pick(eos_id, eos);
        unk = pick(unk_id, unk);
        let _ = unk;
        let mut eot = in_range(eot_id);
        let mut eom = in_range(eom_id);
        let mut fim_pre = in_range(fim_pre_id);
        let mut fim_suf = in_range(fim_suf_id);
        let mut fim_mid = in_range(fim_mid_id);
        let mut fim_pad = in_range(fim_pad_id);
        let mut fim_rep = in_range(fim_rep_id);
        let mut fim_sep = in_range(fim_sep_id);

        if let Some(b) = meta_add_bos {
            add_bos = b;
        }
        if let Some(b) = meta_add_eos {
            add_eos = b;
        }
        if model == "gemma4" {
            add_bos = true;
        }
        if add_bos && bos.is_none() {
            return Err(Error::Tokenizer(
                "add_bos_token is true, but bos_token_id is not set".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(Error::Tokenizer(
                "add_eos_token is true, but eos_token_id is not set".into(),
            ));
        }

        // find special tokens by their text (llama.cpp marks them CONTROL)
        for id in 0..n {
            let t = tokens[id].as_str();
            for (slot, texts) in [
                (&mut eot, EOT_TEXTS),
                (&mut eom, EOM_TEXTS),
                (&mut fim_pre, FIM_PRE_TEXTS),
                (&mut fim_suf, FIM_SUF_TEXTS),
                (&mut fim_mid, FIM_MID_TEXTS),
                (&mut fim_pad, FIM_PAD_TEXTS),
                (&mut fim_rep, FIM_REP_TEXTS),
                (&mut fim_sep, FIM_SEP_TEXTS),
            ] {
                if slot.is_none() && texts.contains(&t) {
                    *slot = Some(id as u32);
                    attrs[id] |= ATTR_CONTROL;
                }
            }
        }
        let _ = (fim_pre, fim_suf, fim_mid);
        for id in 0..n {
            if attrs[id] & ATTR_CONTROL != 0 && tokens[id].contains("unused") {
                attrs[id] |= ATTR_UNUSED;
            }
        }

        // end-of-generation set
        let mut eog: Vec<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for id in 0..n {
            if EOG_TEXTS.contains(&tokens[id].as_str()) {
                eog.push(id as u32);
                attrs[id] |= ATTR_CONTROL;
            }
        }
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = token_to_id.get(t) {
                attrs[id as usize] = ATTR_USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        eog.sort_unstable();
        eog.dedup();
        let has = |eog: &[u32], s: &str| eog.iter().any(|&i| tokens[i as usize] == s);
        if (has(&eog, "<|return|>") && has(&eog, "<|call|>") && has(&eog, "<|end|>"))
            || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>") && has(&eog, "<|end|>"))
        {
            let end = token_to_id["<|end|>"];
            eog.retain(|&i| i != end);
            attrs[end as usize] = ATTR_USER_DEFINED;
        }
        if has(&eog, "<|tool_response>") && has(&eog, "</s>") {
            let s = token_to_id["</s>"];
            eog.retain(|&i| i != s);
            attrs[s as usize] = ATTR_NORMAL;
        }

        // per-model attributes (llama.cpp keys them on names)
        let name = model_name.unwrap_or_default().to_lowercase();
        let arch = architecture.unwrap_or_default();
        let special_ids = |attrs: &[u32]| -> Vec<u32> {
            (0..n as u32)
                .filter(|&i| {
                    attrs[i as usize] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0
                })
                .collect()
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|s| pre_name.contains(s))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|s| arch.contains(s))
        {
            if let Some(&id) = token_to_id.get("<mask>") {
                attrs[id as usize] |= ATTR_LSTRIP;
            }
        } else if name.contains("phi-3") || name.contains("phi3") {
            for id in special_ids(&attrs) {
                attrs[id as usize] |= ATTR_RSTRIP;
            }
            if let Some(&id) = token_to_id.get("</s>") {
                attrs[id as usize] |= ATTR_RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = token_to_id.get(t) {
                    attrs[id as usize] &= !ATTR_RSTRIP;
                }
            }
        } else if name.contains("modern-bert") {
            if let Some(&id) = token_to_id.get("[MASK]") {
                attrs[id as usize] |= ATTR_LSTRIP;
            }
        }

        // special tokens, longest first
        let mut special_cache = special_ids(&attrs);
        special_cache.sort_by(|&a, &b| {
            tokens[b as usize]
                .len()
                .cmp(&tokens[a as usize].len())
                .then(a.cmp(&b))
        });
        let mut special_rank = vec![u32::MAX; n];
        let mut special_trie = Trie::default();
        for (r, &id) in special_cache.iter().enumerate() {
            special_rank[id as usize] = r as u32;
            special_trie.insert(tokens[id as usize].as_bytes(), id);
        }

        let (pre_tok, byte_encode, ignore_merges, escape_whitespaces) = match &cfg {
            Some(c) => {
                let _ = c.clean_spaces;
                (
                    Some(PreTokenizer::new(c.regexes)?),
                    c.byte_encode,
                    c.ignore_merges,
                    c.escape_whitespaces,
                )
            }
            None => (None, true, false, true),
        };

        let mut vocab = Vocab {
            kind,
            tokens,
            scores,
            attrs,
            token_to_id,
            merges: merge_map,
            pre: pre_tok,
            byte_encode,
            ignore_merges,
            escape_whitespaces,
            gemma4_newlines: pre_name == "gemma4",
            add_space_prefix,
            add_bos,
            add_eos,
            bos,
            eos,
            eot,
            eog,
            special_rank,
            special_trie,
            pieces: Vec::new(),
            chat_template,
        };
        vocab.pieces = (0..n as u32).map(|id| vocab.make_piece(id)).collect();
        Ok(vocab)
    }

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

    /// llama.cpp's SPM tokenizer over one piece of (already ▁-escaped) text.
    fn spm_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut syms: Vec<Sym> = Vec::with_capacity(text.len());
        let nchars = text.chars().count();
        for (i, (pos, c)) in text.char_indices().enumerate() {
            syms.push(Sym {
                start: pos,
                n: c.len_utf8(),
                prev: i as isize - 1,
                next: if i + 1 == nchars { -1 } else { i as isize + 1 },
            });
        }
        let mut heap: BinaryHeap<SpmBigram> = BinaryHeap::new();
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<SpmBigram>, l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (ls, rs) = (&syms[l as usize], &syms[r as usize]);
            let size = ls.n + rs.n;
            let piece = &text[ls.start..ls.start + size];
            if let Some(&id) = self.token_to_id.get(piece) {
                heap.push(SpmBigram {
                    score: self.scores[id as usize],
                    left: l as usize,
                    right: r as usize,
                    size,
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i as isize - 1, i as isize);
        }
        while let Some(b) = heap.pop() {
            let (ln, rn) = (syms[b.left].n, syms[b.right].n);
            if ln == 0 || rn == 0 || ln + rn != b.size {
                continue;
            }
            syms[b.left].n += rn;
            syms[b.right].n = 0;
            let rnext = syms[b.right].next;
            syms[b.left].next = rnext;
            if rnext >= 0 {
                syms[rnext as usize].prev = b.left as isize;
            }
            let lprev = syms[b.left].prev;
            try_add(&syms, &mut heap, lprev, b.left as isize);
            try_add(&syms, &mut heap, b.left as isize, rnext);
        }
        let mut i = 0isize;
        while i != -1 {
            let s = &syms[i as usize];
            let piece = &text[s.start..s.start + s.n];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        if let Some(id) = self.byte_token(b) {
                            out.push(id);
                        }
                    }
                }
            }
            i = s.next;
        }
    }

    /// llama.cpp's BPE tokenizer over one piece of text.
    fn bpe_tokenize(&self, text: &str, out: &mut Vec<u32>) {
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
                let (ln, rn) = (syms[b.left].n, syms[b.right].n);
                if ln == 0 || rn == 0 || ln + rn != b.size {
                    continue;
                }
                syms[b.left].n += rn;
                syms[b.right].n = 0;
                let rnext = syms[b.right].next;
                syms[b.left].next = rnext;
                if rnext >= 0 {
                    syms[rnext as usize].prev = b.left as isize;
                }
                let lprev = syms[b.left].prev;
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

/// Max-heap order: highest score first, then the leftmost pair.
#[derive(Debug)]
struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for SpmBigram {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
            .then_with(|| o.right.cmp(&self.right))
            .then_with(|| o.size.cmp(&self.size))
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
