"""Builds of kernelcache's own test kernels through ``kernelcache.build`` with a build cache (the build-cache and
exercise-record tests): one plan whose registry path selects no vLLM task in bfloat16, so the test kernels (and
their launchers and cuda_utils, gcc-built for the fake target) are what compiles; and the cache one cold build
fills, copied for each test that needs it instead of building again (conftest's ``cold_build``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from helpers.common import TESTKERNELS

import kernelcache

FLAGS = {"gpus": ["h200"], "dtypes": ["bfloat16"], "paths": ["registry"], "mode": "cross"}


def build(tmp_path: Path, name: str, cache, tasks=(TESTKERNELS,), **flags):
    """One build of ``tasks`` with ``cache`` (a directory, a URL or False), its work dir kept under ``name``."""
    return kernelcache.build("sm_90", output_dir=tmp_path / name / "out", workdir=tmp_path / name / "work",
                             build_cache=cache, extra_tasks=tuple(tasks), **{**FLAGS, **flags})


def filled(cold_build, tmp_path: Path) -> Path:
    """A copy of the cache ``cold_build`` filled, at ``tmp_path / "cache"``."""
    return Path(shutil.copytree(cold_build[0] / "cache", tmp_path / "cache"))
