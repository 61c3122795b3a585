#!/usr/bin/env python3
"""Prints a PNG's size and the share of its pixels that are not white: a page a browser drew
with text and lines has some, a blank or broken one none. Usage: png_ink.py FILE.png"""
import struct
import sys
import zlib

data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, width, height, depth, color = 8, b"", 0, 0, 0, 0
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, color = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
channels = {2: 3, 6: 4}[color]
assert depth == 8, "8-bit channels expected"
raw = zlib.decompress(idat)
stride = width * channels
prev = bytearray(stride)
ink = 0
for y in range(height):
    row = raw[y * (stride + 1):(y + 1) * (stride + 1)]
    kind, line = row[0], bytearray(row[1:])
    for x in range(stride):  # undo the PNG filter of this row
        a = line[x - channels] if x >= channels else 0
        b = prev[x]
        c = prev[x - channels] if x >= channels else 0
        if kind == 1:
            line[x] = (line[x] + a) & 255
        elif kind == 2:
            line[x] = (line[x] + b) & 255
        elif kind == 3:
            line[x] = (line[x] + (a + b) // 2) & 255
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, channels):
        ink += min(line[x:x + 3]) < 200
    prev = line
print(f"{width}x{height} ink {100.0 * ink / (width * height):.1f}%")
