//! Unit tests over tiny hand-made vocabularies.

use super::unicode::byte_to_char;
use super::*;

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, then `pieces`.
fn spm(pieces: &[(&str, f32, i32)], add_space_prefix: bool) -> Tokenizer {
    let mut tokens = vec![
        ("<unk>".to_string(), 0.0, UNKNOWN),
        ("<s>".to_string(), 0.0, CONTROL),
        ("</s>".to_string(), 0.0, CONTROL),
    ];
    for b in 0..=255u8 {
        tokens.push((format!("<0x{b:02X}>"), 0.0, BYTE));
    }
    for (p, s, t) in pieces {
        tokens.push((p.to_string(), *s, *t));
    }
    Tokenizer::from_gguf_vocab(GgufVocab {
        model: "llama".into(),
        tokens: tokens.iter().map(|t| t.0.clone()).collect(),
        scores: Some(tokens.iter().map(|t| t.1).collect()),
        token_types: Some(tokens.iter().map(|t| t.2).collect()),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        add_space_prefix: Some(add_space_prefix),
        ..Default::default()
    })
    .unwrap()
}

fn ids(t: &Tokenizer, toks: &[&str]) -> Vec<u32> {
    toks.iter()
        .map(|s| t.token_to_id(s).unwrap_or_else(|| panic!("no token {s:?}")))
        .collect()
}

fn hello_spm(add_space_prefix: bool) -> Tokenizer {
    spm(
        &[
            ("▁", -1.0, NORMAL),
            ("h", -2.0, NORMAL),
            ("e", -2.0, NORMAL),
            ("l", -2.0, NORMAL),
            ("o", -2.0, NORMAL),
            ("w", -2.0, NORMAL),
            ("▁h", -3.0, NORMAL),
            ("he", -4.0, NORMAL),
            ("ll", -1.5, NORMAL),
            ("llo", -1.6, NORMAL),
            ("▁he", -2.5, NORMAL),
            ("▁hello", -0.5, NORMAL),
            ("\n\n", 0.0, USER_DEFINED),
            ("<start_of_turn>", 0.0, CONTROL),
            ("<end_of_turn>", 0.0, CONTROL),
        ],
        add_space_prefix,
    )
}

#[test]
fn spm_merges_by_score() {
    let t = hello_spm(true);
    // "▁hello": ll (-1.5) first, then llo (-1.6), ▁h (-3.0) ... he (-4) never: ▁h took the h
    assert_eq!(t.encode("hello", false).unwrap(), ids(&t, &["▁hello"]));
    assert_eq!(
        t.encode("hello", true).unwrap(),
        vec![1, t.token_to_id("▁hello").unwrap()]
    );
    assert!(t.add_bos());
    // "▁hell": ll, then ▁h (-3.0) beats he (-4.0), then ▁he
    assert_eq!(t.encode("hell", false).unwrap(), ids(&t, &["▁he", "ll"]));
    // without the space prefix: "he" is the only bigram at the start
    let t2 = hello_spm(false);
    assert_eq!(t2.encode("hell", false).unwrap(), ids(&t2, &["he", "ll"]));
}

#[test]
fn spm_byte_fallback_and_decode() {
    let t = hello_spm(false);
    // é and 😀 are not pieces: their UTF-8 bytes
    let got = t.encode("hé😀", false).unwrap();
    let mut want = ids(&t, &["h"]);
    for b in "é😀".bytes() {
        want.push(t.token_to_id(&format!("<0x{b:02X}>")).unwrap());
    }
    assert_eq!(got, want);
    assert_eq!(t.decode(&got), "hé😀");
    assert_eq!(
        t.token_bytes(t.token_to_id("<0xC3>").unwrap()),
        Some(vec![0xC3])
    );
    assert_eq!(
        t.token_bytes(t.token_to_id("▁he").unwrap()),
        Some(b" he".to_vec())
    );
    assert_eq!(t.token_bytes(1), Some(b"<s>".to_vec()));
    assert_eq!(t.token_bytes(100_000), None);
}

#[test]
fn spm_special_tokens_in_text() {
    let t = hello_spm(true);
    let sot = t.token_to_id("<start_of_turn>").unwrap();
    let eot = t.token_to_id("<end_of_turn>").unwrap();
    let nn = t.token_to_id("\n\n").unwrap();
    // control tokens are cut out first; a text piece after a special token gets the ▁ prefix
    let got = t
        .encode("<start_of_turn>hello<end_of_turn>\n\nhello", true)
        .unwrap();
    let h = t.token_to_id("▁hello").unwrap();
    assert_eq!(got, vec![1, sot, h, eot, nn, h]);
    assert!(t.is_special(sot) && !t.is_special(h) && !t.is_special(nn));
    // eog: eos and <end_of_turn> (found by its text)
    assert_eq!(t.eog_ids(), &[2, eot]);
    assert!(t.is_eog(eot) && !t.is_eog(sot));
    // decode renders special tokens as text; the first token's space prefix is dropped
    assert_eq!(
        t.decode(&got),
        "<s><start_of_turn> hello<end_of_turn>\n\n hello"
    );
    assert_eq!(t.decode(&[h, h]), "hello hello");
}

/// A byte-level BPE vocabulary: the 256 byte characters, `extra` tokens, and `merges`.
fn bpe(pre: &str, extra: &[(&str, i32)], merges: &[&str]) -> Tokenizer {
    let mut tokens: Vec<(String, i32)> = vec![
        ("<|endoftext|>".into(), CONTROL),
        ("<|im_start|>".into(), CONTROL),
        ("<|im_end|>".into(), CONTROL),
    ];
    for b in 0..=255u8 {
        tokens.push((byte_to_char(b).to_string(), NORMAL));
    }
    for (t, ty) in extra {
        tokens.push((t.to_string(), *ty));
    }
    Tokenizer::from_gguf_vocab(GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens: tokens.iter().map(|t| t.0.clone()).collect(),
        token_types: Some(tokens.iter().map(|t| t.1).collect()),
        merges: Some(merges.iter().map(|m| m.to_string()).collect()),
        bos_id: Some(1),
        eos_id: Some(2),
        add_bos: Some(false),
        ..Default::default()
    })
    .unwrap()
}

fn hello_bpe() -> Tokenizer {
    bpe(
        "smollm",
        &[
            ("he", NORMAL),
            ("ll", NORMAL),
            ("hell", NORMAL),
            ("hello", NORMAL),
            ("Ġw", NORMAL),
            ("or", NORMAL),
            ("Ġwor", NORMAL),
            ("Ġworld", NORMAL),
            ("ld", NORMAL),
            ("el", NORMAL),
        ],
        &[
            "l l", "h e", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "e l",
        ],
    )
}

#[test]
fn bpe_merges_by_rank() {
    let t = hello_bpe();
    assert_eq!(
        t.encode("hello world", true).unwrap(),
        ids(&t, &["hello", "Ġworld"])
    );
    assert!(!t.add_bos());
    // "hel": "h e" (rank 1) before "e l" (rank 9)
    assert_eq!(t.encode("hel", false).unwrap(), ids(&t, &["he", "l"]));
    // "ell": "l l" (rank 0) before "e l"
    assert_eq!(t.encode("ell", false).unwrap(), ids(&t, &["e", "ll"]));
    // smollm pre-tokenizer: digits one by one; unknown text falls back to byte characters
    assert_eq!(
        t.encode("42 é", false).unwrap(),
        ids(&t, &["4", "2", "Ġ", "Ã", "©"])
    );
}

#[test]
fn bpe_special_tokens_and_decode() {
    let t = hello_bpe();
    let got = t
        .encode("<|im_start|>hello<|im_end|>\n world", false)
        .unwrap();
    assert_eq!(
        got,
        ids(&t, &["<|im_start|>", "hello", "<|im_end|>", "Ċ", "Ġworld"])
    );
    assert_eq!(t.decode(&got), "<|im_start|>hello<|im_end|>\n world");
    assert_eq!(
        t.token_bytes(t.token_to_id("Ġwor").unwrap()),
        Some(b" wor".to_vec())
    );
    assert_eq!(t.token_bytes(t.token_to_id("Ã").unwrap()), Some(vec![0xC3]));
    // eog: <|endoftext|>, <|im_end|> (and eos = 2 = <|im_end|>)
    assert_eq!(t.eog_ids(), &[0, 2]);
    assert!(t.is_special(1) && !t.is_special(t.token_to_id("he").unwrap()));
    // utf-8 across byte tokens
    let e = t.encode("é😀", false).unwrap();
    assert_eq!(t.decode(&e), "é😀");
}

#[test]
fn special_tokens_longest_first() {
    // "<a><b>" is longer than "<a>" and wins wherever it occurs
    let t = bpe(
        "gpt-2",
        &[("<a>", CONTROL), ("<a><b>", CONTROL), ("<b>", USER_DEFINED)],
        &[],
    );
    let (a, ab, b) = (
        t.token_to_id("<a>").unwrap(),
        t.token_to_id("<a><b>").unwrap(),
        t.token_to_id("<b>").unwrap(),
    );
    assert_eq!(t.encode("<a><a><b><b>", false).unwrap(), vec![a, ab, b]);
}

#[test]
fn stream_decoder_holds_partial_utf8() {
    let t = hello_spm(false);
    let text = "h😀é中h";
    let toks = t.encode(text, false).unwrap();
    assert!(toks.len() > 5);
    let mut sd = StreamDecoder::new();
    let mut parts = Vec::new();
    for &id in &toks {
        parts.push(sd.push(&t, id));
    }
    parts.push(sd.finish());
    for p in &parts {
        assert!(!p.contains('\u{FFFD}'), "{parts:?}");
    }
    assert_eq!(parts.concat(), t.decode(&toks));
    assert_eq!(parts.concat(), text);
    // the emoji comes out whole, at its last byte
    assert!(parts.iter().any(|p| p == "😀"));
}

#[test]
fn stream_decoder_invalid_and_incomplete_bytes() {
    let t = hello_spm(false);
    let b = |x: u8| t.token_to_id(&format!("<0x{x:02X}>")).unwrap();
    let h = t.token_to_id("h").unwrap();
    let mut sd = StreamDecoder::new();
    assert_eq!(sd.push(&t, b(0xFF)), "\u{FFFD}");
    assert_eq!(sd.push(&t, h), "h");
    assert_eq!(sd.push(&t, b(0xE4)), "");
    assert_eq!(sd.push(&t, b(0xB8)), "");
    assert_eq!(sd.finish(), "\u{FFFD}");
    assert_eq!(
        t.decode(&[b(0xFF), h, b(0xE4), b(0xB8)]),
        "\u{FFFD}h\u{FFFD}"
    );
    // a first token's space prefix is dropped in the stream too (add_space_prefix)
    let t = hello_spm(true);
    let h = t.token_to_id("▁hello").unwrap();
    let mut sd = StreamDecoder::new();
    assert_eq!(sd.push(&t, h), "hello");
    assert_eq!(sd.push(&t, h), " hello");
}

#[test]
fn bpe_tokenizer_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<StreamDecoder>();
}

#[test]
fn unsupported_model_is_an_error() {
    let r = Tokenizer::from_gguf_vocab(GgufVocab {
        model: "bert".into(),
        tokens: vec!["a".into()],
        ..Default::default()
    });
    assert!(matches!(r, Err(Error::Tokenizer(_))));
    let r = Tokenizer::from_gguf_vocab(GgufVocab {
        model: "gpt2".into(),
        pre: Some("no-such-pre".into()),
        tokens: vec!["a".into()],
        merges: Some(vec![]),
        ..Default::default()
    });
    assert!(matches!(r, Err(Error::Tokenizer(_))));
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json
// ---------------------------------------------------------------------------------------------

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-tok-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn hf_word_level() {
    use tokenizers::models::wordlevel::WordLevel;
    use tokenizers::pre_tokenizers::whitespace::Whitespace;
    use tokenizers::processors::template::TemplateProcessing;
    use tokenizers::AddedToken;

    let vocab: std::collections::HashMap<String, u32> = [
        ("<unk>", 0),
        ("<s>", 1),
        ("</s>", 2),
        ("hello", 3),
        ("world", 4),
        ("<|im_end|>", 5),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let model = WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("<unk>".into())
        .build()
        .unwrap();
    let mut tk = tokenizers::Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(Whitespace {}));
    tk.add_special_tokens(vec![
        AddedToken::from("<s>", true),
        AddedToken::from("</s>", true),
        AddedToken::from("<|im_end|>", true),
    ])
    .unwrap();
    tk.with_post_processor(Some(
        TemplateProcessing::builder()
            .try_single("<s> $A")
            .unwrap()
            .special_tokens(vec![("<s>", 1)])
            .build()
            .unwrap(),
    ));
    let dir = temp_dir("wordlevel");
    let path = dir.join("tokenizer.json");
    tk.save(&path, false).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": "{{ messages }}"}"#,
    )
    .unwrap();

    let t = Tokenizer::from_hf_file(&path).unwrap();
    assert_eq!(t.vocab_size(), 6);
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert!(t.add_bos());
    assert_eq!(t.chat_template(), Some("{{ messages }}"));
    assert_eq!(t.encode("hello world", true).unwrap(), vec![1, 3, 4]);
    assert_eq!(t.encode("hello world", false).unwrap(), vec![3, 4]);
    // special token written in the text
    assert_eq!(
        t.encode("hello<|im_end|>world", false).unwrap(),
        vec![3, 5, 4]
    );
    assert_eq!(t.eog_ids(), &[2, 5]);
    assert!(t.is_special(5) && !t.is_special(3));
    assert_eq!(t.token_to_id("world"), Some(4));
    assert_eq!(t.token_bytes(3), Some(b"hello".to_vec()));
    assert_eq!(t.token_bytes(5), Some(b"<|im_end|>".to_vec()));
    let all = [3, 4, 3];
    let mut sd = StreamDecoder::new();
    let mut s: String = all.iter().map(|&i| sd.push(&t, i)).collect();
    s.push_str(&sd.finish());
    assert_eq!(s, t.decode(&all));
    assert_eq!(s, "hello world hello");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn hf_byte_level_bpe() {
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDec;
    use tokenizers::models::bpe::BPE;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;

    let mut vocab: Vec<(String, u32)> = (0..=255u8)
        .map(|b| (byte_to_char(b).to_string(), b as u32))
        .collect();
    vocab.push(("Ġh".into(), 256));
    vocab.push(("Ġhi".into(), 257));
    let merges = vec![
        ("Ġ".to_string(), "h".to_string()),
        ("Ġh".to_string(), "i".to_string()),
    ];
    let model = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .build()
        .unwrap();
    let mut tk = tokenizers::Tokenizer::new(model);
    tk.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tk.with_decoder(Some(ByteLevelDec::default()));
    let dir = temp_dir("bytelevel");
    let path = dir.join("tokenizer.json");
    tk.save(&path, false).unwrap();

    let t = Tokenizer::from_hf_file(&path).unwrap();
    assert_eq!(t.bos(), None);
    assert!(!t.add_bos());
    let text = " hi 😀é";
    let ids = t.encode(text, true).unwrap();
    assert_eq!(ids[0], 257);
    assert_eq!(t.decode(&ids), text);
    assert_eq!(t.token_bytes(257), Some(b" hi".to_vec()));
    assert_eq!(t.token_bytes(0xF0), Some(vec![0xF0]));
    let mut sd = StreamDecoder::new();
    let mut parts: Vec<String> = ids.iter().map(|&i| sd.push(&t, i)).collect();
    parts.push(sd.finish());
    assert!(parts.iter().all(|p| !p.contains('\u{FFFD}')), "{parts:?}");
    assert_eq!(parts.concat(), text);
    std::fs::remove_dir_all(dir).ok();
}
