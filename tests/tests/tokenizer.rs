//! The GGUF tokenizers against llama.cpp on real models: token ids must equal what
//! `llama-tokenize` (llama.cpp 0c1e570) printed for every fixture string
//! (tests/fixtures/llamacpp/tokenize_{smollm2,gemma3}.json), and decoding / streaming must
//! give the text back.
//!
//! The models are looked up in `$KILN_TEST_MODELS` or `~/.cache/kiln/models/`:
//! `SmolLM2-135M-Instruct.Q4_1.gguf` and `gemma-3-270m-q4_k_m.gguf`. Without them the tests
//! print why and pass, unless `KILN_REQUIRE_MODELS=1`.

use kiln_core::load::gguf::GgufFile;
use kiln_core::tokenizer::{StreamDecoder, Tokenizer};
use std::path::PathBuf;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

fn require() -> bool {
    std::env::var("KILN_REQUIRE_MODELS").is_ok_and(|v| v == "1")
}

fn skip(why: String) {
    if require() {
        panic!("{why} (KILN_REQUIRE_MODELS=1)");
    }
    eprintln!("skipping: {why}");
}

fn model_path(file: &str) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("KILN_TEST_MODELS") {
        dirs.push(PathBuf::from(d));
    }
    if let Ok(h) = std::env::var("HOME") {
        dirs.push(PathBuf::from(h).join(".cache/kiln/models"));
    }
    for d in &dirs {
        let p = d.join(file);
        if p.is_file() {
            return Some(p);
        }
    }
    skip(format!(
        "{file} not found in {dirs:?} (set KILN_TEST_MODELS to a folder holding it)"
    ));
    None
}

fn load(file: &str) -> Option<Tokenizer> {
    let path = model_path(file)?;
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(Tokenizer::from_gguf(&gguf).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

struct Case {
    text: String,
    ids: Vec<u32>,
}

fn fixture(name: &str) -> Option<Vec<Case>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/llamacpp")
        .join(format!("tokenize_{name}.json"));
    let Ok(text) = std::fs::read_to_string(&path) else {
        skip(format!("fixture {} missing", path.display()));
        return None;
    };
    let json = json::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let rows = json.as_array().expect("fixture: an array");
    Some(
        rows.iter()
            .map(|r| Case {
                text: r.get("text").and_then(|t| t.as_str()).unwrap().to_string(),
                ids: r
                    .get("ids")
                    .and_then(|t| t.as_array())
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u32().unwrap())
                    .collect(),
            })
            .collect(),
    )
}

/// Every fixture string must tokenize to llama.cpp's ids (model's BOS behaviour, special
/// tokens parsed); all mismatches are listed before failing.
fn compare(model: &str, fixture_name: &str) {
    let Some(tok) = load(model) else { return };
    let Some(cases) = fixture(fixture_name) else {
        return;
    };
    let mut bad = Vec::new();
    for c in &cases {
        let got = tok.encode(&c.text, true).unwrap();
        if got != c.ids {
            bad.push(format!(
                "  {:?}\n    llama.cpp: {:?}\n    kiln:      {:?}",
                c.text, c.ids, got
            ));
        }
    }
    println!(
        "{model}: {}/{} strings match llama.cpp",
        cases.len() - bad.len(),
        cases.len()
    );
    assert!(
        bad.is_empty(),
        "{model}: {} of {} strings differ from llama.cpp:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn smollm2_ids_match_llamacpp() {
    compare(SMOLLM2, "smollm2");
}

#[test]
fn gemma3_ids_match_llamacpp() {
    compare(GEMMA3, "gemma3");
}

/// Strings that exercise every tokenizer path, for the round-trip and streaming checks.
const TEXTS: &[&str] = &[
    "Hello world",
    "  two leading spaces and trailing   ",
    "line1\nline2\n\nline3\r\n\t\ttabs",
    "Café naïve résumé, combining e\u{301} vs é",
    "日本語のテキストと中文字符。한국어도",
    "Привет, как дела? Ёлка!",
    "مرحبا بالعالم",
    "emoji 😀🎉 and 👍🏽 thumbs",
    "family 👨\u{200d}👩\u{200d}👧\u{200d}👦 ZWJ 🏳\u{fe0f}\u{200d}🌈 flags 🇫🇷🇯🇵",
    "12345678 and 3.14159 and 1,000,000",
    "don't I'M you're we'll they'VE it's",
    "def fib(n):\n    return n if n < 2 else fib(n - 1)\n",
    "math: ∑ x² ≤ ∞ → λ",
    "\u{a0}\u{a0} nbsp and x\u{200b}y and soft\u{ad}hyphen",
];

/// decode(encode(text)) gives the text back (special tokens render as their text; a BOS the
/// model adds renders as its text in front).
fn roundtrip(model: &str) {
    let Some(tok) = load(model) else { return };
    let mut texts: Vec<String> = TEXTS.iter().map(|s| s.to_string()).collect();
    if let Some(cases) = fixture(if model == SMOLLM2 {
        "smollm2"
    } else {
        "gemma3"
    }) {
        texts.extend(cases.into_iter().map(|c| c.text));
    }
    for text in &texts {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(&tok.decode(&ids), text, "{model}: {ids:?}");
        let with_bos = tok.encode(text, true).unwrap();
        let mut want = String::new();
        if tok.add_bos() {
            assert_eq!(with_bos[0], tok.bos().unwrap());
            want.push_str(
                &String::from_utf8(tok.token_bytes(tok.bos().unwrap()).unwrap()).unwrap(),
            );
        }
        want.push_str(text);
        assert_eq!(tok.decode(&with_bos), want, "{model}");
    }
}

#[test]
fn smollm2_decode_roundtrip() {
    roundtrip(SMOLLM2);
}

#[test]
fn gemma3_decode_roundtrip() {
    roundtrip(GEMMA3);
}

/// Tokens fed one at a time: no U+FFFD mid-stream, and the pieces add up to decode(all).
fn stream(model: &str) {
    let Some(tok) = load(model) else { return };
    let mut multi_byte_splits = 0;
    for text in TEXTS {
        let ids = tok.encode(text, false).unwrap();
        let mut sd = StreamDecoder::new();
        let mut parts = Vec::new();
        for &id in &ids {
            let p = sd.push(&tok, id);
            if p.is_empty() {
                multi_byte_splits += 1;
            }
            assert!(!p.contains('\u{FFFD}'), "{model}: {text:?}: {p:?}");
            parts.push(p);
        }
        let last = sd.finish();
        assert!(last.is_empty(), "{model}: {text:?}: left over {last:?}");
        assert_eq!(parts.concat(), tok.decode(&ids), "{model}: {text:?}");
        assert_eq!(&parts.concat(), text);
    }
    // the emoji / CJK strings do split characters across tokens on both models
    assert!(multi_byte_splits > 0, "{model}: no character spans tokens");
}

#[test]
fn smollm2_stream_decoder() {
    stream(SMOLLM2);
}

#[test]
fn gemma3_stream_decoder() {
    stream(GEMMA3);
}

#[test]
fn smollm2_metadata() {
    let Some(tok) = load(SMOLLM2) else { return };
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(!tok.add_bos());
    let im_start = tok.token_to_id("<|im_start|>").unwrap();
    let im_end = tok.token_to_id("<|im_end|>").unwrap();
    assert_eq!((im_start, im_end), (1, 2));
    let eot = tok.token_to_id("<|endoftext|>").unwrap();
    assert!(tok.eog_ids().contains(&im_end) && tok.eog_ids().contains(&eot));
    assert!(!tok.eog_ids().contains(&im_start));
    assert!(tok.is_special(im_start) && tok.is_special(im_end));
    assert!(!tok.is_special(tok.token_to_id("Ġthe").unwrap()));
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    assert_eq!(
        tok.token_bytes(tok.token_to_id("Ġthe").unwrap()),
        Some(b" the".to_vec())
    );
    assert_eq!(
        tok.encode("<|im_start|>user\nhi<|im_end|>", true).unwrap()[0],
        im_start
    );
}

#[test]
fn gemma3_metadata() {
    let Some(tok) = load(GEMMA3) else { return };
    assert_eq!(tok.vocab_size(), 262144);
    assert_eq!(tok.bos(), Some(2));
    assert_eq!(tok.eos(), Some(1));
    assert!(tok.add_bos());
    let sot = tok.token_to_id("<start_of_turn>").unwrap();
    let eot = tok.token_to_id("<end_of_turn>").unwrap();
    assert!(tok.eog_ids().contains(&1) && tok.eog_ids().contains(&eot));
    assert!(!tok.eog_ids().contains(&sot));
    assert!(tok.is_special(sot) && tok.is_special(2));
    let byte = tok.token_to_id("<0xE4>").unwrap();
    assert_eq!(tok.token_bytes(byte), Some(vec![0xE4]));
    assert_eq!(
        tok.token_bytes(tok.token_to_id("▁the").unwrap()),
        Some(b" the".to_vec())
    );
    let ids = tok.encode("<start_of_turn>user\nHi", true).unwrap();
    assert_eq!(&ids[..2], &[2, sot]);
}

/// A small JSON reader for the fixtures (the tests crate has no JSON dependency).
mod json {
    #[derive(Debug)]
    #[allow(dead_code)]
    pub enum Json {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<Json>),
        Obj(Vec<(String, Json)>),
    }

    impl Json {
        pub fn as_array(&self) -> Option<&[Json]> {
            match self {
                Json::Arr(a) => Some(a),
                _ => None,
            }
        }
        pub fn as_str(&self) -> Option<&str> {
            match self {
                Json::Str(s) => Some(s),
                _ => None,
            }
        }
        pub fn as_u32(&self) -> Option<u32> {
            match self {
                Json::Num(x) if *x >= 0.0 && x.fract() == 0.0 => Some(*x as u32),
                _ => None,
            }
        }
        pub fn get(&self, key: &str) -> Option<&Json> {
            match self {
                Json::Obj(o) => o.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                _ => None,
            }
        }
    }

    pub fn parse(s: &str) -> Result<Json, String> {
        let mut p = P {
            c: s.chars().collect(),
            i: 0,
        };
        let v = p.value()?;
        p.ws();
        if p.i != p.c.len() {
            return Err(format!("trailing data at {}", p.i));
        }
        Ok(v)
    }

    struct P {
        c: Vec<char>,
        i: usize,
    }

    impl P {
        fn ws(&mut self) {
            while self.i < self.c.len() && self.c[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn peek(&self) -> Option<char> {
            self.c.get(self.i).copied()
        }
        fn eat(&mut self, ch: char) -> Result<(), String> {
            self.ws();
            if self.peek() == Some(ch) {
                self.i += 1;
                Ok(())
            } else {
                Err(format!("expected {ch:?} at {}", self.i))
            }
        }
        fn lit(&mut self, word: &str, v: Json) -> Result<Json, String> {
            for ch in word.chars() {
                if self.peek() != Some(ch) {
                    return Err(format!("bad literal at {}", self.i));
                }
                self.i += 1;
            }
            Ok(v)
        }
        fn value(&mut self) -> Result<Json, String> {
            self.ws();
            match self.peek().ok_or("unexpected end")? {
                '{' => {
                    self.i += 1;
                    let mut o = Vec::new();
                    self.ws();
                    if self.peek() == Some('}') {
                        self.i += 1;
                        return Ok(Json::Obj(o));
                    }
                    loop {
                        self.ws();
                        let k = self.string()?;
                        self.eat(':')?;
                        o.push((k, self.value()?));
                        self.ws();
                        match self.peek() {
                            Some(',') => self.i += 1,
                            Some('}') => {
                                self.i += 1;
                                return Ok(Json::Obj(o));
                            }
                            _ => return Err(format!("bad object at {}", self.i)),
                        }
                    }
                }
                '[' => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.peek() == Some(']') {
                        self.i += 1;
                        return Ok(Json::Arr(a));
                    }
                    loop {
                        a.push(self.value()?);
                        self.ws();
                        match self.peek() {
                            Some(',') => self.i += 1,
                            Some(']') => {
                                self.i += 1;
                                return Ok(Json::Arr(a));
                            }
                            _ => return Err(format!("bad array at {}", self.i)),
                        }
                    }
                }
                '"' => Ok(Json::Str(self.string()?)),
                't' => self.lit("true", Json::Bool(true)),
                'f' => self.lit("false", Json::Bool(false)),
                'n' => self.lit("null", Json::Null),
                _ => {
                    let st = self.i;
                    while self
                        .peek()
                        .is_some_and(|c| c.is_ascii_digit() || "+-.eE".contains(c))
                    {
                        self.i += 1;
                    }
                    let t: String = self.c[st..self.i].iter().collect();
                    t.parse()
                        .map(Json::Num)
                        .map_err(|_| format!("bad number {t:?} at {st}"))
                }
            }
        }
        fn hex4(&mut self) -> Result<u32, String> {
            let t: String = self
                .c
                .get(self.i..self.i + 4)
                .ok_or("short \\u")?
                .iter()
                .collect();
            self.i += 4;
            u32::from_str_radix(&t, 16).map_err(|_| format!("bad \\u{t}"))
        }
        fn string(&mut self) -> Result<String, String> {
            if self.peek() != Some('"') {
                return Err(format!("expected string at {}", self.i));
            }
            self.i += 1;
            let mut out = String::new();
            loop {
                let ch = self.peek().ok_or("unterminated string")?;
                self.i += 1;
                match ch {
                    '"' => return Ok(out),
                    '\\' => {
                        let e = self.peek().ok_or("bad escape")?;
                        self.i += 1;
                        match e {
                            '"' | '\\' | '/' => out.push(e),
                            'b' => out.push('\u{8}'),
                            'f' => out.push('\u{c}'),
                            'n' => out.push('\n'),
                            'r' => out.push('\r'),
                            't' => out.push('\t'),
                            'u' => {
                                let mut cp = self.hex4()?;
                                if (0xD800..0xDC00).contains(&cp)
                                    && self.c.get(self.i) == Some(&'\\')
                                    && self.c.get(self.i + 1) == Some(&'u')
                                {
                                    self.i += 2;
                                    let lo = self.hex4()?;
                                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                                }
                                out.push(char::from_u32(cp).ok_or("bad code point")?);
                            }
                            _ => return Err(format!("bad escape \\{e}")),
                        }
                    }
                    c => out.push(c),
                }
            }
        }
    }
}
