//! Running a model over the paged KV cache. [`Forward`] is the model on its backend with
//! its cache tensors: one [`ForwardBatch`] in, its logits (and hidden-state) rows out, holding
//! nothing per sequence. [`Runner`] adds a [`KvCoordinator`] of its own, for tools, tests and
//! draft models that run sequences directly ([`Session`]: allocate, run and commit in one
//! call); the batching engine ([`crate::engine`]) splits it and gives the coordinator to its
//! scheduler.

mod calibrate;
pub mod embed;
pub mod graphs;
mod images;

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::kv::{KvManager, SeqId, StatePool, StateStats};
use crate::model::{CanvasInput, Features, ForwardBatch, KvCaches, Model};
pub use crate::sched::kv::{BlockCopy, KvCoordinator, Logits, Rewind};
use crate::tensor::{DType, Tensor};

/// Rows of each canvas in a batch whose sequences from `first` on are canvases.
fn canvas_rows(batch: &ForwardBatch, first: usize) -> usize {
    batch.seqs.get(first).map_or(0, |s| s.q_len)
}

/// Per item, the logits rows a pass returns, and (when asked for) the hidden-state rows of
/// every token it fed.
pub type StepRows = (Vec<Vec<Vec<f32>>>, Option<Vec<Vec<Vec<f32>>>>);

/// A pass run on the device, before its logits rows are read back: the hidden states (where
/// asked), the canvases' logits (kept on the device) and how many sequences are not canvases.
struct Launched {
    h: Option<(Vec<f32>, usize)>,
    canvas_logits: Vec<Tensor>,
    n_seqs: usize,
}

/// Tokens of the key-center calibration pass ([`Runner::new`] with a lossy K cache).
pub const CALIBRATION_TOKENS: usize = 64;
/// The tokens of [`RunnerConfig::kv_calibration`] the calibration pass runs for a mean key
/// alone.
pub const CALIBRATION_TEXT_TOKENS: usize = 512;
/// Tokens of the calibration pass for fitted key maps (`kv_fit_keys`): enough head rows for
/// second moments of a head dim of 256 on a model with one KV head.
pub const CALIBRATION_FIT_TOKENS: usize = 1024;
/// The sequence id the calibration pass runs as (released before any request).
const CALIBRATION_SEQ: SeqId = SeqId::MAX;

#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Longest context of one sequence.
    pub ctx: usize,
    /// Sequences that may be resident at once.
    pub max_seqs: usize,
    /// Most tokens per forward pass (prefill chunk size).
    pub max_batch_tokens: usize,
    /// The K and V cache types (per layer where overridden).
    pub kv_types: crate::kv::KvTypes,
    /// Subtract each layer's mean key (measured by one calibration pass at start) before a
    /// lossy K cache quantizes it ([`KvCaches::keys_to_write`]; exact for attention).
    pub kv_center_keys: bool,
    /// Fit a map of each layer's keys to its queries (measured by the calibration pass)
    /// before a lossy K cache quantizes them ([`crate::kv::key_fit`]; exact for attention);
    /// the keys are centered too (as with `kv_center_keys`).
    pub kv_fit_keys: bool,
    /// The calibration pass's tokens (text in the model's vocabulary, repeated as needed);
    /// empty: pseudo-random ones. A mean key takes [`CALIBRATION_TEXT_TOKENS`] of a text or
    /// [`CALIBRATION_TOKENS`] random ones, a fitted map [`CALIBRATION_FIT_TOKENS`] (at most
    /// `ctx`) of either.
    pub kv_calibration: Vec<u32>,
    pub prefix_caching: bool,
    /// Blocks in each full-attention KV pool; default enough for `max_seqs` full contexts.
    /// Smaller pools make the batching engine preempt instead.
    pub kv_blocks: Option<usize>,
    /// Tokens a sequence can always drop again with [`Runner::rollback`] without recomputing
    /// them: sliding windows keep that many more tokens, and a recurrent model keeps that many
    /// state checkpoints per sequence (one per step). Rolling back further recomputes from
    /// the newest checkpoint or snapshot before the target, where one exists.
    pub max_rollback: usize,
    /// Recurrent-state snapshots kept for prefix caching (the state after a full KV block);
    /// default: up to 256 MiB of them, at most `4 * max_seqs + 4`.
    pub state_snapshots: Option<usize>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            block_size: 16,
            ctx: 4096,
            max_seqs: 1,
            max_batch_tokens: 512,
            kv_types: crate::kv::KvTypes::uniform(DType::F32),
            kv_center_keys: false,
            kv_fit_keys: false,
            kv_calibration: Vec::new(),
            prefix_caching: false,
            kv_blocks: None,
            max_rollback: 0,
            state_snapshots: None,
        }
    }
}

/// Memory the default recurrent-state snapshot budget may take.
const SNAPSHOT_BYTES: usize = 256 << 20;

/// The model on its backend with its cache tensors: one forward pass in, its rows out. It
/// holds nothing per sequence; which slots a pass writes and reads comes in the
/// [`ForwardBatch`] (built by whoever owns the [`KvCoordinator`]).
pub struct Forward {
    ex: Executor,
    model: Box<dyn Model>,
    caches: KvCaches,
    cfg: RunnerConfig,
    /// Decode steps recorded as graphs (where the backend has them).
    graphs: graphs::Graphs,
    /// KV cache blocks of each group.
    blocks: Vec<usize>,
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.graphs.clear(&self.ex);
    }
}

impl Forward {
    pub fn executor(&self) -> &Executor {
        &self.ex
    }
    pub fn model(&self) -> &dyn Model {
        self.model.as_ref()
    }
    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }
    /// The KV caches (an MTP assistant reads the target's).
    pub fn caches(&self) -> &KvCaches {
        &self.caches
    }

    /// What recording decode steps as graphs has done ([`graphs`]).
    pub fn graph_stats(&self) -> graphs::GraphStats {
        self.graphs.stats()
    }

    /// Whether decode steps are recorded and replayed as graphs (on by default where the
    /// backend records graphs, unless `KILN_GRAPHS=0`), and why recording turned itself off
    /// for this model if it did.
    pub fn graphs(&self) -> (bool, Option<String>) {
        (self.graphs.enabled(), self.graphs.off_reason())
    }

    /// Turns recording decode steps as graphs on or off (on only where the backend can).
    pub fn set_graphs(&mut self, on: bool) {
        if !on {
            self.graphs.clear(&self.ex);
        }
        self.graphs.set_enabled(&self.ex, on);
    }

    /// Runs `batch`; returns, per sequence of the batch, its logits rows (those
    /// `batch.logits_rows` names, in order) and with `f` the hidden states of every token it
    /// fed.
    pub fn run(&self, batch: &ForwardBatch, f: Option<&Features>) -> Result<StepRows> {
        Ok(self.run_with(batch, f, &[])?.0)
    }

    /// [`Forward::run`] for a batch whose last `canvases.len()` sequences are canvases of a
    /// block-diffusion model ([`crate::model::Denoiser::denoise`]; the others are its
    /// encoder's tokens, in the same pass). The canvases' logits (`[canvas, vocab]` each)
    /// stay on the device, for the denoising ops; the other sequences' rows come back as
    /// [`Forward::run`] gives them.
    pub fn run_with(
        &self,
        batch: &ForwardBatch,
        f: Option<&Features>,
        canvases: &[CanvasInput<'_>],
    ) -> Result<(StepRows, Vec<Tensor>)> {
        let (pass, read) = self.launch(batch, f, canvases)?;
        let flat = match read {
            Some(t) => self.ex.download_f32(&t)?,
            None => Vec::new(),
        };
        self.collect(batch, pass, flat)
    }

    /// [`Forward::run`] without hidden states, reading the logits with `download_async`:
    /// what runs in a browser, where a GPU buffer is read only after control returns to the
    /// event loop (the pass itself reads nothing back on a backend that runs every op).
    pub async fn run_async(&self, batch: &ForwardBatch) -> Result<StepRows> {
        let (pass, read) = self.launch(batch, None, &[])?;
        let flat = match read {
            Some(t) => self.ex.download_f32_async(&t).await?,
            None => Vec::new(),
        };
        Ok(self.collect(batch, pass, flat)?.0)
    }

    /// Runs the pass on the device: its logits (and hidden states where asked) and the
    /// tensor of the rows to read back to the host, if any.
    fn launch(
        &self,
        batch: &ForwardBatch,
        f: Option<&Features>,
        canvases: &[CanvasInput<'_>],
    ) -> Result<(Launched, Option<Tensor>)> {
        let total = batch.tokens.len();
        let (logits, h) = match (f, canvases.is_empty()) {
            (Some(f), true) => {
                let (l, pieces) = self
                    .model
                    .forward_features(&self.ex, batch, &self.caches, f)?;
                (l, Some(self.features(&pieces, total)?))
            }
            (None, true) => {
                let replayed =
                    self.graphs
                        .run(&self.ex, self.model.as_ref(), &self.caches, batch)?;
                match replayed {
                    Some(l) => (l, None),
                    None => (self.model.forward(&self.ex, batch, &self.caches)?, None),
                }
            }
            (Some(f), false) => {
                return Err(Error::Model(format!(
                    "a denoising pass cannot hand a drafter hidden states ({f:?})"
                )))
            }
            (None, false) => {
                let d = self.model.denoiser().ok_or_else(|| {
                    Error::Model("this model does not generate by diffusion".into())
                })?;
                let l = d.denoise(&self.ex, batch, &self.caches, canvases)?;
                (l, None)
            }
        };
        // The canvases' rows are the last ones; each stays on the device.
        let n_seqs = batch.seqs.len() - canvases.len().min(batch.seqs.len());
        let c = canvas_rows(batch, n_seqs);
        let all = batch.logits_rows.len();
        let host_rows = all.checked_sub(canvases.len() * c).ok_or_else(|| {
            Error::Model(format!(
                "{all} logits rows for {} canvases of {c}",
                canvases.len()
            ))
        })?;
        let mut canvas_logits = Vec::with_capacity(canvases.len());
        if host_rows == 0 && canvases.len() == 1 {
            // The pass was one canvas: its logits are the whole tensor.
            canvas_logits.push(logits.clone());
        } else {
            for i in 0..canvases.len() {
                let lo = host_rows + i * c;
                canvas_logits.push(self.ex.rows(&logits, lo..lo + c)?);
            }
        }
        let read = match (host_rows, canvases.is_empty()) {
            (0, _) => None,
            (_, true) => Some(logits),
            (_, false) => Some(self.ex.rows(&logits, 0..host_rows)?),
        };
        Ok((
            Launched {
                h,
                canvas_logits,
                n_seqs,
            },
            read,
        ))
    }

    /// The host logits rows `flat` of a launched pass, per sequence.
    fn collect(
        &self,
        batch: &ForwardBatch,
        pass: Launched,
        mut flat: Vec<f32>,
    ) -> Result<(StepRows, Vec<Tensor>)> {
        let Launched {
            h,
            canvas_logits,
            n_seqs,
        } = pass;
        let vocab = self.model.info().vocab;
        let batch_seqs = &batch.seqs[..n_seqs];
        // One row in all (a single decode step): hand the download over as it is.
        let single = flat.len() == vocab && batch.logits_rows.len() == 1;
        let mut out = Vec::with_capacity(batch_seqs.len());
        let mut hid = h.as_ref().map(|_| Vec::with_capacity(batch_seqs.len()));
        let mut row = 0;
        for s in batch_seqs {
            let rows = s.q_start..s.q_start + s.q_len;
            let n = batch.logits_rows[row..]
                .iter()
                .take_while(|r| rows.contains(r))
                .count();
            if let (Some(hid), Some((h, w))) = (&mut hid, &h) {
                hid.push(
                    rows.clone()
                        .map(|r| h[r * w..(r + 1) * w].to_vec())
                        .collect(),
                );
            }
            out.push(if single && n == 1 {
                vec![std::mem::take(&mut flat)]
            } else {
                (row..row + n)
                    .map(|r| flat[r * vocab..(r + 1) * vocab].to_vec())
                    .collect()
            });
            row += n;
        }
        Ok(((out, hid), canvas_logits))
    }

    /// Column blocks `[t, w_i]` downloaded and laid side by side: `[t, Σ w_i]` row major,
    /// with the row width.
    fn features(&self, pieces: &[Tensor], t: usize) -> Result<(Vec<f32>, usize)> {
        let mut cols = Vec::with_capacity(pieces.len());
        for p in pieces {
            let w = p.shape().dims().last().copied().unwrap_or(0);
            let v = self.ex.download_f32(p)?;
            if v.len() != t * w {
                return Err(Error::Model(format!(
                    "hidden states of {} values for {t} rows of {w}",
                    v.len()
                )));
            }
            cols.push((v, w));
        }
        let width: usize = cols.iter().map(|c| c.1).sum();
        let mut out = Vec::with_capacity(t * width);
        for r in 0..t {
            for (v, w) in &cols {
                out.extend_from_slice(&v[r * w..(r + 1) * w]);
            }
        }
        Ok((out, width))
    }

    /// Carries out the block copies a rewind asked for (copy-on-write of a shared block).
    pub fn copy_blocks(&self, copies: &[BlockCopy]) -> Result<()> {
        for c in copies {
            self.caches.copy_block(&self.ex, c.group, c.src, c.dst)?;
        }
        Ok(())
    }

    /// The checks every pass makes: some tokens, within the batch limit.
    fn check_tokens(&self, total: usize) -> Result<()> {
        if total == 0 {
            return Err(Error::Model(
                "a forward pass needs at least one token".into(),
            ));
        }
        if total > self.cfg.max_batch_tokens {
            return Err(Error::Model(format!(
                "{total} tokens exceed the batch limit of {}",
                self.cfg.max_batch_tokens
            )));
        }
        Ok(())
    }

    fn canvas_len(&self) -> Result<usize> {
        self.model
            .canvas_length()
            .ok_or_else(|| Error::Model("this model does not generate by diffusion".into()))
    }
}

/// The recurrent-state pool of a model with linear-attention layers (its slots and the
/// pool), or `None` for a model without state.
fn state_pool(cfg: &RunnerConfig, model: &dyn Model) -> Option<(usize, StatePool)> {
    let state_shapes = model.state_shapes();
    if state_shapes.is_empty() {
        return None;
    }
    let slot_bytes: usize = state_shapes
        .iter()
        .map(|s| s.iter().product::<usize>() * 4)
        .sum();
    let snapshots = match (cfg.prefix_caching, cfg.state_snapshots) {
        (false, _) => 0,
        (true, Some(n)) => n,
        (true, None) => (SNAPSHOT_BYTES / slot_bytes.max(1)).clamp(1, 4 * cfg.max_seqs + 4),
    };
    let slots = StatePool::slots_needed(cfg.max_seqs, cfg.max_rollback, snapshots);
    Some((
        slots,
        StatePool::new(slots, cfg.max_rollback, snapshots).with_slot_bytes(slot_bytes),
    ))
}

/// A fresh KV coordinator over `blocks` blocks per group (nothing cached, no sequence).
fn coordinator(
    cfg: &RunnerConfig,
    model: &dyn Model,
    blocks: &[usize],
    states: Option<StatePool>,
) -> Result<KvCoordinator> {
    let windows = model.kv_groups().iter().map(|g| g.window).collect();
    KvCoordinator::new(
        windows,
        blocks,
        cfg.block_size,
        cfg.prefix_caching,
        cfg.max_rollback,
        states,
    )
}

/// A target model as a drafter reads it: its forward half and its KV coordinator (the
/// tokens each sequence has in the cache, its block tables).
#[derive(Copy, Clone)]
pub struct Target<'a> {
    pub fwd: &'a Forward,
    pub kv: &'a KvCoordinator,
}

/// A model and a KV coordinator of its own, to run sequences on directly: what tools, tests
/// and a draft model use. The batching engine splits one ([`Runner::into_parts`]): its
/// scheduler owns the coordinator.
pub struct Runner {
    fwd: Forward,
    kv: KvCoordinator,
    /// What the calibration pass measured of the keys (measured once, installed into the
    /// caches of whatever types the runner takes).
    key_cal: Option<crate::model::KeyCalibration>,
}

impl Runner {
    pub fn new(ex: Executor, model: Box<dyn Model>, mut cfg: RunnerConfig) -> Result<Runner> {
        cfg.ctx = cfg.ctx.min(model.info().context_length.max(1));
        cfg.block_size = cfg.block_size.max(1);
        cfg.max_batch_tokens = cfg.max_batch_tokens.max(1);
        let bs = cfg.block_size;
        let full = cfg
            .kv_blocks
            .unwrap_or(cfg.max_seqs * cfg.ctx.div_ceil(bs) + 1)
            .max(2);
        let blocks: Vec<usize> = model
            .kv_groups()
            .iter()
            .map(|g| match g.window {
                // Blocks in the window (and the rollback margin), the chunk being computed,
                // and one partly filled.
                Some(w) => (cfg.max_seqs
                    * ((w + cfg.max_rollback + cfg.max_batch_tokens).div_ceil(bs) + 2)
                    + 1)
                .min(full),
                None => full,
            })
            .collect();
        let mut caches = KvCaches::alloc(&ex, model.kv_groups(), bs, &blocks, &cfg.kv_types)?;
        let states = state_pool(&cfg, model.as_ref());
        if let Some((slots, _)) = &states {
            caches.alloc_states(&ex, &model.state_shapes(), *slots)?;
        }
        let kv = coordinator(&cfg, model.as_ref(), &blocks, states.map(|(_, p)| p))?;
        let mut runner = Runner {
            fwd: Forward {
                graphs: graphs::Graphs::new(&ex),
                ex,
                model,
                caches,
                cfg,
                blocks,
            },
            kv,
            key_cal: None,
        };
        runner.calibrate_keys()?;
        Ok(runner)
    }

    /// Replaces the KV caches by zeroed ones of `types` (the same blocks) and the KV
    /// coordinator by a fresh one (its prefix cache would name blocks of the old types'
    /// bytes), as if the runner had been built with them: for a runner with no sequence in
    /// its cache. Recorded decode graphs are dropped (they name the old caches); the layers
    /// whose K cache is now lossy get the key centers and fitted maps asked for (measured by
    /// the first calibration pass, whatever the types were then).
    pub fn set_kv_types(&mut self, types: crate::kv::KvTypes) -> Result<()> {
        if self.kv.managers().iter().any(|m| m.num_sequences() > 0) {
            return Err(Error::Model(
                "the KV cache types cannot change while sequences are in the cache".into(),
            ));
        }
        let f = &mut self.fwd;
        // Checked before anything changes; past this point an error (out of memory) leaves
        // the runner without KV caches.
        types.check(f.model.kv_groups())?;
        let states = std::mem::take(&mut f.caches.states);
        f.graphs.clear(&f.ex);
        // The old caches go first, so the new ones can take their memory.
        f.caches.groups.clear();
        let mut caches = KvCaches::alloc(
            &f.ex,
            f.model.kv_groups(),
            f.caches.block_size,
            &f.blocks,
            &types,
        )?;
        caches.states = states;
        f.caches = caches;
        f.cfg.kv_types = types;
        let states = state_pool(&f.cfg, f.model.as_ref()).map(|(_, p)| p);
        self.kv = coordinator(&f.cfg, f.model.as_ref(), &f.blocks, states)?;
        self.calibrate_keys()
    }

    /// The forward half (stateless per sequence) and the KV coordinator, apart.
    pub fn into_parts(self) -> (Forward, KvCoordinator) {
        (self.fwd, self.kv)
    }

    /// The direct API over this runner's own coordinator.
    pub fn session(&mut self) -> Session<'_> {
        Session {
            fwd: &self.fwd,
            kv: &mut self.kv,
        }
    }

    pub fn forward(&self) -> &Forward {
        &self.fwd
    }
    /// See [`Forward::set_graphs`].
    pub fn set_graphs(&mut self, on: bool) {
        self.fwd.set_graphs(on);
    }
    pub fn kv(&self) -> &KvCoordinator {
        &self.kv
    }
    /// This runner as a drafter's target.
    pub fn target(&self) -> Target<'_> {
        Target {
            fwd: &self.fwd,
            kv: &self.kv,
        }
    }
    pub fn executor(&self) -> &Executor {
        &self.fwd.ex
    }
    pub fn model(&self) -> &dyn Model {
        self.fwd.model.as_ref()
    }
    pub fn config(&self) -> &RunnerConfig {
        &self.fwd.cfg
    }
    pub fn caches(&self) -> &KvCaches {
        &self.fwd.caches
    }
    pub fn kv_managers(&self) -> &[KvManager] {
        self.kv.managers()
    }
    /// The recurrent-state pool's counters (a model without state has none).
    pub fn state_stats(&self) -> Option<StateStats> {
        self.kv.state_stats()
    }
    /// Tokens of `seq` already in the cache.
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.kv.seq_len(seq)
    }
    /// The tokens of `seq` in the cache, oldest first.
    pub fn computed_tokens(&self, seq: SeqId) -> &[u32] {
        self.kv.computed_tokens(seq)
    }
    /// Whether `seq` has KV state.
    pub fn has_sequence(&self, seq: SeqId) -> bool {
        self.kv.contains(seq)
    }
    /// See [`KvCoordinator::lookahead_batch`].
    pub fn lookahead_batch(&self, rows: &[(SeqId, u32)]) -> Result<ForwardBatch> {
        self.kv.lookahead_batch(rows)
    }
    /// See [`KvCoordinator::cached_prefix`].
    pub fn cached_prefix(&self, prompt: &[u32]) -> (usize, usize) {
        self.kv.cached_prefix(prompt, &[])
    }
    /// See [`Session::step`].
    pub fn step(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<Vec<Vec<Vec<f32>>>> {
        self.session().step(items)
    }
    /// See [`Session::step_features`].
    pub fn step_features(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        f: &Features,
    ) -> Result<StepRows> {
        self.session().step_features(items, f)
    }
    /// See [`Session::step_async`].
    pub async fn step_async(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        self.session().step_async(items).await
    }
    /// See [`Session::feed`].
    pub fn feed(&mut self, seq: SeqId, tokens: &[u32], want: Logits) -> Result<Vec<Vec<f32>>> {
        self.session().feed(seq, tokens, want)
    }
    /// See [`Session::rollback`].
    pub fn rollback(&mut self, seq: SeqId, k: usize) -> Result<()> {
        self.session().rollback(seq, k)
    }
    /// See [`Session::start_cached`].
    pub fn start_cached(&mut self, seq: SeqId, prompt: &[u32], max: usize) -> Result<usize> {
        self.session().start_cached(seq, prompt, max)
    }
    /// See [`Session::denoise`].
    pub fn denoise(
        &mut self,
        seq: SeqId,
        canvas: &[u32],
        self_cond: Option<&[f32]>,
    ) -> Result<Vec<Vec<f32>>> {
        self.session().denoise(seq, canvas, self_cond)
    }
    /// See [`Session::denoise_on_device`].
    pub fn denoise_on_device(
        &mut self,
        seq: SeqId,
        canvas: &Tensor,
        self_cond: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.session().denoise_on_device(seq, canvas, self_cond)
    }
    /// See [`Session::embed`].
    pub fn embed(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        pooling: embed::Pooling,
    ) -> Result<Vec<f32>> {
        self.session().embed(seq, tokens, pooling)
    }
    /// Frees a sequence's cache blocks and state slots.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        self.kv.free(seq)
    }
}

/// A model and a KV coordinator borrowed together: sequences run directly, each call
/// allocating, running and committing at once (no scheduler between them).
pub struct Session<'a> {
    pub(crate) fwd: &'a Forward,
    pub(crate) kv: &'a mut KvCoordinator,
}

impl Session<'_> {
    /// One forward pass over several sequences' new tokens. Sequences not seen before start
    /// empty. Returns, per item, the logits rows asked for.
    pub fn step(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<Vec<Vec<Vec<f32>>>> {
        Ok(self.pass(items, None)?.0)
    }

    /// [`Session::step`], and per item the hidden states `f` names of every token fed (what
    /// a drafter is fed), one row each.
    pub fn step_features(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        f: &Features,
    ) -> Result<StepRows> {
        self.pass(items, Some(f))
    }

    /// [`Session::step`] reading the logits back without blocking the thread (in a browser,
    /// where a GPU buffer is read only through the event loop).
    pub async fn step_async(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
    ) -> Result<Vec<Vec<Vec<f32>>>> {
        let batch = self.prepare(items)?;
        let out = self.fwd.run_async(&batch).await?;
        self.commit(items)?;
        Ok(out.0)
    }

    pub(crate) fn pass(
        &mut self,
        items: &[(SeqId, &[u32], Logits)],
        f: Option<&Features>,
    ) -> Result<StepRows> {
        let batch = self.prepare(items)?;
        let out = self.fwd.run(&batch, f)?;
        self.commit(items)?;
        Ok(out)
    }

    /// Checks the items, reserves their cache slots and makes their batch.
    fn prepare(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<ForwardBatch> {
        self.fwd
            .check_tokens(items.iter().map(|i| i.1.len()).sum())?;
        for (seq, toks, _) in items {
            self.check_room(*seq, toks.len())?;
        }
        self.reserve(items)?;
        Ok(self.kv.batch(items))
    }

    /// The items' tokens are computed: their slots count.
    fn commit(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<()> {
        for (seq, toks, _) in items {
            self.kv.commit(*seq, toks)?;
        }
        Ok(())
    }

    /// Whether `n` more tokens of `seq` stay within the context.
    fn check_room(&self, seq: SeqId, n: usize) -> Result<()> {
        let (after, ctx) = (self.kv.seq_len(seq) + n, self.fwd.cfg.ctx);
        if after > ctx {
            return Err(Error::Model(format!(
                "sequence {seq} would reach {after} tokens, over the context of {ctx}"
            )));
        }
        Ok(())
    }

    /// Cache slots for every item in every KV group and the recurrent-state slot each item's
    /// step writes; a pool that cannot take them is [`Error::KvFull`].
    fn reserve(&mut self, items: &[(SeqId, &[u32], Logits)]) -> Result<()> {
        for (seq, toks, _) in items {
            if !self.kv.allocate_slots(*seq, toks.len(), 0)? {
                return Err(Error::KvFull(format!(
                    "no room in the KV pools for {} more tokens of sequence {seq}",
                    toks.len()
                )));
            }
        }
        Ok(())
    }

    /// Starts a new sequence from the cached full blocks of its prompt's first `max` tokens
    /// ([`KvCoordinator::attach_prefix`]); returns the tokens already computed.
    pub fn start_cached(&mut self, seq: SeqId, prompt: &[u32], max: usize) -> Result<usize> {
        self.kv.attach_prefix(seq, prompt, &[], max)
    }

    /// Drops the last `k` computed tokens of `seq`, as if they had never been fed: their KV
    /// slots are released, and a recurrent state returns to its checkpoint (or prefix snapshot)
    /// at the new length. Without one there, the state restarts from the newest earlier one and
    /// the tokens between are fed again. Fails, changing nothing, if a sliding window already
    /// released a block the shorter sequence needs (see [`RunnerConfig::max_rollback`]) or
    /// the pool has no block for a copy-on-write; if feeding the tokens again fails, the
    /// sequence is left at the checkpoint it resumed from (`seq_len` says where).
    pub fn rollback(&mut self, seq: SeqId, k: usize) -> Result<()> {
        let tokens = self.kv.computed_tokens(seq).to_vec();
        let r = self.kv.rewind(seq, k)?;
        self.fwd.copy_blocks(&r.copies)?;
        if r.from < r.target {
            self.feed(seq, &tokens[r.from..r.target], Logits::None)?;
        }
        Ok(())
    }

    /// One denoising step of a block-diffusion model over `seq`'s next canvas (after its
    /// computed tokens), with the previous step's processed logits (`[canvas × vocab]`, row
    /// major) for self-conditioning. Returns the logits of every canvas position. The canvas
    /// stays uncomputed: its slots are reused by the next step and by the pass that commits
    /// the accepted canvas ([`Session::feed`]).
    pub fn denoise(
        &mut self,
        seq: SeqId,
        canvas: &[u32],
        self_cond: Option<&[f32]>,
    ) -> Result<Vec<Vec<f32>>> {
        let c = self.fwd.canvas_len()?;
        if canvas.len() != c {
            return Err(Error::Model(format!(
                "a canvas of {} tokens; this model's canvas holds {c}",
                canvas.len()
            )));
        }
        let vocab = self.fwd.model.info().vocab;
        if let Some(t) = canvas.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Model(format!(
                "token id {t} is outside the vocabulary of {vocab}"
            )));
        }
        let ex = &self.fwd.ex;
        let sc = match self_cond {
            Some(l) if l.len() == c * vocab => Some(ex.upload_f32(&[c, vocab], l)?),
            Some(l) => {
                return Err(Error::Model(format!(
                    "{} self-conditioning logits; a canvas of {c} over a vocabulary of {vocab} \
                     takes {}",
                    l.len(),
                    c * vocab
                )))
            }
            None => None,
        };
        let ids: Vec<i32> = canvas.iter().map(|&t| t as i32).collect();
        let ids = ex.upload_i32(&[c], &ids)?;
        let logits = self.denoise_on_device(seq, &ids, sc.as_ref())?;
        let flat = self.fwd.ex.download_f32(&logits)?;
        Ok(flat.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    /// [`Session::denoise`] with everything on the device: the canvas's ids (`[canvas]` i32,
    /// each below the vocabulary) and the self-conditioning logits in, the logits
    /// `[canvas, vocab]` out; nothing is read back.
    pub fn denoise_on_device(
        &mut self,
        seq: SeqId,
        canvas: &Tensor,
        self_cond: Option<&Tensor>,
    ) -> Result<Tensor> {
        let c = self.fwd.canvas_len()?;
        if canvas.numel() != c {
            return Err(Error::Model(format!(
                "a canvas of {} tokens; this model's canvas holds {c}",
                canvas.numel()
            )));
        }
        if c > self.fwd.cfg.max_batch_tokens {
            return Err(Error::Model(format!(
                "a canvas of {c} tokens exceeds the batch limit of {}",
                self.fwd.cfg.max_batch_tokens
            )));
        }
        self.check_room(seq, c)?;
        // The batch's token ids are placeholders: the embedding reads `canvas`.
        let placeholder = vec![0u32; c];
        let items = [(seq, &placeholder[..], Logits::All)];
        self.reserve(&items)?;
        let batch = self.kv.batch(&items);
        let c = CanvasInput {
            ids: canvas,
            self_cond,
        };
        let (_, mut logits) = self.fwd.run_with(&batch, None, &[c])?;
        logits
            .pop()
            .ok_or_else(|| Error::Model("a denoising pass gave no logits".into()))
    }

    /// Feeds `tokens` to one sequence in chunks of at most `max_batch_tokens`; returns the
    /// logits rows asked for (indices relative to `tokens`).
    pub fn feed(&mut self, seq: SeqId, tokens: &[u32], want: Logits) -> Result<Vec<Vec<f32>>> {
        let rows = want.rows(tokens.len());
        let mut out = Vec::with_capacity(rows.len());
        let chunk = self.fwd.cfg.max_batch_tokens;
        let mut start = 0;
        while start < tokens.len() {
            let end = (start + chunk).min(tokens.len());
            let lo = rows.start.clamp(start, end) - start;
            let hi = rows.end.clamp(start, end) - start;
            let w = if hi > lo {
                Logits::From(lo)
            } else {
                Logits::None
            };
            // `From(lo)` runs to the chunk's end; trim to `hi`.
            let mut got = self
                .step(&[(seq, &tokens[start..end], w)])?
                .pop()
                .unwrap_or_default();
            got.truncate(hi.saturating_sub(lo));
            out.extend(got);
            start = end;
        }
        Ok(out)
    }

    /// Frees a sequence's cache blocks and state slots.
    pub fn release(&mut self, seq: SeqId) -> Result<()> {
        self.kv.free(seq)
    }

    pub fn forward(&self) -> &Forward {
        self.fwd
    }
    /// Tokens of `seq` already in the cache.
    pub fn seq_len(&self, seq: SeqId) -> usize {
        self.kv.seq_len(seq)
    }
}
