#!/usr/bin/env python3
"""Writes a uniform importance matrix for a GGUF model: every weight matrix's inputs weighted
alike. llama.cpp's llama-quantize refuses IQ2_XXS, IQ2_XS and IQ1_S without an importance
matrix; with this one it quantizes as it would with none, so test files of those types can be
made without running the model over a corpus (llama-imatrix).

    PYTHONPATH=/tmp/pyg python3 scripts/uniform-imatrix.py MODEL.gguf OUT.dat
    llama-quantize --allow-requantize --imatrix OUT.dat MODEL.gguf OUT.gguf IQ2_XXS

The file is llama.cpp's legacy imatrix layout: the entry count, then per entry the name's
length and bytes, the call count (1), the value count (the matrix's row length) and that many
f32 (1.0); then the chunk count (1). Needs the `gguf` package.
"""
import struct
import sys

from gguf import GGUFReader


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.split("\n\n")[1])
    r = GGUFReader(sys.argv[1])
    # GGUF lists dims innermost first: a weight matrix [rows, cols] is (cols, rows).
    mats = [(t.name, int(t.shape[0])) for t in r.tensors
            if len(t.shape) == 2 and t.name.endswith(".weight") and "token_embd" not in t.name]
    with open(sys.argv[2], "wb") as f:
        f.write(struct.pack("<i", len(mats)))
        for name, cols in mats:
            b = name.encode()
            f.write(struct.pack("<i", len(b)) + b + struct.pack("<ii", 1, cols))
            f.write(struct.pack(f"<{cols}f", *([1.0] * cols)))
        f.write(struct.pack("<i", 1))
    print(f"{sys.argv[2]}: {len(mats)} matrices")


if __name__ == "__main__":
    main()
