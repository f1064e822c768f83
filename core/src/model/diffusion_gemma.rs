//! DiffusionGemma, a family of its own that wraps Gemma 4's layers (by delegation: it holds a
//! [`Gemma4`] and a canvas decoder). The layers run two ways over one paged KV cache:
//! causally as the encoder (the prompt, then each committed canvas, written to the cache:
//! [`super::Model::forward`]), and as the decoder ([`super::Denoiser::denoise`]), which
//! predicts every position of a canvas at once, attending to the cached prefix and to the
//! whole canvas (sliding layers see only the last `window - 1` keys before the canvas).
//!
//! The decoder's input is the canvas's token embeddings mixed with a self-conditioning signal:
//! the previous denoising step's processed logits turned into a soft embedding (the softmax
//! over the vocabulary times the embedding table, times `sqrt(hidden)`), through a gated MLP
//! between an RMSNorm and an unscaled RMSNorm: `post(x + mlp(pre(soft)))`. The soft
//! embedding is dense (every row of the table, exact) or sparse (the top `k` logits of each
//! position, softmax over those, `k` rows gathered: the fast path for a large vocabulary).

use super::blocks::{canvas_split, check_batch, GatedFfn};
use super::gemma4::GEMMA4_ROPE;
use super::gemma4::{Gemma4, Pass};
use super::weights::Weights;
use super::{CanvasInput, Denoiser, ForwardBatch, KvCaches, KvGroup, Model, ModelInfo};
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::load::gguf::Value;
use crate::load::hf::config::{Config, Meta};
use crate::load::hf::family::{f, fd, Field, HfFamily};
use crate::op::GluOp;
use crate::tensor::Tensor;

pub use super::SoftEmbedding;

/// DiffusionGemma (`diffusion-gemma`): Gemma 4's layers as a causal encoder, and a canvas
/// decoder over the same layers and cache.
pub struct DiffusionGemma {
    layers: Gemma4,
    canvas: Canvas,
}

pub fn build(f: &GgufFile, ex: &Executor) -> Result<Box<dyn Model>> {
    let layers = Gemma4::load(f, ex, false)?;
    let canvas = Canvas::load(f, ex, &layers)?;
    Ok(Box::new(DiffusionGemma { layers, canvas }))
}

impl Model for DiffusionGemma {
    fn info(&self) -> &ModelInfo {
        &self.layers.info
    }

    fn kv_groups(&self) -> &[KvGroup] {
        self.layers.kv_groups()
    }

    /// The encoder: the batch through the layers causally, each layer's output scaled by its
    /// encoder scalar, into the cache; logits as a language model's.
    fn forward(&self, ex: &Executor, b: &ForwardBatch, kv: &KvCaches) -> Result<Tensor> {
        let m = &self.layers;
        let x = m.causal(ex, b, kv, Pass::Encoder)?;
        m.head.logits(ex, &x, b, m.norm_spec(), m.soft_cap)
    }

    fn denoiser(&self) -> Option<&dyn Denoiser> {
        Some(self)
    }
}

impl Denoiser for DiffusionGemma {
    fn canvas_length(&self) -> usize {
        self.canvas.length
    }

    fn denoise(
        &self,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        canvases: &[CanvasInput<'_>],
    ) -> Result<Tensor> {
        self.canvas.denoise(&self.layers, ex, b, kv, canvases)
    }

    fn set_soft_embedding(&self, s: SoftEmbedding) {
        self.canvas.set_soft_embedding(s)
    }
}

/// The decoder's own parts.
pub struct Canvas {
    /// Tokens per canvas.
    pub length: usize,
    sc_norm: Tensor,
    sc_mlp: GatedFfn,
    /// Ones `[hidden]`: the post-norm has no scale.
    ones: Tensor,
    /// The embedding table transposed, `[hidden, vocab]` f32, for the dense soft embedding
    /// (built on first use).
    embd_t: std::sync::OnceLock<Tensor>,
    /// How the soft embedding is formed.
    pub soft: std::sync::RwLock<SoftEmbedding>,
}

impl Canvas {
    fn load(f: &GgufFile, ex: &Executor, m: &Gemma4) -> Result<Canvas> {
        let key = f.arch_key("diffusion.canvas_length");
        let length = f.get_u64(&key)? as usize;
        if length == 0 {
            return Err(Error::load(f.path(), "canvas_length is 0"));
        }
        let e = m.info.n_embd;
        let mut w = Weights::new(f, ex);
        let ff = f
            .tensor("self_cond.gate.weight")?
            .shape
            .first()
            .copied()
            .unwrap_or(0);
        let sc_mlp = GatedFfn {
            gate: w.get("self_cond.gate.weight", &[ff, e])?,
            up: w.get("self_cond.up.weight", &[ff, e])?,
            down: w.get("self_cond.down.weight", &[e, ff])?,
            act: GluOp::GeGlu,
        };
        // Dense is exact; past a vocabulary of 32 Ki rows the top-k form is the default.
        let soft = match m.info.vocab > 32_768 {
            true => SoftEmbedding::TopK(256),
            false => SoftEmbedding::Dense,
        };
        Ok(Canvas {
            length,
            sc_norm: w.get("self_cond.norm.weight", &[e])?,
            sc_mlp,
            ones: ex.upload_f32(&[e], &vec![1.0; e])?,
            embd_t: std::sync::OnceLock::new(),
            soft: std::sync::RwLock::new(soft),
        })
    }

    /// Sets how the soft embedding is formed (`TopK(k)` with `k` ≥ the vocabulary is dense).
    pub fn set_soft_embedding(&self, s: SoftEmbedding) {
        if let Ok(mut g) = self.soft.write() {
            *g = s;
        }
    }

    fn soft_embedding(&self) -> SoftEmbedding {
        self.soft.read().map_or(SoftEmbedding::Dense, |g| *g)
    }

    /// The embedding table transposed (for `probs · table`), made once.
    fn table_t(&self, ex: &Executor, m: &Gemma4) -> Result<&Tensor> {
        if let Some(t) = self.embd_t.get() {
            return Ok(t);
        }
        let table = &m.head.tok_embd;
        let (v, e) = (m.info.vocab, m.info.n_embd);
        let ids: Vec<i32> = (0..v as i32).collect();
        let rows = ex.get_rows(table, &ex.upload_i32(&[v], &ids)?)?;
        let host = ex.download_f32(&rows)?;
        let mut t = vec![0f32; v * e];
        for (r, row) in host.chunks_exact(e).enumerate() {
            for (c, &x) in row.iter().enumerate() {
                t[c * v + r] = x;
            }
        }
        let up = ex.upload_f32(&[e, v], &t)?;
        Ok(self.embd_t.get_or_init(|| up))
    }

    /// `softmax(logits) · table · sqrt(hidden)`, `[T, hidden]`.
    fn soft(&self, ex: &Executor, m: &Gemma4, logits: &Tensor) -> Result<Tensor> {
        let (v, e) = (m.info.vocab, m.info.n_embd);
        let d = logits.shape().dims();
        if d.len() != 2 || d[1] != v {
            return Err(Error::Model(format!(
                "self-conditioning logits must be [rows, {v}], not {d:?}"
            )));
        }
        let top_k = match self.soft_embedding() {
            SoftEmbedding::TopK(k) if k < v => k.max(1),
            _ => 0,
        };
        let soft = ex.soft_embedding(logits, &m.head.tok_embd, top_k, || self.table_t(ex, m))?;
        ex.scale(&soft, (e as f32).sqrt())
    }

    /// A canvas's rows of the decoder's input: its token embeddings, plus the
    /// self-conditioning MLP's output when it has the last step's logits, normed.
    fn input(&self, m: &Gemma4, ex: &Executor, c: &CanvasInput<'_>) -> Result<Tensor> {
        if c.ids.numel() != self.length {
            return Err(Error::Model(format!(
                "{} canvas ids; this model's canvas holds {}",
                c.ids.numel(),
                self.length
            )));
        }
        let x0 = ex.get_rows(&m.head.tok_embd, c.ids)?;
        let x = ex.scale(&x0, (m.info.n_embd as f32).sqrt())?;
        let ns = m.norm_spec();
        // Without self-conditioning the MLP's input is zero, and so is its output.
        let x = match c.self_cond {
            Some(l) => {
                if l.shape().dims().first() != Some(&self.length) {
                    return Err(Error::Model(format!(
                        "{} rows of self-conditioning logits for {} canvas tokens",
                        l.shape().dims().first().copied().unwrap_or(0),
                        self.length
                    )));
                }
                let soft = self.soft(ex, m, l)?;
                let y = self.sc_mlp.forward(ex, &soft, &self.sc_norm, ns)?;
                ex.add(&x, &y)?
            }
            None => x,
        };
        ex.rms_norm(&x, &self.ones, ns.eps, false)
    }

    fn denoise(
        &self,
        m: &Gemma4,
        ex: &Executor,
        b: &ForwardBatch,
        kv: &KvCaches,
        canvases: &[CanvasInput<'_>],
    ) -> Result<Tensor> {
        check_batch(b, m.info.vocab)?;
        let (enc, _) = canvas_split(b, canvases.len(), self.length)?;
        let xs = canvases
            .iter()
            .map(|c| self.input(m, ex, c))
            .collect::<Result<Vec<_>>>()?;
        let x = match xs.as_slice() {
            [one] => one.clone(),
            many => ex.concat_rows(&many.iter().collect::<Vec<_>>())?,
        };
        let x = m.mixed(ex, b, kv, enc, x, self.length)?;
        m.head.logits(ex, &x, b, m.norm_spec(), m.soft_cap)
    }
}

// ---- Hugging Face checkpoints ----

/// What absent and null fields mean (transformers' class defaults).
const DIFFUSION_GEMMA: &[Field] = &[
    f("rms_norm_eps", "1e-6", true),
    f("max_position_embeddings", "131072", true),
    f("sliding_window", "512", true),
    // Unlike Gemma 4's: 30. Null is no cap (transformers 5.23's forward divides by it
    // unconditionally and fails).
    f("final_logit_softcapping", "30.0", false),
    fd("rope_parameters", GEMMA4_ROPE),
];

/// DiffusionGemma checkpoints: Gemma 4's metadata (K = V on the full layers, which have no V
/// projection), the canvas length, the self-conditioning block; the encoder's copies of the
/// decoder's tensors.
pub const HF: HfFamily = HfFamily {
    encoder_copies: true,
    defaults: &[
        ("diffusion_gemma", DIFFUSION_GEMMA),
        ("diffusion_gemma_text", DIFFUSION_GEMMA),
    ],
    ..HfFamily::new(
        &[
            ("diffusion_gemma", "diffusion-gemma"),
            ("diffusion_gemma_text", "diffusion-gemma"),
        ],
        hf_meta,
        hf_names,
    )
};

/// The GGUF architecture of this file and its checkpoints.
pub const FAMILY: super::Family = super::Family {
    archs: &[("diffusion-gemma", build)],
    hf: &[&HF],
};

fn hf_meta(c: &Config, m: &mut Meta) -> Result<()> {
    super::gemma4::hf_meta(c, m)?;
    // The text config drops `attention_k_eq_v`; transformers then takes K as V on the full
    // layers (they have no V projection).
    m.kv.retain(|(k, _)| !k.ends_with(".attention.k_eq_v"));
    m.set("attention.k_eq_v", Value::Bool(true));
    let canvas = c
        .root
        .get("canvas_length")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(256) as usize;
    if canvas == 0 || canvas > 65_536 {
        return Err(c.err(format!("canvas_length {canvas} is out of range")));
    }
    m.u("diffusion.canvas_length", canvas);
    Ok(())
}

fn hf_names(hf: &str) -> Option<String> {
    let own = match hf {
        "self_conditioning.pre_norm.weight" => Some("self_cond.norm.weight"),
        "self_conditioning.gate_proj.weight" => Some("self_cond.gate.weight"),
        "self_conditioning.up_proj.weight" => Some("self_cond.up.weight"),
        "self_conditioning.down_proj.weight" => Some("self_cond.down.weight"),
        _ => None,
    };
    match own {
        Some(n) => Some(n.into()),
        None => super::gemma4::layer_names(hf, false),
    }
}
