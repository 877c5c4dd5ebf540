#!/usr/bin/env python3
"""UTF-8 cases for tests/text/test_utf8.cpp, decided by CPython's codec (the standard library
only), never by flashmap:

    python3 tools/make_utf8_cases.py > tests/data/utf8_cases.json

Each case is a byte string (hex) with what Python says about it:
- valid, bad: whether bytes.decode('utf-8') accepts it, and UnicodeDecodeError.start if not;
- decode: for every offset, [length, code point] of the one character that starts there (the
  shortest slice from the offset that decodes strictly to a single character), or [0, -1];
- lossy: decode(errors='replace') re-encoded (one U+FFFD per maximal ill-formed subpart);
- complete_prefix: the length minus the trailing bytes that are a proper prefix of the encoding
  of some scalar value (chr(cp).encode() over all of them): what a stream must hold back;
- surrogatepass: the code points of decode(errors='surrogatepass') when that accepts the bytes
  (lone surrogates in their 3-byte form), else null.
`append` lists scalar values with chr(cp).encode('utf-8').
"""
import json
import random

SCALARS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
PROPER_PREFIXES = {chr(cp).encode()[:k] for cp in SCALARS for k in range(1, len(chr(cp).encode()))}


def one_char_at(b, i):
    for k in range(1, 5):
        try:
            s = b[i:i + k].decode()
        except UnicodeDecodeError:
            continue
        if len(s) == 1:
            return [k, ord(s)]
    return [0, -1]


def complete_prefix(b):
    for k in range(1, 4):
        if k <= len(b) and b[len(b) - k:] in PROPER_PREFIXES:
            return len(b) - k
    return len(b)


def case(b):
    try:
        b.decode()
        valid, bad = True, None
    except UnicodeDecodeError as e:
        valid, bad = False, e.start
    try:
        surrogatepass = [ord(c) for c in b.decode(errors='surrogatepass')]
    except UnicodeDecodeError:
        surrogatepass = None
    return {"bytes": b.hex(), "valid": valid, "bad": bad,
            "decode": [one_char_at(b, i) for i in range(len(b))],
            "lossy": b.decode(errors='replace').encode().hex(),
            "complete_prefix": complete_prefix(b), "surrogatepass": surrogatepass}


def inputs():
    yield from (bytes([x]) for x in range(256))
    # The first and last code point of each length and of each second-byte range (Table 3-7),
    # each whole, cut short, and with its last byte replaced.
    edges = [0x0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFF, 0x1000, 0xCFFF, 0xD000, 0xD7FF, 0xE000, 0xFFFD,
             0xFFFE, 0xFFFF, 0x10000, 0x3FFFF, 0x40000, 0xFFFFF, 0x100000, 0x10FFFF]
    for cp in edges:
        e = chr(cp).encode()
        yield e
        yield b"a" + e + b"z"
        for k in range(1, len(e)):
            yield e[:k]
            yield b"x" + e[:k]
            yield e[:k] + b"A"
            yield e[:k] + b"\xc3\xa9"
        if len(e) > 1:
            yield e[:-1] + b"\xc0"
    # Every lead byte against the edges of the second-byte ranges, completed with 0x80s.
    for lead in [0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3,
                 0xF4, 0xF5, 0xF7, 0xF8, 0xFC, 0xFF]:
        need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        for second in [0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0]:
            yield bytes([lead, second] + [0x80] * (need - 2))
            yield bytes([lead, second])
    named = [
        b"\xc0\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x80\xaf", b"\xe0\x9f\xbf",
        b"\xf0\x80\x80\x80", b"\xf0\x80\x80\xaf", b"\xf0\x8f\xbf\xbf",  # overlongs
        b"\xed\xa0\x80", b"\xed\xaf\xbf", b"\xed\xb0\x80", b"\xed\xbf\xbf",  # surrogates
        b"\xed\xa0\xbd\xed\xb2\xa9", b"a\xed\xa0\x80b",  # a CESU-8 pair, a lone one
        b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf",  # above U+10FFFF
        b"\xf8\x88\x80\x80\x80", b"\xfc\x84\x80\x80\x80\x80", b"\xfe", b"\xff\xfe",
        b"\x80", b"\xbf", b"a\x80b", b"\xc3\xa9\xa9", b"\x80\x80\x80\x80",  # stray continuations
        b"\x61\xf1\x80\x80\xe1\x80\xc2\x62\x80\x63\x80\xbf\x64",  # Unicode 15, section 3.9
        "aé€😀 Grüße, 世界".encode(),
    ]
    yield from named
    text = "aé€😀".encode()
    for k in range(len(text)):
        yield text[:k]
    rng = random.Random(20240601)
    alphabet = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE1,
                0xED, 0xEF, 0xF0, 0xF1, 0xF4, 0xF5, 0xFF]
    for _ in range(200):
        yield bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 10)))


def main():
    seen, cases = set(), []
    for b in inputs():
        if b not in seen:
            seen.add(b)
            cases.append(case(b))
    rng = random.Random(7)
    cps = sorted(set([0x0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFE, 0xFFFF,
                      0x10000, 0x10FFFF] + rng.sample(SCALARS, 200)))
    append = [{"cp": cp, "bytes": chr(cp).encode().hex()} for cp in cps]
    def line(v):  # one case a line
        return json.dumps(v, separators=(",", ":"))

    print('{"source":"CPython utf-8 codec",\n"cases":[\n' + ",\n".join(map(line, cases)) +
          '],\n"append":[\n' + ",\n".join(map(line, append)) + "]}")


if __name__ == "__main__":
    main()
