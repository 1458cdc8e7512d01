"""The build cache (issue 27): a build takes every kernel an earlier build compiled, by Triton key, and compiles
only the rest; its bundles are byte for byte those of a build without the cache.

Real builds of kernelcache's test kernels (plus the platform setup every cross build runs) for a fake sm_90, real
concurrent build processes on one cache, real corrupt blobs, a real loopback registry and fsspec's own local
filesystem. Each test names its build cache: the suite otherwise builds without one (conftest.py).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers.common import ROOT, TESTKERNELS, clean_env, kc
from helpers.testkernel_builds import build, filled

import kernelcache
from kernelcache.buildcache import blob as blobs
from kernelcache.buildcache.store import DirStore

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

# Two builds at once in real processes, released together.
CHILD = r"""
import json, os, sys, time
import kernelcache
from kernelcache.plan.tasks import Task
go = sys.argv[3]
while not os.path.exists(go):
    time.sleep(0.01)
result = kernelcache.build("sm_90", gpus=["h200"], dtypes=["bfloat16"], paths=["registry"], mode="cross",
                           output_dir=sys.argv[2], build_cache=sys.argv[1],
                           extra_tasks=(Task("kernelcache.exercise.testkernels:run", label="testkernels"),))
print(json.dumps(result.targets[0].to_dict()))
"""


def only(result):
    [target] = result.targets
    return target


def bundle_bytes(result) -> list[bytes]:
    return [b.path.read_bytes() for b in result.bundles]


def stored(cache: Path, kinds=("kernel", "module")) -> dict[str, list[Path]]:
    """Key -> its blobs in a build-cache directory, for the entries of ``kinds``."""
    found: dict[str, list[Path]] = {}
    for blob in DirStore(cache).blobs():
        if blobs.unpack(blob.path.read_bytes(), blob.key)[0].kind in kinds:
            found.setdefault(blob.key, []).append(blob.path)
    return found


def ran(tmp_path: Path, name: str) -> list[str]:
    """The units whose exercise process ran in build ``name`` (a restored unit leaves no worker log)."""
    return sorted(p.parent.name for p in (tmp_path / name / "work").rglob("worker.log"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The test kernels built without a build cache: what every build with one must write, byte for byte."""
    tmp = tmp_path_factory.mktemp("reference")
    result = build(tmp, "plain", False)
    target = only(result)
    assert target.compiles > 0 and target.build_cache.location is None
    return result


# -- reuse and byte identity -------------------------------------------------------------------------


def test_a_warm_build_compiles_nothing_and_writes_the_bundle_a_build_without_the_cache_writes(reference, cold_build,
                                                                                              tmp_path):
    root, cold_result = cold_build
    cache = filled(cold_build, tmp_path)
    cold = only(cold_result)
    kernels = len(reference.bundles[0].manifest.kernels)
    modules = len(reference.bundles[0].manifest.modules)
    assert cold.compiles == only(reference).compiles and cold.build_cache.reused == 0
    assert cold.build_cache.published == kernels + modules == len(stored(cache))
    assert cold.build_cache.units.kept == 1 and ran(root, "cold") == ["extra"]
    warm_result = build(tmp_path, "warm", str(cache))
    warm = only(warm_result)
    assert warm.compiles == 0 and warm.build_cache.published == 0
    assert (warm.build_cache.reused, warm.build_cache.reused_modules) == (kernels, modules)
    assert ran(tmp_path, "warm") == []  # no exercise process: the unit's record brought its outputs
    assert warm.build_cache.units.reused == 1 and warm.build_cache.units.kept == 0
    assert (cold.build_cache.bundles, warm.build_cache.bundles) == (0, 1)  # the cold build's frame, not compressed
    assert warm.coverage == cold.coverage == only(reference).coverage
    assert bundle_bytes(warm_result) == bundle_bytes(reference)
    assert [p.read_bytes() for p in build_outputs(root, "cold")] == bundle_bytes(reference)


def test_a_corrupt_compressed_bundle_is_compressed_again_and_replaced(reference, cold_build, tmp_path):
    cache = filled(cold_build, tmp_path)
    [frame] = [p for paths in stored(cache, kinds=("bundle",)).values() for p in paths]
    good = frame.read_bytes()
    frame.write_bytes(good[:-40] + bytes(40))  # its zstd checksum and sha256 no longer hold
    again = build(tmp_path, "again", str(cache))
    assert only(again).build_cache.bundles == 0 and bundle_bytes(again) == bundle_bytes(reference)
    assert frame.read_bytes() == good  # the frame compressed again replaced the corrupt one
    assert only(build(tmp_path, "third", str(cache))).build_cache.bundles == 1


def build_outputs(tmp_path: Path, name: str) -> list[Path]:
    return sorted((tmp_path / name / "out").glob("*.tar.zst"))


def test_profiles_of_another_sm_count_take_the_kernels_they_share_from_the_cache(reference, tmp_path):
    """h200 (132 SMs) and h100-pcie (114) are two targets of one build; the test kernels do not depend on the SM
    count, so the second target compiles nothing. The h200 bundle is the one a build of h200 alone writes."""
    result = build(tmp_path, "two", str(tmp_path / "cache"), gpus=["h100-pcie", "h200"])
    first, second = result.targets
    assert first.compiles == only(reference).compiles and first.build_cache.reused == 0
    assert second.compiles == 0 and second.build_cache.reused == first.compiles
    h200 = [b for b in result.bundles if b.manifest.target.gpu == "h200"]
    assert [b.path.read_bytes() for b in h200] == bundle_bytes(reference)


# -- concurrency, corruption, other installs ---------------------------------------------------------


def test_two_builds_at_once_on_one_cache_both_write_the_reference_bundle(reference, tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(cache), str(tmp_path / f"out{i}"), str(go)],
                                 cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(2)]
    go.touch()
    outcomes = [child.communicate(timeout=900) for child in children]
    assert [c.returncode for c in children] == [0, 0], [o[1][-2000:] for o in outcomes]
    for i in range(2):
        assert [p.read_bytes() for p in sorted((tmp_path / f"out{i}").glob("*.tar.zst"))] == bundle_bytes(reference)
    keys = stored(cache)
    kernels = reference.bundles[0].manifest
    assert len(keys) == len(kernels.kernels) + len(kernels.modules)
    assert all(len(paths) == 1 for paths in keys.values())  # one variant per key: both wrote the same install's
    for key, [path] in keys.items():
        blobs.unpack(path.read_bytes(), key)  # every blob whole and consistent
    assert not [p for p in cache.rglob("*") if p.name.endswith(".tmp")]
    after = only(build(tmp_path, "after", str(cache)))
    assert after.compiles == 0


def test_a_corrupt_entry_is_compiled_again_never_bundled_and_replaced(reference, cold_build, tmp_path):
    cache = filled(cold_build, tmp_path)
    kernels = {k: p for k, [p] in stored(cache).items() if blobs.unpack(p.read_bytes(), k)[0].kind == "kernel"}
    flipped, truncated, swapped = sorted(kernels)[:3]
    kernels[flipped].write_bytes(rewritten(kernels[flipped].read_bytes(), flipped))  # a valid tar, a wrong cubin
    kernels[truncated].write_bytes(kernels[truncated].read_bytes()[:200])
    shutil.copyfile(kernels[sorted(kernels)[3]], kernels[swapped])  # another key's entry under this key
    warm_result = build(tmp_path, "warm", str(cache))
    warm = only(warm_result)
    assert warm.compiles == 3 and warm.build_cache.corrupt == 3
    assert warm.build_cache.reused == len(kernels) - 3 and warm.build_cache.published == 3
    assert bundle_bytes(warm_result) == bundle_bytes(reference)
    for key in (flipped, truncated, swapped):  # the compile published a good entry over the bad one
        [path] = stored(cache)[key]
        assert blobs.unpack(path.read_bytes(), key)[0].key == key


def rewritten(blob: bytes, key: str) -> bytes:
    """The blob with one byte of its cubin changed and its record kept: only the sha256 check can tell."""
    import zstandard

    entry, files = blobs.unpack(blob, key)
    cubin = next(n for n in files if n.endswith(".cubin"))
    files[cubin] = files[cubin][:-1] + bytes([files[cubin][-1] ^ 0xFF])
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(blobs.RECORD, entry.to_json()), *sorted(files.items())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(raw.getvalue())


def test_a_kernel_compiled_from_another_install_path_is_not_reused_and_both_keep_theirs(tmp_path, monkeypatch):
    """The same source at two paths has the same Triton keys, but its cubins carry the path: the second install
    compiles its own (a bundle never holds another install's paths), and the cache then keeps both variants."""
    source = (ROOT / "kernelcache" / "exercise" / "testkernels.py").read_text()
    task = type(TESTKERNELS)("kc_copied_kernels:run", label="testkernels")
    cache, results = str(tmp_path / "cache"), {}
    for where in ("a", "elsewhere"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "kc_copied_kernels.py").write_text(source)
        monkeypatch.setenv("PYTHONPATH", str(tmp_path / where))
        results[where] = only(build(tmp_path, where, cache, tasks=(task,)))
    first, second = results["a"], results["elsewhere"]
    assert second.compiles == first.compiles > 0 and second.build_cache.reused == 0
    assert second.build_cache.foreign == first.compiles
    [bundle] = build_outputs(tmp_path, "elsewhere")
    cubins = [m for m in _members(bundle) if m[0].endswith(".cubin")]
    assert any(str(tmp_path / "elsewhere").encode() in data for _, data in cubins)
    assert not any(str(tmp_path / "a").encode() + b"/" in data for _, data in cubins)
    variants = stored(Path(cache))
    assert sum(len(v) == 2 for v in variants.values()) == first.compiles  # each kernel: one variant per install
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "a"))
    assert only(build(tmp_path, "again", cache, tasks=(task,))).compiles == 0


def _members(bundle: Path) -> list[tuple[str, bytes]]:
    import zstandard

    with zstandard.ZstdDecompressor().stream_reader(bundle.open("rb")) as raw, tarfile.open(fileobj=raw,
                                                                                           mode="r|") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]


# -- shared across runners: a URL, a registry ---------------------------------------------------------


def test_runners_sharing_a_file_url_compile_each_kernel_once(reference, tmp_path):
    url = (tmp_path / "shared").as_uri()
    first = only(build(tmp_path, "runner1", url))
    second_result = build(tmp_path, "runner2", url)
    second = only(second_result)
    assert first.compiles > 0 and second.compiles == 0 and second.build_cache.reused == first.compiles
    assert bundle_bytes(second_result) == bundle_bytes(reference) and second.build_cache.bundles == 1
    kept = first.build_cache.units.kept  # the unit's exercise record, beside the kernels and modules
    # ... and the compressed bundle, which the second runner took instead of compressing
    assert len(list((tmp_path / "shared" / "v1").glob("??/*/*.tar.zst"))) == first.build_cache.published + kept + 1 \
        == first.build_cache.published + 2


def test_runners_sharing_a_registry_compile_each_kernel_once(reference, tmp_path):
    from helpers.servers import registry

    (tmp_path / "registry").mkdir()
    with registry(tmp_path / "registry") as reg:
        url = f"oci://{reg.host}/team/kernel-build-cache"
        first = only(build(tmp_path, "runner1", url))
        second_result = build(tmp_path, "runner2", url)
        second = only(second_result)
        tags = json.loads(reg.get("/v2/team/kernel-build-cache/tags/list"))["tags"]
    assert first.compiles > 0 and first.build_cache.errors == ()
    assert second.compiles == 0 and second.build_cache.reused == first.compiles
    # the entries, the unit's exercise record and the compressed bundle (which the second runner took)
    assert len(tags) == first.build_cache.published + first.build_cache.units.kept + 1 == \
        first.build_cache.published + 2
    assert bundle_bytes(second_result) == bundle_bytes(reference) and second.build_cache.bundles == 1


# -- the CLI: bad input, ls, prune ---------------------------------------------------------------------


BUILD = ("build", "--arch", "sm_90", "--gpu", "h200", "--path", "registry", "--dtype", "bfloat16", "--mode", "cross")


@pytest.mark.parametrize("given, code, says", [
    ("FILE", 2, "is not a directory"),
    ("oci://127.0.0.1:9/kernels", 60, "cannot reach registry 127.0.0.1:9"),
    ("oci://127.0.0.1:9/kernels:v1", 2, "name a repository"),
    ("memory://cache", 2, "lives in one process"),
])
def test_a_build_cache_that_cannot_serve_is_refused_before_compiling(given, code, says, tmp_path):
    (tmp_path / "FILE").write_text("not a directory")
    given = str(tmp_path / "FILE") if given == "FILE" else given
    done = kc(*BUILD, "-o", str(tmp_path / "out"), "--build-cache", given, env={"KERNELCACHE_REMOTE_RETRIES": "0"})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1 and says in lines[0], done.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_build_cache_flags_that_exclude_each_other(tmp_path):
    done = kc(*BUILD, "--build-cache", str(tmp_path / "c"), "--no-build-cache")
    assert done.returncode == 2 and "exclude each other" in done.stderr
    done = kc("prune", "--max-size", "1G")
    assert done.returncode == 2 and "--build-cache" in done.stderr
    done = kc("ls", "--build-cache", "oci://127.0.0.1:9/kernels")
    assert done.returncode == 2 and "local directory" in done.stderr


def test_ls_shows_the_cache_size_and_prune_removes_the_least_recently_used_first(cold_build, tmp_path):
    cache = filled(cold_build, tmp_path)
    blobs_now = DirStore(cache).blobs()
    total = sum(b.size for b in blobs_now)
    listing = json.loads(kc("ls", "--build-cache", str(cache), "--json", check=True).stdout)
    assert (listing["entries"], listing["size_on_disk"]) == (len(blobs_now), total) and listing["entries"] > 4
    # A known order of last use: the exercise record and the compressed bundle oldest (a record restores only with
    # all its kernels, so the three kept must be kernel or module entries for the rebuild to take three), then by
    # path.
    def kind(blob):
        return blobs.unpack(blob.path.read_bytes(), blob.key)[0].kind

    order = sorted(blobs_now, key=lambda b: (kind(b) in ("kernel", "module"), str(b.path)))
    assert sorted(kind(b) for b in order[:2]) == ["bundle", "exercise"]  # the cold build kept one of each
    for age, blob in enumerate(order):
        os.utime(blob.path, (1_000_000 + age, 1_000_000 + age))
    keep = sum(b.size for b in order[-3:])
    dry = json.loads(kc("prune", "--build-cache", str(cache), "--max-size", str(keep), "--dry-run", "--json",
                        check=True).stdout)
    assert dry["removed"] == len(order) - 3 and len(DirStore(cache).blobs()) == len(order)
    done = json.loads(kc("prune", "--build-cache", str(cache), "--max-size", str(keep), "--json", check=True).stdout)
    assert done["removed"] == len(order) - 3 and done["size_on_disk"] == keep
    assert [b.path for b in DirStore(cache).blobs()] == [b.path for b in order[-3:]]  # the most recently used
    text = kc("ls", "--build-cache", str(cache), check=True).stdout
    assert "3 entries" in text
    rebuilt = only(build(tmp_path, "rebuilt", str(cache)))
    assert rebuilt.build_cache.reused + rebuilt.build_cache.reused_modules == 3 and rebuilt.compiles > 0


def test_the_default_build_cache_is_the_user_cache_dir_unless_the_environment_names_another(tmp_path, monkeypatch):
    from kernelcache.buildcache import resolve

    monkeypatch.delenv("KERNELCACHE_BUILD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resolve(None).location == str(tmp_path / "xdg" / "kernelcache" / "build")
    monkeypatch.setenv("KERNELCACHE_BUILD_CACHE", "s3://bucket/cache")
    assert (resolve(None).kind, resolve(str(tmp_path)).kind) == ("url", "dir")
    assert resolve(False) is None
    monkeypatch.setenv("KERNELCACHE_BUILD_CACHE", "off")
    assert resolve(None) is None
    listing = kernelcache.ls_build_cache(tmp_path / "nothing-yet")
    assert (listing.entries, listing.size_on_disk) == (0, 0)
