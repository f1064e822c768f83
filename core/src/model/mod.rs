//! Model families. `registry.rs` is the one table from architecture name to builder; each
//! family file maps its file's metadata and tensor names onto a shared implementation.

mod blocks;
pub(crate) use blocks::check_batch;
pub mod decoder;
pub mod dflash;
pub mod diffusion_gemma;
pub mod gemma3;
pub mod gemma4;
pub mod gemma4_assistant;
mod gemma4_hf;
mod gemma4_ple;
pub mod gemma4v;
pub mod llama;
pub mod qwen35;
pub mod qwen35v;
pub mod registry;
pub mod siglip;
mod tower;
pub mod toy;
pub mod vision;
mod weights;

use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::tensor::Tensor;

pub use registry::{architectures, build_from_gguf, FAMILIES};

pub use crate::kv::KvGroup;

/// The paged caches of one KV group: a K and a V tensor `[blocks, block_size, heads, dim]`
/// per layer of the group, in the group's layer order.
pub struct KvCaches {
    pub block_size: usize,
    pub groups: Vec<(Vec<Tensor>, Vec<Tensor>)>,
    /// Per-sequence recurrent state pools (linear-attention layers), one per entry of
    /// [`Model::state_shapes`]: `[slots, 1, 1, numel]` (f32, zeroed). Slot 0 stays zero: a
    /// sequence's first step reads it as its initial state.
    pub states: Vec<Tensor>,
    /// Per group and layer: minus the key center subtracted from every key before it is
    /// written (`[kv_heads, head_dim]`), where the layer's K cache is lossy. See
    /// [`KvCaches::keys_to_write`].
    centers: Vec<Vec<Option<Tensor>>>,
    /// Per group and layer: the keys' map `T` and the queries' `T⁻ᵀ` (`[head_dim, head_dim]`
    /// each), where the layer's K cache is lossy and the keys are fitted to the queries
    /// ([`crate::kv::key_fit`]).
    fitted: Vec<Vec<Option<(Tensor, Tensor)>>>,
    /// While calibrating: what each (group, layer) has seen.
    calibration: std::sync::Mutex<Option<Calibration>>,
}

/// What a calibration pass measured of each layer's keys ([`KvCaches::finish_calibration`]):
/// kept by the runner and installed into caches of whatever types it takes.
#[derive(Clone, Debug, Default)]
pub struct KeyCalibration {
    layers: std::collections::HashMap<(usize, usize), LayerKeys>,
}

#[derive(Clone, Debug)]
struct LayerKeys {
    heads: usize,
    d: usize,
    /// The mean key, per head and channel.
    mean: Vec<f32>,
    /// The keys' map `T` and the queries' `T⁻ᵀ`, row-major `d × d`.
    map: Option<(Vec<f32>, Vec<f32>)>,
}

/// Most head rows of one layer's keys or queries a calibration step adds to their second
/// moments (whole tokens, evenly spaced: [`crate::kv::key_fit::SecondMoments::add_sampled`]):
/// a covariance of `d × d` needs far fewer rows than a long prefill step of many heads holds.
const MOMENT_ROWS: usize = 4096;

/// What a layer's calibration statistics give for a context of `positions`: the mean key and
/// the fitted map. Statistics taken before RoPE ([`KvCaches::calibrate_rope`]) are averaged
/// over the context's positions first ([`crate::kv::rope_moments`]); a layer seen only after
/// RoPE (no rotary embedding kiln knows of) gets a map only from a pass over the whole
/// context, since a shorter one fits the directions its slow pairs keep there.
fn layer_keys(heads: usize, d: usize, stats: &LayerStats, positions: usize) -> LayerKeys {
    let n = stats.keys as f64;
    let mut mean: Vec<f64> = stats.key_sum.iter().map(|s| s / n).collect();
    let mut moments = stats
        .sk
        .as_ref()
        .and_then(|m| m.mean())
        .zip(stats.sq.as_ref().and_then(|m| m.mean()))
        .filter(|(sk, sq)| sk.len() == d * d && sq.len() == d * d);
    match &stats.rotary {
        Some(rot) => {
            mean = mean
                .chunks(d.max(1))
                .flat_map(|m| rot.average_vector(m, positions))
                .collect();
            moments = moments.map(|(sk, sq)| {
                (
                    rot.average_moments(&sk, positions),
                    rot.average_moments(&sq, positions),
                )
            });
        }
        None if stats.keys < positions => moments = None,
        None => {}
    }
    // Fitted to the keys' second moments as they come, not less their mean, though the keys
    // are then centered: measured better on SmolLM2 (tq3 keys, KL from f32 0.072 against
    // 0.086 with E[(k-μ)(k-μ)ᵀ]) and about even on Gemma 3 (0.049 against 0.043).
    let map = moments.and_then(|(sk, sq)| crate::kv::key_fit::fit(&sk, &sq, d));
    LayerKeys {
        heads,
        d,
        mean: mean.iter().map(|&m| m as f32).collect(),
        map,
    }
}

/// A calibration pass's statistics ([`KvCaches::begin_calibration`]).
struct Calibration {
    /// Whether key and query second moments are gathered (for `fit_keys`).
    fit: bool,
    /// The positions the measured statistics are to serve (the context).
    positions: usize,
    layers: std::collections::HashMap<(usize, usize), LayerStats>,
}

#[derive(Default)]
struct LayerStats {
    /// Sum of the keys (per KV head and channel) and their count.
    key_sum: Vec<f64>,
    keys: usize,
    /// `E[k kᵀ]` and `E[q qᵀ]` over head rows, every head pooled.
    sk: Option<crate::kv::key_fit::SecondMoments>,
    sq: Option<crate::kv::key_fit::SecondMoments>,
    /// The layer's rotary embedding, where the statistics above were taken before it.
    rotary: Option<crate::kv::rope_moments::Rotary>,
}

impl LayerStats {
    /// Adds a step's keys (`k`, `[T, heads, d]`): their sums, and with `fit` their second
    /// moments.
    fn add_keys(&mut self, ex: &Executor, k: &Tensor, fit: bool) -> Result<()> {
        let width = k.numel() / k.shape().dims()[0].max(1);
        let d = k.shape().last();
        let x = ex.download_f32(k)?;
        if self.key_sum.is_empty() {
            self.key_sum = vec![0.0; width];
        }
        if self.key_sum.len() == width {
            for row in x.chunks_exact(width) {
                for (s, v) in self.key_sum.iter_mut().zip(row) {
                    *s += *v as f64;
                }
                self.keys += 1;
            }
        }
        if fit {
            let sk = self
                .sk
                .get_or_insert_with(|| crate::kv::key_fit::SecondMoments::new(d));
            if sk.dim() == d {
                sk.add_sampled(&x, width / d.max(1), MOMENT_ROWS);
            }
        }
        Ok(())
    }

    /// Adds a step's queries (`q`, `[T, heads, d]`) to their second moments.
    fn add_queries(&mut self, ex: &Executor, q: &Tensor) -> Result<()> {
        let d = q.shape().last();
        let heads = q.numel() / (q.shape().dims()[0].max(1) * d.max(1));
        let sq = self
            .sq
            .get_or_insert_with(|| crate::kv::key_fit::SecondMoments::new(d));
        if sq.dim() == d {
            sq.add_sampled(&ex.download_f32(q)?, heads, MOMENT_ROWS);
        }
        Ok(())
    }
}

impl KvCaches {
    /// Allocates zeroed caches for `groups`, `num_blocks[g]` blocks each, each layer's K and
    /// V in the types `types` gives it (checked against the heads first).
    pub fn alloc(
        ex: &Executor,
        groups: &[KvGroup],
        block_size: usize,
        num_blocks: &[usize],
        types: &crate::kv::KvTypes,
    ) -> Result<KvCaches> {
        types.check(groups)?;
        let mut out = Vec::new();
        for (g, nb) in groups.iter().zip(num_blocks) {
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for &l in &g.layers {
                let (kt, vt) = types.of_layer(l);
                let b = ex.backend();
                ks.push(b.alloc(&crate::TensorDesc::new(
                    kt,
                    [*nb, block_size, g.n_kv_heads, g.head_dim],
                ))?);
                vs.push(b.alloc(&crate::TensorDesc::new(
                    vt,
                    [*nb, block_size, g.n_kv_heads, g.v_head_dim],
                ))?);
            }
            out.push((ks, vs));
        }
        Ok(KvCaches {
            block_size,
            centers: out.iter().map(|(ks, _)| vec![None; ks.len()]).collect(),
            fitted: out.iter().map(|(ks, _)| vec![None; ks.len()]).collect(),
            groups: out,
            states: Vec::new(),
            calibration: std::sync::Mutex::new(None),
        })
    }

    /// Whether layer `(g, gi)`'s keys go into its cache as they are (no calibration running,
    /// no center to subtract, no fitted map): then their write may be fused with the RoPE
    /// before it.
    pub fn keys_as_they_are(&self, (g, gi): (usize, usize), soft_capped: bool) -> bool {
        let calibrating = self.calibration.lock().map(|c| c.is_some()).unwrap_or(true);
        let centered = self
            .centers
            .get(g)
            .and_then(|c| c.get(gi))
            .is_some_and(|c| c.is_some());
        !calibrating && (soft_capped || !centered) && self.fitted_map((g, gi)).is_none()
    }

    fn fitted_map(&self, (g, gi): (usize, usize)) -> Option<&(Tensor, Tensor)> {
        self.fitted
            .get(g)
            .and_then(|f| f.get(gi))
            .and_then(|f| f.as_ref())
    }

    /// The queries layer `(g, gi)` scores against its cache: `q` (`[T, heads, dim]`) through
    /// the layer's `T⁻ᵀ` where its keys are fitted ([`crate::kv::key_fit`]), else `None` (as
    /// they are). While calibrating with `fit`, the queries' second moments are gathered here
    /// for a layer whose queries [`KvCaches::calibrate_rope`] did not see before RoPE.
    pub fn queries_to_score(
        &self,
        ex: &Executor,
        (g, gi): (usize, usize),
        q: &Tensor,
    ) -> Result<Option<Tensor>> {
        if let Ok(mut cal) = self.calibration.lock() {
            if let Some(c) = cal.as_mut().filter(|c| c.fit) {
                let stats = c.layers.entry((g, gi)).or_default();
                if stats.rotary.is_none() {
                    stats.add_queries(ex, q)?;
                }
            }
        }
        match self.fitted_map((g, gi)) {
            Some((_, qmap)) => Ok(Some(ex.matmul(q, qmap)?)),
            None => Ok(None),
        }
    }

    /// The keys to write into layer `gi` of group `g`: `k` less the layer's key center when
    /// it has one, then through the layer's fitted map `T` when it has one (the queries go
    /// through `T⁻ᵀ`: [`KvCaches::queries_to_score`]). Attention is unchanged by either. By
    /// the center: every key a query sees has the same vector
    /// subtracted, so every score drops by the same `q·center` and the softmax cancels it
    /// (which is why `soft_capped` layers, whose cap is not shift-invariant, are never
    /// centered). What it buys is precision: many models' keys share a large constant part
    /// (a few outlier channels of one sign), which a lossy cache would otherwise spend its
    /// bits on. While calibrating, a layer whose keys [`KvCaches::calibrate_rope`] did not see
    /// before RoPE has them summed per channel here (and their second moments gathered, with
    /// `fit`).
    pub fn keys_to_write(
        &self,
        ex: &Executor,
        (g, gi): (usize, usize),
        k: &Tensor,
        soft_capped: bool,
    ) -> Result<Option<Tensor>> {
        if let Ok(mut cal) = self.calibration.lock() {
            if let Some(c) = cal.as_mut() {
                let fit = c.fit;
                let stats = c.layers.entry((g, gi)).or_default();
                if stats.rotary.is_none() {
                    stats.add_keys(ex, k, fit)?;
                }
            }
        }
        let center = self
            .centers
            .get(g)
            .and_then(|c| c.get(gi))
            .cloned()
            .flatten();
        let centered = match center {
            Some(neg) if !soft_capped => Some(ex.add(k, &neg)?),
            _ => None,
        };
        match self.fitted_map((g, gi)) {
            Some((kmap, _)) => Ok(Some(ex.matmul(centered.as_ref().unwrap_or(k), kmap)?)),
            None => Ok(centered),
        }
    }

    /// While calibrating: layer `(g, gi)`'s queries `q` and keys `k` (`[T, heads, dim]`; none
    /// for a layer that reads another's cache) before `rope` turns them (with `factors`, its
    /// optional frequency divisors). Their statistics, averaged over the context's positions when the calibration ends
    /// ([`crate::kv::rope_moments`]), replace those [`KvCaches::keys_to_write`] and
    /// [`KvCaches::queries_to_score`] would take after RoPE, so a short pass serves a context
    /// of any length. Nothing while not calibrating, or where `rope` does not fit the keys or
    /// gives a frequency that is not a finite number (the statistics after RoPE serve then).
    pub fn calibrate_rope(
        &self,
        ex: &Executor,
        (g, gi): (usize, usize),
        (q, k): (&Tensor, Option<&Tensor>),
        rope: crate::op::RopeParams,
        factors: Option<&Tensor>,
    ) -> Result<()> {
        let Ok(mut cal) = self.calibration.lock() else {
            return Ok(());
        };
        let Some(c) = cal.as_mut() else {
            return Ok(());
        };
        let d = k.unwrap_or(q).shape().last();
        let f = factors.map(|t| ex.download_f32(t)).transpose()?;
        let Some(rot) =
            crate::kv::rope_moments::Rotary::new(&rope, f.as_deref(), d).filter(|r| r.is_finite())
        else {
            return Ok(());
        };
        let fit = c.fit;
        let stats = c.layers.entry((g, gi)).or_default();
        if stats.rotary.as_ref().is_some_and(|r| *r != rot) {
            return Err(Error::Model(format!(
                "layer {gi} of KV group {g} turned by two rotary embeddings while calibrating"
            )));
        }
        stats.rotary = Some(rot);
        if let Some(k) = k {
            stats.add_keys(ex, k, fit)?;
        }
        if fit && q.shape().last() == d {
            stats.add_queries(ex, q)?;
        }
        Ok(())
    }

    /// Starts gathering every layer's keys and queries, before RoPE where the layer has one
    /// ([`KvCaches::calibrate_rope`]), else as written and scored ([`KvCaches::keys_to_write`],
    /// [`KvCaches::queries_to_score`]): the keys' sums, and with `fit` the keys' and queries'
    /// second moments, for a center and maps that serve `positions` (the context).
    pub fn begin_calibration(&self, fit: bool, positions: usize) {
        if let Ok(mut c) = self.calibration.lock() {
            *c = Some(Calibration {
                fit,
                positions,
                layers: std::collections::HashMap::new(),
            });
        }
    }

    /// Ends the calibration: for each layer that saw keys, their mean (per KV head and
    /// channel) and, where second moments were gathered, the map fitted to the queries
    /// ([`crate::kv::key_fit::fit`]) — whatever the layer's cache type, so the record serves
    /// caches of any types ([`KvCaches::install`]).
    pub fn finish_calibration(&self) -> KeyCalibration {
        let cal = match self.calibration.lock() {
            Ok(mut c) => c.take(),
            Err(_) => None,
        };
        let mut out = KeyCalibration::default();
        let Some(cal) = cal else { return out };
        let positions = cal.positions;
        let mut todo = Vec::new();
        for ((g, gi), stats) in cal.layers {
            let Some(k) = self.groups.get(g).and_then(|(ks, _)| ks.get(gi)) else {
                continue;
            };
            let dims = k.shape().dims();
            let (heads, d) = (dims[2], dims[3]);
            if stats.keys > 0 && stats.key_sum.len() == heads * d {
                todo.push(((g, gi), heads, d, stats));
            }
        }
        // The layers' fits (two eigen-decompositions of d × d each) on the machine's threads.
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = todo.len().div_ceil(threads.max(1)).max(1);
        let fitted: Vec<((usize, usize), LayerKeys)> = std::thread::scope(|s| {
            let handles: Vec<_> = todo
                .chunks(per)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|(at, h, d, st)| (*at, layer_keys(*h, *d, st, positions)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        out.layers.extend(fitted);
        out
    }

    /// Gives every layer whose K cache is not exact (not f32, f16 or bf16) what `cal`
    /// measured of it: with `center`, its mean key to subtract, and its fitted map where
    /// there is one (centered too: the two together measured best).
    pub fn install(&mut self, ex: &Executor, cal: &KeyCalibration, center: bool) -> Result<()> {
        for (&(g, gi), l) in &cal.layers {
            let Some(k) = self.groups.get(g).and_then(|(ks, _)| ks.get(gi)) else {
                continue;
            };
            let dims = k.shape().dims();
            if k.dtype().is_float() || dims[2] != l.heads || dims[3] != l.d {
                continue;
            }
            if center || l.map.is_some() {
                let neg: Vec<f32> = l.mean.iter().map(|m| -m).collect();
                let t = ex.upload_f32(&[l.heads, l.d], &neg)?;
                if let Some(slot) = self.centers.get_mut(g).and_then(|c| c.get_mut(gi)) {
                    *slot = Some(t);
                }
            }
            if let Some((kmap, qmap)) = &l.map {
                let pair = (
                    ex.upload_f32(&[l.d, l.d], kmap)?,
                    ex.upload_f32(&[l.d, l.d], qmap)?,
                );
                if let Some(slot) = self.fitted.get_mut(g).and_then(|c| c.get_mut(gi)) {
                    *slot = Some(pair);
                }
            }
        }
        Ok(())
    }

    /// Whether any layer's keys go through a fitted map.
    pub fn keys_fitted(&self) -> bool {
        self.fitted.iter().flatten().any(Option::is_some)
    }

    /// Whether any layer's keys are centered.
    pub fn keys_centered(&self) -> bool {
        self.centers.iter().flatten().any(Option::is_some)
    }

    /// Copies KV block `src` to `dst` in every layer of group `g` (copy-on-write of a shared
    /// block).
    pub fn copy_block(&self, ex: &Executor, g: usize, src: u32, dst: u32) -> Result<()> {
        let Some((ks, vs)) = self.groups.get(g) else {
            return Err(crate::Error::Model(format!("no KV group {g}")));
        };
        for t in ks.iter().chain(vs) {
            let dims = t.shape().dims().to_vec();
            let per: usize = dims[1..].iter().product();
            let at = |b: u32| t.view(b as usize * per, dims[1..].to_vec());
            ex.exec(
                &crate::op::Op::Elementwise(crate::op::ElementwiseOp::Copy),
                &[&at(src)?],
                &[&at(dst)?],
            )?;
        }
        Ok(())
    }

    /// Allocates the recurrent state pools: `slots` slots of each shape.
    pub fn alloc_states(
        &mut self,
        ex: &Executor,
        shapes: &[Vec<usize>],
        slots: usize,
    ) -> Result<()> {
        for s in shapes {
            let n: usize = s.iter().product();
            self.states.push(
                ex.backend()
                    .alloc(&crate::TensorDesc::new(crate::DType::F32, [slots, 1, 1, n]))?,
            );
        }
        Ok(())
    }
}

/// One sequence's part of a batch.
#[derive(Clone, Debug)]
pub struct SeqInput {
    /// First row of this sequence's tokens in the batch.
    pub q_start: usize,
    /// Tokens of this sequence in the batch (the last ones of its context).
    pub q_len: usize,
    /// Context length after this step (cached tokens + `q_len`).
    pub seq_len: usize,
    /// Block table per KV group.
    pub block_tables: Vec<Vec<u32>>,
    /// The slot of the recurrent state pools this step reads (0: the zero state) and the one
    /// it writes (never the same; both 0 for models without state).
    pub state_read: usize,
    pub state_slot: usize,
    /// The sequence's images that start before its context ends, for a model that places
    /// image tokens by their row and column (M-RoPE); empty for the others.
    pub images: Vec<ImageGrid>,
}

/// Where an image's soft tokens sit in a sequence and how they are laid out: `rows × cols`
/// tokens, row-major, from position `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageGrid {
    pub start: usize,
    pub rows: usize,
    pub cols: usize,
}

/// Everything one forward pass needs: the tokens of every scheduled sequence, their
/// positions, where their K/V go (slot per token per KV group), and which rows want logits.
#[derive(Clone, Debug, Default)]
pub struct ForwardBatch {
    pub tokens: Vec<u32>,
    pub positions: Vec<i32>,
    pub seqs: Vec<SeqInput>,
    /// `slots[group][row]`: where row's K/V go in that group's pool (negative: nowhere).
    pub slots: Vec<Vec<i32>>,
    /// Rows whose logits are returned, in this order.
    pub logits_rows: Vec<usize>,
    /// Rows whose input embeddings a vision encoder gave (an image's soft tokens), in row
    /// order; their token ids are not looked up.
    pub embeds: Vec<RowEmbeds>,
}

/// Consecutive rows of a batch that take a vision encoder's embeddings instead of their
/// tokens' (some or all of one image's soft tokens).
#[derive(Clone, Debug)]
pub struct RowEmbeds {
    /// The first of the rows (they are `row..row + n`).
    pub row: usize,
    /// `[n, n_embd]` f32 on the executor's backend: what the rows' embeddings become
    /// (after any embedding scale; Gemma's `sqrt(n_embd)` does not apply to them).
    pub embeds: Tensor,
    /// The position just past the image's last soft token: where a model whose image tokens
    /// see each other both ways lets these rows' attention reach.
    pub span_end: usize,
    /// The image's grid, for a model that places image tokens by row and column.
    pub grid: Option<ImageGrid>,
}

impl ForwardBatch {
    /// The rows that take a vision encoder's embeddings.
    pub fn image_rows(&self) -> std::collections::BTreeSet<usize> {
        self.embeds
            .iter()
            .flat_map(|e| e.row..e.row + e.embeds.shape().dims().first().copied().unwrap_or(0))
            .collect()
    }
}

pub use crate::exec::StepInput;
pub use vision::VisionTower;

impl StepInput {
    /// Its shape and values for batch `b` (what [`Executor::step_input`] takes).
    pub fn of(self, b: &ForwardBatch) -> Result<(Vec<usize>, Vec<i32>)> {
        let (t, s) = (b.tokens.len(), b.seqs.len());
        let int = |x: usize, what: &str| {
            i32::try_from(x).map_err(|_| Error::Model(format!("{what} {x} exceeds the i32 range")))
        };
        Ok(match self {
            StepInput::Tokens => (
                vec![t],
                b.tokens
                    .iter()
                    .map(|&x| int(x as usize, "token id"))
                    .collect::<Result<_>>()?,
            ),
            StepInput::Positions => {
                if b.positions.len() != t {
                    return Err(Error::Model(format!(
                        "{} positions for {t} tokens",
                        b.positions.len()
                    )));
                }
                (vec![t], b.positions.clone())
            }
            StepInput::SeqLens => (
                vec![s],
                b.seqs
                    .iter()
                    .map(|q| int(q.seq_len, "sequence length"))
                    .collect::<Result<_>>()?,
            ),
            StepInput::QStart => {
                let mut v = b
                    .seqs
                    .iter()
                    .map(|q| int(q.q_start, "row"))
                    .collect::<Result<Vec<_>>>()?;
                v.push(int(t, "row count")?);
                (vec![s + 1], v)
            }
            StepInput::Table(g) => {
                let width = b
                    .seqs
                    .iter()
                    .map(|q| q.block_tables.get(g).map_or(0, |t| t.len()))
                    .max()
                    .unwrap_or(0)
                    .max(1);
                let mut table = vec![0i32; s * width];
                for (si, q) in b.seqs.iter().enumerate() {
                    let bt = q.block_tables.get(g).ok_or_else(|| {
                        Error::Model(format!("sequence {si} has no block table for KV group {g}"))
                    })?;
                    for (j, &blk) in bt.iter().enumerate() {
                        table[si * width + j] = int(blk as usize, "block")?;
                    }
                }
                (vec![s, width], table)
            }
            StepInput::Slots(g) => {
                let slots = b
                    .slots
                    .get(g)
                    .ok_or_else(|| Error::Model(format!("no slot mapping for KV group {g}")))?;
                if slots.len() != t {
                    return Err(Error::Model(format!(
                        "{} slots of KV group {g} for {t} tokens",
                        slots.len()
                    )));
                }
                (vec![t], slots.clone())
            }
            StepInput::LogitsRows => (
                vec![b.logits_rows.len()],
                b.logits_rows
                    .iter()
                    .map(|&r| int(r, "row"))
                    .collect::<Result<_>>()?,
            ),
            StepInput::StateRead => (
                vec![s],
                b.seqs
                    .iter()
                    .map(|q| int(q.state_read, "state slot"))
                    .collect::<Result<_>>()?,
            ),
            StepInput::StateWrite => {
                // Slot 0 is the zero state every new sequence reads: never written.
                if b.seqs.iter().any(|q| q.state_slot == 0) {
                    return Err(Error::Model(
                        "a sequence has no recurrent-state slot".into(),
                    ));
                }
                (
                    vec![s],
                    b.seqs
                        .iter()
                        .map(|q| int(q.state_slot, "state slot"))
                        .collect::<Result<_>>()?,
                )
            }
        })
    }
}

/// Sizes a user and the engine need to know.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub architecture: String,
    pub name: Option<String>,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub n_params: u64,
    /// Weight dtypes and how many tensors of each.
    pub dtypes: Vec<(crate::DType, usize)>,
}

/// What a drafter reads of its target's weights and caches: the token embeddings (scaled
/// by `embed_scale`), the output matrix, the hidden width, and where the K/V of the last
/// sliding and the last full layer live in the target's caches (Gemma 4's MTP assistant
/// reads them).
#[derive(Clone)]
pub struct DraftSource {
    pub tok_embd: Tensor,
    pub embed_scale: f32,
    pub output: Tensor,
    pub hidden: usize,
    pub n_layer: usize,
    pub groups: Vec<KvGroup>,
    pub sliding: Option<(usize, usize)>,
    pub full: Option<(usize, usize)>,
}

/// Hidden states a drafter reads of every token the target computes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Features {
    /// The final-normed hidden state (Gemma 4's MTP assistant).
    Final,
    /// The outputs of these layers, side by side (DFlash).
    Layers(Vec<usize>),
}

/// A loaded model.
pub trait Model: Send + Sync {
    fn info(&self) -> &ModelInfo;
    fn kv_groups(&self) -> &[KvGroup];
    /// Shapes of the per-sequence recurrent state a model keeps besides its KV cache (one per
    /// pool; e.g. conv and delta-rule states of linear-attention layers). None by default.
    fn state_shapes(&self) -> Vec<Vec<usize>> {
        Vec::new()
    }
    /// Runs one batch; returns logits `[logits_rows.len(), vocab]` (f32).
    fn forward(&self, ex: &Executor, batch: &ForwardBatch, kv: &KvCaches) -> Result<Tensor>;
    /// [`Model::forward`], and the hidden states `f` names of every row of the batch, as
    /// column blocks `[T, width]` side by side (what a drafter is fed).
    fn forward_features(
        &self,
        _ex: &Executor,
        _batch: &ForwardBatch,
        _kv: &KvCaches,
        f: &Features,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        Err(crate::Error::Model(format!(
            "{} cannot hand its hidden states ({f:?}) to a drafter",
            self.info().architecture
        )))
    }
    /// Whether [`Model::forward_features`] gives `f`.
    fn gives(&self, _f: &Features) -> bool {
        false
    }
    /// What a drafter reads of this model's weights and caches (`None`: none can).
    fn draft_source(&self) -> Option<DraftSource> {
        None
    }
    /// The block-diffusion capability (`None`: an autoregressive model).
    fn denoiser(&self) -> Option<&dyn Denoiser> {
        None
    }
    /// A block-diffusion model's canvas length.
    fn canvas_length(&self) -> Option<usize> {
        self.denoiser().map(|d| d.canvas_length())
    }
}

/// How the soft embedding of self-conditioning logits is formed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SoftEmbedding {
    /// Every vocabulary row, weighted by the softmax (exact).
    Dense,
    /// The top `k` logits of each position, softmax over those.
    TopK(usize),
}

/// A GGUF architecture's builder: the model, its weights uploaded to the executor's backend.
pub type Builder = fn(&crate::load::gguf::GgufFile, &Executor) -> Result<Box<dyn Model>>;

/// One model family, as its file (`model/<family>.rs`) declares it; [`registry`] gathers
/// them.
pub struct Family {
    /// GGUF `general.architecture` names it builds, each with its builder (a drafter built by
    /// speculative decoding's setup has none here).
    pub archs: &'static [(&'static str, Builder)],
    /// Its Hugging Face checkpoints: `model_type`s, metadata, tensor names, conversions.
    pub hf: &'static [&'static crate::load::hf::family::HfFamily],
}

/// One canvas of a denoising pass: its token ids on the device (`[canvas]` i32, each below
/// the vocabulary) and the previous step's processed logits (`[canvas, vocab]`; none on a
/// canvas's first step).
#[derive(Copy, Clone)]
pub struct CanvasInput<'a> {
    pub ids: &'a Tensor,
    pub self_cond: Option<&'a Tensor>,
}

/// What a block-diffusion model can do beyond a language model's forward pass (which, for
/// it, encodes the prompt and each committed canvas into the cache): denoise canvases.
pub trait Denoiser: Send + Sync {
    /// Tokens per canvas.
    fn canvas_length(&self) -> usize;
    /// One pass whose last `canvases.len()` sequences are canvases (`q_len` = the canvas
    /// length each), predicted all at once from their cached prefixes and their whole
    /// canvases, their K/V written to their cache slots as scratch (the pass that commits a
    /// canvas overwrites them); the earlier sequences are the encoder's tokens, run causally
    /// into the cache as [`Model::forward`] runs them, in the same pass. Returns logits
    /// `[logits_rows.len(), vocab]`.
    fn denoise(
        &self,
        ex: &Executor,
        batch: &ForwardBatch,
        kv: &KvCaches,
        canvases: &[CanvasInput<'_>],
    ) -> Result<Tensor>;
    /// How the self-conditioning soft embedding is formed (`TopK(k)` with `k` ≥ the
    /// vocabulary is dense).
    fn set_soft_embedding(&self, s: SoftEmbedding);
}
