"""``hw_profiles.json_input``: the nesting depth measured without parsing is
the depth of the parsed document (ground truth: a recursive walk of what
``json.loads`` returns) on random documents whose strings are full of
brackets, quotes and backslashes; the limit holds at exactly 256, names the
place it is passed, and is far above every real format."""

from __future__ import annotations

import gzip
import inspect
import json
import random
import re
import sys
from pathlib import Path

import pytest

from hw_profiles import ProfileError, available, load, validate
from hw_profiles.json_input import MAX_DEPTH, JSONNestingError, nesting_depth, parse_json

ROOT = Path(__file__).resolve().parents[2]
TRICKY = ['[', ']', '{', '}', '"', '\\', '\\"', '"]', '\\\\', '[\\"]', 'é[', '\u2028', '\\u005b', '\n', ':', ',']


def _depth(value: object) -> int:
    """Ground truth: arrays and objects on the deepest path."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _random_document(rnd: random.Random, depth: int) -> object:
    if depth == 0 or rnd.random() < 0.25:
        return rnd.choice([None, True, 1, -2.5, "".join(rnd.choices(TRICKY, k=rnd.randint(0, 6)))])
    if rnd.random() < 0.5:
        return [_random_document(rnd, depth - 1) for _ in range(rnd.randint(0, 4))]
    return {"".join(rnd.choices(TRICKY, k=rnd.randint(0, 4))) + str(i): _random_document(rnd, depth - 1)
            for i in range(rnd.randint(0, 4))}


@pytest.mark.parametrize("seed", range(20))
def test_nesting_depth_equals_the_depth_of_the_parsed_document(seed: int) -> None:
    rnd = random.Random(seed)
    for _ in range(25):
        document = _random_document(rnd, rnd.randint(0, 12))
        expected = _depth(document)
        for text in (json.dumps(document), json.dumps(document, ensure_ascii=False, indent=1)):
            assert nesting_depth(text) == expected, text
            assert nesting_depth(text.encode("utf-8")) == expected, text
            assert nesting_depth(text.encode("utf-16")) == expected, text  # json.loads reads UTF-16 bytes too
            assert parse_json(text) == json.loads(text)


@pytest.mark.parametrize("open_, close", [("[", "]"), ('{"k":', "}")])
def test_the_limit_is_exactly_max_depth_and_names_where_it_is_passed(open_: str, close: str) -> None:
    ok = open_ * MAX_DEPTH + "1" * (open_ == '{"k":') + close * MAX_DEPTH
    assert _depth(parse_json(ok)) == MAX_DEPTH
    deep = "\n".join([open_] * (MAX_DEPTH + 1)) + "1" * (open_ == '{"k":') + close * (MAX_DEPTH + 1)
    with pytest.raises(JSONNestingError) as err:
        parse_json(deep.encode())
    assert (err.value.lineno, err.value.colno) == (MAX_DEPTH + 1, 1)
    assert isinstance(err.value, json.JSONDecodeError) and "deeper than the limit of 256" in str(err.value)


def test_brackets_inside_strings_do_not_count() -> None:
    assert parse_json('["' + "[" * 10_000 + '"]') == ["[" * 10_000]
    assert parse_json('["\\\\", "' + "{" * 1000 + '"]')[1] == "{" * 1000


def test_far_deeper_than_the_stack_is_refused_before_parsing() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, "[" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        with pytest.raises(JSONNestingError, match="deeper than the limit of 256"):
            parse_json(text)


def test_recursion_in_the_parser_is_a_json_error_too() -> None:
    """The backstop: a stack nearly full already (here: a low recursion limit)."""
    frames = len(inspect.stack())
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(frames + 60)
    try:
        with pytest.raises(JSONNestingError, match="too deeply nested to parse"):
            parse_json("[" * 200 + "]" * 200)
    finally:
        sys.setrecursionlimit(old)


def test_other_errors_are_json_loads_own() -> None:
    with pytest.raises(json.JSONDecodeError, match="Expecting value"):
        parse_json("[1,]")
    with pytest.raises(UnicodeDecodeError):
        parse_json(b'["\xff"]')


def _real_documents() -> dict[str, str | bytes]:
    docs: dict[str, str | bytes] = {}
    text = (ROOT / "docs" / "formats.md").read_text()
    for found in re.finditer(r"<!-- schema: (\S+) -->\s*```json\n(.*?)```", text, re.S):
        docs[f"formats.md {found.group(1)}"] = found.group(2)
    for name in available():
        docs[f"profile {name}"] = json.dumps(load(name).to_dict())
    for path in sorted((ROOT / "examples" / "problems").glob("*.json")):
        docs[f"problem {path.name}"] = path.read_bytes()
    iopddl = ROOT.parent / "shared" / "iopddl" / "asplos-2025-iopddl-V.json.gz"
    if iopddl.exists():
        docs["IOPDDL V"] = gzip.decompress(iopddl.read_bytes())
    return docs


def test_every_real_format_is_far_below_the_limit() -> None:
    depths = {name: nesting_depth(text) for name, text in _real_documents().items()}
    assert {"formats.md problem", "formats.md plan", "formats.md hw_profile", "profile cpu-gloo"} <= set(depths)
    # profiles with bus-bandwidth curves reach 9; the limit (256) leaves a 28x margin
    assert max(depths.values()) <= 9 and MAX_DEPTH >= 16 * max(depths.values()), depths


def test_a_profile_dict_nested_deeper_than_a_file_may_be_is_refused_without_recursion() -> None:
    """``validate`` walks the dict in a loop and refuses it before the JSON
    Schema validator (recursive, and quoting the value) sees it."""
    deep: list = []
    inner = deep
    for _ in range(100_000):
        inner.append([])
        inner = inner[0]
    profile = load("cpu-gloo").to_dict()
    for where in ("device", "unknown_key"):
        with pytest.raises(ProfileError, match=rf"^{where}\[0\]: nested deeper than 256 levels$"):
            validate({**profile, where: deep})
    with pytest.raises(ProfileError, match=r"^device: \[0, 1, 2, .*\.\.\.$") as err:
        validate({**profile, "device": list(range(100_000))})
    assert len(str(err.value)) < 400  # one readable line, not the whole list
