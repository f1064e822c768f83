#!/usr/bin/env python3
"""Write a copy of a GGUF file with its block-quantized tensors re-encoded as another type.

    python3 scripts/requant-gguf.py IN.gguf OUT.gguf [--type f16|f32|q8_0]

Every tensor stored in a block format (Q4_1, Q4_K, ...) is dequantized with the `gguf`
package's reference dequantizer and written as `--type` (default f16); float tensors and every
metadata field are copied unchanged. Used to make a same-vocabulary target/drafter pair out of
one model for `kiln bench --spec draft` (README, speculative decoding): the wider copy is the
target, the original quantized file drafts for it.

Needs `pip install gguf` (numpy comes with it).
"""
import argparse
import sys

import numpy as np

try:
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGMLQuantizationType as Q
except ImportError:
    sys.exit("requant-gguf: needs the `gguf` package (pip install gguf)")

FLOAT_TYPES = {Q.F32, Q.F16, Q.BF16}
TARGETS = {"f16": Q.F16, "f32": Q.F32, "q8_0": Q.Q8_0}


def copy_field(writer, field):
    name = field.name
    if name.startswith("GGUF.") or name in ("general.file_type", "general.architecture"):
        return
    vtype = field.types[0]
    value = field.contents()
    if vtype == GGUFValueType.ARRAY:
        writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
    else:
        writer.add_key_value(name, value, vtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--type", choices=sorted(TARGETS), default="f16")
    args = ap.parse_args()
    target = TARGETS[args.type]

    reader = GGUFReader(args.src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(args.dst, arch)
    for field in reader.fields.values():
        copy_field(writer, field)

    converted = 0
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]  # numpy order: outermost first
        if t.tensor_type in FLOAT_TYPES:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
        if target == Q.F32:
            writer.add_tensor(t.name, values)
        elif target == Q.F16:
            writer.add_tensor(t.name, values.astype(np.float16))
        else:
            data = gguf.quants.quantize(values, target)
            writer.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=target)
        converted += 1

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.dst}: {converted} of {len(reader.tensors)} tensors re-encoded as {args.type}")


if __name__ == "__main__":
    main()
