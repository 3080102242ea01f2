#!/usr/bin/env python3
"""Shows that checkpoints written by pipetrain (src/io/safetensors.c) are ordinary safetensors
files: reads them with nothing but the standard library, numpy and (when installed) the
`safetensors` package or PyTorch, applying the format's rules independently of our C reader.

    python3 experiments/golden/check_safetensors.py FILE.safetensors [...]

Needs numpy (Debian: apt-get install python3-numpy, for /usr/bin/python3): when the python3
running it lacks numpy it runs itself again under /usr/bin/python3, and says what to install
when that one lacks it too. Prints one line per tensor (name, shape, mean, min, max) and
exits non-zero when a file breaks a rule. Not used by the unit tests (they must not need
Python)."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import interpreter  # noqa: E402  (experiments/interpreter.py)

interpreter.ensure_modules(["numpy"])
import numpy as np  # noqa: E402


def check(path):
    raw = open(path, "rb").read()
    if len(raw) < 8:
        raise ValueError(f"{path}: {len(raw)} bytes, shorter than the length field")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    if (8 + n) % 8:
        print(f"{path}: note: data not 8-byte aligned (header length {n})")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    header.pop("__metadata__", None)
    spans = []
    tensors = {}
    for name, info in header.items():
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{path}: tensor {name!r} has keys {sorted(info)}")
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: tensor {name!r} has dtype {info['dtype']}")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end - begin != 4 * int(np.prod(shape, dtype=np.int64)) or end > len(data):
            raise ValueError(f"{path}: tensor {name!r}: offsets {begin, end} vs shape {shape}")
        spans.append((begin, end, name))
        tensors[name] = np.frombuffer(data, dtype="<f4", count=(end - begin) // 4,
                                      offset=begin).reshape(shape)
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ValueError(f"{path}: tensor {name!r} starts at {begin}, expected {at}")
        at = end
    if at != len(data):
        raise ValueError(f"{path}: {len(data) - at} unused bytes at the end")
    for name, t in tensors.items():
        stats = (t.mean(), t.min(), t.max()) if t.size else (float("nan"),) * 3
        print(f"{name:40s} {str(t.shape):18s} mean {stats[0]: .6g} min {stats[1]: .6g} "
              f"max {stats[2]: .6g}")

    # the reference implementations, where this Python has them
    try:
        from safetensors.numpy import load_file
    except ImportError:
        load_file = None
    if load_file is not None:
        ref = load_file(path)
        assert set(ref) == set(tensors), "safetensors sees other tensor names"
        for name, t in tensors.items():
            assert np.array_equal(ref[name], t), f"safetensors reads {name!r} differently"
        print(f"{path}: safetensors.numpy.load_file agrees")
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        for name, t in tensors.items():
            torch.from_numpy(t.copy())  # a float32 tensor of that shape
        print(f"{path}: {len(tensors)} tensors convert to torch.float32")
    return tensors


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    status = 0
    for path in argv[1:]:
        try:
            check(path)
            print(f"{path}: OK")
        except (ValueError, AssertionError, json.JSONDecodeError, OSError) as e:
            print(f"{path}: FAILED: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
