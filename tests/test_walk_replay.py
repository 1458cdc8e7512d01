"""A served process replays Triton's dependency walk of a ``@jit`` function from a kept record, with the same key and
``used_global_vals`` Triton's own walk gives, and walks whenever anything it read differs
(hooks/kernelcache_walks.py), on every Triton the replay supports: each test runs on the lab stack (Triton 3.6) and
on the serving stack (Triton 3.8; marked ``serving``, run by scripts/test.sh with the serving venvs).

Every process here is real: a plain one (Triton alone) gives what Triton computes; a served one (``kernelcache run``
on a cache its stack installed) walks and keeps the walks at exit, and the next served one replays them. The
conformance test runs over every ``@jit`` function of vLLM's sampler packages; the other tests use
tests/helpers/walkkernels.py, whose keys depend on the order functions are first walked in on Triton 3.6 (it merges a
callee's globals as they are when the walk meets it; 3.8 walks the callee first), and a real launch under the fake
target.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import stacks
from helpers.common import ROOT

from kernelcache.hooks import kernelcache_walks as kw

# Computes cache_key for the named functions in order (after an optional change) and prints, per function, its key and
# its used_global_vals: name, the module whose dict holds it, whether that is the live module dict, the value.
PROBE = r"""
import importlib, json, sys
sys.path.insert(0, TESTS)
from triton.runtime.jit import JITCallable
order, change = sys.argv[1], sys.argv[2]
if order.startswith("vllm"):
    import os, pkgutil
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vLLM's Triton-import branch for a machine without a GPU
    import vllm.v1.sample, vllm.v1.worker.gpu.sample
    fns = {}
    for pkg in (vllm.v1.sample, vllm.v1.worker.gpu.sample):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            module = importlib.import_module(info.name)
            fns.update((v._fn_name, v) for v in vars(module).values()
                       if isinstance(v, JITCallable) and v.__module__ == module.__name__)
    names = sorted(fns, reverse=order == "vllm-reversed")
else:
    import triton.language as tl
    from helpers import walkkernels as k
    if change == "global":
        k.SALT = tl.constexpr(18)
    elif change == "callee":
        k.mix = k.other_mix
    elif change == "source":
        k.mix._unsafe_update_src(k.mix.src.replace("SALT", "SALT + 1"))
    fns = {name: getattr(k, name) for name in order.split(",")}
    names = list(fns)
out = {}
for name in names:
    fn = fns[name]
    key = fn.cache_key
    used = sorted([n, d.get("__name__"), d is sys.modules[d["__name__"]].__dict__, repr(v)]
                  for (n, _), (v, d) in fn.used_global_vals.items())
    out[fn._fn_name] = [key, used]
print(json.dumps(out))
""".replace("TESTS", repr(str(ROOT / "tests")))

ORDER = "scale_kernel,twice,mix,plain_kernel"
REVERSED = "mix,twice,scale_kernel,plain_kernel"


@pytest.fixture(scope="module", params=stacks.STACKS)
def stack(request) -> stacks.Stack:
    return stacks.stack(request.param)


@pytest.fixture(scope="module")
def stack_bundle(stack, request, tmp_path_factory) -> Path:
    """A small bundle of this stack's Triton (the lab's: the session's own ``small_bundle``)."""
    if stack.name == "lab":
        return request.getfixturevalue("small_bundle")
    return stacks.small_bundle(stack, tmp_path_factory.mktemp("serving-bundle"))


@pytest.fixture
def served_cache(stack, stack_bundle, tmp_path) -> Path:
    cache = tmp_path / "c"
    stack.kc("install", str(stack_bundle), "--cache-dir", str(cache), "--no-gpu-check", check=True)
    return cache


def plain(stack: stacks.Stack, order: str, change: str = "none") -> dict:
    done = stack.run("-c", PROBE, order, change, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def served(stack: stacks.Stack, cache: Path, order: str, change: str = "none", **env: str) -> tuple[dict, list[str]]:
    """The probe's result in a served process of ``stack``, and its debug lines about walks."""
    done = stack.kc("run", "--cache-dir", str(cache), "--", stack.python, "-c", PROBE, order, change,
                    env={"KERNELCACHE_DEBUG": "1", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "Triton's walk of " in line or "kept walks:" in line]
    return json.loads(done.stdout.strip().splitlines()[-1]), lines


def outcomes(lines: list[str]) -> dict[str, str]:
    """Function name -> "replayed" / "walked", from the debug log."""
    found = {}
    for line in lines:
        if "Triton's walk of " in line:
            name, _, rest = line.split("Triton's walk of ", 1)[1].partition(": ")
            found[name] = rest.split(" ")[0]
    return found


def walks_record(cache: Path) -> Path:
    [record] = (cache / ".kernelcache" / "triton-walks").glob("*.json")
    return record


def test_replayed_walks_equal_tritons_own_over_vllms_sampler_kernels(stack, served_cache):
    own = plain(stack, "vllm")
    assert len(own) > 40 and any(used for _, used in own.values())  # some read globals: what is compared is not empty
    first, lines = served(stack, served_cache, "vllm")  # walks, as Triton does, and keeps them at exit
    assert first == own and set(outcomes(lines).values()) == {"walked"}
    assert len(json.loads(walks_record(served_cache).read_text())["functions"]) == len(own)
    again, lines = served(stack, served_cache, "vllm")
    assert again == own
    assert outcomes(lines) == dict.fromkeys(own, "replayed")


def test_a_replay_follows_the_order_functions_are_first_walked_in(stack, served_cache):
    in_order, reversed_order = plain(stack, ORDER), plain(stack, REVERSED)
    # Triton 3.6's own keys depend on the order (what the replay must reproduce); 3.8 walks a callee before it merges
    # the callee's globals, so its keys do not, and the replay must not make them.
    order_matters = not kw.rules_for(stack.triton()).callee_key_first
    assert (in_order != reversed_order) == order_matters
    assert served(stack, served_cache, ORDER)[0] == in_order
    replayed, lines = served(stack, served_cache, REVERSED)  # the record was made in the other order
    assert replayed == reversed_order and set(outcomes(lines).values()) == {"replayed"}


@pytest.mark.parametrize(("change", "walked"), [
    ("global", {"mix", "twice", "scale_kernel"}),  # mix reads SALT; the callers take mix's key
    ("callee", {"other_mix", "twice", "scale_kernel"}),  # `mix` is another @jit function now, walked for the first time
    ("source", {"mix", "twice", "scale_kernel"}),
])
def test_a_changed_global_callee_or_source_is_walked_as_triton_walks_it(stack, served_cache, change, walked):
    served(stack, served_cache, ORDER)  # keeps the walks of the unchanged functions
    result, lines = served(stack, served_cache, ORDER, change)
    assert result == plain(stack, ORDER, change) != plain(stack, ORDER)
    found = outcomes(lines)
    prefix = "helpers.walkkernels."
    assert {name.removeprefix(prefix) for name, how in found.items() if how == "walked"} == walked
    assert found[prefix + "plain_kernel"] == "replayed"


@pytest.mark.parametrize("change", ["another Triton", "malformed entries", "switched off"])
def test_a_record_of_another_triton_a_malformed_one_or_the_switch_off_walks(stack, served_cache, change):
    served(stack, served_cache, ORDER)
    record = walks_record(served_cache)
    data = json.loads(record.read_text())
    if change == "switched off":
        assert served(stack, served_cache, ORDER, **{kw.OFF_ENV: "0"})[1] == []  # no hook at all
        return
    if change == "another Triton":
        data["triton_key"] = "another Triton"
    else:
        data["functions"] = {name: {"src": entry["src"], "chains": 5} for name, entry in data["functions"].items()}
    record.write_text(json.dumps(data))
    result, lines = served(stack, served_cache, ORDER)
    assert result == plain(stack, ORDER) and set(outcomes(lines).values()) == {"walked"}


LAUNCH = r"""
import sys, tempfile
sys.path.insert(0, TESTS)
import torch
import triton.language as tl
from kernelcache.exercise import fake_target
fake_target.activate(90, 132, prebuild=False, stub_dir=tempfile.mkdtemp())
from helpers import walkkernels as k
x = torch.zeros(16)
k.scale_kernel[(1,)](x, 16, BLOCK=16)
k.OFFSET = tl.constexpr(6)
try:
    k.scale_kernel[(1,)](x, 16, BLOCK=16)
    print("launched")
except RuntimeError as exc:
    print(exc)
k.OFFSET = tl.constexpr(5)  # as it was: the walk is kept at exit only while what it read holds
""".replace("TESTS", repr(str(ROOT / "tests")))


def test_launches_still_check_the_globals_a_replayed_walk_read(stack, served_cache):
    """A real launch (compiled for sm_90 under the fake target) after a replayed walk: changing a global the kernel
    read is refused at the next launch, as Triton refuses it after its own walk."""
    env = {"KERNELCACHE_DEBUG": "1"}
    first = stack.kc("run", "--cache-dir", str(served_cache), "--", stack.python, "-c", LAUNCH, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    again = stack.kc("run", "--cache-dir", str(served_cache), "--", stack.python, "-c", LAUNCH, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert outcomes(again.stderr.splitlines())["helpers.walkkernels.scale_kernel"] == "replayed"
    for done in (first, again):
        assert "Global variable OFFSET has changed" in done.stdout.strip().splitlines()[-1]
