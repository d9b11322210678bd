"""The cache folder: ``$AUTOSHARD_CACHE_DIR`` first, else XDG's; the tables' folder inside it."""

from __future__ import annotations

from pathlib import Path

from autoshard.plan.cache_folder import default_cache_dir, tables_folder


def test_tables_folder_is_under_the_cache_folder_the_environment_names(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AUTOSHARD_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    assert tables_folder() == tmp_path / "redistribute"


def test_tables_folder_follows_xdg_without_autoshard_cache_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("AUTOSHARD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tables_folder() == tmp_path / "autoshard" / "plans" / "redistribute"
    assert tables_folder(Path("/x")) == Path("/x/redistribute")
