//! Prompt lookup: the longest suffix of the request's tokens (up to `max` tokens long, at
//! least `min`) that occurred before, and the tokens that followed its latest occurrence
//! (continued periodically when they reach the end: a loop drafts whole turns of itself).
//! Free to run, and right surprisingly often wherever the output repeats its input: code
//! edits, quotations, structured data.

use super::{Draft, DraftReq, Drafter};
use crate::error::Result;
use crate::runner::Target;

#[derive(Clone, Debug)]
pub struct Ngram {
    /// Longest suffix looked up.
    pub max: usize,
    /// Shortest suffix worth a proposal.
    pub min: usize,
}

impl Default for Ngram {
    fn default() -> Self {
        Ngram { max: 4, min: 2 }
    }
}

impl Ngram {
    /// Up to `k` tokens continuing `tokens` as they continued before.
    pub fn lookup(&self, tokens: &[u32], k: usize) -> Vec<u32> {
        let len = tokens.len();
        if k == 0 {
            return Vec::new();
        }
        for n in (self.min.max(1)..=self.max.min(len.saturating_sub(1))).rev() {
            let suffix = &tokens[len - n..];
            // The latest earlier occurrence (it may overlap the suffix itself).
            if let Some(j) = (0..len - n).rev().find(|&j| &tokens[j..j + n] == suffix) {
                // What followed, and should it run into the present, the same again: after
                // the match, the text repeats with period `len - from`.
                let from = j + n;
                let period = len - from;
                return (0..k).map(|i| tokens[from + i % period]).collect();
            }
        }
        Vec::new()
    }
}

impl Drafter for Ngram {
    fn name(&self) -> &'static str {
        "ngram"
    }
    fn propose(&mut self, reqs: &[DraftReq<'_>], _target: &Target<'_>) -> Result<Vec<Draft>> {
        Ok(reqs
            .iter()
            .map(|r| Draft {
                tokens: self.lookup(r.tokens, r.k),
                q: None,
            })
            .collect())
    }
}
