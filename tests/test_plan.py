"""Build recipes: the shipped ones (by name), CLI overrides, and clear errors for bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.common import ROOT, kc

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


# -- model recipes (plan/model.py) ------------------------------------------------------------------

QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
             "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
             "num_attention_heads": 32, "num_key_value_heads": 4, "torch_dtype": "bfloat16", "rope_theta": 1e6}


def write_config(tmp_path, data: dict, folder: str = "Qwen3-30B-A3B"):
    import json

    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_model_recipes_ship_and_round_trip():
    from kernelcache.plan.tasks import plan_units

    shipped = {p.stem: plan_file.load(p.stem) for p in sorted(plan_file.RECIPES.glob("models/*.toml"))}
    assert {"qwen3-30b-a3b", "llama-3.1-8b", "llama-3.1-8b-eagle3", "llama-3.1-8b-triton-attn"} <= set(shipped)
    for plan in shipped.values():
        assert plan_file.BuildPlan.from_dict(plan.to_dict()) == plan
        assert [v.size for v in plan.vocabs] == [plan.model.vocab_size]
        assert plan.dtypes == ("float32", plan.model.dtype)
    moe = shipped["qwen3-30b-a3b"]
    [(name, [task])] = [u for u in plan_units(moe) if u[0] == "model"]
    assert task.kwargs == {"num_experts": 128, "hidden_size": 2048, "intermediate_size": 768, "top_k": 8,
                           "dtype": "bfloat16", "max_num_batched_tokens": 8192, "tensor_parallel_size": 1}
    assert not [u for u in plan_units(shipped["llama-3.1-8b"]) if u[0] == "model"]
    assert shipped["llama-3.1-8b-eagle3"].num_speculative_tokens == 3


def test_a_shipped_recipe_is_taken_by_name_and_recorded_relative_to_the_package():
    plan = plan_file.load("qwen3-30b-a3b")
    assert plan.source == "kernelcache/recipes/models/qwen3-30b-a3b.toml"  # the same in every install
    assert plan_file.load() == plan_file.load("vllm-sampler") == plan_file.load(plan_file.RECIPES / "vllm-sampler.toml")
    assert plan_file.load().source == "kernelcache/recipes/vllm-sampler.toml"


def test_every_shipped_recipe_is_named_after_its_file_and_listed():
    from kernelcache.plan.catalog import Catalog, recipes

    shipped = plan_file.shipped()
    assert next(iter(shipped)) == plan_file.DEFAULT_RECIPE
    assert len(shipped) == len(list(plan_file.RECIPES.rglob("*.toml")))  # no two files share a name
    assert all(plan_file.load(name).name == name for name in shipped)  # the bundle's file name is the recipe's
    catalog = recipes()
    assert [r.name for r in catalog.recipes] == list(shipped)
    assert Catalog.from_dict(catalog.to_dict()) == catalog
    by_name = {r.name: r for r in catalog.recipes}
    assert by_name["qwen3-30b-a3b"].model == "Qwen3MoeForCausalLM" and "moe" in by_name["qwen3-30b-a3b"].paths
    assert by_name["vllm-sampler"].model is None and len(by_name["vllm-sampler"].vocabs) == 8
    listed = kc("recipes", "--json", check=True)
    assert Catalog.from_dict(json.loads(listed.stdout)) == catalog
    table = kc("recipes", check=True).stdout
    assert all(name in table for name in shipped)


def test_an_unknown_recipe_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    with pytest.raises(RecipeError, match=r"no-such-model: no such build recipe \(shipped: vllm-sampler, .*qwen3-30b"):
        plan_file.load("no-such-model")
    done = kc("build", "--arch", "sm_90", "--recipe", "no-such-model", "-o", str(tmp_path / "out"))
    assert done.returncode == RecipeError.exit_code and "no such build recipe (shipped:" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").write_text(GOOD)  # a plain word that names no shipped recipe but a file here
    assert plan_file.load("mine").name == "small"


def test_model_config_drives_the_plan(tmp_path):
    path = write_config(tmp_path, QWEN3_MOE)
    plan = plan_file.load().override(model_config=str(path), tensor_parallel_size=2, max_num_batched_tokens=2048)
    assert plan.name == "Qwen3-30B-A3B" and [v.size for v in plan.vocabs] == [151936]
    assert {"moe", "runner"} <= set(plan.paths) and plan.layer_dtypes == ("bfloat16",)
    assert plan.model.moe_intermediate_size == 768
    assert (plan.tensor_parallel_size, plan.max_num_batched_tokens) == (2, 2048)
    assert plan_file.BuildPlan.from_dict(plan.to_dict()) == plan
    # Mixtral's names for the same fields; a multimodal config's text_config; a dense model drops moe.
    mixtral = {"architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
               "intermediate_size": 14336, "num_local_experts": 8, "num_experts_per_tok": 2, "torch_dtype": "float16"}
    plan = plan_file.load().override(model_config=str(write_config(tmp_path, mixtral, "mixtral")))
    assert (plan.model.num_experts, plan.model.moe_intermediate_size, plan.layer_dtypes) == (8, 14336, ("float16",))
    wrapped = {"architectures": ["Qwen3VLMoeForConditionalGeneration"], "text_config": QWEN3_MOE}
    assert plan_file.load().override(model_config=str(write_config(tmp_path, wrapped, "vl"))).model.num_experts == 128
    dense = {k: v for k, v in QWEN3_MOE.items() if k not in ("num_experts", "moe_intermediate_size")}
    assert "moe" not in plan_file.load().override(model_config=str(write_config(tmp_path, dense, "dense"))).paths


@pytest.mark.parametrize("change, message", [
    ({"vocab_size": None}, "has no 'vocab_size'"),
    ({"hidden_size": "2048"}, "'hidden_size' must be a positive integer"),
    ({"num_experts_per_tok": None}, "has no 'num_experts_per_tok'"),
    ({"torch_dtype": "float8_e4m3fn"}, "model dtype 'float8_e4m3fn'"),
])
def test_bad_model_configs_name_the_file_and_field(tmp_path, change, message):
    data = {k: v for k, v in {**QWEN3_MOE, **change}.items() if v is not None}
    path = write_config(tmp_path, data)
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        plan_file.load().override(model_config=str(path))
    assert str(path) in str(info.value)
    done = kc("build", "--arch", "sm_90", "--model-config", str(path))
    assert done.returncode == UsageError.exit_code and message in done.stderr


def test_moe_needs_a_moe_model_and_a_dividing_tp(tmp_path):
    with pytest.raises(UsageError, match="moe path needs a mixture-of-experts model"):
        plan_file.load().override(paths=["moe"])
    with pytest.raises(UsageError, match="does not divide"):
        plan_file.load().override(model_config=str(write_config(tmp_path, QWEN3_MOE)), tensor_parallel_size=5)
    for text, message in ((GOOD + "\n[model]\nvocab_size = 1\nhidden = 2\n", "unknown key 'model.hidden'"),
                          (GOOD.replace('"mrv2"]', '"moe"]'), "needs a mixture-of-experts model")):
        with pytest.raises(RecipeError, match=re.escape(message)):
            plan_file.load(write(tmp_path, text))
    missing = kc("build", "--arch", "sm_90", "--model-config", str(tmp_path / "nope.json"))
    assert missing.returncode == UsageError.exit_code and "no such model config" in missing.stderr


def test_moe_targets_split_by_product_name(tmp_path):
    plan = plan_file.load("qwen3-30b-a3b")
    cross = plan_targets(plan, "sm_90", "cross", [])
    assert [[p.name for p in t.profiles] for t in cross] == [["h100-sxm"], ["h200"]]
    assert len({t.label for t in cross}) == 2
    sampler = plan.override(paths=["mrv2"])
    assert [[p.name for p in t.profiles] for t in plan_targets(sampler, "sm_90", "cross", [])] == [["h100-sxm", "h200"]]
    # mamba too: selective_state_update's configs are read by device name
    nemotron = plan_file.load("nemotron-h-8b")
    assert [[p.name for p in t.profiles] for t in plan_targets(nemotron, "sm_90", "cross", [])] == [["h100-sxm"],
                                                                                                   ["h200"]]
    # a native build makes bundles only for the visible GPU's product, and says so when none is requested
    h100 = VisibleGpu(0, "NVIDIA H100 80GB HBM3", 90, 132)
    [native] = plan_targets(plan, "sm_90", "native", [h100])
    assert [p.name for p in native.profiles] == ["h100-sxm"]
    assert [p.name for p in plan_targets(sampler, "sm_90", "native", [h100])[0].profiles] == ["h100-sxm", "h200"]
    with pytest.raises(UsageError, match="by name"):
        plan_targets(plan.override(gpus=["h200"]), "sm_90", "native", [h100])


# -- the attention path (vLLM's Triton attention backend) ------------------------------------------

LLAMA = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}


def attention_kwargs(plan) -> list[dict]:
    from kernelcache.plan.tasks import plan_units

    return [t.kwargs for name, tasks in plan_units(plan) if name == "model" for t in tasks if t.label == "attention"]


def test_triton_attention_backend_adds_the_attention_path(tmp_path):
    config = str(write_config(tmp_path, LLAMA, "Llama-3.1-8B"))
    assert "attention" not in plan_file.load().override(model_config=config).paths  # auto: FlashAttention
    plan = plan_file.load().override(model_config=config, attention_backend="TRITON_ATTN", kv_cache_dtype="auto",
                                     block_size=32, tensor_parallel_size=2, max_model_len=4096)
    assert "attention" in plan.paths and plan_file.BuildPlan.from_dict(plan.to_dict()) == plan
    # head_dim is not in Llama's config: hidden_size / num_attention_heads, as transformers derives it.
    assert attention_kwargs(plan) == [{
        "num_heads": 32, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16", "kv_cache_dtype": "auto",
        "block_size": 32, "max_num_seqs": 256, "max_model_len": 4096, "max_num_batched_tokens": 8192,
        "sliding_window": 0, "tensor_parallel_size": 2}]
    assert "attention" not in plan.override(attention_backend="FLASH_ATTN").paths
    # An fp8 KV cache: refused where Triton attention would need its kernels, accepted where it compiles none.
    with pytest.raises(UsageError, match="kv_cache_dtype auto only"):
        plan.override(kv_cache_dtype="fp8")
    assert plan.override(attention_backend="FLASH_ATTN", kv_cache_dtype="fp8").kv_cache_dtype == "fp8"
    shipped = plan_file.load("llama-3.1-8b-triton-attn")
    assert shipped.attention_backend == "TRITON_ATTN" and len(attention_kwargs(shipped)) == 1


def test_sliding_windows_give_one_attention_task_each(tmp_path):
    def windows(**fields) -> list[int]:
        config = str(write_config(tmp_path, {**LLAMA, **fields}, "m"))
        plan = plan_file.load().override(model_config=config, attention_backend="TRITON_ATTN")
        return [k["sliding_window"] for k in attention_kwargs(plan)]

    assert windows(sliding_window=4096) == [4096]  # Mistral: every layer windowed
    assert windows(sliding_window=32768, use_sliding_window=False) == [0]  # Qwen2/Qwen3 carry an unused window
    assert windows(sliding_window=None, head_dim=None) == [0]  # null: the default
    mixed = ["sliding_attention", "full_attention"]
    assert windows(sliding_window=128, layer_types=mixed) == [0, 128]  # gpt-oss, Gemma 3: both kinds


def test_attention_path_needs_the_triton_backend_and_dividing_heads(tmp_path):
    config = str(write_config(tmp_path, LLAMA, "Llama-3.1-8B"))
    with pytest.raises(UsageError, match="needs attention_backend = TRITON_ATTN"):
        plan_file.load().override(model_config=config, paths=["attention"])
    with pytest.raises(UsageError, match="needs a model with num_attention_heads"):
        plan_file.load().override(attention_backend="TRITON_ATTN", paths=["mrv2", "attention"])
    with pytest.raises(UsageError, match="does not divide Llama-3.1-8B's 32 attention heads"):
        plan_file.load().override(model_config=config, attention_backend="TRITON_ATTN", tensor_parallel_size=3)
    for flag, value, message in (("--attention-backend", "XFORMERS", "'--attention-backend' must be one of"),
                                 ("--kv-cache-dtype", "int4", "'--kv-cache-dtype' must be one of"),
                                 ("--block-size", "0", "'--block-size' must be a positive integer")):
        done = kc("build", "--arch", "sm_90", "--model-config", config, flag, value)
        assert done.returncode == UsageError.exit_code and message in done.stderr, done.stderr
    bad = GOOD.replace("[vllm]", '[vllm]\nattention_backend = "TRITON"')
    with pytest.raises(RecipeError, match="'vllm.attention_backend' must be one of"):
        plan_file.load(write(tmp_path, bad))


NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "vocab_size": 131072, "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "mamba_num_heads": 128,
              "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4, "chunk_size": 128,
              "torch_dtype": "bfloat16"}
GRANITE_H = {"architectures": ["GraniteMoeHybridForCausalLM"], "vocab_size": 100352, "hidden_size": 1536,
             "num_attention_heads": 12, "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128,
             "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_chunk_size": 256, "torch_dtype": "bfloat16"}


def mamba_kwargs(plan) -> list[dict]:
    from kernelcache.plan.tasks import plan_units

    return [t.kwargs for name, tasks in plan_units(plan) if name == "model" for t in tasks if t.label == "mamba"]


def test_a_hybrid_model_adds_the_mamba_path_with_its_architectures_names(tmp_path):
    plan = plan_file.load().override(model_config=str(write_config(tmp_path, NEMOTRON_H, "Nemotron-H-8B")),
                                     max_num_seqs=8, max_num_batched_tokens=512)
    assert "mamba" in plan.paths and plan_file.BuildPlan.from_dict(plan.to_dict()) == plan
    # Nemotron-H's vLLM config class makes the SSM state float32 when the server leaves it on auto.
    assert mamba_kwargs(plan) == [{
        "mamba_num_heads": 128, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8, "conv_kernel": 4,
        "chunk_size": 128, "mamba_ssm_cache_dtype": "float32", "hidden_size": 4096, "dtype": "bfloat16",
        "max_num_seqs": 8, "max_num_batched_tokens": 512, "tensor_parallel_size": 1}]
    granite = plan_file.load().override(model_config=str(write_config(tmp_path, GRANITE_H, "granite-4.0-h")))
    [kwargs] = mamba_kwargs(granite)
    assert (kwargs["mamba_num_heads"], kwargs["n_groups"], kwargs["chunk_size"], kwargs["mamba_ssm_cache_dtype"]) == (
        48, 1, 256, "auto")
    shipped = plan_file.load("nemotron-h-8b")
    assert mamba_kwargs(shipped)[0]["mamba_num_heads"] == 128 and "moe" not in shipped.paths


def test_the_mamba_path_needs_a_hybrid_model_and_dividing_heads(tmp_path):
    with pytest.raises(UsageError, match="needs a hybrid model with Mamba-2 layers"):
        plan_file.load().override(model_config=str(write_config(tmp_path, LLAMA, "Llama")), paths=["mamba"])
    config = str(write_config(tmp_path, NEMOTRON_H, "Nemotron-H-8B"))
    with pytest.raises(UsageError, match="does not divide Nemotron-H-8B's 128 Mamba heads"):
        plan_file.load().override(model_config=config, tensor_parallel_size=3)
    with pytest.raises(UsageError, match="'mamba_ssm_cache_dtype' must be one of"):
        plan_file.load().override(model_config=str(write_config(
            tmp_path, {**NEMOTRON_H, "mamba_ssm_cache_dtype": "int8"}, "bad")))
    with pytest.raises(UsageError, match="no 'mamba_d_state'"):
        plan_file.load().override(model_config=str(write_config(
            tmp_path, {k: v for k, v in GRANITE_H.items() if k != "mamba_d_state"}, "bad")))


# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (the fields kernelcache reads, plus some it ignores).
QWEN3_NEXT = {"architectures": ["Qwen3NextForCausalLM"], "vocab_size": 151936, "hidden_size": 2048,
              "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "num_experts": 512,
              "num_experts_per_tok": 10, "moe_intermediate_size": 512, "linear_num_key_heads": 16,
              "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
              "linear_conv_kernel_dim": 4, "full_attention_interval": 4, "mtp_num_hidden_layers": 1,
              "torch_dtype": "bfloat16"}
# A Qwen3.5 multimodal config: the language model's fields under text_config, the SSM state's dtype named there.
QWEN3_5 = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": {
    "vocab_size": 248320, "hidden_size": 2560, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mamba_ssm_dtype": "float32", "dtype": "bfloat16"}}


def gdn_kwargs(plan) -> list[dict]:
    from kernelcache.plan.tasks import plan_units

    return [t.kwargs for name, tasks in plan_units(plan) if name == "model" for t in tasks if t.label == "gdn"]


def test_a_gated_delta_net_model_brings_its_gdn_moe_runner_and_sampler_paths(tmp_path):
    plan = plan_file.load().override(model_config=str(write_config(tmp_path, QWEN3_NEXT, "Qwen3-Next-80B-A3B")),
                                     max_num_seqs=8, max_num_batched_tokens=512, num_speculative_tokens=1,
                                     gdn_prefill_backend="triton")
    assert {"gdn", "moe", "runner", "registry", "mrv1", "mrv2"} <= set(plan.paths) and "mamba" not in plan.paths
    assert plan_file.BuildPlan.from_dict(plan.to_dict()) == plan
    assert gdn_kwargs(plan) == [{
        "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "layout": "interleaved",
        "mamba_ssm_cache_dtype": "auto", "hidden_size": 2048, "dtype": "bfloat16", "max_num_seqs": 8,
        "max_num_batched_tokens": 512, "tensor_parallel_size": 1, "num_speculative_tokens": 1,
        "gdn_prefill_backend": "triton", "num_key_value_heads": 2, "head_dim": 256, "attention_backend": "auto",
        "kv_cache_dtype": "auto", "block_size": 16, "max_model_len": 8192}]
    qwen35 = plan_file.load().override(model_config=str(write_config(tmp_path, QWEN3_5, "Qwen3.5-4B")))
    [kwargs] = gdn_kwargs(qwen35)
    # Qwen3.5's vLLM config class takes the SSM state's dtype from the config's mamba_ssm_dtype.
    assert (kwargs["layout"], kwargs["mamba_ssm_cache_dtype"], kwargs["hidden_size"]) == ("flat", "float32", 2560)
    assert "moe" not in qwen35.paths and qwen35.vocabs[0].size == 248320
    shipped = plan_file.load("qwen3-next-80b-a3b")
    assert {"gdn", "moe"} <= set(shipped.paths) and shipped.gdn_prefill_backend == "triton"
    assert gdn_kwargs(shipped)[0]["layout"] == "interleaved" and shipped.model.num_experts == 512


def test_the_gdn_path_needs_a_gdn_model_and_refuses_the_linear_attention_it_does_not_build(tmp_path):
    with pytest.raises(UsageError, match="the gdn path needs a model with gated-delta-net layers"):
        plan_file.load().override(model_config=str(write_config(tmp_path, LLAMA, "Llama")), paths=["gdn"])
    config = str(write_config(tmp_path, QWEN3_NEXT, "Qwen3-Next-80B-A3B"))
    with pytest.raises(UsageError, match="does not divide Qwen3-Next-80B-A3B's 16 key / 32 value heads"):
        plan_file.load().override(model_config=config, paths=["gdn"], tensor_parallel_size=3)
    kimi = {**QWEN3_NEXT, "architectures": ["KimiLinearForCausalLM"]}
    with pytest.raises(UsageError, match="KimiLinearForCausalLM has linear-attention layers kernelcache does not"):
        plan_file.load().override(model_config=str(write_config(tmp_path, kimi, "Kimi-Linear")))
    with pytest.raises(UsageError, match="no 'linear_conv_kernel_dim'"):
        plan_file.load().override(model_config=str(write_config(
            tmp_path, {k: v for k, v in QWEN3_NEXT.items() if k != "linear_conv_kernel_dim"}, "bad")))
    done = kc("build", "--arch", "sm_90", "--model-config", config, "--gdn-prefill-backend", "cutedsl")
    assert done.returncode == UsageError.exit_code and "'--gdn-prefill-backend' must be one of" in done.stderr
    bad = GOOD.replace("[vllm]", '[vllm]\ngdn_prefill_backend = "fla"')
    with pytest.raises(RecipeError, match="'vllm.gdn_prefill_backend' must be one of"):
        plan_file.load(write(tmp_path, bad))


def test_mrv2_spec_decode_runs_with_drafts(tmp_path):
    from kernelcache.plan.tasks import vocab_tasks

    def spec(plan) -> list[dict]:
        return [t.kwargs for t in vocab_tasks(plan, 128256) if t.label == "mrv2_spec_decode"]

    plan = plan_file.load().override(paths=["mrv2", "mrv2_spec_decode"], num_speculative_tokens=3,
                                     max_model_len=131072, block_size=32)
    assert spec(plan) == [{"vocab": 128256, "max_num_seqs": 256, "num_speculative_tokens": 3,
                           "max_model_len": 131072, "max_num_batched_tokens": 8192, "block_size": 32,
                           "dtypes": list(plan.dtypes)}]
    default = plan_file.load(write(tmp_path, GOOD.replace('paths = ["registry", "mrv2"]\n', "")))
    assert "mrv2_spec_decode" in default.paths and not spec(default)  # every path, no drafts: no task
    with pytest.raises(UsageError, match="the mrv2_spec_decode path needs num_speculative_tokens >= 1"):
        plan_file.load().override(paths=["mrv2", "mrv2_spec_decode"])
    shipped = plan_file.load("llama-3.1-8b-eagle3")
    assert spec(shipped) and "mrv1_spec_decode" in shipped.paths


# -- the two attention families' tasks: one builder, the same bytes ------------------------------------------

GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "vocab_size": 256000, "hidden_size": 3584, "num_attention_heads": 16,
          "num_key_value_heads": 8, "head_dim": 256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16",
          "sliding_window": 4096, "layer_types": ["sliding_attention", "full_attention"],
          "attn_logit_softcapping": 50.0}
# (model config, overrides): both families, with and without sliding windows and a soft-cap, over TP, block size,
# limits, cubins and the backend named or auto.
ATTENTION_CONFIGS = (
    (LLAMA, {"attention_backend": "TRITON_ATTN", "block_size": 32, "tensor_parallel_size": 2, "max_model_len": 4096}),
    ({**LLAMA, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
     {"attention_backend": "TRITON_ATTN", "max_num_seqs": 64, "max_num_batched_tokens": 2048}),
    (LLAMA, {"attention_backend": "FLASHINFER", "flashinfer_cubins": False, "tensor_parallel_size": 4}),
    (LLAMA, {"attention_backend": "auto", "paths": ["flashinfer_attention"], "block_size": 64}),
    (GEMMA2, {"attention_backend": "FLASHINFER", "max_model_len": 8192, "max_num_seqs": 128}),
)
ATTENTION_TASKS = Path(__file__).parent / "data" / "attention_tasks.json"


def attention_tasks(tmp_path) -> list[dict]:
    """The tasks both attention families plan for ``ATTENTION_CONFIGS``, in plan order, as their JSON gives them."""
    from dataclasses import asdict, replace

    from kernelcache.plan.tasks import plan_units

    found = []
    for index, (config, overrides) in enumerate(ATTENTION_CONFIGS):
        given = {k: v for k, v in overrides.items() if k != "flashinfer_cubins"}  # a recipe's, no build flag
        plan = plan_file.load().override(model_config=str(write_config(tmp_path, config, f"m{index}")), **given)
        plan = replace(plan, flashinfer_cubins=overrides.get("flashinfer_cubins", plan.flashinfer_cubins))
        found += [asdict(t) for _, tasks in plan_units(plan) for t in tasks
                  if t.label in ("attention", "flashinfer_attention")]
    return found


def test_both_attention_families_plan_the_tasks_they_planned_before(tmp_path):
    """tests/data/attention_tasks.json is what the two families planned for ``ATTENTION_CONFIGS`` before they shared
    one builder (``attention_tasks`` run once on commit d75ece5, written with ``json.dumps(tasks, indent=1)``): a
    task's JSON, its key order included, is what build-cache and task keys are taken from."""
    assert json.dumps(attention_tasks(tmp_path), indent=1) + "\n" == ATTENTION_TASKS.read_text()


def keyword_parameters(module: str, function: str) -> list[str]:
    """A function's keyword-only parameters in order, read from its source (importing the exercise imports torch)."""
    import ast

    tree = ast.parse((ROOT / f"{module.replace('.', '/')}.py").read_text())
    [found] = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function]
    return [a.arg for a in found.args.kwonlyargs]


def test_attention_tasks_list_their_arguments_in_the_exercise_functions_order(tmp_path):
    tasks = attention_tasks(tmp_path)
    assert {t["label"] for t in tasks} == {"attention", "flashinfer_attention"}
    for task in tasks:
        module, _, function = task["call"].partition(":")
        order = keyword_parameters(module, function)
        assert set(task["kwargs"]) <= set(order)
        assert list(task["kwargs"]) == [name for name in order if name in task["kwargs"]]
