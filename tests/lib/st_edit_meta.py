"""st_edit_meta.py FILE KEY VALUE: sets one __metadata__ value of a safetensors checkpoint and
recomputes its metadata CRC-32 as src/io/safetensors.c does (the pairs other than
crc32:__metadata__ in key order, each "key\\0value\\0"), so that only the field is wrong."""
import json
import struct
import sys
import zlib

path, key, value = sys.argv[1:4]
blob = open(path, "rb").read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
meta = header["__metadata__"]
meta[key] = value
crc = 0
for k in sorted(k for k in meta if k != "crc32:__metadata__"):
    crc = zlib.crc32(k.encode() + b"\0" + meta[k].encode() + b"\0", crc)
meta["crc32:__metadata__"] = "%08x" % crc
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + blob[8 + n:])
