//! The blocks every family is built from, in one place: the batch's index tensors, the
//! norm-then-projections and gated FFN (through the fused norm-matmul and GLU-matmul ops where
//! the backend has them: the fused-op gate, taken the same way by every family), one layer's
//! paged attention, the mixture-of-experts expert pass, and the logits head.

use super::weights::Weights;
use super::{Features, ForwardBatch, KvCaches, SeqInput, StepInput};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::op::{AttnParams, GluOp, RopeParams};
use crate::tensor::Tensor;

/// An RMSNorm's settings: epsilon, and whether the weight is applied as `1 + w` (Gemma's HF
/// checkpoints).
#[derive(Copy, Clone, Debug)]
pub(crate) struct NormSpec {
    pub eps: f32,
    pub one_plus: bool,
}

/// `norm(x)` projected by each of `ws`, through the fused norm-matmul where the backend has
/// it.
pub(crate) fn normed_matmuls<const N: usize>(
    ex: &Executor,
    x: &Tensor,
    norm_w: &Tensor,
    n: NormSpec,
    ws: [&Tensor; N],
) -> Result<[Tensor; N]> {
    let out = ex.rms_norm_matmuls(x, norm_w, n.eps, n.one_plus, &ws)?;
    out.try_into()
        .map_err(|_| Error::Model("a matmul per weight".into()))
}

/// A gated feed-forward block: `down(act(gate·x) ⊙ up·x)`.
pub(crate) struct GatedFfn {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    pub act: GluOp,
}

impl GatedFfn {
    /// Layer `l`'s `ffn_gate`, `ffn_up` and `ffn_down` (`[ff, e]`, `[ff, e]`, `[e, ff]`).
    pub fn load(w: &mut Weights, l: usize, e: usize, ff: usize, act: GluOp) -> Result<GatedFfn> {
        let n = |s: &str| format!("blk.{l}.ffn_{s}.weight");
        Ok(GatedFfn {
            gate: w.get(&n("gate"), &[ff, e])?,
            up: w.get(&n("up"), &[ff, e])?,
            down: w.get(&n("down"), &[e, ff])?,
            act,
        })
    }

    /// The block on `h` as it is.
    pub fn forward_on(&self, ex: &Executor, h: &Tensor) -> Result<Tensor> {
        let gate = ex.matmul(h, &self.gate)?;
        let up = ex.matmul(h, &self.up)?;
        ex.glu_matmul(self.act, &gate, &up, &self.down)
    }

    /// The block on `norm(x)` (the norm fused into the projections where the backend can).
    pub fn forward(
        &self,
        ex: &Executor,
        x: &Tensor,
        norm_w: &Tensor,
        n: NormSpec,
    ) -> Result<Tensor> {
        let [gate, up] = normed_matmuls(ex, x, norm_w, n, [&self.gate, &self.up])?;
        ex.glu_matmul(self.act, &gate, &up, &self.down)
    }

    /// `x + block(norm(x))`: the residual added in the down projection's epilogue where the
    /// backend can.
    pub fn forward_residual(
        &self,
        ex: &Executor,
        x: &Tensor,
        norm_w: &Tensor,
        n: NormSpec,
    ) -> Result<Tensor> {
        let [gate, up] = normed_matmuls(ex, x, norm_w, n, [&self.gate, &self.up])?;
        ex.glu_matmul_add(self.act, &gate, &up, &self.down, x)
    }
}

/// One layer's paged attention: `k`, `v` (`[T, kv_heads, dim]`, positions already applied)
/// written into the layer's cache when given (a layer that shares another's KV gives none),
/// then `q` (`[T, heads, dim]`) attends through the block table. Returns `[T, heads·dim]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    ex: &Executor,
    bt: &BatchTensors,
    kv: &KvCaches,
    (g, gi): (usize, usize),
    q: &Tensor,
    new_kv: Option<(&Tensor, &Tensor)>,
    p: AttnParams,
) -> Result<Tensor> {
    let (kc, vc) = layer_cache(kv, (g, gi))?;
    let (table, _) = bt
        .tables
        .get(g)
        .ok_or_else(|| Error::Model(format!("no block table for KV group {g}")))?;
    if let Some(new) = new_kv {
        write_kv(ex, bt, kv, (g, gi), new, p.soft_cap.is_some())?;
    }
    let fitted = kv.queries_to_score(ex, (g, gi), q)?;
    let a = ex.paged_attention(
        p,
        fitted.as_ref().unwrap_or(q),
        kc,
        vc,
        table,
        &bt.seq_lens,
        &bt.q_start,
        bt.key_end.as_ref(),
    )?;
    let d = q.shape().dims();
    a.reshape([d[0], d[1] * d[2]])
}

/// RoPE of `q` and `k` at the batch's positions, then [`attention`] with `k` and `v` written
/// to the layer's cache first: as one fused op where the backend runs it and the keys go to
/// the cache as they are (the fused-op gate), else as the three ops.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_attention(
    ex: &Executor,
    bt: &BatchTensors,
    kv: &KvCaches,
    (g, gi): (usize, usize),
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    (rope, freqs): (RopeParams, Option<&Tensor>),
    p: AttnParams,
) -> Result<Tensor> {
    if kv.keys_as_they_are((g, gi), p.soft_cap.is_some()) {
        let (kc, vc) = layer_cache(kv, (g, gi))?;
        let (_, slots) = bt
            .tables
            .get(g)
            .ok_or_else(|| Error::Model(format!("no block table for KV group {g}")))?;
        if let Some(qr) =
            ex.rope_kv_write(q, k, v, (&bt.positions, slots), rope, freqs, (kc, vc))?
        {
            return attention(ex, bt, kv, (g, gi), &qr, None, p);
        }
    }
    kv.calibrate_rope(ex, (g, gi), (q, Some(k)), rope, freqs)?;
    let q = ex.rope(q, &bt.positions, rope, freqs)?;
    let k = ex.rope(k, &bt.positions, rope, freqs)?;
    attention(ex, bt, kv, (g, gi), &q, Some((&k, v)), p)
}

/// The routed experts of a mixture-of-experts block on `h [T, E]`: each token through its
/// chosen experts (`ids [T, k]`) as gated FFNs, mixed by `weights [T, k]`.
pub(crate) fn experts(
    ex: &Executor,
    h: &Tensor,
    (gate, up, down): (&Tensor, &Tensor, &Tensor),
    act: GluOp,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<Tensor> {
    let g = ex.matmul_id(h, gate, ids)?;
    let u = ex.matmul_id(h, up, ids)?;
    let a = ex.glu(act, &g, &u)?;
    let d = ex.matmul_id(&a, down, ids)?;
    ex.moe_sum(&d, weights)
}

/// The token embeddings and the logits head (final norm and output matrix).
pub(crate) struct Head {
    pub tok_embd: Tensor,
    pub out_norm: Tensor,
    pub output: Tensor,
}

impl Head {
    /// `token_embd` `[vocab, e]`, `output_norm` `[e]` and `output` `[vocab, e]` (the
    /// embeddings again when the checkpoint ties them).
    pub fn load(w: &mut Weights, vocab: usize, e: usize) -> Result<Head> {
        let tok_embd = w.get("token_embd.weight", &[vocab, e])?;
        let out_norm = w.get("output_norm.weight", &[e])?;
        let output = match w.get_opt("output.weight", &[vocab, e])? {
            Some(t) => t,
            None => tok_embd.clone(),
        };
        Ok(Head {
            tok_embd,
            out_norm,
            output,
        })
    }

    /// The token embeddings of a batch, and the uploaded ids (for per-layer inputs).
    pub fn embed(&self, ex: &Executor, b: &ForwardBatch) -> Result<(Tensor, Tensor)> {
        let ids = match b.embeds.is_empty() {
            true => step_input(ex, b, StepInput::Tokens)?,
            // An image's soft-token id may lie past the table (Gemma 3's does): its rows
            // look up row 0, which the vision encoder's embeddings then replace.
            false => {
                let rows = b.image_rows();
                let ids: Vec<i32> = (0..b.tokens.len())
                    .map(|r| match rows.contains(&r) {
                        true => Ok(0),
                        false => i32::try_from(b.tokens[r]).map_err(|_| {
                            Error::Model(format!("token id {} exceeds the i32 range", b.tokens[r]))
                        }),
                    })
                    .collect::<Result<_>>()?;
                ex.upload_i32(&[ids.len()], &ids)?
            }
        };
        Ok((ex.get_rows(&self.tok_embd, &ids)?, ids))
    }

    /// The logits of the rows that want them (see [`logits_head`]).
    pub fn logits(
        &self,
        ex: &Executor,
        x: &Tensor,
        b: &ForwardBatch,
        n: NormSpec,
        soft_cap: Option<f32>,
    ) -> Result<Tensor> {
        let vocab = self.output.shape().dims()[0];
        let (norm, out) = (&self.out_norm, &self.output);
        logits_head(ex, x, b, norm, out, (n.eps, n.one_plus), vocab, soft_cap)
    }
}

/// The hidden states a pass collects for a drafter ([`Features`]): the outputs of the
/// layers it reads, or (for the final state) nothing until the end.
pub(crate) struct Taps {
    layers: Vec<usize>,
    got: Vec<Option<Tensor>>,
    last: bool,
}

impl Taps {
    /// Nothing to collect (a plain forward).
    pub fn none() -> Taps {
        Taps {
            layers: Vec::new(),
            got: Vec::new(),
            last: false,
        }
    }

    /// `f` over a model of `n` layers; an error for a layer it does not have.
    pub fn new(f: &Features, n: usize) -> Result<Taps> {
        if !gives(f, n) {
            return Err(Error::Model(format!(
                "a drafter reads {f:?}; the model has {n} layers"
            )));
        }
        let layers = match f {
            Features::Final => Vec::new(),
            Features::Layers(ls) => ls.clone(),
        };
        Ok(Taps {
            got: vec![None; layers.len()],
            layers,
            last: *f == Features::Final,
        })
    }

    /// After layer `l`: keeps its output `x` where a drafter reads it.
    pub fn after(&mut self, l: usize, x: &Tensor) {
        for (g, _) in self
            .got
            .iter_mut()
            .zip(&self.layers)
            .filter(|(_, &t)| t == l)
        {
            *g = Some(x.clone());
        }
    }

    /// What the drafter is handed after the last layer's `x`: the final-normed state, or
    /// the collected outputs in the order asked for.
    pub fn finish(
        self,
        ex: &Executor,
        x: &Tensor,
        head: &Head,
        n: NormSpec,
    ) -> Result<Vec<Tensor>> {
        if self.last {
            return Ok(vec![ex.rms_norm(x, &head.out_norm, n.eps, n.one_plus)?]);
        }
        Ok(self.got.into_iter().flatten().collect())
    }
}

/// Whether a model of `n` layers whose outputs it can hand over gives `f`.
pub(crate) fn gives(f: &Features, n: usize) -> bool {
    match f {
        Features::Final => true,
        Features::Layers(ls) => ls.iter().all(|&l| l < n),
    }
}

/// Step input `which` of batch `b` on the device (see [`Executor::step_input`]).
pub(crate) fn step_input(ex: &Executor, b: &ForwardBatch, which: StepInput) -> Result<Tensor> {
    let (shape, data) = which.of(b)?;
    ex.step_input(which, &shape, &data)
}

/// The batch's index tensors, uploaded once per forward.
#[derive(Clone)]
pub(crate) struct BatchTensors {
    pub positions: Tensor,
    pub seq_lens: Tensor,
    pub q_start: Tensor,
    /// Per KV group: block table and slot mapping.
    pub tables: Vec<(Tensor, Tensor)>,
    /// Per row, the key position its attention reaches at least (`[T]` i32, 0: its mask
    /// alone): set for a model whose image soft tokens see each other both ways
    /// ([`image_key_end`]).
    pub key_end: Option<Tensor>,
}

pub(crate) fn upload_batch(
    ex: &Executor,
    b: &ForwardBatch,
    n_groups: usize,
) -> Result<BatchTensors> {
    let tables = (0..n_groups)
        .map(|g| {
            Ok((
                step_input(ex, b, StepInput::Table(g))?,
                step_input(ex, b, StepInput::Slots(g))?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(BatchTensors {
        positions: step_input(ex, b, StepInput::Positions)?,
        seq_lens: step_input(ex, b, StepInput::SeqLens)?,
        q_start: step_input(ex, b, StepInput::QStart)?,
        tables,
        key_end: None,
    })
}

/// For a model whose image soft tokens attend to each other both ways (and causally to
/// what comes before): each image row's key reach, the end of its image (`None` when the
/// batch has no image rows).
pub(crate) fn image_key_end(ex: &Executor, b: &ForwardBatch) -> Result<Option<Tensor>> {
    if b.embeds.is_empty() {
        return Ok(None);
    }
    let mut end = vec![0i32; b.tokens.len()];
    for e in &b.embeds {
        let n = e.embeds.shape().dims()[0];
        let reach = i32::try_from(e.span_end)
            .map_err(|_| Error::Model(format!("image end {} exceeds the i32 range", e.span_end)))?;
        for r in end.get_mut(e.row..e.row + n).into_iter().flatten() {
            *r = reach;
        }
    }
    Ok(Some(ex.upload_i32(&[end.len()], &end)?))
}

/// `x` (`[T, E]`, the batch's scaled token embeddings) with the rows a vision encoder gave
/// replaced by its embeddings.
pub(crate) fn splice_embeds(ex: &Executor, x: &Tensor, b: &ForwardBatch) -> Result<Tensor> {
    if b.embeds.is_empty() {
        return Ok(x.clone());
    }
    let (t, e) = (x.shape().dims()[0], x.shape().dims()[1]);
    let mut parts = Vec::new();
    let mut at = 0;
    for s in &b.embeds {
        let d = s.embeds.shape().dims();
        if d.len() != 2 || d[1] != e || s.row < at || s.row + d[0] > t {
            return Err(Error::Model(format!(
                "image rows {}..+{:?} do not fit a batch of {t} rows of width {e} in order",
                s.row, d
            )));
        }
        if s.row > at {
            parts.push(ex.rows(x, at..s.row)?);
        }
        parts.push(s.embeds.clone());
        at = s.row + d[0];
    }
    if at < t {
        parts.push(ex.rows(x, at..t)?);
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    ex.concat_rows(&refs)
}

/// A batch cut in two at sequence `seqs` (the first part's rows are `0..rows`, where the
/// second's sequences start): each part with its rows counted from 0, its own slot mappings
/// and logits rows. A pass whose parts attend under different masks runs its attention once
/// per part ([`Split`]).
pub(crate) fn split_batch(b: &ForwardBatch, seqs: usize) -> (ForwardBatch, ForwardBatch) {
    let seqs = seqs.min(b.seqs.len());
    let rows = b.seqs.get(seqs).map_or(b.tokens.len(), |s| s.q_start);
    let part = |range: std::ops::Range<usize>, sr: std::ops::Range<usize>| ForwardBatch {
        tokens: b.tokens[range.clone()].to_vec(),
        positions: b.positions[range.clone()].to_vec(),
        seqs: b.seqs[sr]
            .iter()
            .map(|s| SeqInput {
                q_start: s.q_start - range.start,
                ..s.clone()
            })
            .collect(),
        slots: b.slots.iter().map(|g| g[range.clone()].to_vec()).collect(),
        logits_rows: (b.logits_rows.iter())
            .filter(|r| range.contains(r))
            .map(|r| r - range.start)
            .collect(),
        embeds: (b.embeds.iter())
            .filter(|e| range.contains(&e.row))
            .map(|e| super::RowEmbeds {
                row: e.row - range.start,
                ..e.clone()
            })
            .collect(),
    };
    (
        part(0..rows, 0..seqs),
        part(rows..b.tokens.len(), seqs..b.seqs.len()),
    )
}

/// A pass's rows in two parts that attend under different masks (DiffusionGemma's encoder
/// rows, then canvases): rows `0..rows` are the first part's; each part's index tensors.
pub(crate) struct Split {
    pub rows: usize,
    pub first: BatchTensors,
    pub second: BatchTensors,
}

impl Split {
    pub fn new(ex: &Executor, b: &ForwardBatch, seqs: usize, n_groups: usize) -> Result<Split> {
        let (a, c) = split_batch(b, seqs);
        Ok(Split {
            rows: a.tokens.len(),
            first: upload_batch(ex, &a, n_groups)?,
            second: upload_batch(ex, &c, n_groups)?,
        })
    }

    /// [`attention`] with the K/V of every row written through `bt` (the whole batch's
    /// tensors), then each part's queries attending under its own mask (`p.0`, `p.1`); the
    /// outputs one after the other.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        ex: &Executor,
        bt: &BatchTensors,
        kv: &KvCaches,
        cache: (usize, usize),
        q: &Tensor,
        new_kv: Option<(&Tensor, &Tensor)>,
        p: (AttnParams, AttnParams),
    ) -> Result<Tensor> {
        let t = q.shape().dims().first().copied().unwrap_or(0);
        if let Some(kv_new) = new_kv {
            write_kv(ex, bt, kv, cache, kv_new, p.0.soft_cap.is_some())?;
        }
        let qa = ex.rows(q, 0..self.rows)?;
        let qb = ex.rows(q, self.rows..t)?;
        let a = attention(ex, &self.first, kv, cache, &qa, None, p.0)?;
        let b = attention(ex, &self.second, kv, cache, &qb, None, p.1)?;
        ex.concat_rows(&[&a, &b])
    }

    /// `f` on the first part's rows and `g` on the second's, the results one after the other.
    pub fn each(
        &self,
        ex: &Executor,
        x: &Tensor,
        f: impl FnOnce(Tensor) -> Result<Tensor>,
        g: impl FnOnce(Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let t = x.shape().dims().first().copied().unwrap_or(0);
        let a = f(ex.rows(x, 0..self.rows)?)?;
        let b = g(ex.rows(x, self.rows..t)?)?;
        ex.concat_rows(&[&a, &b])
    }
}

/// Layer `(g, gi)`'s K and V caches.
fn layer_cache(kv: &KvCaches, (g, gi): (usize, usize)) -> Result<(&Tensor, &Tensor)> {
    kv.groups
        .get(g)
        .and_then(|(ks, vs)| Some((ks.get(gi)?, vs.get(gi)?)))
        .ok_or_else(|| Error::Model(format!("no KV cache for layer {gi} of group {g}")))
}

/// Checks a denoising pass's batch: its last `canvases` sequences are canvases of `len`
/// tokens (at least one), and the rows before them the encoder's. Returns the index of the
/// first canvas sequence and its first row.
pub(crate) fn canvas_split(
    b: &ForwardBatch,
    canvases: usize,
    len: usize,
) -> Result<(usize, usize)> {
    let t = b.tokens.len();
    let bad = || {
        Error::Model(format!(
            "{canvases} canvases of {len} tokens do not end a batch of {} sequences, {t} rows",
            b.seqs.len()
        ))
    };
    let enc = (b.seqs.len().checked_sub(canvases))
        .filter(|_| canvases > 0)
        .ok_or_else(bad)?;
    let first = b.seqs[enc].q_start;
    if b.seqs[enc..].iter().any(|s| s.q_len != len) || t.checked_sub(first) != Some(canvases * len)
    {
        return Err(bad());
    }
    Ok((enc, first))
}

/// Writes `k`, `v` (`[T, kv_heads, dim]`) into layer `(g, gi)`'s cache at the batch's slots
/// (keys centered and fitted first where the cache keeps them so).
fn write_kv(
    ex: &Executor,
    bt: &BatchTensors,
    kv: &KvCaches,
    (g, gi): (usize, usize),
    (k, v): (&Tensor, &Tensor),
    capped: bool,
) -> Result<()> {
    let (kc, vc) = layer_cache(kv, (g, gi))?;
    let (_, slots) = bt
        .tables
        .get(g)
        .ok_or_else(|| Error::Model(format!("no block table for KV group {g}")))?;
    let keys = kv.keys_to_write(ex, (g, gi), k, capped)?;
    ex.kv_write(keys.as_ref().unwrap_or(k), v, slots, kc, vc)
}

/// Checks a batch against the model: tokens and positions agree, every id is in the
/// vocabulary. Returns the token count.
pub(crate) fn check_batch(b: &ForwardBatch, vocab: usize) -> Result<usize> {
    let t = b.tokens.len();
    if t == 0 || b.positions.len() != t {
        return Err(Error::Model(format!(
            "batch of {t} tokens with {} positions",
            b.positions.len()
        )));
    }
    let image_rows = b.image_rows();
    if let Some((_, &bad)) = b
        .tokens
        .iter()
        .enumerate()
        .find(|&(r, &tok)| tok as usize >= vocab && !image_rows.contains(&r))
    {
        return Err(Error::Model(format!(
            "token id {bad} is outside the vocabulary of {vocab}"
        )));
    }
    Ok(t)
}

/// The model's head on the rows that want logits (only those go through the final RMSNorm,
/// `(eps, one_plus)`, and the output matrix, fused where the backend has the fused op):
/// `[rows, vocab]`, soft-capped when `soft_cap` is set.
#[allow(clippy::too_many_arguments)]
pub(crate) fn logits_head(
    ex: &Executor,
    x: &Tensor,
    b: &ForwardBatch,
    out_norm: &Tensor,
    output: &Tensor,
    (eps, one_plus): (f32, bool),
    vocab: usize,
    soft_cap: Option<f32>,
) -> Result<Tensor> {
    let t = b.tokens.len();
    let rows: Vec<i32> = b.logits_rows.iter().map(|&r| r as i32).collect();
    if rows.is_empty() {
        return ex
            .backend()
            .alloc(&crate::TensorDesc::new(crate::DType::F32, [0, vocab]));
    }
    if rows.iter().any(|&r| r as usize >= t) {
        return Err(Error::Model(format!(
            "logits rows {:?} out of the batch of {t}",
            b.logits_rows
        )));
    }
    let sel = ex.get_rows(x, &step_input(ex, b, StepInput::LogitsRows)?)?;
    let mut logits = ex
        .rms_norm_matmuls(&sel, out_norm, eps, one_plus, &[output])?
        .remove(0);
    if let Some(c) = soft_cap {
        logits = ex.scale(&logits, 1.0 / c)?;
        logits = ex.unary(crate::op::UnaryOp::Tanh, &logits)?;
        logits = ex.scale(&logits, c)?;
    }
    Ok(logits)
}
