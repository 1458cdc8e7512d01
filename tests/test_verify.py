"""``kernelcache verify`` never passes having verified nothing (issue 13, defect 1).

A plan whose paths and dtypes select no exercise task (registry and MRV1 need float32) used to report
ok with 0 hits and 0 compiles. It now exits 52, and every bundled kernel shows up as unexercised.
"""

from __future__ import annotations

import json

from helpers.common import kc

from kernelcache.format import archive

RECIPE = "vllm-sampler"  # the shipped default recipe, by name
NOTHING = ("--recipe", RECIPE, "--gpu", "h200", "--path", "registry", "--path", "mrv1", "--dtype", "bfloat16")


def test_a_plan_that_selects_no_task_fails_and_lists_every_bundled_kernel(bundle90):
    done = kc("verify", str(bundle90), *NOTHING, "--json")
    assert done.returncode == 52, done.stderr
    report = json.loads(done.stdout)
    assert not report["ok"] and report["nothing_verified"] and report["tasks"] == 0
    assert report["hits"] == 0 and report["kernels"] == []
    bundled = {(k.name, k.key) for k in archive.read_manifest(bundle90).kernels}
    assert {(k["name"], k["key"]) for k in report["unexercised"]} == bundled
    assert "nothing was verified" in done.stderr and "float32" in done.stderr


def test_the_text_report_warns_about_unexercised_kernels(bundle90):
    done = kc("verify", str(bundle90), *NOTHING)
    assert done.returncode == 52
    assert "no task asked for" in done.stderr and "add_kernel" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("kernelcache: error: nothing was verified")


def test_a_bundle_whose_modules_were_all_left_out_names_them():
    """Blackwell's trtllm-gen module is left out of a build that cannot fetch NVIDIA's artifacts: verify of that
    bundle still proves nothing, and says which module the build left out and why."""
    from pathlib import Path

    from kernelcache.errors import NothingVerified
    from kernelcache.verify import VerifyReport

    why = "fmha_gen (its build includes a header downloaded from NVIDIA's artifactory)"
    report = VerifyReport(Path("/cache"), "cross", "sm_100", (), (), (), 0.0, tasks=1, left_out=(why,))
    failure = report.failure()
    assert isinstance(failure, NothingVerified) and failure.exit_code == 52
    assert why in str(failure) and report.to_dict()["left_out"] == [why]
    assert "float32" not in str(VerifyReport(Path("/c"), "cross", "sm_100", (), (), (), 0.0, left_out=(why,)).failure())
