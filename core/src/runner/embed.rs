//! Embeddings: a text's final-normed hidden states (the ones the output head reads) pooled
//! into one vector and scaled to unit length, as `/v1/embeddings` serves them.

use super::{Logits, Session};
use crate::error::{Error, Result};
use crate::kv::SeqId;
use crate::model::Features;

/// How a text's hidden states become one vector.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The average over every token.
    Mean,
    /// The first token's state (`cls`).
    First,
    /// The last token's state: what a causal model has read the whole text into (the
    /// default for decoder models).
    #[default]
    Last,
}

impl Pooling {
    /// `mean`, `cls` (or `first`), `last`.
    pub fn parse(s: &str) -> Option<Pooling> {
        match s {
            "mean" => Some(Pooling::Mean),
            "cls" | "first" => Some(Pooling::First),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::First => "cls",
            Pooling::Last => "last",
        }
    }

    /// llama.cpp's `{arch}.pooling_type` codes: 1 mean, 2 cls, 3 last (0, none, and 4,
    /// rank, have no vector of their own here).
    pub fn from_gguf_code(code: u64) -> Option<Pooling> {
        match code {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::First),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }
}

impl Session<'_> {
    /// `tokens` fed to sequence `seq` in chunks, their final hidden states pooled and
    /// normalised. The sequence is released afterwards, also on an error.
    pub fn embed(&mut self, seq: SeqId, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
        let r = self.embed_inner(seq, tokens, pooling);
        let released = self.release(seq);
        let v = r?;
        released?;
        Ok(v)
    }

    fn embed_inner(&mut self, seq: SeqId, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(Error::Model("nothing to embed: the input is empty".into()));
        }
        if !self.fwd.model().gives(&Features::Final) {
            return Err(Error::Model(format!(
                "{} does not hand out its hidden states, so it has no embeddings",
                self.fwd.model().info().architecture
            )));
        }
        let mut pooled = Pooled::new(pooling, tokens.len());
        let chunk = self.fwd.config().max_batch_tokens.max(1);
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + chunk).min(tokens.len());
            let (_, hid) = self.pass(
                &[(seq, &tokens[start..end], Logits::None)],
                Some(&Features::Final),
            )?;
            let rows = hid.and_then(|mut h| h.pop()).unwrap_or_default();
            pooled.add(start, &rows);
            start = end;
        }
        pooled.finish()
    }
}

/// An embedding's hidden states pooled as they come, chunk by chunk (a chunk fed again after
/// a preemption is not counted twice).
#[derive(Clone, Debug)]
pub struct Pooled {
    pooling: Pooling,
    len: usize,
    /// Tokens whose rows have been seen.
    next: usize,
    acc: Vec<f64>,
}

impl Pooled {
    /// Pooling `len` tokens' states.
    pub fn new(pooling: Pooling, len: usize) -> Pooled {
        Pooled {
            pooling,
            len,
            next: 0,
            acc: Vec::new(),
        }
    }

    /// The hidden-state rows of the tokens from `first` on.
    pub fn add(&mut self, first: usize, rows: &[Vec<f32>]) {
        for (i, row) in rows.iter().enumerate() {
            let pos = first + i;
            if pos < self.next {
                continue;
            }
            self.next = pos + 1;
            let take = match self.pooling {
                Pooling::Mean => true,
                Pooling::First => pos == 0,
                Pooling::Last => pos + 1 == self.len,
            };
            if !take {
                continue;
            }
            if self.acc.is_empty() {
                self.acc = vec![0.0; row.len()];
            }
            for (a, &x) in self.acc.iter_mut().zip(row) {
                *a += x as f64;
            }
        }
    }

    /// The pooled vector scaled to unit length, once every token has been seen.
    pub fn finish(&self) -> Result<Vec<f32>> {
        if self.next < self.len {
            return Err(Error::Model(format!(
                "{} of {} tokens' hidden states were seen",
                self.next, self.len
            )));
        }
        unit(&self.acc)
    }
}

/// `acc` scaled to unit length.
fn unit(acc: &[f64]) -> Result<Vec<f32>> {
    let norm = acc.iter().map(|x| x * x).sum::<f64>().sqrt();
    if acc.is_empty() || !norm.is_finite() || norm == 0.0 {
        return Err(Error::Model(
            "the hidden state has no direction (zero or not finite)".into(),
        ));
    }
    Ok(acc.iter().map(|x| (x / norm) as f32).collect())
}
