"""JSON written by someone else, parsed with a bound on its nesting depth.

Why: ``json.loads`` recurses once per nested array or object, so ``[`` x
100,000 raises ``RecursionError`` (a traceback for a CLI user, a 500 from
the plan service), and a document nested some hundreds of levels parses but
then overflows the stack of whatever walks it recursively afterwards
(validation, ``from_dict`` code, the JSON encoder with ``indent``). Every
reader of user input in autoshard goes through :func:`parse_json`, which
refuses a document nested deeper than :data:`MAX_DEPTH` before parsing it.

The formats nest at most 8 levels: a problem 5, an IOPDDL problem 5, a
solution 4, a plan 6, a hardware profile 5 (``tests/hw_profiles/
test_json_input.py`` measures the documented examples, the shipped profiles
and problems), a plan-service request (``autoshard solve --dump-problem``
of ``examples.models.llama3:tiny``) 8, raw calibration measurements 4
(measured once by hand). 256 refuses nothing real.

How the depth is measured, in a few passes at C speed and without
recursion: escapes (a backslash and the byte after it) are removed, every
byte but quotes and brackets is dropped, then the strings (now ``"..."``
with no quote inside); what is left are the brackets outside strings, and
the depth is the largest prefix sum of ``[{`` = +1, ``]}`` = -1. For valid
JSON that is its exact nesting depth (in valid JSON a backslash occurs only
inside strings, where it always starts an escape). For invalid JSON the
number may be off, but ``json.loads`` then refuses the text anyway; and
``RecursionError`` is caught as a backstop. Cost: a few percent of the
parse (IOPDDL problem R, 49 MB: 0.17 s against 3.3 s for ``json.loads``, on
a shared machine).

A document too deep raises :class:`JSONNestingError`, a
``json.JSONDecodeError``, so that each reader's existing handling of
malformed JSON reports it in its own words, naming its file or field.

Why here, in the lowest package: ``hw_profiles`` reads profile files and may
import nothing above it, while ``solver`` and ``autoshard`` may import it;
one implementation serves the three (standard library only, no torch).

>>> parse_json(b'{"a": [1, [2]]}')
{'a': [1, [2]]}
>>> nesting_depth('{"a": "[[[", "b": [[]]}')
3
>>> parse_json("[" * 300 + "]" * 300)
Traceback (most recent call last):
...
hw_profiles.json_input.JSONNestingError: too deeply nested (arrays and objects deeper than the limit of 256): line 1 column 257 (char 256)
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

__all__ = ["MAX_DEPTH", "JSONNestingError", "nesting_depth", "parse_json"]

MAX_DEPTH = 256
"""Deepest nesting of arrays and objects accepted (module docstring)."""

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')  # after escapes and other bytes are gone: no quote inside
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_STEP = [0] * 256
for _byte in b"[{":
    _STEP[_byte] = 1
for _byte in b"]}":
    _STEP[_byte] = -1
_TOKEN = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)


class JSONNestingError(json.JSONDecodeError):
    """A JSON document nested deeper than the limit (a ``json.JSONDecodeError``
    whose position is where the limit was passed)."""


def _utf8(data: bytes | str) -> bytes:
    """The text as UTF-8 bytes, decoded the way ``json.loads`` decodes bytes."""
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    encoding = json.detect_encoding(data)
    if encoding in ("utf-8", "utf-8-sig"):
        return bytes(data)
    return data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")


def nesting_depth(data: bytes | str) -> int:
    """How deeply arrays and objects nest in a JSON text (0 for a scalar),
    without parsing it (module docstring: exact for valid JSON).

    >>> nesting_depth(b'[[1], {"k": [2]}]'), nesting_depth("3")
    (3, 0)
    """
    raw = _utf8(data)
    if b"\\" in raw:
        raw = _ESCAPE.sub(b"", raw)
    brackets = _STRING.sub(b"", raw.translate(None, _NOT_STRUCTURE))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _too_deep_at(raw: bytes, max_depth: int) -> int:
    """Byte offset of the bracket that first passes ``max_depth`` (only called
    once the text is known to be too deep: a loop in Python, on the error path)."""
    depth, in_string = 0, False
    for match in _TOKEN.finditer(raw):
        token = match.group()
        if token[:1] == b"\\":
            continue
        if token == b'"':
            in_string = not in_string
        elif not in_string:
            depth += 1 if token in (b"[", b"{") else -1
            if depth > max_depth:
                return match.start()
    return 0


def parse_json(data: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(data)``, refusing nesting deeper than ``max_depth`` with
    :class:`JSONNestingError` before parsing. Other errors are ``json.loads``'s
    own: ``json.JSONDecodeError``, and ``UnicodeDecodeError`` for bytes that
    are not text.

    >>> parse_json('[[1]]', max_depth=1)
    Traceback (most recent call last):
    ...
    hw_profiles.json_input.JSONNestingError: too deeply nested (arrays and objects deeper than the limit of 1): line 1 column 2 (char 1)
    """
    if nesting_depth(data) > max_depth:
        raw = _utf8(data)
        prefix = raw[: _too_deep_at(raw, max_depth)].decode("utf-8", "replace")
        raise JSONNestingError(f"too deeply nested (arrays and objects deeper than the limit of {max_depth})", prefix, len(prefix))
    try:
        return json.loads(data)
    except RecursionError:  # not reached within MAX_DEPTH unless the stack is nearly full already
        raise JSONNestingError("too deeply nested to parse", "", 0) from None
