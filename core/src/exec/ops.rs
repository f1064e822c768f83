//! Convenience calls on the executor: one method per op, so model code reads as the math.
//! Every call still goes through `Executor::run`/`exec` (checks, dispatch, fallback).

use super::Executor;
use crate::error::{Error, Result};
use crate::op::{
    AttentionOp, AttnParams, ConvOp, DeltaNetOp, ElementwiseOp, GetRowsOp, GluOp, MatMulOp,
    MoeGating, MoeOp, NormOp, Op, RopeOp, RopeParams, SoftmaxOp, UnaryOp, MAX_SHARED_NORM,
};
use crate::quant;
use crate::tensor::{DType, Tensor, TensorDesc};

impl Executor {
    /// The two outputs of an op that has two (output, new state; weights, ids).
    fn two(&self, op: &Op, inputs: &[&Tensor]) -> Result<(Tensor, Tensor)> {
        let mut out = self.run(op, inputs)?.into_iter();
        match (out.next(), out.next()) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(Error::Op {
                op: op.name().into(),
                msg: "produced fewer than two outputs".into(),
                inputs: String::new(),
                outputs: String::new(),
            }),
        }
    }

    /// One denoising draw (`op`, an [`crate::op::CanvasOp::CanvasDraw`]) over a canvas's `logits [T, V]`:
    /// (processed logits, argmax, drawn tokens, entropies).
    pub fn canvas_draw(
        &self,
        op: &Op,
        logits: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
        let mut out = self.run(op, &[logits])?.into_iter();
        match (out.next(), out.next(), out.next(), out.next()) {
            (Some(a), Some(b), Some(c), Some(d)) => Ok((a, b, c, d)),
            _ => Err(Error::Op {
                op: op.name().into(),
                msg: "produced fewer than four outputs".into(),
                inputs: String::new(),
                outputs: String::new(),
            }),
        }
    }
    /// Entropy-bound acceptance of a draw: updates `canvas`, `history` and `status` in place;
    /// see [`crate::op::CanvasOp::CanvasAccept`].
    pub fn canvas_accept(
        &self,
        op: &Op,
        draw: [&Tensor; 3],
        canvas: &Tensor,
        history: &Tensor,
        status: &Tensor,
    ) -> Result<()> {
        self.exec(op, &draw, &[canvas, history, status])
    }
    /// Each token's rows of `w` (experts `[E, N, K]`) chosen by `ids [T, k]`: `[T, k, N]`.
    pub fn matmul_id(&self, x: &Tensor, w: &Tensor, ids: &Tensor) -> Result<Tensor> {
        self.one(&Op::Moe(MoeOp::MatMulId), &[x, w, ids])
    }
    /// `Σⱼ x[t, j, :] · weights[t, j]`: the experts' outputs mixed by their weights.
    pub fn moe_sum(&self, x: &Tensor, weights: &Tensor) -> Result<Tensor> {
        self.one(&Op::Moe(MoeOp::MoeSum), &[x, weights])
    }
    /// The top `k` experts of each token's router logits: (weights, ids).
    pub fn moe_route(
        &self,
        logits: &Tensor,
        k: usize,
        gating: MoeGating,
        normalize: bool,
    ) -> Result<(Tensor, Tensor)> {
        let op = Op::Moe(MoeOp::MoeRoute {
            k,
            gating,
            normalize,
        });
        self.two(&op, &[logits])
    }
    /// L2 normalisation of each row of the last dimension.
    pub fn l2_norm(&self, x: &Tensor, eps: f32) -> Result<Tensor> {
        self.one(&Op::Norm(NormOp::L2Norm { eps }), &[x])
    }
    /// Causal depthwise conv1d over each sequence, continuing from `state`: (output, new
    /// state).
    pub fn conv1d(
        &self,
        silu: bool,
        x: &Tensor,
        w: &Tensor,
        state: &Tensor,
        seq_start: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.two(
            &Op::Conv(ConvOp::Conv1d { silu }),
            &[x, w, state, seq_start],
        )
    }
    /// The Gated DeltaNet recurrence over each sequence, from `state`: (output, new state).
    #[allow(clippy::too_many_arguments)]
    pub fn delta_net(
        &self,
        scale: f32,
        chunk: Option<usize>,
        qkv: [&Tensor; 3],
        g: &Tensor,
        beta: &Tensor,
        state: &Tensor,
        seq_start: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let [q, k, v] = qkv;
        self.two(
            &Op::DeltaNet(DeltaNetOp::DeltaNet { scale, chunk }),
            &[q, k, v, g, beta, state, seq_start],
        )
    }

    fn one(&self, op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
        self.run(op, inputs)?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Op {
                op: op.name().into(),
                msg: "produced no output".into(),
                inputs: String::new(),
                outputs: String::new(),
            })
    }

    /// A tensor on the backend holding `bytes`.
    pub fn upload(&self, desc: &TensorDesc, bytes: &[u8]) -> Result<Tensor> {
        if self.capturing() {
            return Err(Error::backend(
                self.backend().name(),
                format!("an upload of {desc} inside a recorded step (only step inputs are filled before a replay)"),
            ));
        }
        let t = self.backend().alloc(desc)?;
        self.backend().upload(&t, bytes)?;
        Ok(t)
    }
    pub fn upload_f32(&self, shape: &[usize], v: &[f32]) -> Result<Tensor> {
        self.upload(&TensorDesc::new(DType::F32, shape), bytemuck::cast_slice(v))
    }
    pub fn upload_i32(&self, shape: &[usize], v: &[i32]) -> Result<Tensor> {
        self.upload(&TensorDesc::new(DType::I32, shape), bytemuck::cast_slice(v))
    }
    /// A tensor's elements as f32, dequantized if need be.
    pub fn download_f32(&self, t: &Tensor) -> Result<Vec<f32>> {
        let bytes = self.backend().download(t)?;
        f32s(t, bytes)
    }
    /// [`Executor::download_f32`] through `download_async` (what a browser can wait for).
    pub async fn download_f32_async(&self, t: &Tensor) -> Result<Vec<f32>> {
        let bytes = self.backend().download_async(t).await?;
        f32s(t, bytes)
    }
    pub fn download_i32(&self, t: &Tensor) -> Result<Vec<i32>> {
        if t.dtype() != DType::I32 {
            return Err(Error::Tensor(format!("{t:?} is not i32")));
        }
        let bytes = self.backend().download(t)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    pub fn matmul(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        self.one(&Op::MatMul(MatMulOp::MatMul), &[x, w])
    }
    pub fn get_rows(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        self.one(&Op::GetRows(GetRowsOp::GetRows), &[table, ids])
    }
    /// Rows `rows` of `x` (`[R, ..]`, split along its first axis) as a tensor of their own
    /// (copied, so every kernel sees them at offset 0).
    pub fn rows(&self, x: &Tensor, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let d = x.shape().dims();
        let n = d.first().copied().unwrap_or(0);
        if rows.start > rows.end || rows.end > n {
            return Err(Error::Tensor(format!("rows {rows:?} of {}", x.desc())));
        }
        let per = x.numel() / n.max(1);
        let mut shape = d.to_vec();
        shape[0] = rows.len();
        let v = x.view(rows.start * per, shape)?;
        self.one(&Op::Elementwise(ElementwiseOp::Copy), &[&v])
    }
    /// `parts` (`[R_i, ..]`, one dtype and the same trailing shape) one after another along
    /// the first axis: `[Σ R_i, ..]`.
    pub fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let first = parts
            .first()
            .ok_or_else(|| Error::Tensor("a concatenation of nothing".into()))?;
        let d = first.shape().dims();
        let rest = d.get(1..).unwrap_or(&[]);
        let mut total = 0;
        for p in parts {
            let pd = p.shape().dims();
            if p.dtype() != first.dtype() || pd.get(1..).unwrap_or(&[]) != rest {
                return Err(Error::Tensor(format!(
                    "rows of {} and {} do not concatenate",
                    first.desc(),
                    p.desc()
                )));
            }
            total += pd.first().copied().unwrap_or(0);
        }
        let mut shape = vec![total];
        shape.extend_from_slice(rest);
        let out = self
            .backend()
            .alloc(&TensorDesc::new(first.dtype(), shape))?;
        let mut at = 0;
        for p in parts {
            if p.numel() > 0 {
                let dst = out.view(at, p.shape().clone())?;
                self.exec(&Op::Elementwise(ElementwiseOp::Copy), &[p], &[&dst])?;
            }
            at += p.numel();
        }
        Ok(out)
    }
    pub fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.one(&Op::Elementwise(ElementwiseOp::Add), &[a, b])
    }
    pub fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.one(&Op::Elementwise(ElementwiseOp::Mul), &[a, b])
    }
    pub fn scale(&self, x: &Tensor, s: f32) -> Result<Tensor> {
        self.one(&Op::Elementwise(ElementwiseOp::Scale(s)), &[x])
    }
    pub fn unary(&self, u: UnaryOp, x: &Tensor) -> Result<Tensor> {
        self.one(&Op::Elementwise(ElementwiseOp::Unary(u)), &[x])
    }
    /// Row softmax of `x · scale`.
    pub fn softmax(&self, x: &Tensor, scale: f32) -> Result<Tensor> {
        self.one(
            &Op::Softmax(SoftmaxOp::Softmax {
                scale,
                soft_cap: None,
            }),
            &[x],
        )
    }
    pub fn glu(&self, g: GluOp, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        self.one(&Op::Elementwise(ElementwiseOp::Glu(g)), &[gate, up])
    }
    pub fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32, one_plus: bool) -> Result<Tensor> {
        self.one(&Op::Norm(NormOp::RmsNorm { eps, one_plus }), &[x, w])
    }
    pub fn rope(
        &self,
        x: &Tensor,
        pos: &Tensor,
        p: RopeParams,
        factors: Option<&Tensor>,
    ) -> Result<Tensor> {
        match factors {
            Some(f) => self.one(&Op::Rope(RopeOp::Rope(p)), &[x, pos, f]),
            None => self.one(&Op::Rope(RopeOp::Rope(p)), &[x, pos]),
        }
    }
    /// RoPE of `q` and `k` and the K/V write of the rotated `k` and `v` as one op, where the
    /// backend runs it: the rotated `q`, or `None` where it does not (the caller then runs
    /// `rope`, `rope` and `kv_write`). Not on the CPU reference (its three ops are the same
    /// arithmetic) and not into TurboQuant caches (their rows are rotated first).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_kv_write(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        (pos, slots): (&Tensor, &Tensor),
        p: RopeParams,
        factors: Option<&Tensor>,
        (k_cache, v_cache): (&Tensor, &Tensor),
    ) -> Result<Option<Tensor>> {
        if self.on_cpu() || k_cache.dtype().is_turbo() || v_cache.dtype().is_turbo() {
            return Ok(None);
        }
        let op = Op::Attention(AttentionOp::RopeKvWrite(p));
        let mut ins = vec![q, k, v, pos, slots];
        ins.extend(factors);
        let in_descs: Vec<&TensorDesc> = ins.iter().map(|t| t.desc()).collect();
        let outs = [q.desc(), k_cache.desc(), v_cache.desc()];
        if !self.supports_op(&op, &in_descs, &outs) {
            return Ok(None);
        }
        let q_out = self.backend().alloc(q.desc())?;
        self.exec(&op, &ins, &[&q_out, k_cache, v_cache])?;
        Ok(Some(q_out))
    }
    #[allow(clippy::too_many_arguments)]
    /// Paged attention (`key_end`: see [`AttentionOp::PagedAttention`]). A TurboQuant cache (`tq*`, [`quant::turbo`]) holds rotated rows: the
    /// queries are rotated the same way before they are scored against a rotated K, and the
    /// output is rotated back when V is rotated.
    pub fn paged_attention(
        &self,
        p: AttnParams,
        q: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
        block_table: &Tensor,
        seq_lens: &Tensor,
        q_start: &Tensor,
        key_end: Option<&Tensor>,
    ) -> Result<Tensor> {
        let rq;
        let q = if k_cache.dtype().is_turbo() {
            rq = self.turbo_rotate(q, false)?;
            &rq
        } else {
            q
        };
        let mut inputs = vec![q, k_cache, v_cache, block_table, seq_lens, q_start];
        inputs.extend(key_end);
        let out = self.one(&Op::Attention(AttentionOp::PagedAttention(p)), &inputs)?;
        if v_cache.dtype().is_turbo() {
            return self.turbo_rotate(&out, true);
        }
        Ok(out)
    }

    /// Writes `k`, `v` into the caches at `slots`; rows bound for a TurboQuant cache are
    /// rotated first ([`Executor::paged_attention`]).
    pub fn kv_write(
        &self,
        k: &Tensor,
        v: &Tensor,
        slots: &Tensor,
        k_cache: &Tensor,
        v_cache: &Tensor,
    ) -> Result<()> {
        let (rk, rv);
        let k = if k_cache.dtype().is_turbo() {
            rk = self.turbo_rotate(k, false)?;
            &rk
        } else {
            k
        };
        let v = if v_cache.dtype().is_turbo() {
            rv = self.turbo_rotate(v, false)?;
            &rv
        } else {
            v
        };
        self.exec(
            &Op::Attention(AttentionOp::KvWrite),
            &[k, v, slots],
            &[k_cache, v_cache],
        )
    }

    /// Each head row of `x [.., d]` times the TurboQuant rotation ([`quant::turbo::rotate`]),
    /// or its inverse: a matmul by the `d × d` matrix, uploaded once per head dim, so every
    /// backend runs it with the matmul it has.
    pub fn turbo_rotate(&self, x: &Tensor, inverse: bool) -> Result<Tensor> {
        let d = x.shape().last();
        if !quant::turbo::rotatable(d) {
            return Err(Error::Model(format!(
                "a TurboQuant KV cache needs a power-of-two head dimension of at least 32, not {d}"
            )));
        }
        let m = {
            let mut held = self
                .rotations
                .lock()
                .map_err(|_| Error::Model("rotation cache poisoned".into()))?;
            match held.get(&(d, inverse)) {
                Some(m) => m.clone(),
                None => {
                    let m = self.upload_f32(&[d, d], &quant::turbo::rotation_matrix(d, inverse))?;
                    held.insert((d, inverse), m.clone());
                    m
                }
            }
        };
        self.matmul(x, &m)
    }

    /// `rms_norm(x) · wᵀ` for each `w` of `ws` (the projections that share one norm: Q/K/V,
    /// gate/up). Through the fused-op gate, best first: one fused op over all of them (one
    /// launch where the backend has it), else the fused op per weight (each matmul normalises
    /// as it loads `x`, and the normalised rows are never written), else one norm feeding the
    /// plain matmuls.
    pub fn rms_norm_matmuls(
        &self,
        x: &Tensor,
        norm_w: &Tensor,
        eps: f32,
        one_plus: bool,
        ws: &[&Tensor],
    ) -> Result<Vec<Tensor>> {
        let op = Op::MatMul(MatMulOp::RmsNormMatMul { eps, one_plus });
        if (2..=MAX_SHARED_NORM).contains(&ws.len()) {
            let mut ins = vec![x, norm_w];
            ins.extend_from_slice(ws);
            let descs: Vec<TensorDesc> = ins.iter().map(|t| t.desc().clone()).collect();
            let outs = op.output_descs(&descs)?;
            let in_refs: Vec<&TensorDesc> = descs.iter().collect();
            let out_refs: Vec<&TensorDesc> = outs.iter().collect();
            if self.supports_op(&op, &in_refs, &out_refs) {
                return self.run(&op, &ins);
            }
        }
        let mut fused = true;
        for w in ws {
            let ins = [x.desc(), norm_w.desc(), w.desc()];
            let out =
                op.output_descs(&[x.desc().clone(), norm_w.desc().clone(), w.desc().clone()])?;
            fused &= self.supports_op(&op, &ins, &[&out[0]]);
        }
        if fused {
            return ws.iter().map(|w| self.one(&op, &[x, norm_w, w])).collect();
        }
        let h = self.rms_norm(x, norm_w, eps, one_plus)?;
        ws.iter().map(|w| self.matmul(&h, w)).collect()
    }

    /// `Σⱼ softmax(logits[t])ⱼ · table[j]` (`[T, E]`), over every row of `table [V, E]`
    /// (`top_k` 0 or ≥ V) or the `top_k` largest logits: the fused op where the backend has
    /// it (the fused-op gate), else composed. Composed, the top-k form is routing (top-k and
    /// softmax over them), gathered rows and a weighted sum; the dense form a softmax and a
    /// matmul by `table_t [E, V]`, the table transposed, which `table_t` supplies when asked.
    pub fn soft_embedding<'t>(
        &self,
        logits: &Tensor,
        table: &Tensor,
        top_k: usize,
        table_t: impl FnOnce() -> Result<&'t Tensor>,
    ) -> Result<Tensor> {
        let op = Op::GetRows(GetRowsOp::SoftEmbedding { top_k });
        let out = op.output_descs(&[logits.desc().clone(), table.desc().clone()])?;
        if self.supports_op(&op, &[logits.desc(), table.desc()], &[&out[0]]) {
            return self.one(&op, &[logits, table]);
        }
        let d = logits.shape().dims();
        let (t, v) = (d[0], d[1]);
        let e = table.shape().dims()[1];
        if top_k > 0 && top_k < v {
            let (w, ids) = self.moe_route(logits, top_k, MoeGating::Softmax, true)?;
            let rows = self.get_rows(table, &ids.reshape([t * top_k])?)?;
            return self.moe_sum(&rows.reshape([t, top_k, e])?, &w);
        }
        let p = self.softmax(logits, 1.0)?;
        self.matmul(&p, table_t()?)
    }

    /// `x · wᵀ + r`, a projection added to the residual stream `r`: the fused op where the
    /// backend has it (the fused-op gate; the add is the matmul's epilogue), else the matmul
    /// and the add.
    pub fn matmul_add(&self, x: &Tensor, w: &Tensor, r: &Tensor) -> Result<Tensor> {
        let op = Op::MatMul(MatMulOp::MatMulAdd);
        let out = op.output_descs(&[x.desc().clone(), w.desc().clone(), r.desc().clone()])?;
        if self.supports_op(&op, &[x.desc(), w.desc(), r.desc()], &[&out[0]]) {
            return self.one(&op, &[x, w, r]);
        }
        let y = self.matmul(x, w)?;
        self.add(r, &y)
    }

    /// `act(gate)·up` projected by `w_down` and added to the residual stream `r`: one fused op
    /// where the backend has it, else [`Executor::glu_matmul`] and the add.
    pub fn glu_matmul_add(
        &self,
        g: GluOp,
        gate: &Tensor,
        up: &Tensor,
        w_down: &Tensor,
        r: &Tensor,
    ) -> Result<Tensor> {
        let op = Op::MatMul(MatMulOp::GluMatMul(g));
        let ins = [gate.desc(), up.desc(), w_down.desc(), r.desc()];
        let out = op.output_descs(&ins.map(|d| d.clone()))?;
        if self.supports_op(&op, &ins, &[&out[0]]) {
            return self.one(&op, &[gate, up, w_down, r]);
        }
        let d = self.glu_matmul(g, gate, up, w_down)?;
        self.add(r, &d)
    }

    /// `act(gate)·up` projected by `w_down`: the fused kernel where the backend has one (the
    /// fused-op gate), else the two plain ops.
    pub fn glu_matmul(
        &self,
        g: GluOp,
        gate: &Tensor,
        up: &Tensor,
        w_down: &Tensor,
    ) -> Result<Tensor> {
        let op = Op::MatMul(MatMulOp::GluMatMul(g));
        let ins = [gate.desc(), up.desc(), w_down.desc()];
        let out = op.output_descs(&[
            gate.desc().clone(),
            up.desc().clone(),
            w_down.desc().clone(),
        ])?;
        if self.supports_op(&op, &ins, &[&out[0]]) {
            return self.one(&op, &[gate, up, w_down]);
        }
        let h = self.glu(g, gate, up)?;
        self.matmul(&h, w_down)
    }
}

/// A downloaded tensor's bytes as f32 values, dequantized if need be.
fn f32s(t: &Tensor, bytes: Vec<u8>) -> Result<Vec<f32>> {
    if t.dtype() == DType::F32 && bytes.len() == 4 * t.numel() {
        return Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect());
    }
    let mut v = vec![0f32; t.numel()];
    quant::dequantize(t.dtype(), &bytes, &mut v)?;
    Ok(v)
}
