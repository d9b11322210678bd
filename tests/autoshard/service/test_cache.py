"""The result cache: content keys, atomic files, LRU eviction by size, recency kept across a restart."""

from __future__ import annotations

import os
import time

from autoshard.service.cache import ResultCache, code_version, content_key


def test_keys_follow_content_options_and_version() -> None:
    base = content_key("problem", b"{}", {"time_limit": 5, "backend": "cbc"}, "v1")
    assert base == content_key("problem", b"{}", {"backend": "cbc", "time_limit": 5}, "v1")
    assert len({base, content_key("plan", b"{}", {"time_limit": 5, "backend": "cbc"}, "v1"),
                content_key("problem", b"{ }", {"time_limit": 5, "backend": "cbc"}, "v1"),
                content_key("problem", b"{}", {"time_limit": 6, "backend": "cbc"}, "v1"),
                content_key("problem", b"{}", {"time_limit": 5, "backend": "cbc"}, "v2")}) == 5
    assert code_version().startswith("0.") and code_version() == code_version()


def test_least_recently_used_goes_first_and_survives_a_restart(tmp_path) -> None:
    cache = ResultCache(tmp_path, max_bytes=300)
    keys = [content_key("problem", bytes([i]), {}, "v") for i in range(4)]
    for k in keys[:3]:
        cache.put(k, "x" * 100)
        time.sleep(0.01)  # distinct mtimes: the recency order on disk
    assert cache.get(keys[0]) == "x" * 100  # keys[1] is now the least recent
    cache.put(keys[3], "y" * 100)
    assert keys[1] not in cache and cache.get(keys[1]) is None
    assert all(k in cache for k in (keys[0], keys[2], keys[3])) and cache.total_bytes == 300
    reopened = ResultCache(tmp_path, max_bytes=200)  # a smaller bound: the oldest on disk goes
    assert keys[2] not in reopened and reopened.get(keys[0]) == "x" * 100 and reopened.get(keys[3]) == "y" * 100


def test_writes_are_atomic_and_stray_temporaries_are_dropped(tmp_path) -> None:
    cache = ResultCache(tmp_path, max_bytes=1 << 20)
    key = content_key("problem", b"a", {}, "v")
    cache.put(key, '{"a": 1}')
    folder = tmp_path / "results" / key[:2]
    (folder / f".{key[:16]}.half.tmp").write_text('{"a":')  # an interrupted write
    assert sorted(os.listdir(folder)) == sorted([f"{key}.json", f".{key[:16]}.half.tmp"])
    reopened = ResultCache(tmp_path, max_bytes=1 << 20)
    assert os.listdir(folder) == [f"{key}.json"] and reopened.get(key) == '{"a": 1}'
    cache.put(key, "z" * (2 << 20))  # larger than the bound: not kept, the old entry stays
    assert cache.get(key) == '{"a": 1}'
