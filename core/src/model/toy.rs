//! A toy model for engine tests: two attention layers (one full, one sliding-window) over a
//! small vocabulary, with fixed pseudo-random weights made in code — no file, no download — so
//! the engine's scheduling, preemption, cancellation, prefix caching, speculative verification
//! and rollback are tested in milliseconds. It is a real model to the engine: its K/V go
//! through the paged cache and its logits depend on every token its layers can see, so a
//! wrong block table, a stale slot or a lost token changes its output.
//!
//! Per layer: `x += attn(norm(x))·Wo`; then logits `= norm(x)·Outᵀ`, an output matrix of its
//! own, so a greedy continuation wanders over the vocabulary instead of repeating a token. It
//! hands out its final-normed hidden state (embeddings, MTP-style drafters).
//!
//! [`ToyDiffusion`] is the same toy as a block-diffusion model: the toy runs causally as its
//! encoder, and its decoder runs the same layers over canvases of its canvas length, which
//! attend to their whole canvas and the cached prefix (the sliding layer to the last
//! `window` keys before the canvas); a canvas pass may carry the encoder's rows beside it.

use super::blocks::{attention, canvas_split, check_batch, logits_head, upload_batch, Split};
use super::{CanvasInput, Denoiser, Features, ForwardBatch, KvCaches, KvGroup, Model, ModelInfo};
use crate::error::Result;
use crate::exec::Executor;
use crate::op::{AttentionOp, AttnParams, Mask, Op, RopeMode, RopeParams};
use crate::tensor::Tensor;
use crate::validate::rng::Rng;

/// Hidden width, heads and head size of the toy.
const E: usize = 32;
const HEADS: usize = 2;
const HD: usize = 16;

struct Layer {
    norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    /// (KV group, index of the layer in it).
    kv: (usize, usize),
    window: Option<usize>,
}

/// The toy model (see the module's documentation).
pub struct Toy {
    info: ModelInfo,
    groups: Vec<KvGroup>,
    tok_embd: Tensor,
    out_norm: Tensor,
    /// `[vocab, E]`, untied: with the embeddings tied, each token would predict itself.
    output: Tensor,
    layers: Vec<Layer>,
    rope: RopeParams,
}

/// A toy of `vocab` tokens (at least 2) whose sliding layer sees `window` tokens, its weights
/// drawn from `seed`.
pub fn toy(ex: &Executor, vocab: usize, window: usize, seed: u64) -> Result<Box<dyn Model>> {
    Ok(Box::new(Toy::new(ex, vocab, window, seed)?))
}

impl Toy {
    /// The toy itself (the same weights for the same arguments), for [`Toy::greedy_reference`].
    pub fn new(ex: &Executor, vocab: usize, window: usize, seed: u64) -> Result<Toy> {
        build(ex, vocab, window, seed)
    }

    /// The oracle the engine is checked against: `n` greedy tokens after `prompt`, each from a
    /// pass over the whole sequence with contiguous attention — no KV cache, no block table,
    /// no scheduler.
    pub fn greedy_reference(&self, ex: &Executor, prompt: &[u32], n: usize) -> Result<Vec<u32>> {
        let mut seq = prompt.to_vec();
        for _ in 0..n {
            let t = seq.len();
            let ids: Vec<i32> = seq.iter().map(|&x| x as i32).collect();
            let pos: Vec<i32> = (0..t as i32).collect();
            let pos = ex.upload_i32(&[t], &pos)?;
            let mut x = ex.get_rows(&self.tok_embd, &ex.upload_i32(&[t], &ids)?)?;
            for layer in &self.layers {
                let (q, k, v, p) = self.qkv(ex, layer, &x, &pos, t)?;
                let a = ex.run(&Op::Attention(AttentionOp::Attention(p)), &[&q, &k, &v])?;
                let a = a
                    .into_iter()
                    .next()
                    .ok_or_else(|| crate::Error::Model("attention gave nothing".into()))?
                    .reshape([t, HEADS * HD])?;
                x = ex.add(&x, &ex.matmul(&a, &layer.wo)?)?;
            }
            let h = ex.rms_norm(&x, &self.out_norm, 1e-6, false)?;
            let logits = ex.download_f32(&ex.matmul(&h, &self.output)?)?;
            let last = &logits[(t - 1) * self.info.vocab..];
            let best = (0..last.len())
                .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
                .unwrap_or(0);
            seq.push(best as u32);
        }
        Ok(seq[prompt.len()..].to_vec())
    }
}

impl Toy {
    /// A layer's normed input projected to Q, K (both rotated at `pos`) and V, `[t, heads,
    /// dim]`, and its attention settings: what the cached and the oracle pass share.
    fn qkv(
        &self,
        ex: &Executor,
        layer: &Layer,
        x: &Tensor,
        pos: &Tensor,
        t: usize,
    ) -> Result<(Tensor, Tensor, Tensor, AttnParams)> {
        let h = ex.rms_norm(x, &layer.norm, 1e-6, false)?;
        let q = ex.matmul(&h, &layer.wq)?.reshape([t, HEADS, HD])?;
        let k = ex.matmul(&h, &layer.wk)?.reshape([t, HEADS, HD])?;
        let v = ex.matmul(&h, &layer.wv)?.reshape([t, HEADS, HD])?;
        let q = ex.rope(&q, pos, self.rope, None)?;
        let k = ex.rope(&k, pos, self.rope, None)?;
        let p = AttnParams {
            scale: 1.0 / (HD as f32).sqrt(),
            soft_cap: None,
            mask: layer.window.map_or(Mask::Causal, Mask::SlidingWindow),
        };
        Ok((q, k, v, p))
    }
}

fn build(ex: &Executor, vocab: usize, window: usize, seed: u64) -> Result<Toy> {
    if vocab < 2 || window == 0 {
        return Err(crate::Error::Model(format!(
            "a toy needs 2 or more tokens and a window, not {vocab} and {window}"
        )));
    }
    let mut rng = Rng::new(seed);
    let mut mat = |rows: usize, cols: usize, scale: f32| -> Result<Tensor> {
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * scale).collect();
        ex.upload_f32(&[rows, cols], &v)
    };
    let proj = 1.0 / (E as f32).sqrt();
    let tok_embd = mat(vocab, E, 1.0)?;
    let output = mat(vocab, E, 2.0)?;
    let mut layers = Vec::new();
    for (l, window) in [None, Some(window)].into_iter().enumerate() {
        layers.push(Layer {
            norm: ex.upload_f32(&[E], &[1.0; E])?,
            wq: mat(HEADS * HD, E, proj)?,
            wk: mat(HEADS * HD, E, proj)?,
            wv: mat(HEADS * HD, E, proj)?,
            wo: mat(E, HEADS * HD, 2.0 * proj)?,
            kv: (l, 0),
            window,
        });
    }
    let groups = layers
        .iter()
        .enumerate()
        .map(|(l, layer)| KvGroup {
            layers: vec![l],
            window: layer.window,
            n_kv_heads: HEADS,
            head_dim: HD,
            v_head_dim: HD,
        })
        .collect();
    Ok(Toy {
        info: ModelInfo {
            architecture: "toy".into(),
            name: Some("toy".into()),
            n_layer: layers.len(),
            n_embd: E,
            n_head: HEADS,
            n_head_kv: HEADS,
            head_dim: HD,
            n_ff: 0,
            vocab,
            context_length: 4096,
            n_params: ((2 * vocab + 4 * layers.len() * HEADS * HD) * E) as u64,
            dtypes: vec![(crate::DType::F32, 3 + 5 * layers.len())],
        },
        groups,
        tok_embd,
        out_norm: ex.upload_f32(&[E], &[1.0; E])?,
        output,
        layers,
        rope: RopeParams::new(RopeMode::Neox, HD, 10_000.0),
    })
}

impl Toy {
    /// The layers over the embedded batch `x`; with `canvases = (seqs, len)`, the batch's
    /// sequences from `seqs` on are canvases of `len` tokens (bidirectional over the canvas).
    fn layers(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        mut x: Tensor,
        canvases: Option<(usize, usize)>,
    ) -> Result<Tensor> {
        let t = b.tokens.len();
        let bt = upload_batch(ex, b, self.groups.len())?;
        let split = match canvases {
            Some((seqs, _)) if seqs > 0 => Some(Split::new(ex, b, seqs, self.groups.len())?),
            _ => None,
        };
        for layer in &self.layers {
            let (q, k, v, p) = self.qkv(ex, layer, &x, &bt.positions, t)?;
            let canvas_p = |c: usize| AttnParams {
                mask: match layer.window {
                    Some(w) => Mask::Lookback(c + w),
                    None => Mask::Bidirectional,
                },
                ..p
            };
            let a = match (canvases, &split) {
                (Some((_, c)), Some(sp)) => {
                    sp.attention(ex, &bt, kv, layer.kv, &q, Some((&k, &v)), (p, canvas_p(c)))?
                }
                (Some((_, c)), None) => {
                    attention(ex, &bt, kv, layer.kv, &q, Some((&k, &v)), canvas_p(c))?
                }
                (None, _) => attention(ex, &bt, kv, layer.kv, &q, Some((&k, &v)), p)?,
            };
            x = ex.matmul_add(&a, &layer.wo, &x)?;
        }
        Ok(x)
    }

    fn embed(&self, ex: &Executor, tokens: &[u32]) -> Result<Tensor> {
        let ids: Vec<i32> = tokens.iter().map(|&x| x as i32).collect();
        ex.get_rows(&self.tok_embd, &ex.upload_i32(&[ids.len()], &ids)?)
    }

    fn head(&self, ex: &Executor, x: &Tensor, b: &ForwardBatch) -> Result<Tensor> {
        let (norm, out) = (&self.out_norm, &self.output);
        logits_head(ex, x, b, norm, out, (1e-6, false), self.info.vocab, None)
    }
}

impl Model for Toy {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        &self.groups
    }

    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        check_batch(b, self.info.vocab)?;
        let x = self.layers(ex, b, kv, self.embed(ex, &b.tokens)?, None)?;
        self.head(ex, &x, b)
    }

    fn forward_features(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        f: &Features,
    ) -> Result<(Tensor, Vec<Tensor>)> {
        if *f != Features::Final {
            return Err(crate::Error::Model(format!(
                "the toy hands out its final hidden state, not {f:?}"
            )));
        }
        check_batch(b, self.info.vocab)?;
        let x = self.layers(ex, b, kv, self.embed(ex, &b.tokens)?, None)?;
        let h = ex.rms_norm(&x, &self.out_norm, 1e-6, false)?;
        Ok((self.head(ex, &x, b)?, vec![h]))
    }

    fn gives(&self, f: &Features) -> bool {
        *f == Features::Final
    }
}

/// The toy as a block-diffusion model (see the module's documentation). The decoder ignores
/// self-conditioning.
pub struct ToyDiffusion {
    toy: Toy,
    canvas: usize,
}

impl ToyDiffusion {
    /// The toy of [`Toy::new`] with canvases of `canvas` tokens (at least 1).
    pub fn new(
        ex: &Executor,
        vocab: usize,
        window: usize,
        seed: u64,
        canvas: usize,
    ) -> Result<ToyDiffusion> {
        if canvas == 0 {
            return Err(crate::Error::Model("a canvas of no tokens".into()));
        }
        let mut toy = build(ex, vocab, window, seed)?;
        toy.info.architecture = "toy-diffusion".into();
        Ok(ToyDiffusion { toy, canvas })
    }
}

impl Model for ToyDiffusion {
    fn info(&self) -> &ModelInfo {
        &self.toy.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        &self.toy.groups
    }

    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        self.toy.forward(ex, b, kv)
    }

    fn denoiser(&self) -> Option<&dyn Denoiser> {
        Some(self)
    }
}

impl Denoiser for ToyDiffusion {
    fn canvas_length(&self) -> usize {
        self.canvas
    }

    fn denoise(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        canvases: &[CanvasInput<'_>],
    ) -> Result<Tensor> {
        let toy = &self.toy;
        check_batch(b, toy.info.vocab)?;
        let (enc, first) = canvas_split(b, canvases.len(), self.canvas)?;
        if canvases.iter().any(|c| c.ids.numel() != self.canvas) {
            return Err(crate::Error::Model(format!(
                "canvas ids must be {} tokens",
                self.canvas
            )));
        }
        let mut parts = Vec::with_capacity(canvases.len() + 1);
        if first > 0 {
            parts.push(toy.embed(ex, &b.tokens[..first])?);
        }
        for c in canvases {
            parts.push(ex.get_rows(&toy.tok_embd, c.ids)?);
        }
        let x = ex.concat_rows(&parts.iter().collect::<Vec<_>>())?;
        let x = toy.layers(ex, b, kv, x, Some((enc, self.canvas)))?;
        toy.head(ex, &x, b)
    }

    fn set_soft_embedding(&self, _: super::SoftEmbedding) {}
}
