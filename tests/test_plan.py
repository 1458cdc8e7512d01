"""Build manifests: the default one, CLI overrides, and clear errors for bad files."""

from __future__ import annotations

import re

import pytest
from helpers.common import kc

from kernelcache.errors import RecipeError, UsageError
from kernelcache.plan import recipe as plan_file
from kernelcache.plan.gpus import PROFILES, VisibleGpu
from kernelcache.plan.targets import plan_targets

pytestmark = pytest.mark.fast

GOOD = """
name = "small"
gpus = ["h200", "b200"]
[vllm]
paths = ["registry", "mrv2"]
logits_dtypes = ["float32"]
[[vocab]]
size = 128256
"""


def write(tmp_path, text):
    path = tmp_path / "m.toml"
    path.write_text(text)
    return path


def test_default_manifest_covers_the_popular_families():
    plan = plan_file.load()
    sizes = {v.size for v in plan.vocabs}
    assert {128256, 151936, 152064, 32768, 131072, 129280, 201088, 262208} <= sizes
    assert set(plan.paths) == {"registry", "mrv1", "mrv2", "flashinfer"}
    assert set(plan.dtypes) == {"float32", "bfloat16", "float16"}
    assert plan.seeded and plan.unseeded and plan.max_num_seqs >= 65
    assert {g.name for g in plan.gpus} >= {"h200", "b200", "a100"}


def test_round_trip_and_overrides(tmp_path):
    plan = plan_file.load(write(tmp_path, GOOD))
    assert plan_file.BuildPlan.from_dict(plan.to_dict()) == plan
    changed = plan.override(gpus=["h20"], vocabs=[32000], dtypes=["bfloat16"], max_num_seqs=8, paths=["mrv1"])
    assert [g.name for g in changed.gpus] == ["h20"] and [v.size for v in changed.vocabs] == [32000]
    assert changed.dtypes == ("bfloat16",) and changed.max_num_seqs == 8 and changed.paths == ("mrv1",)


@pytest.mark.parametrize("text, message", [
    (GOOD.replace('paths = ["registry", "mrv2"]', 'pathz = ["registry"]'), "unknown key 'vllm.pathz'"),
    (GOOD.replace('"mrv2"]', '"mrv3"]'), "'vllm.paths' has unknown value 'mrv3'"),
    (GOOD.replace('size = 128256', 'size = "big"'), "'vocab[0].size' must be a positive integer"),
    (GOOD.replace('gpus = ["h200", "b200"]', 'gpus = ["h300"]'), "unknown GPU profile 'h300'"),
    (GOOD.replace('logits_dtypes = ["float32"]', 'logits_dtypes = ["float8"]'), "'vllm.logits_dtypes'"),
    (GOOD.replace("[[vocab]]\nsize = 128256", ""), "'vocab' must be a non-empty array"),
    (GOOD + "\ncolour = = 1\n", "not valid TOML"),
    (GOOD + "\ncolour = 1\n", "unknown key 'vocab[0].colour'"),
    (GOOD.replace('name = "small"', 'name = "small"\nflavour = "x"'), "unknown key 'flavour'"),
    (GOOD.replace('"mrv2"]', '"mrv1_spec_decode"]'), "the mrv1_spec_decode path needs num_speculative_tokens >= 1"),
    (GOOD.replace('[vllm]', '[vllm]\nmax_model_len = 0'), "'vllm.max_model_len' must be a positive integer"),
])
def test_bad_manifests_name_the_file_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(RecipeError, match=re.escape(message)) as info:
        plan_file.load(path)
    assert str(path) in str(info.value)
    done = kc("build", "--arch", "sm_90", "--recipe", str(path))
    assert done.returncode == RecipeError.exit_code
    assert message.split("'")[1] in done.stderr if "'" in message else message in done.stderr


def test_spec_decode_runs_only_with_drafts(tmp_path):
    from kernelcache.plan.tasks import vocab_tasks

    text = GOOD.replace('"mrv2"]', '"mrv1_spec_decode"]').replace("[vllm]", "[vllm]\nnum_speculative_tokens = 3")
    plan = plan_file.load(write(tmp_path, text))
    [spec] = [t for t in vocab_tasks(plan, 128256) if t.label == "mrv1_spec_decode"]
    assert spec.kwargs["num_speculative_tokens"] == 3 and spec.kwargs["max_model_len"] == 8192
    longer = plan.override(num_speculative_tokens=5, max_model_len=131072)
    assert (longer.num_speculative_tokens, longer.max_model_len) == (5, 131072)
    with pytest.raises(UsageError, match="num_speculative_tokens >= 1"):
        plan.override(num_speculative_tokens=0)
    # The default (every path) asks for mrv1_spec_decode only when the recipe has drafts: no task, no error.
    default = plan_file.load(write(tmp_path, GOOD.replace('paths = ["registry", "mrv2"]\n', "")))
    assert "mrv1_spec_decode" in default.paths and not [t for t in vocab_tasks(default, 128256)
                                                   if t.label == "mrv1_spec_decode"]


def test_custom_gpu_profiles(tmp_path):
    text = GOOD.replace('gpus = ["h200", "b200"]', 'gpus = ["my-h100"]') + (
        '\n[gpu.my-h100]\narch = "sm_90"\nsm_count = 114\n')
    plan = plan_file.load(write(tmp_path, text))
    assert plan.gpus[0].sm_count == 114 and plan.gpus[0].arch == "sm_90"


def test_bad_flags_are_usage_errors(tmp_path):
    plan = plan_file.load(write(tmp_path, GOOD))
    with pytest.raises(UsageError, match="--dtype"):
        plan.override(dtypes=["int8"])
    with pytest.raises(UsageError, match="unknown GPU profile 'h300'"):
        plan.override(gpus=["h300"])
    done = kc("build", "--arch", "sm_90", "--manifest", str(write(tmp_path, GOOD)), "--vocab", "0")
    assert done.returncode == UsageError.exit_code and "--vocab" in done.stderr
    assert "h200" in kc("gpus", check=True).stdout and PROFILES["b200"].sm_count == 148


def test_targets_group_profiles_by_sm_count_and_pick_native_when_the_gpu_is_here():
    plan = plan_file.load().override(gpus=["h100-sxm", "h200", "h20", "b200"])
    cross = plan_targets(plan, "sm_90", "auto", [])
    assert [(t.sm_count, [p.name for p in t.profiles], t.mode) for t in cross] == [
        (78, ["h20"], "cross"), (132, ["h100-sxm", "h200"], "cross")]
    native = plan_targets(plan, "sm_90", "auto", [VisibleGpu(0, "NVIDIA H200", 90, 132)])
    assert [(t.mode, t.sm_count) for t in native] == [("native", 132)]
    assert plan_targets(plan, "sm_90", "cross", [VisibleGpu(0, "NVIDIA H200", 90, 132)])[0].mode == "cross"
    with pytest.raises(UsageError, match="114 SMs"):
        plan_targets(plan, "sm_90", "auto", [VisibleGpu(0, "NVIDIA H100 PCIe", 90, 114)])
    with pytest.raises(UsageError, match=r"not sm_120; pass --gpu with a profile of sm_120 \(rtx-pro-6000\)"):
        plan_targets(plan, "sm_120", "cross", [])
