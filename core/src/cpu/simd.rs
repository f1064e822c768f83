//! The CPU's inner loops, picked once at run time: AVX-512 (512-bit FMA), AVX2 + FMA, or a
//! portable version that is plain Rust (and obviously right). AMX is never used: the machines
//! this runs on advertise it and die with SIGILL on its instructions.
//!
//! Every path accumulates in f32 over f32 inputs; only the order of the additions differs
//! (lanes are summed at the end), which is why the results of two paths agree to rounding.

use std::sync::OnceLock;

/// The instruction set the CPU kernels use.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2+fma",
            Isa::Portable => "portable",
        }
    }
}

/// The best instruction set this CPU has, or the one `KILN_CPU_ISA` (`avx512`, `avx2`,
/// `portable`) asks for if the CPU has it.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        let want = match std::env::var("KILN_CPU_ISA").ok().as_deref() {
            Some("avx512") => Isa::Avx512,
            Some("avx2") => Isa::Avx2,
            Some("portable") => Isa::Portable,
            _ => best,
        };
        let rank = |i: Isa| match i {
            Isa::Avx512 => 2,
            Isa::Avx2 => 1,
            Isa::Portable => 0,
        };
        if rank(want) <= rank(best) {
            want
        } else {
            best
        }
    })
}

/// Whether this CPU can run the AVX2 kernels (AVX2, FMA, F16C): their tests run them on every
/// such CPU, also where [`isa`] picks AVX-512.
#[cfg(test)]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn detect() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The sums of one micro-kernel call: `[activation row][weight row]`.
pub type Sums = [[f32; 4]; 4];

/// Activation rows one micro-kernel call covers at most on `isa` (weight rows: always 4).
pub fn max_rows(isa: Isa) -> usize {
    match isa {
        // Six rows (24 accumulators) measured slower than four here: the register pressure
        // makes the compiler spill.
        Isa::Avx512 => 4,
        Isa::Avx2 => 2,
        Isa::Portable => 4,
    }
}

/// `out[i][j] = Σₖ x[i·ldx + k] · w[j][k]` for `i < mr` (1..=max_rows) and the four weight
/// rows `w` (each `k` long; repeat a row to cover fewer).
///
/// # Safety
/// `x` must point to `mr` rows of `k` readable f32 at stride `ldx`, each `w[j]` to `k`
/// readable f32, and the CPU must have `isa` (as [`isa`] returns).
#[inline]
pub unsafe fn dots(
    isa: Isa,
    x: *const f32,
    ldx: usize,
    mr: usize,
    w: [*const f32; 4],
    k: usize,
    out: &mut Sums,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => match mr {
            1 => x86::dots512::<1>(x, ldx, w, k, out),
            2 => x86::dots512::<2>(x, ldx, w, k, out),
            3 => x86::dots512::<3>(x, ldx, w, k, out),
            _ => x86::dots512::<4>(x, ldx, w, k, out),
        },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => match mr {
            1 => x86::dots256::<1>(x, ldx, w, k, out),
            _ => x86::dots256::<2>(x, ldx, w, k, out),
        },
        _ => dots_portable(x, ldx, mr.min(4), w, k, out),
    }
}

/// The portable micro-kernel: eight partial sums per pair, added at the end.
unsafe fn dots_portable(
    x: *const f32,
    ldx: usize,
    mr: usize,
    w: [*const f32; 4],
    k: usize,
    out: &mut Sums,
) {
    let ws: [&[f32]; 4] = w.map(|p| std::slice::from_raw_parts(p, k));
    for (i, o) in out.iter_mut().enumerate().take(mr) {
        let xr = std::slice::from_raw_parts(x.add(i * ldx), k);
        for (j, o) in o.iter_mut().enumerate() {
            *o = dot_portable(xr, ws[j]);
        }
    }
}

#[inline(always)]
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let chunks = n / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = 0f32;
    for i in chunks * 8..n {
        s += a[i] * b[i];
    }
    s + acc.iter().sum::<f32>()
}

/// `Σ a[i]·b[i]` over the shorter of the two.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    let n = a.len().min(b.len());
    match isa() {
        // SAFETY: both slices hold `n` elements and the CPU has the instruction set.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::dot512(a.as_ptr(), b.as_ptr(), n) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::dot256(a.as_ptr(), b.as_ptr(), n) },
        _ => dot_portable(a, b),
    }
}

/// `y[i] += s · x[i]` over the shorter of the two.
#[inline]
pub fn axpy(s: f32, x: &[f32], y: &mut [f32]) {
    axpy_rows(&[s], &[x], y)
}

/// `y[i] += s[t] · x[t][i]` for the rows `t = 0, 1, …` in turn, over the shortest of the
/// slices: each element sums in the order (and with the roundings) of one [`axpy`] call a row,
/// while `y` is loaded and stored once for all the rows, not once a row (the attention's
/// weighted values: a store and a reload of the same output every key cost more than the
/// multiply-adds).
#[inline]
pub fn axpy_rows(s: &[f32], x: &[&[f32]], y: &mut [f32]) {
    let rows = s.len().min(x.len());
    let n = x[..rows].iter().fold(y.len(), |n, r| n.min(r.len()));
    match isa() {
        // SAFETY: every row and y hold `n` elements and the CPU has the instruction set.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::axpy_rows512(&s[..rows], &x[..rows], y.as_mut_ptr(), n) },
        _ => {
            for (s, x) in s.iter().zip(x) {
                for (y, x) in y[..n].iter_mut().zip(&x[..n]) {
                    *y += s * x;
                }
            }
        }
    }
}

/// `out[h·dv .. (h + 1)·dv] (+)= Σ_j s[h·ls + j] · rows[j][..dv]` for `heads` rows of weights
/// `s` (row stride `ls`) over the value rows at the addresses `rows`, each element one fused
/// multiply-add chain over `j` ascending, from zero or (with `accumulate`) from what `out`
/// holds: the bits of applying [`axpy_rows`] to the rows in order, on AVX-512, with the sums
/// kept in registers (up to 4 heads × 64 values at a time) instead of loaded and stored every
/// four rows. Returns false, doing nothing, where the CPU path is not AVX-512 (the caller then
/// takes `axpy_rows`). As row `j` is read, the same columns of the row at `fetch[j]` (where
/// there is one) are prefetched: the caller's rows further on.
///
/// # Safety
/// Each address in `rows` must point to at least `dv` readable f32 values.
#[allow(clippy::too_many_arguments)]
pub unsafe fn weighted_rows(
    s: &[f32],
    ls: usize,
    heads: usize,
    rows: &[usize],
    fetch: &[usize],
    dv: usize,
    out: &mut [f32],
    accumulate: bool,
) -> bool {
    let n = rows.len();
    let fits = heads == 0 || (ls >= n && s.len() >= (heads - 1) * ls + n);
    if isa() != Isa::Avx512 || !fits || out.len() < heads * dv {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the CPU has AVX-512 (isa); s holds heads rows of ls ≥ n, out heads rows of
        // dv, and the caller vouches for the rows.
        unsafe {
            x86::weighted_rows512(
                s.as_ptr(),
                ls,
                heads,
                rows,
                fetch,
                dv,
                out.as_mut_ptr(),
                accumulate,
            )
        };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the integer weight kernel's prefetches, far ahead of the rows it streams (16 KB,
/// `qdot_x16i`), ask for the second-level cache rather than the first. A line asked for the
/// first level holds one of its few miss buffers for a whole trip to memory and lands in a
/// cache of 32 or 48 KB beside the activations; the second level has more of both. Measured
/// decoding the 1.17 B Llama shape (tokens a second, old and new binaries alternating, medians
/// of 3), AMD Zen 4 (32 KB first level), the second level against the first: one thread Q4_K
/// 26.4 → 35.1, Q6_K 13.9 → 27.4; two threads 41.0 → 46.7 and 23.8 → 30.4 (8 to 64 KB ahead
/// all alike). On Zen 5 (48 KB) the first level at 16 KB was the best of 1–64 KB; Q8_0's f32
/// kernel (`qdot_x16f`) lost a third with the second level on Zen 4 and keeps the first. So:
/// the second level where the first-level data cache is under 48 KB, or as
/// `KILN_CPU_PREFETCH` says (`l1`, `l2`), to measure either anywhere.
pub(crate) fn prefetch_to_l2() -> bool {
    static L2: OnceLock<bool> = OnceLock::new();
    *L2.get_or_init(
        || match std::env::var("KILN_CPU_PREFETCH").ok().as_deref() {
            Some("l1") => false,
            Some("l2") => true,
            _ => l1d_bytes().is_some_and(|b| b < 48 * 1024),
        },
    )
}

/// The first-level data cache of this core in bytes, where `cpuid` tells it (AMD's leaf
/// 0x8000_0005, Intel's deterministic cache leaf 4).
fn l1d_bytes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    #[allow(unused_unsafe)]
    {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        // SAFETY: `cpuid` exists on every x86-64 CPU and only reads identification registers.
        let (max, vendor) = unsafe {
            let r = __cpuid(0);
            (r.eax, r.ebx)
        };
        if vendor == u32::from_le_bytes(*b"Auth") {
            // SAFETY: as above; the extended leaf is read only where the CPU lists it.
            let ext = unsafe { __cpuid(0x8000_0000) }.eax;
            if ext >= 0x8000_0005 {
                let kb = unsafe { __cpuid(0x8000_0005) }.ecx >> 24;
                return (kb > 0).then_some(kb as usize * 1024);
            }
        } else if max >= 4 {
            for sub in 0..16 {
                // SAFETY: as above; leaf 4 is within the CPU's listed leaves.
                let r = unsafe { __cpuid_count(4, sub) };
                let (kind, level) = (r.eax & 0x1F, (r.eax >> 5) & 7);
                if kind == 0 {
                    break;
                }
                if kind == 1 && level == 1 {
                    let ways = (r.ebx >> 22) as usize + 1;
                    let parts = ((r.ebx >> 12) & 0x3FF) as usize + 1;
                    let line = (r.ebx & 0xFFF) as usize + 1;
                    return Some(ways * parts * line * (r.ecx as usize + 1));
                }
            }
        }
        None
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Prefetches the line at `p` into the first-level cache, or with `l2` the second only
/// ([`prefetch_to_l2`]). A prefetch never faults, wherever `p` points.
///
/// # Safety
/// None beyond the call: it is `unsafe` to be inlined into the kernels' `unsafe` loops.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_line(p: *const u8, l2: bool) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
    if l2 {
        _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
    } else {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }
}

/// Asks for the `bytes` from `p` in the first-level cache ahead of their use (nothing where the
/// CPU has no such hint). A prefetch never faults, wherever `p` points.
#[inline]
pub fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut o = 0;
        while o < bytes {
            // SAFETY: a prefetch is a hint; it reads nothing the program sees and never faults.
            unsafe { prefetch_line(p.wrapping_add(o), false) };
            o += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (p, bytes);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::hsum256;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Sums;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dots512<const MR: usize>(
        x: *const f32,
        ldx: usize,
        w: [*const f32; 4],
        k: usize,
        out: &mut Sums,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        let mut kk = 0;
        while kk + 16 <= k {
            let wv = [
                _mm512_loadu_ps(w[0].add(kk)),
                _mm512_loadu_ps(w[1].add(kk)),
                _mm512_loadu_ps(w[2].add(kk)),
                _mm512_loadu_ps(w[3].add(kk)),
            ];
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(i * ldx + kk));
                for j in 0..4 {
                    a[j] = _mm512_fmadd_ps(xv, wv[j], a[j]);
                }
            }
            kk += 16;
        }
        if kk < k {
            // Masked loads read nothing past the end.
            let m: __mmask16 = ((1u32 << (k - kk)) - 1) as __mmask16;
            let wv = [
                _mm512_maskz_loadu_ps(m, w[0].add(kk)),
                _mm512_maskz_loadu_ps(m, w[1].add(kk)),
                _mm512_maskz_loadu_ps(m, w[2].add(kk)),
                _mm512_maskz_loadu_ps(m, w[3].add(kk)),
            ];
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(m, x.add(i * ldx + kk));
                for j in 0..4 {
                    a[j] = _mm512_fmadd_ps(xv, wv[j], a[j]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(&acc) {
            _mm_storeu_ps(o.as_mut_ptr(), sum4(a));
        }
    }

    /// The lane sums of four vectors, as one vector of four.
    #[inline(always)]
    unsafe fn sum4(a: &[__m512; 4]) -> __m128 {
        let half = |v: __m512| -> __m128 {
            let h = _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
            );
            _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))
        };
        _mm_hadd_ps(
            _mm_hadd_ps(half(a[0]), half(a[1])),
            _mm_hadd_ps(half(a[2]), half(a[3])),
        )
    }

    /// The lanes of `v` summed in the order every AVX2 dot of this crate uses.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dots256<const MR: usize>(
        x: *const f32,
        ldx: usize,
        w: [*const f32; 4],
        k: usize,
        out: &mut Sums,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        let mut kk = 0;
        while kk + 8 <= k {
            let wv = [
                _mm256_loadu_ps(w[0].add(kk)),
                _mm256_loadu_ps(w[1].add(kk)),
                _mm256_loadu_ps(w[2].add(kk)),
                _mm256_loadu_ps(w[3].add(kk)),
            ];
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = _mm256_loadu_ps(x.add(i * ldx + kk));
                for j in 0..4 {
                    a[j] = _mm256_fmadd_ps(xv, wv[j], a[j]);
                }
            }
            kk += 8;
        }
        for (i, (o, a)) in out.iter_mut().zip(&acc).enumerate() {
            for j in 0..4 {
                let mut s = hsum256(a[j]);
                for t in kk..k {
                    s += *x.add(i * ldx + t) * *w[j].add(t);
                }
                o[j] = s;
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot512(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let mut i = 0;
        while i + 32 <= n {
            acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(i)), _mm512_loadu_ps(b.add(i)), acc0);
            acc1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.add(i + 16)),
                _mm512_loadu_ps(b.add(i + 16)),
                acc1,
            );
            i += 32;
        }
        while i < n {
            let m: __mmask16 = if n - i >= 16 {
                0xFFFF
            } else {
                ((1u32 << (n - i)) - 1) as __mmask16
            };
            acc0 = _mm512_fmadd_ps(
                _mm512_maskz_loadu_ps(m, a.add(i)),
                _mm512_maskz_loadu_ps(m, b.add(i)),
                acc0,
            );
            i += 16;
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot256(a: *const f32, b: *const f32, n: usize) -> f32 {
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a.add(i)), _mm256_loadu_ps(b.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.add(i + 8)),
                _mm256_loadu_ps(b.add(i + 8)),
                acc1,
            );
            i += 16;
        }
        let mut s = hsum256(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += *a.add(i) * *b.add(i);
            i += 1;
        }
        s
    }

    /// `weighted_rows` for heads h0 .. h0 + H and values c0 .. c0 + 16·V of them (the last
    /// vector masked to dv).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn weighted_chunk<const H: usize, const V: usize>(
        s: *const f32,
        ls: usize,
        h0: usize,
        rows: &[usize],
        fetch: &[usize],
        c0: usize,
        dv: usize,
        out: *mut f32,
        accumulate: bool,
    ) {
        let mut m = [0xFFFFu16; V];
        for (v, mv) in m.iter_mut().enumerate() {
            let left = dv - c0 - 16 * v;
            if left < 16 {
                *mv = ((1u32 << left) - 1) as __mmask16;
            }
        }
        let mut acc = [[_mm512_setzero_ps(); V]; H];
        if accumulate {
            for h in 0..H {
                for v in 0..V {
                    acc[h][v] = _mm512_maskz_loadu_ps(m[v], out.add((h0 + h) * dv + c0 + 16 * v));
                }
            }
        }
        for (j, &r) in rows.iter().enumerate() {
            let r = r as *const f32;
            if let Some(&a) = fetch.get(j) {
                super::prefetch((a as *const f32).wrapping_add(c0) as *const u8, 64 * V);
            }
            let mut x = [_mm512_setzero_ps(); V];
            for v in 0..V {
                x[v] = _mm512_maskz_loadu_ps(m[v], r.add(c0 + 16 * v));
            }
            for h in 0..H {
                let b = _mm512_set1_ps(*s.add((h0 + h) * ls + j));
                for v in 0..V {
                    acc[h][v] = _mm512_fmadd_ps(b, x[v], acc[h][v]);
                }
            }
        }
        for h in 0..H {
            for v in 0..V {
                _mm512_mask_storeu_ps(out.add((h0 + h) * dv + c0 + 16 * v), m[v], acc[h][v]);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn weighted_rows512(
        s: *const f32,
        ls: usize,
        heads: usize,
        rows: &[usize],
        fetch: &[usize],
        dv: usize,
        out: *mut f32,
        accumulate: bool,
    ) {
        let mut h0 = 0;
        while h0 < heads {
            let hc = (heads - h0).min(4);
            let mut c0 = 0;
            while c0 < dv {
                let vc = (dv - c0).div_ceil(16).min(4);
                macro_rules! chunk {
                    ($($h:literal, $v:literal);*) => {
                        match (hc, vc) {
                            $(($h, $v) => weighted_chunk::<$h, $v>(s, ls, h0, rows, fetch, c0, dv, out, accumulate),)*
                            _ => unreachable!("hc and vc are 1..=4"),
                        }
                    };
                }
                chunk!(1, 1; 1, 2; 1, 3; 1, 4; 2, 1; 2, 2; 2, 3; 2, 4;
                       3, 1; 3, 2; 3, 3; 3, 4; 4, 1; 4, 2; 4, 3; 4, 4);
                c0 += 64;
            }
            h0 += 4;
        }
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy_rows512(s: &[f32], x: &[&[f32]], y: *mut f32, n: usize) {
        let mut i = 0;
        while i < n {
            let m: __mmask16 = if n - i >= 16 {
                0xFFFF
            } else {
                ((1u32 << (n - i)) - 1) as __mmask16
            };
            let mut yv = _mm512_maskz_loadu_ps(m, y.add(i));
            for (s, x) in s.iter().zip(x) {
                let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(i));
                yv = _mm512_fmadd_ps(_mm512_set1_ps(*s), xv, yv);
            }
            _mm512_mask_storeu_ps(y.add(i), m, yv);
            i += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// The first-level data cache read from `cpuid` is a size such caches have (a power of two
    /// or 48 KB, between 16 and 128 KB) on every x86-64 CPU that reports one; a misread field
    /// or leaf gives a count of bytes far outside that.
    #[test]
    fn the_first_level_cache_reads_as_a_cache_size() {
        let b = l1d_bytes();
        eprintln!("first-level data cache: {b:?} bytes");
        if let Some(b) = b {
            assert!((16 << 10..=128 << 10).contains(&b), "{b} bytes");
            assert!(b.is_power_of_two() || b % (48 << 10) == 0, "{b} bytes");
        }
    }

    fn rand(rng: &mut Rng, n: usize) -> Vec<f32> {
        (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect()
    }

    fn naive(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    #[test]
    fn every_available_isa_matches_an_f64_dot() {
        let mut rng = Rng::new(7);
        let mut isas = vec![Isa::Portable];
        match detect() {
            Isa::Avx512 => isas.extend([Isa::Avx2, Isa::Avx512]),
            Isa::Avx2 => isas.push(Isa::Avx2),
            Isa::Portable => {}
        }
        for &isa in &isas {
            for k in [1usize, 7, 16, 17, 33, 576, 1000] {
                for mr in 1..=max_rows(isa) {
                    let x = rand(&mut rng, mr * (k + 3));
                    let w: Vec<Vec<f32>> = (0..4).map(|_| rand(&mut rng, k)).collect();
                    let mut out: Sums = [[f32::NAN; 4]; 4];
                    unsafe {
                        dots(
                            isa,
                            x.as_ptr(),
                            k + 3,
                            mr,
                            [w[0].as_ptr(), w[1].as_ptr(), w[2].as_ptr(), w[3].as_ptr()],
                            k,
                            &mut out,
                        )
                    };
                    for i in 0..mr {
                        for j in 0..4 {
                            let want = naive(&x[i * (k + 3)..i * (k + 3) + k], &w[j]);
                            let got = out[i][j] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + k as f64).sqrt(),
                                "{isa:?} k={k} mr={mr} ({i},{j}): {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
        for k in [0usize, 5, 16, 31, 100] {
            let a = rand(&mut rng, k);
            let b = rand(&mut rng, k);
            assert!((dot(&a, &b) as f64 - naive(&a, &b)).abs() < 1e-5);
            let mut y = rand(&mut rng, k);
            let y0 = y.clone();
            axpy(0.5, &a, &mut y);
            for i in 0..k {
                assert!((y[i] - (y0[i] + 0.5 * a[i])).abs() < 1e-6);
            }
        }
    }

    /// Several rows at once give the bits of one `axpy` a row in turn, tails included.
    #[test]
    fn axpy_rows_equals_one_axpy_a_row() {
        let mut rng = Rng::new(11);
        for n in [1usize, 15, 16, 17, 64, 100, 256] {
            for rows in 1..=4 {
                let x: Vec<Vec<f32>> = (0..rows).map(|_| rand(&mut rng, n)).collect();
                let s = rand(&mut rng, rows);
                let y0 = rand(&mut rng, n);
                let mut want = y0.clone();
                for (s, x) in s.iter().zip(&x) {
                    axpy(*s, x, &mut want);
                }
                let mut got = y0.clone();
                let xs: Vec<&[f32]> = x.iter().map(|r| &r[..]).collect();
                axpy_rows(&s, &xs, &mut got);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "n {n} rows {rows}");
                assert_ne!(bits(&got), bits(&y0));
            }
        }
    }
}
