"""The compile path's record against the serving environment's factors (enginecompile.differences): what the
refusal at install names first, without vLLM (the factors themselves come from vLLM in tests/test_compile_path.py)."""

from __future__ import annotations

import pytest

from kernelcache.enginecompile import differences
from kernelcache.format.manifest import engine_record

RECORD = {"python": "3.12.1", "torch": "2.11.0+cu130", "vllm": "0.33.0", "factors": ["e", "c"],
          "env": {"VLLM_USE_MEGA_AOT_ARTIFACT": False, "VLLM_PP_LAYER_PARTITION": None},
          "configs": {"compilation_config": {"hash": "a", "fields": {"mode": "3"}},
                      "scheduler_config": {"hash": "b", "fields": {"max_num_batched_tokens": 2048}}}}


def _here(**changes) -> dict:
    here = {k: (dict(v) if isinstance(v, dict) else v) for k, v in RECORD.items()}
    here.update(changes)
    return here


def test_the_same_factors_differ_in_nothing():
    assert differences(RECORD, _here()) == []


def test_the_python_version_is_named_first():
    found = differences(RECORD, _here(python="3.12.3", env={**RECORD["env"], "VLLM_PP_LAYER_PARTITION": "1"}))
    assert found[0].startswith("the Python version") and "3.12.1" in found[0] and "3.12.3" in found[0]
    assert "VLLM_PP_LAYER_PARTITION: bundle None, here '1'" in found[1]


def test_a_config_field_comes_before_a_sub_config_that_only_hashes_differently():
    configs = {"compilation_config": {"hash": "a2", "fields": {"mode": "3"}},
               "scheduler_config": {"hash": "b2", "fields": {"max_num_batched_tokens": 1024}}}
    found = differences(RECORD, _here(configs=configs, factors=["e", "c2"]))
    assert found == ["scheduler_config.max_num_batched_tokens: bundle 2048, here 1024",
                     "compilation_config (its compute_hash differs)"]


def test_only_the_hash_differing_names_the_factor():
    assert differences(RECORD, _here(factors=["e", "c2"])) == ["VllmConfig.compute_hash() differs"]


def test_the_manifest_takes_only_the_compile_members():
    good = {"path": "vllm-compile/0123456789abcdef/compile.json", "size": 1, "sha256": "0" * 64}
    assert engine_record({"files": [good]}).files[0].path == good["path"]
    for path in ("vllm-compile/x/compile.json", "vllm-compile/0123456789abcdef/model", "triton-walks/a/b"):
        with pytest.raises(ValueError, match="engine lists"):
            engine_record({"files": [{**good, "path": path}]})
    assert engine_record(None) is None


def test_a_hashed_field_of_any_type_is_named_inside_its_sub_config():
    record = {**RECORD, "configs": {"model_config": {"hash": "m", "fields": {"dtype": "torch.bfloat16"}}}}
    here = _here(configs={"model_config": {"hash": "n", "fields": {"dtype": "torch.float16"}}})
    assert differences(record, here) == ["model_config.dtype: bundle 'torch.bfloat16', here 'torch.float16'"]


def test_the_fields_vllm_hashes_are_recorded_as_it_normalized_them():
    pytest.importorskip("vllm")
    from dataclasses import fields

    from vllm.config import CacheConfig

    from kernelcache.exercise.vllm_compile import _hashed_fields

    config = CacheConfig(block_size=16, cache_dtype="fp8")
    digest, hashed = _hashed_fields(config)
    assert digest == config.compute_hash()
    assert hashed["cache_dtype"] == "fp8" and set(hashed) < {f.name for f in fields(config)}
    other = CacheConfig(block_size=16, cache_dtype="auto")
    assert _hashed_fields(other)[1]["cache_dtype"] == "auto" and _hashed_fields(other)[0] != digest


@pytest.mark.parametrize("pair", ["FOO=1", "CUDA_HOME", "VLLM_CACHE_ROOT=/x", "VLLM_FORCE_AOT_LOAD=1"])
def test_serve_env_takes_only_the_variables_vllm_hashes(pair):
    from kernelcache.enginecompile import serve_env_of
    from kernelcache.errors import UsageError

    with pytest.raises(UsageError, match="--serve-env"):
        serve_env_of([pair])


def test_serve_env_reaches_the_compile_child_as_json(monkeypatch):
    import json

    from kernelcache.enginecompile import SERVE_ENV, serve_env, serve_env_of

    monkeypatch.setenv(SERVE_ENV, serve_env_of(["CUDA_HOME=/usr/local/cuda", "VLLM_USE_V2=0"]))
    assert serve_env() == {"CUDA_HOME": "/usr/local/cuda", "VLLM_USE_V2": "0"}
    assert json.loads(serve_env_of([])) == {}


def test_a_hugging_face_config_is_named_by_its_differing_key():
    bundle = '{"hidden_size": 4096, "transformers_version": "5.20.2"}'
    served = '{"hidden_size": 4096, "transformers_version": "5.3.0"}'
    record = {**RECORD, "transformers": "5.20.2",
              "configs": {"model_config": {"hash": "m", "fields": {"hf_config": bundle}}}}
    here = _here(transformers="5.3.0", configs={"model_config": {"hash": "n", "fields": {"hf_config": served}}})
    found = differences(record, here)
    assert found[0].startswith("the transformers version") and "5.20.2" in found[0]
    assert found[1] == "model_config.hf_config.transformers_version: bundle '5.20.2', here '5.3.0'"
