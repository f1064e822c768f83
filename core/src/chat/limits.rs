//! Limits on rendering a chat template. A template comes from a model file and is code: a
//! loop can run for minutes and a string that doubles itself can take all memory. Every
//! render counts instructions (minijinja's fuel) and caps its output; where processes exist
//! (Unix), it also runs in a child process with a memory limit and a wall-clock deadline,
//! killed when it passes them or when its caller gives up (`sandbox`).

use std::time::Duration;

/// What one render may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// Template instructions (minijinja's fuel). Measured: Qwen3.5's template over 1,000
    /// messages and 10 tools takes 74 thousand, Gemma 4's 3.7 million (its loops are
    /// quadratic in the messages); 10 million take about 0.4 s.
    pub fuel: u64,
    /// Bytes of rendered prompt.
    pub max_output: usize,
    /// Bytes the render may allocate (enforced in the sandbox process).
    pub max_memory: usize,
    /// Wall-clock time (enforced in the sandbox process).
    pub timeout: Duration,
}

impl Default for RenderLimits {
    fn default() -> Self {
        RenderLimits {
            fuel: 25_000_000,
            max_output: 16 << 20,
            max_memory: 512 << 20,
            timeout: Duration::from_secs(3),
        }
    }
}

/// Which limit a render went over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Fuel,
    Output,
    Memory,
    Time,
}

impl Limit {
    /// A short name (the `/metrics` label).
    pub fn name(self) -> &'static str {
        match self {
            Limit::Fuel => "fuel",
            Limit::Output => "output",
            Limit::Memory => "memory",
            Limit::Time => "time",
        }
    }

    /// The sandbox's wire code (there are no child processes on the web, hence no use there).
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn code(self) -> u8 {
        match self {
            Limit::Fuel => 0,
            Limit::Output => 1,
            Limit::Memory => 2,
            Limit::Time => 3,
        }
    }

    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn from_code(c: u8) -> Option<Limit> {
        [Limit::Fuel, Limit::Output, Limit::Memory, Limit::Time]
            .into_iter()
            .find(|l| l.code() == c)
    }

    /// The sentence a client sees.
    pub fn describe(self, l: &RenderLimits) -> String {
        match self {
            Limit::Fuel => format!(
                "the chat template ran more than {} instructions (template fuel limit)",
                l.fuel
            ),
            Limit::Output => format!(
                "the chat template's output passed {} bytes (template output limit)",
                l.max_output
            ),
            Limit::Memory => format!(
                "the chat template used more than {} MiB of memory (template memory limit)",
                l.max_memory >> 20
            ),
            Limit::Time => format!(
                "the chat template ran longer than {:.1} s (template time limit)",
                l.timeout.as_secs_f64()
            ),
        }
    }
}

/// Why a render gave no prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum RenderError {
    /// It went over a limit (the message names it).
    Limit(Limit, String),
    /// The template failed: `raise_exception`, a type error, a missing variable.
    Template(String),
    /// The caller gave up (its client left); the render was stopped.
    Cancelled,
    /// The sandbox could not run it.
    Sandbox(String),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Limit(_, m) | RenderError::Template(m) => f.write_str(m),
            RenderError::Cancelled => f.write_str("the render was cancelled"),
            RenderError::Sandbox(m) => write!(f, "the template sandbox failed: {m}"),
        }
    }
}

impl std::error::Error for RenderError {}

/// An `io::Write` into memory that refuses to pass `cap` bytes.
pub(crate) struct Capped {
    pub buf: Vec<u8>,
    pub cap: usize,
    pub over: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + b.len() > self.cap {
            self.over = true;
            return Err(std::io::Error::other("template output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
