//! Constrained decoding: a grammar (a JSON schema, a Lark grammar or a regular expression)
//! decides which tokens may come next, and every other token's logit is set to −∞ before the
//! sampler sees it. The parsing is llguidance's (the engine llama.cpp, vLLM and mistral.rs
//! use): [`Grammars`] turns the model's vocabulary into its token trie once per model,
//! [`Grammars::compile`] makes one [`Constraint`] per request.
//!
//! A constraint's mask for the next token depends only on the tokens already sampled, so the
//! engine computes it on another thread while the forward pass runs
//! ([`Constraint::prepare`]); [`Constraint::apply`] then only writes the −∞s.
//!
//! Sampling happens on the host on every backend (the logits of the rows that sample are
//! read back), so the mask is applied there too.

use std::sync::Arc;
use std::time::Duration;

use crate::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

pub mod limits;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// JSON matching a JSON schema (`{"type": "object"}` for OpenAI's `json_object`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark dialect (which can embed JSON schemas and regexes).
    Lark(String),
    /// A regular expression (Rust `regex` syntax) the whole output matches.
    Regex(String),
}

impl GrammarSpec {
    /// Any JSON object.
    pub fn json_object() -> GrammarSpec {
        GrammarSpec::JsonSchema(serde_json::json!({"type": "object"}))
    }

    /// A spec given on the command line: `json` (any object), `regex:EXPR`, or a file: a
    /// `.json` file holds a JSON schema, anything else a Lark grammar.
    pub fn parse_arg(arg: &str) -> Result<GrammarSpec> {
        if arg == "json" {
            return Ok(GrammarSpec::json_object());
        }
        if let Some(rx) = arg.strip_prefix("regex:") {
            return Ok(GrammarSpec::Regex(rx.to_string()));
        }
        let path = std::path::Path::new(arg);
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Model(format!("grammar {arg}: {e}")))?;
        if path.extension().is_some_and(|e| e == "json") {
            let schema = serde_json::from_str(&text)
                .map_err(|e| Error::Model(format!("grammar {arg}: not JSON: {e}")))?;
            Ok(GrammarSpec::JsonSchema(schema))
        } else {
            Ok(GrammarSpec::Lark(text))
        }
    }
}

impl GrammarSpec {
    /// The grammar after a closed reasoning block: for a prompt that opened the reasoning,
    /// the output first closes it (`close`, a Lark expression: the format's closing tag as
    /// text or as a control token, then a blank line), then follows the grammar. Only JSON
    /// schemas are wrapped; a Lark grammar or regex stays as given (it decides itself).
    pub fn after_reasoning(self, close: &str) -> GrammarSpec {
        match self {
            GrammarSpec::JsonSchema(s) => GrammarSpec::Lark(format!(
                "start: {close} \"\\n\\n\" body\nbody: %json {}\n",
                json_style(s)
            )),
            g => g,
        }
    }
}

/// Separators of the JSON a schema grammar allows: one space after `,` and `:`, no other
/// whitespace (what `json.dumps` writes). Flexible whitespace lets a weak model emit
/// newlines until it runs out of tokens.
fn json_style(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            })
        });
    }
    schema
}

/// The token trie of one model's vocabulary and llguidance's parser factory over it.
pub struct Grammars {
    factory: Arc<ParserFactory>,
    /// Every end-of-generation id: allowed wherever the grammar allows its end.
    stop: Arc<[u32]>,
    eos: u32,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("eos", &self.eos).finish()
    }
}

impl Grammars {
    /// The trie of `tok`'s vocabulary padded to `vocab` (the model's logit rows; ids past
    /// the tokenizer's are never allowed). Control tokens are special: a grammar's text never
    /// matches them.
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<Grammars> {
        let stop: Vec<u32> = tok
            .eog_ids()
            .iter()
            .copied()
            .filter(|&t| (t as usize) < vocab)
            .collect();
        let eos = tok
            .eos()
            .filter(|t| stop.contains(t))
            .or_else(|| stop.first().copied())
            .ok_or_else(|| {
                Error::Model(
                    "the vocabulary has no end-of-generation token; grammars need one".into(),
                )
            })?;
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let special = |name: &[u8]| {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(name);
                    w
                };
                match tok.token_bytes(id) {
                    Some(b) if tok.is_special(id) || stop.contains(&id) => special(&b),
                    Some(b) if !b.is_empty() => b,
                    _ => special(format!("<|kiln-unused-{id}|>").as_bytes()),
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_bos: tok.bos(),
            tok_end_of_turn: tok.eot(),
            ..TokRxInfo::new(vocab as u32, eos)
        };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::Model(format!("grammar setup: {e}")))?;
        factory.quiet();
        // Errors go back to clients: no parser state or grammar dump in them.
        factory.limits_mut().verbose_errors = false;
        Ok(Grammars {
            factory: Arc::new(factory),
            stop: stop.into(),
            eos,
        })
    }

    /// A fresh constraint for one request; a grammar that does not compile is an error that
    /// says why. The grammar is first checked against [`limits`] (size, `$ref` depth, rule
    /// count and depth: an error naming the limit), then compiled on a thread of its
    /// own with a [`limits::COMPILE_STACK`] stack, so that no grammar within the limits can
    /// overflow the caller's stack; the first token's mask is computed there too, so a grammar
    /// beyond the parser's own limits is refused here rather than after the request starts.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        limits::check(spec)?;
        let spec = match spec {
            GrammarSpec::JsonSchema(s) => GrammarSpec::JsonSchema(json_style(s.clone())),
            g => g.clone(),
        };
        let factory = self.factory.clone();
        let compiled = std::thread::Builder::new()
            .name("kiln-grammar".into())
            .stack_size(limits::COMPILE_STACK)
            .spawn(
                move || -> std::result::Result<(Matcher, Option<SimpleVob>), String> {
                    let grammar = match &spec {
                        GrammarSpec::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
                        GrammarSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
                        GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
                    };
                    let parser = factory.create_parser(grammar).map_err(|e| e.to_string())?;
                    let mut matcher = Matcher::new(Ok(parser));
                    if let Some(e) = matcher.get_error() {
                        return Err(e);
                    }
                    let mask = if matcher.is_stopped() {
                        None
                    } else {
                        Some(matcher.compute_mask().map_err(|e| e.to_string())?)
                    };
                    Ok((matcher, mask))
                },
            )
            .map_err(|e| Error::Model(format!("grammar: no thread to compile it on: {e}")))?
            .join();
        let (matcher, mask) = match compiled {
            Ok(r) => r.map_err(|e| Error::Model(format!("grammar: {}", short_error(&e))))?,
            Err(_) => return Err(Error::Model("grammar: the compiler failed on it".into())),
        };
        Ok(Constraint {
            matcher,
            stop: self.stop.clone(),
            eos: self.eos,
            mask,
        })
    }
}

/// The first lines of a parser error, at most 400 characters: the client's mistake in a
/// sentence, not the parser's state.
fn short_error(e: &str) -> String {
    let mut out: String = e.lines().take(3).collect::<Vec<_>>().join("; ");
    if out.chars().count() > 400 {
        out = out.chars().take(400).collect::<String>() + "…";
    }
    out
}

/// One request's grammar state. Cloning gives an independent copy (a request with `n`
/// choices gives each its own).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    stop: Arc<[u32]>,
    eos: u32,
    /// The mask for the next token, once computed.
    mask: Option<SimpleVob>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("stopped", &self.matcher.is_stopped())
            .field("mask_ready", &self.mask.is_some())
            .finish()
    }
}

impl Constraint {
    /// Computes the mask for the next token unless it is ready; returns the time it took
    /// (`None` when there was nothing to do). Errors are kept for [`Constraint::apply`].
    pub fn prepare(&mut self) -> Option<Duration> {
        if self.mask.is_some() || self.matcher.is_stopped() {
            return None;
        }
        let t = Instant::now();
        let mask = self.matcher.compute_mask().ok()?;
        self.mask = Some(mask);
        Some(t.elapsed())
    }

    /// Sets the logit of every token the grammar forbids next to −∞ (the end-of-generation
    /// tokens count as one: all are allowed where the grammar may end). Computes the mask
    /// first if [`Constraint::prepare`] did not.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        self.prepare();
        let Some(mask) = self.mask.as_ref() else {
            return Err(Error::Model(format!(
                "grammar: {}",
                self.matcher
                    .get_error()
                    .unwrap_or_else(|| "no token can continue the output".into())
            )));
        };
        let end = mask.is_allowed(self.eos);
        // The end-of-generation ids are decided by `end`, whatever their own bit says.
        let kept: Vec<(usize, f32)> = self
            .stop
            .iter()
            .map(|&t| t as usize)
            .filter(|&t| t < logits.len())
            .map(|t| (t, logits[t]))
            .collect();
        // Word by word: a word of allowed tokens costs one compare.
        let words = mask.as_slice();
        for (w, &bits) in words.iter().enumerate() {
            let mut banned = !bits;
            while banned != 0 {
                let i = w * 32 + banned.trailing_zeros() as usize;
                banned &= banned - 1;
                match logits.get_mut(i) {
                    Some(l) => *l = f32::NEG_INFINITY,
                    None => break,
                }
            }
        }
        for l in logits.iter_mut().skip(words.len() * 32) {
            *l = f32::NEG_INFINITY;
        }
        for (t, l) in kept {
            logits[t] = if end { l } else { f32::NEG_INFINITY };
        }
        if !logits.iter().any(|&l| l > f32::NEG_INFINITY) {
            return Err(Error::Model(
                "grammar: the model gives every allowed token zero probability".into(),
            ));
        }
        Ok(())
    }

    /// Advances past a sampled token (an end-of-generation id is the grammar's end).
    pub fn consume(&mut self, tok: u32) -> Result<()> {
        self.mask = None;
        let tok = if self.stop.contains(&tok) {
            self.eos
        } else {
            tok
        };
        self.matcher
            .consume_token(tok)
            .map_err(|e| Error::Model(format!("grammar: {e}")))
    }

    /// The grammar is complete and allows nothing more: the output ends here.
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the output so far is a complete sentence of the grammar.
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
