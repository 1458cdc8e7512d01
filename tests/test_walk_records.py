"""A bundle carries the record of Triton's dependency walks of the ``@jit`` functions its build ran
(hooks/kernelcache_walks.py ``walk_records``, the manifest's ``walks``): the first served process after a fresh
install replays them, and walks a function whose source changed since, on each stack (the serving one marked
``serving``).

Everything is real: ``kernelcache build`` of a registry-path plan whose one task runs tests/helpers/walkkernels.py's
kernels (a copy importable as ``kc_walk_kernels``) under the fake sm_90 target, ``kernelcache install`` into a new
cache dir, and served processes (``kernelcache run``) that import the same module from another directory than the
build did: the record names no path of the build machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import stacks
from helpers.common import ROOT

from kernelcache.format.archive import iter_members, read_manifest
from kernelcache.format.manifest import walks_member, walks_path

pytestmark = pytest.mark.vllm  # the registry path's platform set-up imports vLLM

MODULE = "kc_walk_kernels"
RUN = '''

def run() -> int:
    """Launch both kernels (the fake target's launches do nothing)."""
    import torch

    x = torch.zeros(16)
    scale_kernel[(1,)](x, 16, BLOCK=16)
    plain_kernel[(1,)](x, 16, BLOCK=16)
    return 2
'''
NAMES = ("scale_kernel", "twice", "mix", "plain_kernel")

BUILD = r"""
import json, sys
import kernelcache
from kernelcache.plan.tasks import Task
result = kernelcache.build("sm_90", gpus=["h200"], dtypes=["bfloat16"], paths=["registry"], mode="cross",
                           output_dir=sys.argv[1], workdir=sys.argv[2], build_cache=False,
                           extra_tasks=(Task("kc_walk_kernels:run", label="walkkernels"),))
print(json.dumps([str(b.path) for b in result.bundles]))
"""

# Each function's cache_key and used_global_vals (name, value), in the order the build's task met them.
PROBE = r"""
import json, sys
import kc_walk_kernels as k
out = {}
for name in ("scale_kernel", "plain_kernel"):
    fn = getattr(k, name)
    out[name] = [fn.cache_key, sorted([n, repr(v)] for (n, _), (v, _) in fn.used_global_vals.items())]
print(json.dumps(out))
"""


# The record walk_records makes at the end of a process that first walked the kernels in the given order.
RECORD = r"""
import json, sys
import triton.runtime.jit as jit
import kc_walk_kernels as k
from kernelcache.hooks.kernelcache_walks import walk_records
fns = [getattr(k, name) for name in sys.argv[1].split(",")]
keys = [fn.cache_key for fn in fns]
print(json.dumps({"keys": keys, "record": walk_records(jit, fns)}))
"""


def module_dir(where: Path, change: str = "") -> Path:
    where.mkdir(parents=True, exist_ok=True)
    source = (ROOT / "tests" / "helpers" / "walkkernels.py").read_text() + RUN
    if change:
        source = source.replace("return x * SCALE + SALT", "return x * SCALE + SALT + 1")
    (where / f"{MODULE}.py").write_text(source)
    return where


@pytest.fixture(scope="module", params=stacks.STACKS)
def stack(request) -> stacks.Stack:
    return stacks.stack(request.param)


@pytest.fixture(scope="module")
def bundle(stack, tmp_path_factory) -> Path:
    """The build's bundle, made from ``<tmp>/build-site``."""
    top = tmp_path_factory.mktemp(f"walk-build-{stack.name}")
    site = module_dir(top / "build-site")
    done = stack.run("-c", BUILD, str(top / "out"), str(top / "work"), env={"PYTHONPATH": str(site)}, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    [path] = json.loads(done.stdout.strip().splitlines()[-1])
    return Path(path)


def served(stack: stacks.Stack, cache: Path, site: Path) -> tuple[dict, dict[str, str]]:
    """The probe's keys in the first served process of ``cache`` importing the module from ``site``, and per function
    what the debug log says of its walk ("replayed (... recorded by the bundle)" / "walked (why)")."""
    done = stack.kc("run", "--cache-dir", str(cache), "--", stack.python, "-c", PROBE,
                    env={"KERNELCACHE_DEBUG": "1", "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr[-3000:]
    said = {}
    for line in done.stderr.splitlines():
        if f"Triton's walk of {MODULE}." in line:
            name, _, rest = line.split(f"Triton's walk of {MODULE}.", 1)[1].partition(": ")
            said[name] = rest
    return json.loads(done.stdout.strip().splitlines()[-1]), said


def plain(stack: stacks.Stack, site: Path) -> dict:
    done = stack.run("-c", PROBE, env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def install(stack: stacks.Stack, bundle: Path, cache: Path) -> None:
    stack.kc("install", str(bundle), "--cache-dir", str(cache), "--no-gpu-check", check=True)


def test_the_bundle_carries_the_builds_walks_and_names_no_build_path(stack, bundle):
    manifest = read_manifest(bundle)
    [record] = manifest.walks.files
    assert walks_path(record.path)
    data = {name: blob for _, name, blob in iter_members(bundle)}[record.path]
    walks = json.loads(data)
    assert {f"{MODULE}.{name}" for name in NAMES} <= set(walks["functions"])
    assert str(bundle.parents[1]).encode() not in data  # nothing of the build's directories
    assert walks["triton_key"] == manifest.triton_identity.triton_key


def test_a_fresh_installs_first_served_process_replays_the_bundles_walks(stack, bundle, tmp_path):
    site = module_dir(tmp_path / "serve-site")  # the same module, elsewhere than the build had it
    cache = tmp_path / "fresh"
    install(stack, bundle, cache)
    assert not (cache / ".kernelcache" / "triton-walks").exists()  # no served process has kept walks there yet
    keys, said = served(stack, cache, site)
    assert keys == plain(stack, site)
    assert set(said) == set(NAMES)
    assert all(how.startswith("replayed") and how.endswith("recorded by the bundle)") for how in said.values()), said


def test_a_changed_source_is_walked_after_a_fresh_install(stack, bundle, tmp_path):
    site = module_dir(tmp_path / "serve-site", change="source")  # mix's source is not what the build walked
    cache = tmp_path / "fresh"
    install(stack, bundle, cache)
    keys, said = served(stack, cache, site)
    assert keys == plain(stack, site) != plain(stack, module_dir(tmp_path / "unchanged"))
    assert said["mix"] == "walked (the source changed)"
    assert said["twice"].startswith("walked") and said["scale_kernel"].startswith("walked")  # they take mix's key
    assert said["plain_kernel"].startswith("replayed")


def without_walks(bundle: Path, out: Path) -> Path:
    """The bundle as a kernelcache from before walk records made it: the same members and manifest, less ``walks``."""
    import dataclasses

    from kernelcache.format.archive import write

    manifest = read_manifest(bundle)
    members = {name: blob for _, name, blob in iter_members(bundle) if not walks_path(name)}
    return write(out, dataclasses.replace(manifest, walks=None),
                 [(name, lambda blob=blob: blob) for name, blob in members.items()])


def test_a_bundle_without_walk_records_installs_and_serves_as_before(stack, bundle, tmp_path):
    """An older bundle (no ``walks``): its install and first served process are what they were (Triton walks)."""
    old = without_walks(bundle, tmp_path / "old.tar.zst")
    assert "walks" not in json.loads(read_manifest(old).to_json())
    cache = tmp_path / "fresh"
    install(stack, old, cache)
    site = module_dir(tmp_path / "serve-site")
    keys, said = served(stack, cache, site)
    assert keys == plain(stack, site) and set(said.values()) == {"walked (no kept walk)"}
    assert not (cache / "triton-walks").exists()
    shutil.rmtree(cache)


def test_the_record_is_the_same_whatever_order_the_process_first_walked_in(stack, tmp_path):
    """A build's threads meet the kernels in any order (and Triton 3.6's keys depend on it): the record is made by
    walking them again in order of name, so it is the same bytes either way."""
    site, found = module_dir(tmp_path / "site"), []
    for order in ("scale_kernel,twice,mix,plain_kernel", "mix,twice,scale_kernel,plain_kernel"):
        done = stack.run("-c", RECORD, order, env={"PYTHONPATH": str(site)})
        assert done.returncode == 0, done.stderr[-3000:]
        found.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = found
    assert first["record"] == second["record"] and walks_member(first["record"]) == walks_member(second["record"])
    assert set(first["record"]["functions"]) == {f"{MODULE}.{name}" for name in NAMES}


def test_a_merge_keeps_the_walk_records_of_either_side(stack, bundle, tmp_path):
    old = without_walks(bundle, tmp_path / "old.tar.zst")
    for pair in ((old, bundle), (bundle, old), (bundle, bundle)):
        merged = tmp_path / "merged.tar.zst"
        stack.kc("merge", *map(str, pair), "-o", str(merged), check=True)
        assert read_manifest(merged).walks == read_manifest(bundle).walks
        merged.unlink()
