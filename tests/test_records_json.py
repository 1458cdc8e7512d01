"""The no-op install reads its record and hashes its environment key with the json package's own C scanner and
encoder (hooks/kernelcache_records.py), without importing json (and with it re and enum): the same values and the
same text as ``json.loads`` / ``json.dumps(sort_keys=True)``, and the same refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.common import ROOT, clean_env

from kernelcache.format.envscan import _normalize
from kernelcache.hooks.kernelcache_records import json_dumps_sorted, json_loads

VALUES = [
    {"format": 1, "bundle": "/tmp/a b/ü.tar.zst", "identity": [1, 2, 3, 1 << 62], "digest": "ab" * 32, "gpu": None,
     "warnings": ["torch: bundle 2.11.0, here 2.11.0+cu130 (\"quoted\")"], "files": [], "fits": {"gpus": ["h200"]}},
    [0.1, -2.5e-300, 1e300, True, False, None, "", "\u2028\x00\t"],
    {"z": {"b": 1, "a": [{"y": 2, "x": 3}]}, "a": "é"},
    "just a string",
    7,
]


@pytest.mark.parametrize("value", VALUES)
def test_the_same_text_and_values_as_the_json_package(value):
    assert json_dumps_sorted(value) == json.dumps(value, sort_keys=True)
    for text in (json.dumps(value), json.dumps(value, indent=1), f" {json.dumps(value)}\n"):
        assert json_loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ["", "   ", "{", '{"a": 1} x', "[1, 2,]", "nul", '{"a": NaN', "{'a': 1}"])
def test_what_is_not_one_document_is_a_value_error(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        json_loads(text)


def test_a_value_json_cannot_hold_is_refused():
    with pytest.raises(TypeError):
        json_dumps_sorted({"a": object()})


@pytest.mark.parametrize("name", ["cuda-bindings", "cuda_bindings", "Cuda.Bindings", "a--_.b", "-x-", "flashinfer"])
def test_distribution_names_normalize_as_the_regex_does(name):
    import re

    assert _normalize(name) == re.sub(r"[-_.]+", "_", name).lower()


def test_the_record_path_imports_neither_json_nor_re(tmp_path):
    code = ("import sys; import kernelcache.entry, kernelcache.cachedir.checked; "
            "print(sorted(m for m in ('json', 're', 'enum', 'hashlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-S", "-c", code], env=clean_env(PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, check=True, cwd=tmp_path)  # -S: no site's own imports
    assert done.stdout.strip() == "[]"
