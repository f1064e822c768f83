//! When a request's tokens came, as llama.cpp's server reports it (`timings`): the prompt
//! phase runs from submission to the first token (prefill and one sample), the decode phase
//! from the first token to the last (one forward pass per token after the first).

use std::time::Instant;

use serde_json::{json, Value};

#[derive(Clone, Copy, Debug)]
pub struct Timings {
    prompt: usize,
    start: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: usize,
}

impl Timings {
    /// Starts timing a request of `prompt` tokens now.
    pub fn start(prompt: usize) -> Timings {
        Timings {
            prompt,
            start: Instant::now(),
            first: None,
            last: None,
            tokens: 0,
        }
    }

    /// A token arrived now.
    pub fn token(&mut self) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.tokens += 1;
    }

    /// Milliseconds of the prompt phase, and of the decode phase with its token count.
    fn phases(&self) -> (f64, f64, usize) {
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        match (self.first, self.last) {
            (Some(f), Some(l)) => (ms(self.start, f), ms(f, l), self.tokens - 1),
            _ => (ms(self.start, Instant::now()), 0.0, 0),
        }
    }

    /// llama.cpp's `timings` object: `prompt_n`, `prompt_ms`, `prompt_per_second`,
    /// `predicted_n` (tokens after the first), `predicted_ms`, `predicted_per_second`.
    pub fn json(&self) -> Value {
        let (p, d, n) = self.phases();
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        json!({"prompt_n": self.prompt, "prompt_ms": p,
               "prompt_per_second": rate(self.prompt, p),
               "predicted_n": n, "predicted_ms": d, "predicted_per_second": rate(n, d)})
    }

    /// One line for a terminal.
    pub fn line(&self) -> String {
        let (p, d, n) = self.phases();
        let rate = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        format!(
            "prompt {} tokens in {p:.0} ms ({:.1} t/s), then {n} tokens in {d:.0} ms ({:.1} t/s)",
            self.prompt,
            rate(self.prompt, p),
            rate(n, d)
        )
    }
}
