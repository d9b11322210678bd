"""Redistribution tables on disk (``costmodel.redistribute_disk``): a table read back is the
table computed, bit for bit; the file's key (profile, mesh, code) keeps tables apart; a damaged
file is ignored; a store in use serves ``redistribute_costs`` without recomputing."""

from __future__ import annotations

import math

import numpy as np
import pytest

from costmodel import redistribute, redistribute_disk
from costmodel.mesh import MeshSpec
from costmodel.placements import parse_placements as pp
from costmodel.redistribute import redistribute_costs
from costmodel.redistribute_disk import TableStore, use_folder
from hw_profiles import load

PLACEMENTS = [pp(t) for t in ("RR", "S(0)R", "RS(1)", "S(0)S(1)", "P(sum)R", "RP(sum)", "S(1)P(sum)")]


@pytest.fixture(autouse=True)
def no_store_left_in_use():
    yield
    use_folder(None)


def _costs(shape=(8, 64), mesh=MeshSpec((2, 2)), profile="cpu-gloo"):
    return redistribute_costs(PLACEMENTS, [*PLACEMENTS, None], mesh, shape, 4, load(profile))


def test_tables_written_then_read_in_a_new_store_are_the_same_floats(tmp_path) -> None:
    redistribute.clear_cache()
    use_folder(tmp_path)
    computed = _costs()
    assert redistribute_disk.active_store().flush() == 1
    fresh = use_folder(tmp_path)
    read = fresh.get(MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 64), 4, PLACEMENTS, [*PLACEMENTS, None])
    assert read is not None
    assert np.array_equal(np.array(read), np.array(computed))  # == on every double, inf included
    assert [[v.hex() for v in row] for row in read] == [[v.hex() for v in row] for row in computed]


def test_infinite_costs_round_trip(tmp_path) -> None:
    store = TableStore(tmp_path)
    args = (MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 8), 4, ["S(0)R"], ["RR", "S(1)R"])
    store.put(*args, [[1.25e-05, math.inf]])
    store.flush()
    assert TableStore(tmp_path).get(*args) == [[1.25e-05, math.inf]]


def test_a_store_in_use_answers_without_pricing_again(tmp_path, monkeypatch) -> None:
    use_folder(tmp_path)
    first = _costs(shape=(16, 32))
    redistribute_disk.active_store().flush()
    use_folder(tmp_path)  # a new process: nothing in memory but the folder

    def no_pricing(*args, **kwargs):
        raise AssertionError("priced again although the table was on disk")

    monkeypatch.setattr(redistribute, "tensor_table", no_pricing)
    assert _costs(shape=(16, 32)) == first


def test_another_profile_or_mesh_is_not_served_a_stored_table(tmp_path) -> None:
    store = TableStore(tmp_path)
    args = ((8, 8), 4, ["S(0)R"], ["RR"])
    store.put(MeshSpec((2, 2)), load("cpu-gloo"), True, *args, [[1.0]])
    store.flush()
    again = TableStore(tmp_path)
    assert again.get(MeshSpec((2, 2)), load("cpu-gloo"), True, *args) == [[1.0]]
    assert again.get(MeshSpec((2, 2)), load("h100-sxm-80gb"), True, *args) is None
    assert again.get(MeshSpec((4, 1)), load("cpu-gloo"), True, *args) is None
    assert again.get(MeshSpec((2, 2)), load("cpu-gloo"), False, *args) is None


def test_another_code_version_starts_a_new_file(tmp_path, monkeypatch) -> None:
    store = TableStore(tmp_path)
    args = (MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 8), 4, ["S(0)R"], ["RR"])
    store.put(*args, [[2.0]])
    store.flush()
    monkeypatch.setattr(redistribute_disk, "_CODE", ["an-edited-cost-model"])
    assert TableStore(tmp_path).get(*args) is None


def test_a_damaged_file_is_ignored_and_rewritten(tmp_path) -> None:
    store = TableStore(tmp_path)
    args = (MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 8), 4, ["S(0)R"], ["RR"])
    store.put(*args, [[3.0]])
    store.flush()
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(path.read_bytes()[:100])  # truncated, as by a full disk
    again = TableStore(tmp_path)
    assert again.get(*args) is None
    again.put(*args, [[3.0]])
    assert again.flush() == 1
    assert TableStore(tmp_path).get(*args) == [[3.0]]


def test_two_processes_tables_are_merged_not_overwritten(tmp_path) -> None:
    mesh, profile = MeshSpec((2, 2)), load("cpu-gloo")
    one, two = TableStore(tmp_path), TableStore(tmp_path)
    one.get(mesh, profile, True, (8, 8), 4, ["RR"], ["RR"])  # both read the (empty) file first
    two.get(mesh, profile, True, (8, 8), 4, ["RR"], ["RR"])
    one.put(mesh, profile, True, (8, 8), 4, ["S(0)R"], ["RR"], [[1.0]])
    two.put(mesh, profile, True, (16, 8), 4, ["S(0)R"], ["RR"], [[2.0]])
    one.flush()
    two.flush()
    both = TableStore(tmp_path)
    assert both.get(mesh, profile, True, (8, 8), 4, ["S(0)R"], ["RR"]) == [[1.0]]
    assert both.get(mesh, profile, True, (16, 8), 4, ["S(0)R"], ["RR"]) == [[2.0]]


def test_a_folder_that_cannot_be_written_is_logged_not_raised(tmp_path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = TableStore(blocker / "redistribute")
    store.put(MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 8), 4, ["S(0)R"], ["RR"], [[1.0]])
    assert store.flush() == 0
    assert "not cached" in caplog.text


def test_docstring_examples_pass() -> None:
    import doctest

    result = doctest.testmod(redistribute_disk, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_a_write_deletes_the_files_of_other_code_versions(tmp_path, monkeypatch) -> None:
    args = (MeshSpec((2, 2)), load("cpu-gloo"), True, (8, 8), 4, ["S(0)R"], ["RR"])
    old = TableStore(tmp_path)
    old.put(*args, [[2.0]])
    old.flush()
    (stale,) = tmp_path.glob("*.npz")
    monkeypatch.setattr(redistribute_disk, "_CODE", ["0123456789abcdef0123"])
    new = TableStore(tmp_path)
    new.put(*args, [[2.5]])
    new.flush()
    assert not stale.exists()
    assert [p.name.split("-")[0] for p in tmp_path.glob("*.npz")] == ["0123456789abcdef0123"]


def test_the_hashed_sources_cover_every_module_a_table_depends_on() -> None:
    hashed = set(redistribute_disk.DEPENDS)
    missing = {name for name in redistribute_disk.dependencies() if not name.startswith("hw_profiles")} - hashed
    assert not missing, f"add {sorted(missing)} to costmodel.redistribute_disk.DEPENDS"
    assert "costmodel.buckets.grouping" not in hashed  # an unrelated edit keeps the tables


def test_the_dependency_reader_follows_from_imports_of_modules(tmp_path) -> None:
    (tmp_path / "costmodel").mkdir()
    (tmp_path / "costmodel" / "__init__.py").write_text("")
    (tmp_path / "costmodel" / "redistribute.py").write_text("from costmodel import a\ndef f():\n    import costmodel.b\n")
    (tmp_path / "costmodel" / "a.py").write_text("from hw_profiles.profile import X\n")
    (tmp_path / "costmodel" / "b.py").write_text("")
    (tmp_path / "costmodel" / "c.py").write_text("")
    assert redistribute_disk.dependencies(tmp_path) == {"costmodel", "costmodel.redistribute", "costmodel.a",
                                                        "costmodel.b"}
