"""Shared fixtures: real Triton compiles for a fake target in fresh subprocesses, real bundles,
and one real build of FlashInfer's sampling module with pip's nvcc (``sampling90``).

Under CI (``CI=true``, as GitHub Actions and .ci/run set it) every skip is a failure: a test that
cannot run there (vLLM missing, no mount rights, no registry server, no linter) must not pass as
"skipped". The summary always ends with the skip count.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.ci import pytest_make_collect_report, pytest_runtest_makereport, pytest_terminal_summary  # noqa: F401
from helpers.common import kc, run_job
from helpers.fast import pytest_configure, pytest_ignore_collect  # noqa: F401
from helpers.testkernel_builds import build

# Builds under test compile everything unless a test names a build cache itself: the counts they assert are a cold
# build's, and nothing of the developer's (or the CI machine's) ~/.cache/kernelcache/build may decide a result.
# helpers.common.clean_env passes this on to every process a test starts.
os.environ["KERNELCACHE_BUILD_CACHE"] = "off"


class KernelBuilds:
    """The test kernels compiled for sm_90 and sm_100 into fresh caches, each on first use: {capability: (cache,
    compile log, records)}. A session that only needs sm_90 (the slow stream) runs one exercise process, not two."""

    CAPABILITIES = (90, 100)

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._made: dict[int, tuple[Path, Path, list[dict]]] = {}

    def __getitem__(self, capability: int) -> tuple[Path, Path, list[dict]]:
        if capability not in self._made:
            work = self._factory.mktemp(f"build{capability}")
            result, records = run_job(work, work / "cache", capability)
            assert result["ok"] and records
            self._made[capability] = (work / "cache", work / "compiles.jsonl", records)
        return self._made[capability]

    def items(self) -> list[tuple[int, tuple[Path, Path, list[dict]]]]:
        return [(capability, self[capability]) for capability in self.CAPABILITIES]


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> KernelBuilds:
    """Test kernels compiled for sm_90 and sm_100 into fresh caches: {capability: (cache, log, records)}."""
    return KernelBuilds(tmp_path_factory)


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory) -> Path:
    """One build cache for the session's cross builds of vLLM's paths: a kernel, gcc-built module or exercise unit
    one test's build compiled, a later build takes (by Triton key: into the same bundle bytes a build without it
    writes, tests/test_build_cache.py). A test that asserts what a cold build compiled or ran names no build cache
    (conftest's ``KERNELCACHE_BUILD_CACHE=off``) or its own. KERNELCACHE_TEST_BUILD_CACHE names a directory to use
    instead: scripts/test.sh gives both streams the same one."""
    shared = os.environ.get("KERNELCACHE_TEST_BUILD_CACHE")
    return Path(shared) if shared else tmp_path_factory.mktemp("build-cache")


@pytest.fixture(scope="module")
def cold_build(tmp_path_factory):
    """The test kernels built once per test module with a build cache of its own (``root / "cache"``): (root,
    result). A test that needs the cache a cold build fills takes a copy of it (helpers/testkernel_builds.py
    ``filled``) instead of building again."""
    root = tmp_path_factory.mktemp("cold-build")
    return root, build(root, "cold", str(root / "cache"))


@pytest.fixture(scope="session")
def bundle90(built, tmp_path_factory) -> Path:
    cache, log, _ = built[90]
    out = tmp_path_factory.mktemp("bundles") / "test-sm_90.tar.zst"
    kc("pack", str(cache), "-o", str(out), "--compile-log", str(log), check=True)
    return out


@pytest.fixture(scope="session")
def sampling90(tmp_path_factory, build_cache):
    """FlashInfer's sampling module really built for sm_90 (about 100 s on 2 cores): (module, members, workdir).

    Every FlashInfer test reuses this one build. It runs as users run it, ``kernelcache build --path
    flashinfer`` (its bundle lands in ``workdir.parents[2] / "out"``, its build cache in ``.../build-cache``); rerunning
    ``build_sampling`` in its kept work dir then finds nothing to do and returns the module and members. The entry
    it published is then put in the session's build cache too: a later build there of the same FlashInfer release
    (tests/test_serving_stack.py, tests/test_uv_vllm_flashinfer.py) takes it instead of running nvcc again (its key
    names the release, toolchain, compilers and arch, no venv: buildcache/flashinfer_modules.py ``module_key``).
    KERNELCACHE_TEST_FLASHINFER_WORKDIR keeps a build dir between runs while developing; CI leaves it unset.
    """
    from helpers.flashinfer import require_flashinfer

    require_flashinfer()
    from kernelcache.buildcache.store import SUFFIX, DirStore
    from kernelcache.exercise.flashinfer_sampling import build_sampling

    if os.environ.get("KERNELCACHE_TEST_FLASHINFER_WORKDIR"):
        workdir = Path(os.environ["KERNELCACHE_TEST_FLASHINFER_WORKDIR"])
    else:
        scratch = tmp_path_factory.mktemp("fi-build90")
        kc("build", "--arch", "sm_90", "--gpu", "h200", "--path", "flashinfer", "--mode", "cross",
           "--workdir", str(scratch / "work"), "-o", str(scratch / "out"),
           "--build-cache", str(scratch / "build-cache"), check=True, timeout=1800)
        workdir = scratch / "work" / "sm_90-132sm" / "flashinfer"
        shared = DirStore(build_cache)
        for blob in DirStore(scratch / "build-cache").blobs():
            shared.put(blob.key, blob.path.name.removesuffix(SUFFIX), blob.path.read_bytes())
    module, members = build_sampling("sm_90", workdir, jobs=2)
    return module, members, workdir


@pytest.fixture(scope="session")
def small_bundle(bundle90, tmp_path_factory) -> Path:
    """Three real kernels and one launcher of ``bundle90``: quick to install many times over."""
    from helpers.hostile import subset

    return subset(bundle90, tmp_path_factory.mktemp("small") / "small-sm_90.tar.zst")
