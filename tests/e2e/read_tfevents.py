#!/usr/bin/env python3
"""Reads TensorBoard event files independently of strata's writer.

The TFRecord framing is checked with the `crc32c` module (Debian's
python3-crc32c), and the Event / Summary messages are decoded from the
protobuf wire format with the field numbers of TensorFlow's event.proto
and summary.proto. Prints {"file_version": ..., "scalars": {tag: [[step,
value], ...]}} as JSON; exits 1 naming the file and offset on a bad record.
"""
import json
import struct
import sys
from pathlib import Path

import crc32c


def masked(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf: bytes, pos: int):
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(buf: bytes):
    """Yields (field number, wire type, value) of one message."""
    pos = 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            length, pos = varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def records(path: Path):
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"{path}: truncated header at offset {pos}")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if header_crc != masked(header):
            raise ValueError(f"{path}: bad length CRC at offset {pos}")
        payload = data[pos + 12:pos + 12 + length]
        if len(payload) != length or pos + 16 + length > len(data):
            raise ValueError(f"{path}: truncated record at offset {pos}")
        (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        if payload_crc != masked(payload):
            raise ValueError(f"{path}: bad data CRC at offset {pos}")
        yield payload
        pos += 16 + length


def main() -> int:
    out = {"file_version": None, "scalars": {}}
    files = sorted(p for p in Path(sys.argv[1]).iterdir() if "tfevents" in p.name)
    if not files:
        print(f"no event files in {sys.argv[1]}", file=sys.stderr)
        return 1
    try:
        for path in files:
            for payload in records(path):
                step, version, values = 0, None, []
                for number, _, value in fields(payload):
                    if number == 2:  # Event.step
                        step = value
                    elif number == 3:  # Event.file_version
                        version = value.decode()
                    elif number == 5:  # Event.summary
                        for n, _, v in fields(value):
                            if n == 1:  # Summary.value
                                tag, simple = None, None
                                for vn, _, vv in fields(v):
                                    if vn == 1:
                                        tag = vv.decode()
                                    elif vn == 2:
                                        (simple,) = struct.unpack("<f", vv)
                                values.append((tag, simple))
                if version is not None:
                    out["file_version"] = version
                for tag, simple in values:
                    out["scalars"].setdefault(tag, []).append([step, simple])
    except ValueError as e:
        print(e, file=sys.stderr)
        return 1
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
