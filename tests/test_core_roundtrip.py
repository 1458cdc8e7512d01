"""The end-to-end core: compile for a fake GPU, pack, delete, install elsewhere, hit everything."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.common import kc, run_job, tree

from kernelcache.cachedir import STATE_DIR
from kernelcache.format import archive


@pytest.mark.parametrize("capability", [90, 100])
def test_relocated_install_hits_every_kernel_and_writes_nothing(capability, tmp_path):
    build_dir = tmp_path / "build"
    result, compiled = run_job(tmp_path / "w1", build_dir / "cache", capability)
    assert compiled and not any(r["cache_hit"] for r in compiled)
    bundle = tmp_path / "b.tar.zst"
    kc("pack", str(build_dir / "cache"), "-o", str(bundle), "--compile-log", str(tmp_path / "w1" / "compiles.jsonl"),
       check=True)
    shutil.rmtree(build_dir)

    target = tmp_path / "elsewhere" / "cache"
    kc("install", str(bundle), "--cache-dir", str(target), check=True)
    before = tree(target)
    _, replay = run_job(tmp_path / "w2", target, capability)

    assert len(replay) == len(compiled) >= 20
    assert all(r["cache_hit"] for r in replay), [r["name"] for r in replay if not r["cache_hit"]]
    assert {r["key"] for r in replay} == {r["key"] for r in compiled}
    assert tree(target) == before  # no kernel, launcher or cuda_utils was written


def test_without_group_rewrite_a_moved_cache_misses(tmp_path):
    """The control: a cache moved as-is recompiles everything (why install rewrites group files)."""
    original, moved = tmp_path / "original", tmp_path / "moved"
    run_job(tmp_path / "w0", original, 90)
    _, again = run_job(tmp_path / "w1", original, 90)
    assert again and all(r["cache_hit"] for r in again)
    original.rename(moved)
    _, replay = run_job(tmp_path / "w", moved, 90)
    assert not any(r["cache_hit"] for r in replay)


def test_cubins_are_for_the_named_arch(built):
    cuobjdump = Path(__import__("triton").__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    for capability, (cache, _, _) in built.items():
        cubins = sorted(cache.glob("*/*.cubin"))
        assert cubins
        for cubin in cubins[:4]:
            listing = subprocess.run([str(cuobjdump), "-lelf", str(cubin)], capture_output=True, text=True).stdout
            assert f".sm_{capability}a.cubin" in listing, listing


def test_pack_is_byte_identical_and_slim(built, tmp_path):
    cache, log, compiled = built[90]
    a, b = tmp_path / "a.tar.zst", tmp_path / "b.tar.zst"
    kc("pack", str(cache), "-o", str(a), "--compile-log", str(log), check=True)
    kc("pack", str(cache), "-o", str(b), "--compile-log", str(log), check=True)
    assert a.read_bytes() == b.read_bytes()

    names = [name for _, name, _ in archive.iter_members(a)]
    assert names == sorted(names)
    suffixes = {Path(n).suffix for n in names}
    assert suffixes <= {".json", ".cubin", ".so", ".source-sha256"}  # no IR
    manifest = archive.read_manifest(a)
    assert len(manifest.kernels) == len({r["key"] for r in compiled})
    assert {m.kind for m in manifest.modules} == {"launcher", "cuda_utils"}
    kernel = next(k for k in manifest.kernels if k.name == "add_kernel" and k.constexprs.get("n") == 1)
    assert kernel.signature["n"] == "constexpr" and kernel.constexprs["BLOCK"] == 1024
    assert kernel.num_warps == 4


def test_tar_members_are_normalised(bundle90):
    import io
    import tarfile

    import zstandard

    with open(bundle90, "rb") as handle:
        raw = zstandard.ZstdDecompressor().stream_reader(handle, read_across_frames=True)
        with tarfile.open(fileobj=io.BufferedReader(raw), mode="r|") as tar:
            members = list(tar)
    assert members[0].name == "manifest.json"
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode, m.type) for m in members} == {
        (0, 0, 0, "", "", 0o644, tarfile.REGTYPE)}


def test_source_date_epoch_sets_mtime(built, tmp_path):
    cache, log, _ = built[90]
    out = tmp_path / "e.tar.zst"
    kc("pack", str(cache), "-o", str(out), env={"SOURCE_DATE_EPOCH": "1700000000"}, check=True)
    assert archive.read_manifest(out).build.source_date_epoch == 1700000000


def test_keep_ir_carries_ir_and_still_hits(built, tmp_path):
    cache, log, compiled = built[100]
    out = tmp_path / "ir.tar.zst"
    kc("pack", str(cache), "-o", str(out), "--keep-ir", check=True)
    names = {Path(n).suffix for _, n, _ in archive.iter_members(out)}
    assert {".ttir", ".ttgir", ".llir", ".ptx", ".source"} <= names
    target = tmp_path / "inst"
    kc("install", str(out), "--cache-dir", str(target), check=True)
    _, replay = run_job(tmp_path / "w", target, 100)
    assert replay and all(r["cache_hit"] for r in replay)


def test_pack_skips_incomplete_writes_and_reports_them(built, tmp_path):
    cache, log, _ = built[90]
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    victim = next(p for p in sorted(copy.iterdir()) if list(p.glob("__grp__*.json")))
    next(victim.glob("__grp__*.json")).unlink()  # as if the writer died before the commit marker
    (copy / "tmp.pid_1_abc").mkdir()
    (copy / "tmp.pid_1_abc" / "x.cubin").write_bytes(b"partial")
    out = tmp_path / "s.tar.zst"
    done = kc("pack", str(copy), "-o", str(out), check=True)
    assert "tmp.pid_1_abc" in done.stderr and victim.name in done.stderr
    manifest = archive.read_manifest(out)
    assert victim.name not in {k.key for k in manifest.kernels}
    assert {s["path"] for s in manifest.build.skipped} >= {"tmp.pid_1_abc", victim.name}


def test_pack_without_compile_log_reads_the_signature_from_the_ir(built, tmp_path):
    cache, _, _ = built[90]
    out = tmp_path / "nolog.tar.zst"
    kc("pack", str(cache), "-o", str(out), check=True)
    kernels = [k for k in archive.read_manifest(out).kernels if k.name == "add_kernel"]
    assert {k.signature["x_ptr"] for k in kernels} == {"*fp32", "*fp16", "*bf16"}
    assert all("BLOCK" not in k.signature and k.constexprs is None for k in kernels)


def test_install_is_idempotent_and_leaves_other_entries_alone(bundle90, tmp_path):
    target = tmp_path / "cache"
    foreign = target / "FOREIGNENTRYAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
    foreign.mkdir(parents=True)
    (foreign / "mine.txt").write_text("keep me")
    first = json.loads(kc("install", str(bundle90), "--cache-dir", str(target), "--json", check=True).stdout)
    snapshot = tree(target)
    second = json.loads(kc("install", str(bundle90), "--cache-dir", str(target), "--json", check=True).stdout)
    assert first["action"] == "installed" and second["action"] == "already-installed"
    assert tree(target) == snapshot
    assert (foreign / "mine.txt").read_text() == "keep me"
    assert not list((target / STATE_DIR / "staging").iterdir())


def test_install_fills_an_entry_triton_left_partial(bundle90, tmp_path):
    manifest = archive.read_manifest(bundle90)
    kernel = manifest.kernels[0]
    target = tmp_path / "cache"
    (target / kernel.key).mkdir(parents=True)
    (target / kernel.key / f"{kernel.name}.json").write_text("{}")  # torn: no cubin, no group file
    kc("install", str(bundle90), "--cache-dir", str(target), check=True)
    assert (target / kernel.key / f"{kernel.name}.json").read_text() != "{}"
    group = json.loads((target / kernel.key / f"__grp__{kernel.name}.json").read_text())
    assert all(Path(p).exists() and str(target) in p for p in group["child_paths"].values())
