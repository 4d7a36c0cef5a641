"""Randomised cross-check of `toolgate canonical --lines` against Python (SPEC §1).

The canonical form must equal
    json.dumps(doc, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
byte for byte. Documents are fed in deliberately non-canonical spellings
(unsorted keys, raw non-ASCII, random whitespace), one JSON text per line.

Binary: $TOOLGATE_BIN, default <repo>/target/debug/toolgate (run `cargo build` first).
"""

from __future__ import annotations

import json
import math
import os
import random
import struct
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED = 20240611
N_DOCS = 20_000
MAX_DEPTH = 6


def _binary() -> str:
    path = Path(os.environ.get("TOOLGATE_BIN", REPO_ROOT / "target" / "debug" / "toolgate"))
    if not path.is_file():
        pytest.fail(f"toolgate binary not found at {path}; run `cargo build` or set TOOLGATE_BIN")
    return str(path)


def _run_lines(tmp_path: Path, lines: list[str]) -> tuple[int, list[str], str]:
    for i, line in enumerate(lines):
        assert "\n" not in line and not line.endswith("\r"), f"generator bug on line {i + 1}"
        assert line != "", f"generator bug: empty line {i + 1}"
    src = tmp_path / "input.jsonl"
    # No trailing newline: the line count is unambiguous however the CLI splits.
    src.write_bytes("\n".join(lines).encode("utf-8"))
    proc = subprocess.run(
        [_binary(), "canonical", "--lines", str(src)],
        capture_output=True,
        timeout=300,
    )
    out = proc.stdout.decode("utf-8", errors="replace")
    if out.endswith("\n"):
        out = out[:-1]
    return proc.returncode, out.split("\n") if lines else [], proc.stderr.decode("utf-8", "replace")


def _canonical(doc) -> str:
    return json.dumps(doc, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


# --------------------------------------------------------------------------- generator

ASCII = [chr(c) for c in range(0x20, 0x7F)]
CONTROL = [chr(c) for c in range(0x20)] + ["\x7f"]
SPECIAL = ['"', "\\", "/", "\\u", "\b", "\f", "\n", "\r", "\t"]
COMBINING = ["\u0301", "\u0308", "\u0327", "\u20dd", "\ufe0f"]
BMP_SAMPLES = ["é", "ß", "Ж", "中", "文", "€", "\u2028", "\u2029", "\u00a0", "\ufeff", "\uffff", "\ue000", "\u0085"]
ASTRAL = ["😀", "🎉", "👍🏽", "𝄞", "\U00010000", "\U0010ffff", "\U0001f1e7\U0001f1f7"]


def _random_bmp(rng: random.Random) -> str:
    while True:
        c = rng.randint(0x80, 0xFFFF)
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)


def _random_char(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        return rng.choice(ASCII)
    if r < 0.55:
        return rng.choice(CONTROL)
    if r < 0.63:
        return rng.choice(SPECIAL)
    if r < 0.73:
        return rng.choice(BMP_SAMPLES)
    if r < 0.83:
        return _random_bmp(rng)
    if r < 0.90:
        return rng.choice(COMBINING)
    if r < 0.97:
        return rng.choice(ASTRAL)
    return chr(rng.randint(0x10000, 0x10FFFF))


def _random_string(rng: random.Random, max_len: int = 12) -> str:
    if rng.random() < 0.1:
        return ""
    return "".join(_random_char(rng) for _ in range(rng.randint(1, max_len)))


def _random_key(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.4:
        return "".join(rng.choice("abcdeABCDE_-0123") for _ in range(rng.randint(1, 4)))
    if r < 0.5:
        # Keys differing only in non-ASCII / combining marks / case.
        return rng.choice(["e", "é", "e\u0301", "E", "ë", "z", "Z", "\uffff", "😀", "", " "])
    return _random_string(rng, 8)


INT_EDGES = [0, 1, -1, 2**31 - 1, -(2**31), 2**53, 2**53 + 1, -(2**53) - 1,
             2**63 - 1, 2**63, -(2**63), -(2**63) + 1, 2**64 - 1, 2**64 - 2, 10**18, 10**19]


def _random_int(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.2:
        return rng.choice(INT_EDGES)
    if r < 0.5:
        return rng.randint(-1000, 1000)
    if r < 0.7:
        return rng.randint(-(2**63), 2**64 - 1)
    bits = rng.randint(1, 64)
    v = rng.getrandbits(bits)
    return -v if v <= 2**63 and rng.random() < 0.5 else v


FLOAT_EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, 0.5, 15000.0, 1e15, 1e16, 1e-4, 1e-5, 1.5e-7,
               5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.7976931348623157e308,
               1e22, 1e23, 2.0**53, 2.0**63, 2.0**64, 123456789.0, 9999999999999998.0, 0.30000000000000004,
               111275153569243.125, 1997107851181081.25]


def _random_float(rng: random.Random) -> float:
    while True:
        r = rng.random()
        if r < 0.35:
            f = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        elif r < 0.5:
            f = rng.choice(FLOAT_EDGES)
        elif r < 0.7:
            f = rng.uniform(-1.0, 1.0) * 10.0 ** rng.randint(-30, 30)
        elif r < 0.8:
            f = float(rng.randint(-(10**7), 10**7))  # integral floats: 15000.0
        elif r < 0.9:
            f = math.ldexp(rng.randint(1, 2**53 - 1), -rng.randint(1, 30))  # exact binary fractions (ties)
        else:
            f = rng.uniform(-1e6, 1e6)
        if math.isfinite(f):
            return f


def _random_scalar(rng: random.Random):
    r = rng.random()
    if r < 0.3:
        return _random_string(rng)
    if r < 0.55:
        return _random_int(rng)
    if r < 0.85:
        return _random_float(rng)
    if r < 0.95:
        return rng.choice([True, False])
    return None


def _random_doc(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth >= MAX_DEPTH or r < 0.25 + 0.1 * depth:
        return _random_scalar(rng)
    n = rng.randint(0, 8) if depth == 0 else rng.choice([0, 1, 1, 2, 2, 3, 4])
    if r < 0.6:
        return [_random_doc(rng, depth + 1) for _ in range(n)]
    doc = {}
    for _ in range(n):
        doc[_random_key(rng)] = _random_doc(rng, depth + 1)
    # Python dicts keep insertion order; shuffle so keys arrive unsorted.
    items = list(doc.items())
    rng.shuffle(items)
    return dict(items)


def _noncanonical_dumps(rng: random.Random, doc) -> str:
    ws = [" ", "\t", "  ", "\r", ""]
    item_sep = rng.choice([",", ", ", " ,", ",\t", " , "])
    key_sep = rng.choice([":", ": ", " : ", ":\t", "\t:"])
    text = json.dumps(
        doc,
        sort_keys=False,
        ensure_ascii=rng.random() < 0.5,
        separators=(item_sep, key_sep),
        allow_nan=False,
    )
    if rng.random() < 0.3:
        text = rng.choice(ws) + text
    if rng.random() < 0.3:
        text = text + rng.choice([" ", "\t", "  "])  # never a trailing "\r"
    return text


# --------------------------------------------------------------------------- tests


def _first_diff(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _excerpt(text: str, at: int, width: int = 80) -> str:
    start = max(0, at - width)
    return ("..." if start else "") + text[start : at + width] + ("..." if at + width < len(text) else "")


def test_random_documents_match_python(tmp_path):
    rng = random.Random(SEED)
    docs = [_random_doc(rng) for _ in range(N_DOCS)]
    lines = [_noncanonical_dumps(rng, doc) for doc in docs]
    expected = [_canonical(doc) for doc in docs]

    code, got, stderr = _run_lines(tmp_path, lines)

    assert len(got) == len(expected), (
        f"expected {len(expected)} output lines, got {len(got)} (exit {code}); stderr: {stderr[:500]}"
    )
    mismatches = [(i + 1, lines[i], g, e) for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    report = "\n".join(
        f"line {n} (first difference at char {_first_diff(g, e)}):\n"
        f"  input: {_excerpt(inp, 0)!r}\n"
        f"  got:   {_excerpt(g, _first_diff(g, e))!r}\n"
        f"  want:  {_excerpt(e, _first_diff(g, e))!r}"
        for n, inp, g, e in mismatches[:5]
    )
    assert not mismatches, f"{len(mismatches)} of {len(expected)} lines differ; first ones:\n{report}"
    assert code == 0, f"exit code {code} although every line is valid; stderr: {stderr[:500]}"


def test_invalid_lines_are_reported_per_line(tmp_path):
    deep_ok = "[" * 64 + "]" * 64
    cases = [
        ('{"b": 1, "a": [1.0, -0.0]}', '{"a":[1.0,-0.0],"b":1}'),
        ('{"a":1,"a":2}', "error: duplicate-key"),
        ('"caf\u00e9 \U0001F600"', '"caf\\u00e9 \\ud83d\\ude00"'),
        ('"\\ud800"', "error: lone-surrogate"),
        ('"\\udc00x"', "error: lone-surrogate"),
        ("NaN", "error: invalid-json"),
        ("[1e16, 1e-05]", "[1e+16,1e-05]"),
        ("1e400", "error: number-out-of-range"),
        ("18446744073709551616", "error: number-out-of-range"),
        ("[" * 65 + "]" * 65, "error: too-deep"),
        (deep_ok, deep_ok),
        ("[1,]", "error: invalid-json"),
        ("{'a':1}", "error: invalid-json"),
        ("01", "error: invalid-json"),
        ('{"x":{"a":1,"a":1}}', "error: duplicate-key"),
        ("  18446744073709551615  ", "18446744073709551615"),
        ("-Infinity", "error: invalid-json"),
        ('{"z":null,"\u00e9":true,"Z":false}', '{"Z":false,"z":null,"\\u00e9":true}'),
    ]
    lines = [c[0] for c in cases]
    want = [c[1] for c in cases]

    code, got, stderr = _run_lines(tmp_path, lines)

    assert got == want, "per-line results differ:\n" + "\n".join(
        f"line {i + 1}: input {lines[i][:80]!r}: got {g!r}, want {w!r}"
        for i, (g, w) in enumerate(zip(got + [None] * len(want), want))
        if g != w
    )
    assert code == 1, f"exit code {code}, want 1 when some lines are rejected; stderr: {stderr[:500]}"
