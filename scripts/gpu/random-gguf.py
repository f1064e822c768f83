#!/usr/bin/env python3
"""Random-weight Llama-shaped GGUF checkpoints of any size, for speed and agreement checks on a
GPU machine that cannot download a real model.

    python3 scripts/gpu/random-gguf.py template IN.gguf OUT.gguf
    python3 scripts/gpu/random-gguf.py make --template T.gguf --out O.gguf \
        --hidden 2048 --layers 16 --ffn 8192 --heads 32 --kv-heads 8 --type q4_k

`template` copies every metadata field of a real model (its tokenizer above all) into a GGUF
file with no tensors: a few MB that travel where the model cannot. `make` writes a checkpoint
with that vocabulary and the given shape: every matrix is random but valid blocks of --type
(q4_k, q5_k, q6_k, q8_0, nvfp4, f16, bf16: scales drawn so weights stay small, never NaN or Inf),
norm weights near 1. Kernels read such blocks exactly as they read a real model's, so decode
speed and CPU/GPU agreement mean the same; the text it writes is noise.

Needs the `gguf` package (and numpy).
"""
import argparse
import importlib.util
import os
import sys

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q, GGUFReader
except ImportError:
    sys.exit("random-gguf: needs the `gguf` package (pip install gguf)")

# (block values, block bytes) of each block type this script writes.
BLOCKS = {
    "q4_k": (Q.Q4_K, 256, 144),
    "q5_k": (Q.Q5_K, 256, 176),
    "q6_k": (Q.Q6_K, 256, 210),
    "q8_0": (Q.Q8_0, 32, 34),
    "nvfp4": (Q.NVFP4, 64, 36),
    "iq2_xxs": (Q.IQ2_XXS, 256, 66),
    "iq2_xs": (Q.IQ2_XS, 256, 74),
    "iq2_s": (Q.IQ2_S, 256, 82),
    "iq3_xxs": (Q.IQ3_XXS, 256, 98),
    "iq3_s": (Q.IQ3_S, 256, 110),
    "iq1_s": (Q.IQ1_S, 256, 50),
    "iq1_m": (Q.IQ1_M, 256, 56),
    "iq4_nl": (Q.IQ4_NL, 32, 18),
    "iq4_xs": (Q.IQ4_XS, 256, 136),
    "tq1_0": (Q.TQ1_0, 256, 54),
    "tq2_0": (Q.TQ2_0, 256, 66),
}
# The f16 scale range of each i-quant and ternary type (before --scale) that gives weights of
# about the K-quants' size: each code's grid values and sub-scales multiply it differently.
IQ_D = {
    "iq2_xxs": 2e-5, "iq2_xs": 2e-5, "iq2_s": 2e-5, "iq3_xxs": 1e-5, "iq3_s": 1e-5,
    "iq1_s": 2e-4, "iq1_m": 2e-4, "iq4_nl": 3e-5, "iq4_xs": 1e-6, "tq1_0": 1e-3, "tq2_0": 1e-3,
}
FLOATS = {"f16": Q.F16, "bf16": Q.BF16, "f32": Q.F32}


def copy_field():
    """requant-gguf.py's metadata copy, loaded from beside this folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "requant_gguf", os.path.join(here, "..", "requant-gguf.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.copy_field


def f16_bytes(rng, n, lo, hi):
    return rng.uniform(lo, hi, n).astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng, kind, rows, cols, scale=1.0):
    qtype, per, size = BLOCKS[kind]
    if cols % per:
        sys.exit(f"random-gguf: {kind} rows need a multiple of {per} values, not {cols}")
    n = rows * cols // per
    b = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    if kind in ("q4_k", "q5_k"):
        # d and dmin (f16) first: weights d*sc*q - dmin*m with 6-bit sc, m and 4- or 5-bit q.
        b[:, 0:2] = f16_bytes(rng, n, 1e-5 * scale, 4e-5 * scale)
        b[:, 2:4] = f16_bytes(rng, n, 1e-5 * scale, 4e-5 * scale)
    elif kind == "q6_k":
        b[:, 208:210] = f16_bytes(rng, n, 1e-5 * scale, 4e-5 * scale)  # d last; scales are signed 8-bit
    elif kind == "q8_0":
        b[:, 0:2] = f16_bytes(rng, n, 5e-5 * scale, 2e-4 * scale)
    elif kind in IQ_D:
        lo = IQ_D[kind] * scale
        d = f16_bytes(rng, n, lo, 2 * lo)
        sign = rng.integers(0, 2, size=n, dtype=np.uint8) << 7
        d[:, 1] |= sign
        if kind in ("tq1_0", "tq2_0"):
            b[:, size - 2:] = d
        elif kind == "iq1_m":
            # The f16 scale lives in the top nibbles of the four scale words (bytes 48..56).
            h = d.view(np.uint16).reshape(n)
            for i in range(4):
                w = b[:, 48 + 2 * i:50 + 2 * i].copy().view(np.uint16).reshape(n)
                w = (w & 0x0FFF) | (((h >> (4 * i)) & 0xF) << 12)
                b[:, 48 + 2 * i:50 + 2 * i] = w.astype(np.uint16).view(np.uint8).reshape(n, 2)
        else:
            b[:, 0:2] = d
    elif kind == "nvfp4":
        # four UE4M3 sub-block scales, exponent field 1..2 (1/64 .. 3/64): |w| < 0.2.
        b[:, 0:4] = (rng.integers(8, 24, size=(n, 4))).astype(np.uint8)
    return qtype, b.reshape(rows, cols // per * size)


def add_matrix(w, rng, name, rows, cols, kind, scale=1.0):
    if kind in FLOATS:
        x = (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02 * scale)
        if kind == "f32":
            w.add_tensor(name, x)
        elif kind == "f16":
            w.add_tensor(name, x.astype(np.float16))
        else:  # bf16: the top halves of the f32s
            raw = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, cols * 2)
            w.add_tensor(name, raw, raw_dtype=Q.BF16)
        return
    qtype, raw = random_blocks(rng, kind, rows, cols, scale)
    w.add_tensor(name, raw, raw_dtype=qtype)


def cmd_template(args):
    r = GGUFReader(args.input)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(args.output, arch)
    copy = copy_field()
    for field in r.fields.values():
        copy(w, field)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.output}: {len(r.fields)} fields of {args.input}, no tensors")


def cmd_make(args):
    t = GGUFReader(args.template)
    arch = t.fields["general.architecture"].contents()
    if arch != "llama":
        sys.exit(f"random-gguf: the template is a {arch!r} model; make writes llama-shaped ones")
    vocab = len(t.fields["tokenizer.ggml.tokens"].contents())
    k = args.shrink
    h, nl, ffn = args.hidden // k, max(args.layers // k, 1), args.ffn // k
    nh, nkv = max(args.heads // k, 1), max(args.kv_heads // k, 1)
    hd = h // nh
    w = gguf.GGUFWriter(args.out, "llama")
    copy = copy_field()
    shape_keys = {
        "llama.embedding_length": h, "llama.block_count": nl, "llama.feed_forward_length": ffn,
        "llama.attention.head_count": nh, "llama.attention.head_count_kv": nkv,
        "llama.rope.dimension_count": hd, "llama.context_length": 8192,
        # A template whose heads are not hidden / heads wide says so; the new shape's are.
        "llama.attention.key_length": hd, "llama.attention.value_length": hd,
        "llama.vocab_size": vocab,
    }
    for field in t.fields.values():
        if field.name not in shape_keys and not field.name.startswith("general.name"):
            copy(w, field)
    for k, v in shape_keys.items():
        w.add_uint32(k, v)
    w.add_name(os.path.basename(args.out))
    rng = np.random.default_rng(args.seed)
    emb_kind = args.embed_type or args.type
    add_matrix(w, rng, "token_embd.weight", vocab, h, emb_kind, args.scale)
    params = vocab * h
    mix = args.types.split(",") if args.types else None
    for k in mix or []:
        if k not in BLOCKS and k not in FLOATS:
            sys.exit(f"random-gguf: unknown type {k}")
    n_mat = 0
    for i in range(nl):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", rng.uniform(0.8, 1.2, h).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", rng.uniform(0.8, 1.2, h).astype(np.float32))
        for name, rows, cols in [
            ("attn_q", nh * hd, h), ("attn_k", nkv * hd, h), ("attn_v", nkv * hd, h),
            ("attn_output", h, nh * hd), ("ffn_gate", ffn, h), ("ffn_up", ffn, h),
            ("ffn_down", h, ffn),
        ]:
            kind = mix[n_mat % len(mix)] if mix else args.type
            n_mat += 1
            add_matrix(w, rng, p + name + ".weight", rows, cols, kind, args.scale)
            params += rows * cols
    w.add_tensor("output_norm.weight", rng.uniform(0.8, 1.2, h).astype(np.float32))
    if not args.tied:
        add_matrix(w, rng, "output.weight", vocab, h, args.head_type or args.type, args.scale)
        params += vocab * h
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    size = os.path.getsize(args.out)
    print(f"{args.out}: {params / 1e9:.2f} B parameters, {size / 1e9:.2f} GB, {args.type}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("template", help="copy a model's metadata into a tensor-less GGUF")
    a.add_argument("input")
    a.add_argument("output")
    m = sub.add_parser("make", help="write a random-weight llama-shaped checkpoint")
    m.add_argument("--template", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--hidden", type=int, required=True)
    m.add_argument("--layers", type=int, required=True)
    m.add_argument("--ffn", type=int, required=True)
    m.add_argument("--heads", type=int, required=True)
    m.add_argument("--kv-heads", type=int, required=True)
    m.add_argument("--type", default="q4_k", choices=sorted(BLOCKS) + sorted(FLOATS))
    m.add_argument("--embed-type", choices=sorted(BLOCKS) + sorted(FLOATS))
    m.add_argument("--head-type", choices=sorted(BLOCKS) + sorted(FLOATS))
    m.add_argument("--tied", action="store_true", help="no output.weight (the embedding is reused)")
    m.add_argument("--types", help="comma-separated types the layers' matrices take in turn "
                   "(Q, K, V, output, gate, up, down of each layer), instead of --type")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--scale", type=float, default=1.0,
                   help="block scales (and float weights) this many times larger: weights of a "
                        "size that gives a small model's text some life, for tests")
    m.add_argument("--shrink", type=int, default=1, help="divide every size by this (a quick try)")
    args = ap.parse_args()
    {"template": cmd_template, "make": cmd_make}[args.cmd](args)


if __name__ == "__main__":
    main()
