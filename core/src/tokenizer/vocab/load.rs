//! Loading a [`GgufVocab`] into a [`Vocab`]: token attributes, special ids, the end-of-generation
//! set and the special-token cache, as llama.cpp's `llama_vocab::load` does.

use super::bpe::bpe_pre_config;
use super::{
    GgufVocab, Kind, Trie, Vocab, ATTR_BYTE, ATTR_CONTROL, ATTR_LSTRIP, ATTR_NORMAL, ATTR_RSTRIP,
    ATTR_UNKNOWN, ATTR_UNUSED, ATTR_USER_DEFINED,
};
use crate::tokenizer::unicode::PreTokenizer;
use crate::{Error, Result};
use std::collections::HashMap;

// ---------------------------------------------------------------------------------------------
// loading
// ---------------------------------------------------------------------------------------------

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
}
