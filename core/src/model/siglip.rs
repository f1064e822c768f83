//! SigLIP's vision transformer and Gemma 3's projector: the image encoder of Gemma 3, read
//! from an mmproj GGUF (llama.cpp's `clip` architecture, projector type `gemma3`) or from a
//! Hugging Face checkpoint through the same view ([`crate::load::hf::vision`]).
//!
//! Per image (pixel values `[3, S, S]`): the `p × p` patches (an `S/p × S/p` grid, row-major)
//! embedded by the patch convolution (a matmul over each patch's `3·p·p` values, channel then
//! row then column, plus its bias) and the learned position embeddings; `L` pre-norm encoder
//! layers (LayerNorm, bidirectional multi-head attention with biases, LayerNorm, a GELU (tanh)
//! MLP with biases); the final LayerNorm. Gemma 3's projector then averages `k × k` blocks of
//! the patch grid (`k` = the metadata's scale factor) into the soft tokens, RMS-normalizes
//! them (its weight holds the `1 +`) and projects them into the text model's width.

use super::weights::Weights;
use crate::error::{Error, Result};
use crate::exec::Executor;
use crate::load::gguf::GgufFile;
use crate::op::{AttentionOp, AttnParams, Mask, Op, UnaryOp};
use crate::tensor::Tensor;

struct Layer {
    ln1: (Tensor, Tensor),
    q: (Tensor, Tensor),
    k: (Tensor, Tensor),
    v: (Tensor, Tensor),
    out: (Tensor, Tensor),
    ln2: (Tensor, Tensor),
    up: (Tensor, Tensor),
    down: (Tensor, Tensor),
}

/// A SigLIP encoder with Gemma 3's projector.
pub struct Siglip {
    /// Image side in pixels, patch side, hidden width, heads, text width, pooling factor.
    pub image: usize,
    pub patch: usize,
    hidden: usize,
    heads: usize,
    pub text_width: usize,
    pool: usize,
    eps: f32,
    patch_w: Tensor,
    patch_b: Tensor,
    pos: Tensor,
    layers: Vec<Layer>,
    post_ln: (Tensor, Tensor),
    soft_norm: Tensor,
    /// `[text_width, hidden]`.
    proj: Tensor,
}

use super::tower::{first, linear, meta_or, meta_usize, Shape};

impl Siglip {
    /// Builds the encoder from an mmproj view, its weights uploaded to `ex`'s backend.
    pub fn load(f: &GgufFile, ex: &Executor) -> Result<Siglip> {
        let kind = f.get_str("clip.projector_type")?;
        if kind != super::gemma3::PROJECTOR {
            return Err(Error::load(
                f.path(),
                format!(
                    "projector type {kind:?} is not supported ({} is)",
                    super::gemma3::PROJECTOR
                ),
            ));
        }
        let image = meta_usize(f, "clip.vision.image_size")?;
        let Shape {
            patch,
            hidden,
            ff,
            layers: n_layer,
            heads,
            text_width,
        } = Shape::read(f)?;
        // llama.cpp writes the pooling factor only where it is not Gemma 3's 4.
        let pool = meta_or(f, "clip.vision.projector.scale_factor", 4)?;
        let eps = f
            .get_f32("clip.vision.attention.layer_norm_epsilon")
            .unwrap_or(1e-6);
        let side = image / patch;
        if image % patch != 0 || side % pool != 0 || hidden % heads != 0 {
            return Err(Error::load(
                f.path(),
                format!("{image}-pixel images, {patch}-pixel patches, pooling {pool}, {hidden} wide in {heads} heads do not fit together"),
            ));
        }
        let mut w = Weights::new(f, ex);
        // Small tensors as f32 (norms, biases, the position table), whatever the file holds.
        let vecf = |w: &mut Weights, name: &str, shape: &[usize]| -> Result<Tensor> {
            let n = shape.iter().product();
            let v = w.host_f32(name, n)?;
            ex.upload_f32(shape, &v)
        };
        let pair = |w: &mut Weights, stem: &str, shape: &[usize]| -> Result<(Tensor, Tensor)> {
            let weight = match shape.len() {
                1 => vecf(w, &format!("{stem}.weight"), shape)?,
                _ => w.get(&format!("{stem}.weight"), shape)?,
            };
            let bias = vecf(w, &format!("{stem}.bias"), &shape[..1])?;
            Ok((weight, bias))
        };
        let pp = 3 * patch * patch;
        let patch_w = w
            .get("v.patch_embd.weight", &[hidden, 3, patch, patch])?
            .reshape([hidden, pp])?;
        let patch_b = vecf(&mut w, "v.patch_embd.bias", &[hidden])?;
        let pos = vecf(&mut w, "v.position_embd.weight", &[side * side, hidden])?;
        let mut layers = Vec::with_capacity(n_layer);
        for l in 0..n_layer {
            let s = |x: &str| format!("v.blk.{l}.{x}");
            layers.push(Layer {
                ln1: pair(&mut w, &s("ln1"), &[hidden])?,
                q: pair(&mut w, &s("attn_q"), &[hidden, hidden])?,
                k: pair(&mut w, &s("attn_k"), &[hidden, hidden])?,
                v: pair(&mut w, &s("attn_v"), &[hidden, hidden])?,
                out: pair(&mut w, &s("attn_out"), &[hidden, hidden])?,
                ln2: pair(&mut w, &s("ln2"), &[hidden])?,
                up: pair(&mut w, &s("ffn_up"), &[ff, hidden])?,
                down: pair(&mut w, &s("ffn_down"), &[hidden, ff])?,
            });
        }
        let post_ln = pair(&mut w, "v.post_ln", &[hidden])?;
        let soft_norm = vecf(&mut w, "mm.soft_emb_norm.weight", &[hidden])?;
        // Stored `[hidden, text]` (used as `x · W`): transposed for `x · Wᵀ`.
        let p = w.host_f32("mm.input_projection.weight", hidden * text_width)?;
        let mut t = vec![0f32; p.len()];
        for i in 0..hidden {
            for j in 0..text_width {
                t[j * hidden + i] = p[i * text_width + j];
            }
        }
        let proj = ex.upload_f32(&[text_width, hidden], &t)?;
        Ok(Siglip {
            image,
            patch,
            hidden,
            heads,
            text_width,
            pool,
            eps,
            patch_w,
            patch_b,
            pos,
            layers,
            post_ln,
            soft_norm,
            proj,
        })
    }

    /// Soft tokens per image.
    pub fn tokens_per_image(&self) -> usize {
        let n = self.image / self.patch / self.pool;
        n * n
    }

    fn layer_norm(&self, ex: &Executor, x: &Tensor, p: &(Tensor, Tensor)) -> Result<Tensor> {
        super::tower::layer_norm(ex, x, p, self.eps)
    }

    /// The soft tokens of one image's pixel values (`[3, S, S]`, channel planes):
    /// `[tokens_per_image, text_width]` f32 on `ex`'s backend.
    pub fn encode(&self, ex: &Executor, pixels: &[f32]) -> Result<Tensor> {
        let (s, p, d) = (self.image, self.patch, self.hidden);
        if pixels.len() != 3 * s * s {
            return Err(Error::Model(format!(
                "{} pixel values for a {s}x{s} RGB image",
                pixels.len()
            )));
        }
        let side = s / p;
        let n = side * side;
        let patches = super::tower::patches(pixels, s, s, p, |v| v);
        let x = ex.upload_f32(&[n, 3 * p * p], &patches)?;
        let x = ex.add(&ex.matmul(&x, &self.patch_w)?, &self.patch_b)?;
        let mut x = ex.add(&x, &self.pos)?;
        let hd = d / self.heads;
        let attn = AttnParams {
            scale: 1.0 / (hd as f32).sqrt(),
            soft_cap: None,
            mask: Mask::Bidirectional,
        };
        for l in &self.layers {
            let h = self.layer_norm(ex, &x, &l.ln1)?;
            let q = linear(ex, &h, &l.q)?.reshape([n, self.heads, hd])?;
            let k = linear(ex, &h, &l.k)?.reshape([n, self.heads, hd])?;
            let v = linear(ex, &h, &l.v)?.reshape([n, self.heads, hd])?;
            let a = first(ex.run(&Op::Attention(AttentionOp::Attention(attn)), &[&q, &k, &v])?)?
                .reshape([n, d])?;
            x = ex.add(&x, &linear(ex, &a, &l.out)?)?;
            let h = self.layer_norm(ex, &x, &l.ln2)?;
            let h = ex.unary(UnaryOp::GeluTanh, &linear(ex, &h, &l.up)?)?;
            x = ex.add(&x, &linear(ex, &h, &l.down)?)?;
        }
        let x = self.layer_norm(ex, &x, &self.post_ln)?;
        let pooled = super::tower::avg_pool(ex, &x, side, side, self.pool)?;
        let normed = ex.rms_norm(&pooled, &self.soft_norm, self.eps, false)?;
        ex.matmul(&normed, &self.proj)
    }
}
