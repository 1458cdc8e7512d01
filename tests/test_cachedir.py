"""The cache dir's own state on synthetic entries (no Triton): receipts, publishing, roll-forward, sweep.

An entry here is what Triton writes: a key dir holding files and a ``__grp__<name>.json`` group file
whose ``child_paths`` name them by absolute path. A launcher-only dir holds ``.so`` files only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelcache.cachedir import STATE_DIR, CacheDir, Journal, Receipt, complete_entry, publish_entries, recover
from kernelcache.format.manifest import Build, Environment, Manifest, Target

pytestmark = pytest.mark.fast
KEYS = ("A" * 52, "B" * 52, "C" * 52)


def manifest() -> Manifest:
    env = Environment(python="3.11", platform="linux-x86_64", triton="3.6.0", triton_key_sha256="0" * 64)
    return Manifest(target=Target("cuda", "sm_90"), environment=env, build=Build(tool="test", mode="cross"))


def entry(root: Path, key: str, name: str = "k", group_root: Path | None = None) -> Path:
    """A complete Triton entry under ``root``, its group naming its children under ``group_root``."""
    where = root / key
    where.mkdir(parents=True)
    (where / f"{name}.cubin").write_bytes(b"\x7fELF" + key.encode())
    (where / f"{name}.json").write_text("{}")
    final = (group_root or root) / key
    children = {f"{name}.cubin": str(final / f"{name}.cubin"), f"{name}.json": str(final / f"{name}.json")}
    (where / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    return where


def staged(cache: CacheDir, keys=KEYS) -> Path:
    staging = cache.ensure_state() / "staging" / "s1"
    for key in keys:
        entry(staging, key, group_root=cache.root)
    return staging


def journal_for(cache: CacheDir, staging: Path, keys=KEYS, digest: str = "d" * 64) -> Path:
    receipt = Receipt(digest, manifest(), tuple(keys), "b.tar.zst", str(cache.root), 1.0, 1)
    path = cache.journal_path(digest)
    path.write_text(Journal(staging.name, tuple(keys), receipt).to_json())
    return path


def test_a_receipt_round_trips_through_json():
    receipt = Receipt("d" * 64, manifest(), ("x",), "b.tar.zst", "/c", 12.5, 7)
    assert Receipt.from_dict(json.loads(receipt.to_json())) == receipt


@pytest.mark.parametrize("text", ["not json", "[]", '{"digest": "abc"}', '{"digest": "abc", "manifest": {"x": 1}}'])
def test_a_bad_receipt_is_set_aside_with_its_reason(tmp_path, text):
    cache = CacheDir(tmp_path)
    cache.ensure_state()
    good = Receipt("d" * 64, manifest())
    cache.receipt_path(good.digest).write_text(good.to_json())
    cache.receipt_path("e" * 64).write_text(text)
    scan = cache.scan()
    assert scan.receipts == (good,) and [p.name for p, _ in scan.bad] == [f"{'e' * 64}.json"]
    assert cache.receipt("e" * 64) is None and cache.receipt(good.digest) == good


def test_receipts_come_newest_first(tmp_path):
    cache = CacheDir(tmp_path)
    cache.ensure_state()
    for digest, when in (("a" * 64, 1.0), ("b" * 64, 3.0), ("c" * 64, 2.0)):
        cache.receipt_path(digest).write_text(Receipt(digest, manifest(), installed_at=when).to_json())
    assert [r.digest[0] for r in cache.receipts()] == ["b", "c", "a"]


def test_publishing_moves_new_entries_whole_and_leaves_complete_ones_alone(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    staging = staged(cache)
    existing = entry(cache.root, KEYS[0])
    before = existing.joinpath("k.cubin").stat().st_mtime_ns
    moved: list = []
    assert publish_entries(cache.root, staging, KEYS, moved) == (2, 1)
    assert [t.name for _, t in moved] == list(KEYS[1:])
    assert all(complete_entry(cache.root / k) for k in KEYS)
    assert existing.joinpath("k.cubin").stat().st_mtime_ns == before


def test_publishing_fills_a_partial_entry_group_file_last(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    staging = staged(cache, KEYS[:1])
    partial = cache.root / KEYS[0]
    partial.mkdir(parents=True)
    (partial / "k.json").write_text("{}")  # Triton was killed before the cubin and the group file
    assert not complete_entry(partial)
    assert publish_entries(cache.root, staging, KEYS[:1], []) == (1, 0)
    assert complete_entry(partial)


def test_roll_forward_finishes_a_killed_publish_and_writes_the_receipt(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    staging = staged(cache)
    journal = journal_for(cache, staging)
    publish_entries(cache.root, staging, KEYS[:1], [])  # killed after the first rename
    assert recover(cache) == 1
    assert all(complete_entry(cache.root / k) for k in KEYS)
    [receipt] = cache.receipts()
    assert receipt.entries == KEYS and not journal.exists()
    assert list((cache.state / "staging").iterdir()) == []


def test_a_torn_journal_is_dropped_and_publishes_nothing(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    staging = staged(cache)
    cache.journal_path("d" * 64).write_text('{"staging": "s1", "entr')
    assert recover(cache) == 0
    assert cache.pending_journals() == [] and cache.receipts() == ()
    assert not any((cache.root / k).exists() for k in KEYS) and not staging.exists()


def test_roll_forward_writes_no_receipt_while_an_entry_is_incomplete(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    staging = staged(cache)
    journal_for(cache, staging)
    (staging / KEYS[2] / "k.cubin").unlink()  # its group names a child that will never exist
    assert recover(cache) == 1
    assert cache.receipts() == () and not complete_entry(cache.root / KEYS[2])


def test_sweep_removes_stale_staging_and_temp_files_only(tmp_path):
    cache = CacheDir(tmp_path / "cache")
    staged(cache)
    (cache.state / "installed" / ".x.json.123.tmp").write_text("")
    keep = Receipt("d" * 64, manifest())
    cache.receipt_path(keep.digest).write_text(keep.to_json())
    assert recover(cache) == 0
    assert sorted(p.name for p in (cache.state / "installed").iterdir()) == [f"{'d' * 64}.json"]
    assert list((cache.state / "staging").iterdir()) == []


def test_recover_on_a_dir_without_state_does_nothing(tmp_path):
    assert recover(CacheDir(tmp_path)) == 0 and not (tmp_path / STATE_DIR).exists()


def test_a_launcher_only_dir_is_complete_when_it_holds_only_modules(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "__triton_launcher.so").write_bytes(b"\x7fELF")
    assert complete_entry(tmp_path / "m")
    (tmp_path / "m" / "tmp.txt").write_text("")
    assert not complete_entry(tmp_path / "m")
