//! Decode steps recorded once and replayed (CUDA graphs, where the backend has them).
//!
//! A decode step (one new row for each of `s` sequences, logits for every row) does the same
//! work for every batch of the same shape: the same kernels with the same arguments on the
//! same tensors; only the batch's index arrays ([`StepInput`]: token ids, positions, block
//! tables, slots, ...) change. So the first step of a shape runs the model's forward pass
//! once under [`Executor::begin_capture`], which records its ops into a graph instead of
//! running them, and every later step of that shape fills the graph's step inputs (a copy
//! each) and replays it: one launch a step, no host work per layer.
//!
//! The shape is the key: the number of sequences and each KV group's block-table width,
//! rounded up to a power of two (the tables are padded with block 0, which no kernel reads
//! past a sequence's length), so a growing context records a new graph only when its table
//! doubles. A pass that cannot be recorded (an op the backend does not run, an upload inside
//! the pass) runs as before; after a few such passes in a row recording turns itself off for
//! the model, with the reason logged.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::backend::GraphId;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::model::{check_batch, ForwardBatch, KvCaches, Model, StepInput};
use crate::tensor::Tensor;

/// The most sequences a recorded step serves.
pub const MAX_GRAPH_SEQS: usize = 64;
/// Graphs kept per model; the least recently used goes first.
const MAX_GRAPHS: usize = 24;

/// What recording has done since the model loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Steps recorded into a new graph.
    pub captured: u64,
    /// Steps run by replaying a graph (the recording steps included).
    pub replayed: u64,
    /// Graphs dropped to make room.
    pub evicted: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    seqs: usize,
    widths: Vec<usize>,
}

struct Entry {
    id: GraphId,
    inputs: Vec<(StepInput, Tensor)>,
    logits: Tensor,
    used: u64,
}

impl Entry {
    fn drop_in(self, ex: &Executor) {
        ex.backend().drop_graph(self.id);
    }
}

/// Recordings that may fail in a row before recording turns itself off for the model (a
/// pass's first use of a lazily uploaded constant fails once, then succeeds).
const MAX_FAILED_RECORDINGS: u32 = 3;

struct State {
    entries: HashMap<Key, Entry>,
    /// Why recording is off for this model, once passes could not be recorded.
    off: Option<String>,
    failed: u32,
    clock: u64,
    stats: GraphStats,
}

/// The recorded decode steps of one model on one executor.
pub struct Graphs {
    enabled: bool,
    state: Mutex<State>,
}

impl Graphs {
    /// Recording is on where the backend records graphs, unless `KILN_GRAPHS=0`.
    pub fn new(ex: &Executor) -> Graphs {
        let env_off = std::env::var("KILN_GRAPHS").is_ok_and(|v| v == "0");
        Graphs {
            enabled: ex.backend().graphs() && !env_off,
            state: Mutex::new(State {
                entries: HashMap::new(),
                off: None,
                failed: 0,
                clock: 0,
                stats: GraphStats::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns recording on or off (on only where the backend records graphs).
    pub fn set_enabled(&mut self, ex: &Executor, on: bool) {
        self.enabled = on && ex.backend().graphs();
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn stats(&self) -> GraphStats {
        self.lock().stats
    }

    /// Why recording turned itself off, if it did.
    pub fn off_reason(&self) -> Option<String> {
        self.lock().off.clone()
    }

    /// The logits of a decode step, by replaying its shape's graph (recorded first if need
    /// be), or `None` when the step is not one a graph serves: then the caller runs it as
    /// usual. The returned tensor is the graph's own: read it before the next step.
    pub fn run(
        &self,
        ex: &Executor,
        model: &dyn Model,
        caches: &KvCaches,
        batch: &ForwardBatch,
    ) -> Result<Option<Tensor>> {
        // A recorded pass looks every row's embedding up: image rows run the model's own; so
        // do the rows of a sequence with image grids (their M-RoPE positions are uploaded in
        // the pass, not step inputs a replay refills).
        if !self.enabled
            || ex.profiling()
            || !is_decode(batch)
            || !batch.embeds.is_empty()
            || batch.seqs.iter().any(|s| !s.images.is_empty())
        {
            return Ok(None);
        }
        // The checks the model's own pass makes of its batch, which a replay skips.
        check_batch(batch, model.info().vocab)?;
        let (key, padded) = padded(batch);
        let mut st = self.lock();
        if st.off.is_some() {
            return Ok(None);
        }
        st.clock += 1;
        let now = st.clock;
        if !st.entries.contains_key(&key) {
            if st.entries.len() >= MAX_GRAPHS {
                let oldest = st
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| k.clone());
                if let Some(e) = oldest.and_then(|k| st.entries.remove(&k)) {
                    e.drop_in(ex);
                    st.stats.evicted += 1;
                }
            }
            match record(ex, model, caches, &padded) {
                Ok(e) => {
                    st.stats.captured += 1;
                    st.failed = 0;
                    st.entries.insert(key.clone(), e);
                }
                Err(e) => {
                    st.failed += 1;
                    if st.failed >= MAX_FAILED_RECORDINGS {
                        tracing::info!(
                            backend = ex.backend().name(),
                            "decode steps are not recorded as graphs for this model: {e}"
                        );
                        st.off = Some(e.to_string());
                    }
                    return Ok(None);
                }
            }
        }
        let e = st
            .entries
            .get_mut(&key)
            .ok_or_else(|| Error::Model("a recorded step went missing".into()))?;
        e.used = now;
        for (which, t) in &e.inputs {
            let (shape, data) = which.of(&padded)?;
            if shape != t.shape().dims() {
                return Err(Error::Model(format!(
                    "step input {which:?} of shape {shape:?} for a graph recorded with {:?}",
                    t.shape().dims()
                )));
            }
            ex.backend().upload(t, bytemuck::cast_slice(&data))?;
        }
        ex.backend().replay(e.id)?;
        let logits = e.logits.clone();
        st.stats.replayed += 1;
        Ok(Some(logits))
    }

    /// Frees every graph (the model's caches or weights are going away).
    pub fn clear(&self, ex: &Executor) {
        let mut st = self.lock();
        for (_, e) in st.entries.drain() {
            e.drop_in(ex);
        }
    }
}

/// One new row for each sequence, every row's logits, few enough sequences.
fn is_decode(b: &ForwardBatch) -> bool {
    let s = b.seqs.len();
    s > 0
        && s <= MAX_GRAPH_SEQS
        && b.tokens.len() == s
        && b.positions.len() == s
        && b.seqs
            .iter()
            .enumerate()
            .all(|(i, q)| q.q_start == i && q.q_len == 1)
        && b.logits_rows.iter().copied().eq(0..s)
}

/// The batch's shape key, and the batch with every block table padded to its group's
/// rounded width.
fn padded(b: &ForwardBatch) -> (Key, ForwardBatch) {
    let groups = b
        .seqs
        .iter()
        .map(|q| q.block_tables.len())
        .max()
        .unwrap_or(0);
    let widths: Vec<usize> = (0..groups)
        .map(|g| {
            b.seqs
                .iter()
                .map(|q| q.block_tables.get(g).map_or(0, |t| t.len()))
                .max()
                .unwrap_or(0)
                .max(1)
                .next_power_of_two()
        })
        .collect();
    let mut p = b.clone();
    for q in &mut p.seqs {
        for (t, &w) in q.block_tables.iter_mut().zip(&widths) {
            t.resize(w.max(t.len()), 0);
        }
    }
    (
        Key {
            seqs: b.seqs.len(),
            widths,
        },
        p,
    )
}

/// Records the forward pass of `b` into a graph. Every step input the pass read must hold
/// `b`'s own values (a pass over part of its batch cannot be replayed for another batch).
fn record(ex: &Executor, model: &dyn Model, caches: &KvCaches, b: &ForwardBatch) -> Result<Entry> {
    /// Ends the recording if the pass fails or panics before `end_capture`.
    struct Abort<'a>(&'a Executor);
    impl Drop for Abort<'_> {
        fn drop(&mut self) {
            self.0.abort_capture();
        }
    }
    ex.begin_capture()?;
    let guard = Abort(ex);
    let logits = model.forward(ex, b, caches)?;
    std::mem::forget(guard);
    let (id, recorded) = ex.end_capture()?;
    let mut inputs = Vec::with_capacity(recorded.len());
    let entry_of = |inputs| Entry {
        id,
        inputs,
        logits: logits.clone(),
        used: 0,
    };
    for (which, t, read) in recorded {
        let (_, want) = match which.of(b) {
            Ok(w) => w,
            Err(e) => {
                entry_of(inputs).drop_in(ex);
                return Err(e);
            }
        };
        if read != want {
            entry_of(inputs).drop_in(ex);
            return Err(Error::Model(format!(
                "the pass read {which:?} of another batch than its own"
            )));
        }
        inputs.push((which, t));
    }
    Ok(entry_of(inputs))
}
