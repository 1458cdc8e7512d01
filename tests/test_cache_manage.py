"""`kernelcache ls`, `rm` and `prune`: what is installed in a cache dir, and removing it safely.

Real bundles (parts of the session's compiled test bundle that share kernels and launchers), installed for real;
the CLI runs as users run it (``python -m kernelcache``); the concurrency test runs `rm` and `install` as separate
processes beside a Triton process that looks every kernel up with Triton's own ``FileCacheManager``; the crash
test SIGKILLs `rm` at seeded points of its file-system operations (tests/test_crash_safety.py's ``fork_run``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.bundles import engine_bundle, rewrite, split
from helpers.cachecheck import bundle_state, entry_states, expected_bytes, has_receipt, leftovers
from helpers.common import ROOT, clean_env, entry_point, kc, tree
from helpers.mounts import read_only
from test_crash_safety import fork_run

import kernelcache
from kernelcache.cachedir import STATE_DIR, CacheDir, recover
from kernelcache.errors import NotInstalled, StorageError
from kernelcache.format import archive
from kernelcache.install import InstallPlan, entry_dirs
from kernelcache.manage import rm

PROCS = Path(__file__).parent / "helpers" / "procs.py"
NO_GPU = {"KERNELCACHE_NO_GPU_PROBE": "1"}
CLEAN = {"staging": [], "journal": [], "temp": []}
SEED = 25
KILLS = 30


@pytest.fixture(scope="module")
def parts(bundle90, tmp_path_factory) -> dict[str, Path]:
    """Three bundles of the 21 test kernels and 6 modules: a and b share 4 kernels and 2 launchers, c shares
    kernels and a launcher with both; m is b's members under a fingerprint of another Triton build."""
    out = tmp_path_factory.mktemp("parts")
    made = {"a": split(bundle90, out / "a.tar.zst", slice(0, 12), slice(0, 4)),
            "b": split(bundle90, out / "b.tar.zst", slice(8, 21), slice(2, 6)),
            "c": split(bundle90, out / "c.tar.zst", slice(4, 10), slice(3, 5))}
    made["m"] = rewrite(made["b"], out / "m.tar.zst", triton_key_sha256="0" * 64)
    return made


def install(bundle: Path, cache: Path, force: bool = False) -> None:
    """In this process, as the other crash and concurrency tests do (no GPU check)."""
    manifest = archive.read_manifest(bundle)
    plan = InstallPlan(bundle, manifest, archive.bundle_digest(manifest), cache, force=force)
    plan.execute()


def entries(bundle: Path) -> set[str]:
    return set(entry_dirs(archive.read_manifest(bundle)))


def digest(bundle: Path) -> str:
    return archive.bundle_digest(archive.read_manifest(bundle))


def du(cache: Path, names: set[str]) -> int:
    return sum(p.stat().st_blocks * 512 for name in names for p in (cache / name).iterdir() if p.is_file())


def ls_json(cache: Path) -> dict:
    return json.loads(kc("ls", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)


def by_name(listing: dict) -> dict[str, dict]:
    return {b["name"]: b for b in listing["bundles"]}


# -- ls ------------------------------------------------------------------------------------------------


def test_ls_lists_each_bundle_with_its_shared_entries_and_size(parts, tmp_path):
    cache = tmp_path / "cache"
    for name in ("a", "b", "c"):
        install(parts[name], cache)
    listing = ls_json(cache)
    found = by_name(listing)
    assert sorted(found) == ["a", "b", "c"] and listing["warnings"] == []
    sets = {name: entries(parts[name]) for name in found}
    for name, info in found.items():
        manifest = archive.read_manifest(parts[name])
        others = set().union(*(s for n, s in sets.items() if n != name))
        assert info["digest"] == digest(parts[name]) and info["arch"] == "sm_90" and info["matches"] is True
        assert info["kernels"] == len(manifest.kernels) and info["modules"] == len(manifest.modules)
        assert info["entries"] == len(sets[name]) and info["missing_files"] == 0
        assert info["shared_entries"] == len(sets[name] & others) > 0
        assert {s["name"]: s["entries"] for s in info["shared_with"]} == {
            n: len(sets[name] & s) for n, s in sets.items() if n != name and sets[name] & s}
        assert info["size_on_disk"] == du(cache, sets[name]) > 0
        assert info["exclusive_size"] == du(cache, sets[name] - others) < info["size_on_disk"]
        receipt = CacheDir(cache).receipt(info["digest"])
        assert info["installed_at"] == receipt.installed_at and info["last_served"] is None
    assert listing["size_on_disk"] == du(cache, set().union(*sets.values()))


def test_last_served_is_when_env_last_served_the_cache_dir_with_the_bundle_installed(parts, tmp_path):
    cache = tmp_path / "cache"
    install(parts["a"], cache)
    started = time.time()
    found, done = entry_point("env", "--cache-dir", str(cache), watched=("kernelcache.runtime.env",))
    assert found == {"exit": 0, "imported": ["kernelcache.runtime.env"]}, done.stderr  # in full: keeps a record
    [record] = (cache / STATE_DIR / "served").glob("*.json")
    assert by_name(ls_json(cache))["a"]["last_served"] >= started - 1
    old = started - 1000
    os.utime(record, (old, old))
    assert by_name(ls_json(cache))["a"]["last_served"] is None  # the only record is older than the install
    kept = record.read_bytes()
    found, done = entry_point("env", "--cache-dir", str(cache), watched=("kernelcache.runtime.env",))
    assert found == {"exit": 0, "imported": []}, done.stderr  # answered from the record: the fast path
    assert record.read_bytes() == kept and record.stat().st_mtime >= started - 1
    assert by_name(ls_json(cache))["a"]["last_served"] >= started - 1
    install(parts["b"], cache)  # served before b was installed: not b's
    listing = by_name(ls_json(cache))
    assert listing["b"]["last_served"] is None and listing["a"]["last_served"] is not None


# -- rm ------------------------------------------------------------------------------------------------


def test_rm_removes_only_the_entries_no_other_installed_bundle_uses(parts, tmp_path):
    cache = tmp_path / "cache"
    for name in ("a", "b", "c"):
        install(parts[name], cache)
    sets = {name: entries(parts[name]) for name in ("a", "b", "c")}
    done = json.loads(kc("rm", "a", "--cache-dir", str(cache), "--json", check=True).stdout)["bundle"]
    assert set(done["removed"]) == sets["a"] - sets["b"] - sets["c"] and done["removed"]
    assert set(done["kept"]) == sets["a"] & (sets["b"] | sets["c"]) and done["kept"]
    assert not any((cache / e).exists() for e in done["removed"])
    for name in ("b", "c"):
        assert bundle_state(cache, archive.read_manifest(parts[name]), expected_bytes(parts[name])) == "all"
    assert {r.digest for r in CacheDir(cache).receipts()} == {digest(parts["b"]), digest(parts["c"])}
    assert leftovers(cache) == CLEAN
    assert by_name(ls_json(cache))["b"]["shared_with"] == [{"name": "c", "digest": digest(parts["c"]),
                                                            "entries": len(sets["b"] & sets["c"])}]
    kc("rm", digest(parts["b"])[:10], "--cache-dir", str(cache), check=True)  # by a digest prefix
    assert bundle_state(cache, archive.read_manifest(parts["c"]), expected_bytes(parts["c"])) == "all"
    assert not any((cache / e).exists() for e in sets["b"] - sets["c"])
    assert [b["name"] for b in ls_json(cache)["bundles"]] == ["c"]
    events = [json.loads(line)["event"] for line in (cache / STATE_DIR / "log.jsonl").read_text().splitlines()]
    assert events.count("removed") == 2


def test_an_entry_that_cannot_be_moved_out_stays_whole_and_is_said(parts, tmp_path):
    """A mount point cannot be renamed (EBUSY): the removal goes on without it and names it; nothing is stuck."""
    cache = tmp_path / "cache"
    install(parts["a"], cache)
    victim = sorted(entries(parts["a"]))[0]
    held = tmp_path / "held"
    shutil.copytree(cache / victim, held)
    bound = subprocess.run(["mount", "--bind", str(held), str(cache / victim)], capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here ({bound.stderr.strip()}); a mount point is what cannot be renamed")
    try:
        done = kc("rm", "a", "--cache-dir", str(cache), "--json", check=True)
    finally:
        subprocess.run(["umount", "-l", str(cache / victim)], capture_output=True)
    gone = json.loads(done.stdout)["bundle"]
    assert gone["stuck"] == [victim] and victim not in gone["removed"]
    assert set(gone["removed"]) == entries(parts["a"]) - {victim}
    assert not any((cache / e).exists() for e in gone["removed"]) and (cache / victim).is_dir()
    assert not CacheDir(cache).receipts() and leftovers(cache) == CLEAN


def test_rm_of_a_name_two_installed_bundles_share_asks_for_the_digest(parts, tmp_path):
    cache, other = tmp_path / "cache", tmp_path / "other"
    other.mkdir()
    install(parts["a"], cache)
    install(_copy(parts["b"], other / "a.tar.zst"), cache)  # another bundle from a file of the same name
    before = tree(cache)
    done = kc("rm", "a", "--cache-dir", str(cache))
    assert done.returncode == NotInstalled.exit_code and "give the digest" in done.stderr.strip().splitlines()[-1]
    assert tree(cache) == before


def _copy(source: Path, target: Path) -> Path:
    target.write_bytes(source.read_bytes())
    return target


def test_rm_and_prune_refuse_a_read_only_cache_dir_and_ls_reads_it(parts, tmp_path):
    src = tmp_path / "src"
    install(parts["a"], src / "cache")
    before = tree(src / "cache")
    with read_only(src, tmp_path / "ro") as how:
        cache = tmp_path / "ro" / "cache"
        for argv in (["rm", "a"], ["prune"]):
            done = kc(*argv, "--cache-dir", str(cache), env=NO_GPU)
            lines = done.stderr.strip().splitlines()
            assert done.returncode == StorageError.exit_code and len(lines) == 1, (how, done.stderr)
            assert "read-only" in lines[0]
        assert [b["name"] for b in ls_json(cache)["bundles"]] == ["a"]
        assert kc("prune", "--dry-run", "--cache-dir", str(cache), env=NO_GPU).returncode == 0
    assert tree(src / "cache") == before


def fi_bundle(out: Path, *modules: tuple[str, str]) -> Path:
    """A bundle of FlashInfer modules (name, provider dir) whose .so files are stand-in bytes: installing and
    removing never loads them."""
    from kernelcache import __version__
    from kernelcache.bundle.make import make_bundle
    from kernelcache.format.fingerprint import local_environment
    from kernelcache.format.manifest import Build, FlashInferModule, Member, Target

    pairs = tuple((FlashInferModule(name, "0.0.0", "13.0", ("sm90a",), None, ()),
                   [Member(f"flashinfer/{folder}/{name}/{name}.so", data=f"{folder} {name}".encode())])
                  for name, folder in modules)
    build = Build(tool=f"kernelcache {__version__}", mode="cross")
    make_bundle(out, [], Target("cuda", "sm_90"), local_environment(["sm_90"]), build, flashinfer=pairs)
    return out


def test_rm_of_flashinfer_modules_removes_their_dirs_once_no_module_is_left(tmp_path):
    one, two = "0.0.0-sm90a-aaaaaaaaaaaa", "0.0.0-sm90a-bbbbbbbbbbbb"
    first = fi_bundle(tmp_path / "fi1.tar.zst", ("sampling", one))
    second = fi_bundle(tmp_path / "fi2.tar.zst", ("sampling", one), ("topk", two))
    cache = tmp_path / "cache"
    install(first, cache)
    install(second, cache)
    assert [(b["name"], b["flashinfer"], b["shared_entries"]) for b in ls_json(cache)["bundles"]] == [
        ("fi2", 2, 1), ("fi1", 1, 1)]
    kc("rm", "fi2", "--cache-dir", str(cache), check=True)
    assert not (cache / "flashinfer" / two).exists()  # its only module went, and the dir that held it
    assert (cache / "flashinfer" / one / "sampling" / "sampling.so").read_bytes() == f"{one} sampling".encode()
    kc("rm", "fi1", "--cache-dir", str(cache), check=True)
    assert not (cache / "flashinfer").exists() and leftovers(cache) == CLEAN


def du_all(cache: Path, names: set[str]) -> int:
    """Bytes allocated to every file under the entries ``names``, nested ones too."""
    return sum(p.stat().st_blocks * 512 for name in names for p in (cache / name).rglob("*") if p.is_file())


AOT = "vllm/torch_compile_cache/torch_aot_compile"


def test_rm_removes_the_vllm_aot_dirs_a_bundle_installed_and_only_those(tmp_path):
    one = engine_bundle(tmp_path / "one.tar.zst", "a" * 10, "vllm serve one")
    two = engine_bundle(tmp_path / "two.tar.zst", "a" * 10, "vllm serve two")  # another record, the same hash
    three = engine_bundle(tmp_path / "three.tar.zst", "b" * 10, "vllm serve three")
    cache = tmp_path / "cache"
    for bundle in (one, two, three):
        install(bundle, cache, force=True)
    shared, alone = f"{AOT}/{'a' * 10}", f"{AOT}/{'b' * 10}"
    (cache / shared / "inductor_cache").mkdir()  # what vLLM writes in the AOT directory after a load
    (cache / shared / "inductor_cache" / "x.py").write_text("x" * 5000)
    (cache / "vllm" / "modelinfos").mkdir()  # what vLLM writes elsewhere under VLLM_CACHE_ROOT
    (cache / "vllm" / "modelinfos" / "m.json").write_text("{}")

    found = by_name(ls_json(cache))
    uses = {name: entries(bundle) | {shared if name != "three" else alone}
            for name, bundle in (("one", one), ("two", two), ("three", three))}
    assert found["one"]["entries"] == 2 and found["one"]["shared_entries"] == 1
    assert [(s["name"], s["entries"]) for s in found["one"]["shared_with"]] == [("two", 1)]
    assert found["one"]["size_on_disk"] == du_all(cache, uses["one"]) > du_all(cache, entries(one))
    assert found["three"]["exclusive_size"] == du_all(cache, uses["three"])
    assert ls_json(cache)["size_on_disk"] == du_all(cache, set().union(*uses.values()))

    done = json.loads(kc("rm", "one", "--cache-dir", str(cache), "--json", check=True).stdout)
    assert done["bundle"]["kept"] == [shared]  # two still uses it
    assert (cache / shared / "rank_0_0" / "model").is_file()
    done = json.loads(kc("rm", "two", "--cache-dir", str(cache), "--json", check=True).stdout)
    assert shared in done["bundle"]["removed"] and not (cache / shared).exists()
    assert done["bundle"]["freed"] >= 5000 + 3000 * len("vllm serve two")
    assert (cache / alone / "rank_0_0" / "model").read_bytes() == b"vllm serve three" * 3000
    kc("rm", "three", "--cache-dir", str(cache), check=True)
    assert not (cache / "vllm" / "torch_compile_cache").exists()  # its emptied parents went too
    assert (cache / "vllm" / "modelinfos" / "m.json").read_text() == "{}"  # vLLM's own files stay
    assert "VLLM_CACHE_ROOT" not in json.loads(kc("env", "--cache-dir", str(cache), "--json", check=True).stdout)
    assert leftovers(cache) == CLEAN


def test_prune_removes_a_mismatching_bundles_vllm_aot_dir(tmp_path):
    kept = engine_bundle(tmp_path / "kept.tar.zst", "a" * 10, "vllm serve kept")
    other = engine_bundle(tmp_path / "other.tar.zst", "b" * 10, "vllm serve other", platform="another-platform")
    cache = tmp_path / "cache"
    install(kept, cache, force=True)
    install(other, cache, force=True)
    dry = json.loads(kc("prune", "--dry-run", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)
    assert [b["name"] for b in dry["bundles"]] == ["other"] and f"{AOT}/{'b' * 10}" in dry["bundles"][0]["removed"]
    assert (cache / AOT / ("b" * 10)).is_dir()
    kc("prune", "--cache-dir", str(cache), env=NO_GPU, check=True)
    assert not (cache / AOT / ("b" * 10)).exists() and (cache / AOT / ("a" * 10) / "rank_0_0" / "model").is_file()


def test_a_read_only_bases_removed_aot_dir_leaves_the_overlay_mirror(tmp_path):
    one = engine_bundle(tmp_path / "one.tar.zst", "a" * 10, "vllm serve one")
    two = engine_bundle(tmp_path / "two.tar.zst", "b" * 10, "vllm serve two")
    base, overlay = tmp_path / "base", tmp_path / "overlay"
    install(one, base, force=True)
    install(two, base, force=True)
    args = ("env", "--read-only", "--cache-dir", str(base), "--overlay", str(overlay), "--json")
    variables = json.loads(kc(*args, env=NO_GPU, check=True).stdout)
    mirror = Path(variables["VLLM_CACHE_ROOT"]) / "torch_compile_cache" / "torch_aot_compile"
    assert {p.name for p in mirror.iterdir()} == {"a" * 10, "b" * 10}
    (mirror / ("b" * 10) / "inductor_cache").mkdir()  # what vLLM writes in the overlay after a load
    (mirror / ("b" * 10) / "inductor_cache" / "x.py").write_text("x")
    kc("rm", "two", "--cache-dir", str(base), check=True)  # while the base was writable
    variables = json.loads(kc(*args, env=NO_GPU, check=True).stdout)
    assert (mirror / ("a" * 10) / "rank_0_0" / "model").read_bytes() == b"vllm serve one" * 3000
    assert not (mirror / ("b" * 10) / "rank_0_0").exists()  # no link to a file that is gone
    assert (mirror / ("b" * 10) / "inductor_cache" / "x.py").read_text() == "x"  # the overlay's own stay


# -- prune ---------------------------------------------------------------------------------------------


def test_prune_removes_a_mismatching_bundle_what_installs_left_and_stale_records(parts, tmp_path):
    cache = tmp_path / "cache"
    copy = _copy(parts["a"], tmp_path / "a.tar.zst")
    kc("install", str(copy), "--cache-dir", str(cache), env=NO_GPU, check=True)  # keeps a checked record
    install(parts["m"], cache, force=True)
    kc("env", "--cache-dir", str(cache), check=True)  # keeps a served record
    [served] = (cache / STATE_DIR / "served").glob("*.json")
    kc("env", "--cache-dir", str(cache), env={"PYTHONPATH": str(tmp_path)}, check=True)  # other inputs: another
    [newest] = set((cache / STATE_DIR / "served").glob("*.json")) - {served}
    [checked] = (cache / STATE_DIR / "checked").glob("*.json")
    old = time.time() - 40 * 86400
    os.utime(served, (old, old))  # unused for 40 days
    os.utime(copy)  # the bundle file changed: its checked record can never answer again
    (cache / STATE_DIR / "staging" / "0123456789abcdef-1").mkdir()  # what a killed install leaves
    (cache / STATE_DIR / "installed" / ".x.json.1.tmp").write_text("torn")

    listing = by_name(ls_json(cache))
    assert listing["a"]["matches"] is True and listing["m"]["matches"] is False
    assert any(d.startswith("triton_key_sha256:") for d in listing["m"]["differences"])
    before = tree(cache)
    dry = json.loads(kc("prune", "--dry-run", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)
    assert tree(cache) == before  # a dry run removes nothing
    m_only = entries(parts["m"]) - entries(parts["a"])
    assert [(b["name"], set(b["removed"])) for b in dry["bundles"]] == [("m", m_only)]
    assert set(dry["leftovers"]) == {"staging/0123456789abcdef-1", "installed/.x.json.1.tmp"}
    assert set(dry["records"]) == {f"served/{served.name}", f"checked/{checked.name}"}

    done = json.loads(kc("prune", "--cache-dir", str(cache), "--json", env=NO_GPU, check=True).stdout)
    assert {k: v for k, v in done.items() if k not in ("dry_run", "seconds")} == \
        {k: v for k, v in dry.items() if k not in ("dry_run", "seconds")}
    assert [r.digest for r in CacheDir(cache).receipts()] == [digest(parts["a"])]
    assert not any((cache / e).exists() for e in m_only)
    assert bundle_state(cache, archive.read_manifest(parts["a"]), expected_bytes(parts["a"])) == "all"
    assert leftovers(cache) == CLEAN and not served.exists() and not checked.exists()
    assert newest.exists() and by_name(ls_json(cache))["a"]["last_served"] == newest.stat().st_mtime  # kept for ls
    again = kc("prune", "--cache-dir", str(cache), env=NO_GPU, check=True)
    assert again.stdout.startswith("nothing to prune")


# -- the Python API --------------------------------------------------------------------------------------


def test_the_python_api_has_the_same_verbs(parts, tmp_path):
    cache = tmp_path / "cache"
    for name in ("a", "c"):
        install(parts[name], cache)
    assert {"ls", "rm", "prune"} <= set(dir(kernelcache))
    assert json.loads(json.dumps(kernelcache.ls(cache).to_dict())) == ls_json(cache)
    assert kernelcache.prune(cache, dry_run=True).to_dict()["bundles"] == []
    removed = kernelcache.rm("c", cache_dir=cache)
    assert removed.bundle.digest == digest(parts["c"]) and json.dumps(removed.to_dict())
    with pytest.raises(NotInstalled):
        kernelcache.rm("c", cache_dir=cache)


# -- concurrency: rm beside an install, under a Triton reader ---------------------------------------


def start(args: list[str], go: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(PROCS), *args, str(go)], cwd=ROOT, env=clean_env(**NO_GPU),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def race(cache: Path, bundle: Path, gap: float, tmp: Path) -> list[str]:
    """`kernelcache rm a` and `kernelcache install bundle`, each warmed up, released ``gap`` seconds apart
    (negative: the install first); the order the lock saw them in."""
    go_rm, go_install = tmp / "go-rm", tmp / "go-install"
    procs = [start(["rm", str(cache), "a"], go_rm), start(["install", str(bundle), str(cache)], go_install)]
    deadline = time.monotonic() + 300
    while len(list(tmp.glob("go-*.ready.*"))) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a process died warming up"
        time.sleep(0.05)
    first, second = (go_rm, go_install) if gap >= 0 else (go_install, go_rm)
    first.touch()
    time.sleep(abs(gap))
    second.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (proc.returncode, out[-1000:], err[-2000:])
    log = (cache / STATE_DIR / "log.jsonl").read_text().splitlines()
    return [json.loads(line)["event"] for line in log][-2:]


def test_rm_beside_a_concurrent_install_never_loses_or_tears_a_kernel(parts, tmp_path):
    """Each round: a and c installed; `rm a` and `install b` (b shares entries with a and c) released together, or
    one just before the other; a Triton process looks up every kernel of a, b and c all the while. c's kernels are
    complete in every snapshot; no kernel is ever partial; afterwards b and c are whole and a's own entries gone."""
    pointer, stop, out = tmp_path / "pointer", tmp_path / "stop", tmp_path / "reader.json"
    others = ",".join(str(parts[n]) for n in ("a", "b"))
    reader = subprocess.Popen([sys.executable, str(PROCS), "watch", str(parts["c"]), others, str(pointer), str(stop),
                               str(out)], cwd=ROOT, env=clean_env(), stderr=subprocess.PIPE, text=True)
    orders = []
    try:
        for i, gap in enumerate([0.0, 0.0, 0.0, 0.0, 1.0, -1.0]):
            cache, work = tmp_path / f"c{i}", tmp_path / f"w{i}"
            work.mkdir()
            install(parts["a"], cache)
            install(parts["c"], cache)
            pointer.write_text(str(cache))
            orders.append(race(cache, parts["b"], gap, work))
            for name in ("b", "c"):
                assert bundle_state(cache, archive.read_manifest(parts[name]), expected_bytes(parts[name])) == "all"
            assert {r.digest for r in CacheDir(cache).receipts()} == {digest(parts["b"]), digest(parts["c"])}
            own = entries(parts["a"]) - entries(parts["b"]) - entries(parts["c"])
            states = entry_states(cache, archive.read_manifest(parts["a"]), expected_bytes(parts["a"]))
            assert {states[e] for e in own} == {"absent"} and leftovers(cache) == CLEAN
    finally:
        stop.touch()
        reader.wait(timeout=120)
    assert reader.returncode == 0, reader.stderr.read()[-2000:]
    seen = json.loads(out.read_text())
    (tmp_path / "seen.json").write_text(json.dumps({**seen, "orders": orders}))
    assert seen["partial"] == 0 and seen["problem_count"] == 0, seen["problems"]
    assert seen["snapshots"] > len(orders) and seen["kept_complete"] > 0 and seen["absent"] > 0, seen
    assert {tuple(o) for o in orders} == {("removed", "extracted"), ("extracted", "removed")}, orders


# -- crash safety: SIGKILL in the middle of rm ---------------------------------------------------------


def removal(cache: Path):
    return lambda: rm("a", cache_dir=cache)


def fresh(parts, where: Path) -> Path:
    cache = where / "cache"
    install(parts["a"], cache)
    install(parts["c"], cache)
    return cache


def check_after_kill(parts, cache: Path) -> str:
    """Never partial; c whole; a's receipt only with all of a; without a journal, a is installed whole or its own
    entries (those c does not list) are all gone."""
    a, c = (archive.read_manifest(parts[n]) for n in ("a", "c"))
    assert bundle_state(cache, c, expected_bytes(parts["c"])) == "all" and has_receipt(cache, c)
    state = bundle_state(cache, a, expected_bytes(parts["a"]))  # raises on a partial entry
    states = entry_states(cache, a, expected_bytes(parts["a"]))
    own = {states[e] for e in entries(parts["a"]) - entries(parts["c"])}
    own_state = "all" if own == {"complete"} else "none" if own == {"absent"} else "some"
    journal, receipt = bool(leftovers(cache)["journal"]), has_receipt(cache, a)
    if receipt:
        assert state == "all"
    if not journal:
        assert (receipt, own_state) in ((True, "all"), (False, "none")), (receipt, own_state)
    return f"own entries: {own_state}" + (" + journal" if journal else "") + (" + receipt" if receipt else "")


def check_recovered(parts, cache: Path, journal: bool) -> None:
    """After recover(): a removed (the journal was there) or whole and installed (killed before it); c whole."""
    a, c = (archive.read_manifest(parts[n]) for n in ("a", "c"))
    own = entries(parts["a"]) - entries(parts["c"])
    assert bundle_state(cache, c, expected_bytes(parts["c"])) == "all" and has_receipt(cache, c)
    if journal:
        assert not has_receipt(cache, a) and not any((cache / e).exists() for e in own)
    else:
        assert has_receipt(cache, a) and bundle_state(cache, a, expected_bytes(parts["a"])) == "all"
    assert leftovers(cache) == CLEAN


def test_sigkill_during_rm_never_tears_a_kernel_and_the_next_command_finishes_it(parts, tmp_path):
    ended, report = fork_run(removal(fresh(parts, tmp_path / "dry")))
    assert ended == "exit 0"
    trace = report["trace"]
    start = next(i for i, (e, a) in enumerate(trace, 1) if e == "os.rename" and "/journal/" in a)
    end = next(i for i, (e, a) in enumerate(trace, 1) if e == "os.remove" and a.endswith(".rm.json"))
    rng = random.Random(SEED)
    points = [rng.randint(1, len(trace)) for _ in range(KILLS // 2)]
    points += [rng.randint(start, end) for _ in range(KILLS - KILLS // 2)]
    seen: dict[str, int] = {}
    for i, point in enumerate(points):
        cache = fresh(parts, tmp_path / f"k{i}")
        ended, _ = fork_run(removal(cache), kill_at=point)
        outcome = f"{ended}: {check_after_kill(parts, cache)}"
        seen[outcome] = seen.get(outcome, 0) + 1
        journal = bool(leftovers(cache)["journal"])
        if i % 5 == 4:  # the next command of any kind finishes it: here `kernelcache env`
            kc("env", "--cache-dir", str(cache), check=True)
        else:
            recover(CacheDir(cache))
        check_recovered(parts, cache, journal or not has_receipt(cache, archive.read_manifest(parts["a"])))
    (tmp_path / "kills.json").write_text(json.dumps({"events": len(trace), "window": [start, end], "seen": seen}))
    assert sum(n for k, n in seen.items() if k.startswith("killed")) >= KILLS - 2, seen
    assert any("some + journal" in k for k in seen), seen  # the removal window was really hit


def test_kills_during_the_removal_roll_forward_still_converge(parts, tmp_path):
    ended, report = fork_run(removal(fresh(parts, tmp_path / "dry")))
    trace = report["trace"]
    start = next(i for i, (e, a) in enumerate(trace, 1) if e == "os.rename" and "/journal/" in a)
    rng = random.Random(SEED + 1)
    for round_ in range(4):
        cache = fresh(parts, tmp_path / f"r{round_}")
        ended, _ = fork_run(removal(cache), kill_at=start + 3 + round_)
        assert ended == "killed" and leftovers(cache)["journal"]
        for _ in range(3):
            fork_run(lambda cache=cache: recover(CacheDir(cache)), kill_at=rng.randint(1, 30))
            check_after_kill(parts, cache)
        recover(CacheDir(cache))
        check_recovered(parts, cache, journal=True)
