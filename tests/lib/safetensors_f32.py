"""The tests' reader of float32 safetensors files, with the standard library only (the tests
must not need numpy or torch): {name: (shape, [values])}. Exits naming the tensor when one
is not F32."""
import json
import struct
import sys


def read_f32(path):
    raw = open(path, 'rb').read()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop('__metadata__', None)
    data, out = raw[8 + n:], {}
    for name, info in header.items():
        if info['dtype'] != 'F32':
            sys.exit('%s: %s is %s, not F32' % (path, name, info['dtype']))
        b, e = info['data_offsets']
        out[name] = (tuple(info['shape']), list(struct.unpack('<%df' % ((e - b) // 4), data[b:e])))
    return out
