"""Build manifests (``cache-manifests/*.toml``) -> a frozen, validated ``BuildPlan``.

A build manifest says which vLLM sampler paths to exercise, for which vocab sizes, logits dtypes,
batch range and sampling modes, and for which GPU profiles. Every key is checked; an error names the
file and the key. Command-line flags override the file (``BuildPlan.override``).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from ..errors import ManifestFileError, UsageError
from .gpus import PROFILES, GpuProfile

PATHS = ("registry", "mrv1", "mrv2", "flashinfer")
MODES = ("top_k", "top_p", "top_k_top_p")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MANIFEST = Path(__file__).resolve().parents[2] / "cache-manifests" / "vllm-sampler.toml"


@dataclass(frozen=True)
class Vocab:
    size: int
    models: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildPlan:
    name: str
    paths: tuple[str, ...]
    vocabs: tuple[Vocab, ...]
    dtypes: tuple[str, ...]  # float32: the processed paths; bf16/fp16: MRV2's raw-logits Gumbel
    modes: tuple[str, ...]
    gpus: tuple[GpuProfile, ...]
    max_num_seqs: int = 256
    num_speculative_tokens: int = 0
    seeded: bool = True
    unseeded: bool = True
    min_p: bool = True
    fp64_gumbel: bool = False
    source: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> BuildPlan:
        return cls(**{
            **data,
            "paths": tuple(data["paths"]),
            "vocabs": tuple(Vocab(v["size"], tuple(v.get("models", ()))) for v in data["vocabs"]),
            "dtypes": tuple(data["dtypes"]),
            "modes": tuple(data["modes"]),
            "gpus": tuple(GpuProfile(**g) for g in data["gpus"]),
        })

    def for_arch(self, arch: str) -> tuple[GpuProfile, ...]:
        return tuple(g for g in self.gpus if g.arch == arch)

    def override(self, gpus: list[str] | None = None, vocabs: list[int] | None = None,
                 dtypes: list[str] | None = None, max_num_seqs: int | None = None,
                 paths: list[str] | None = None) -> BuildPlan:
        """Command-line flags over the file, checked like the file (a bad flag is a usage error)."""
        try:
            return self._override(gpus, vocabs, dtypes, max_num_seqs, paths)
        except ManifestFileError as exc:
            raise UsageError(str(exc)) from None

    def _override(self, gpus, vocabs, dtypes, max_num_seqs, paths) -> BuildPlan:
        where = "command line"
        changes: dict[str, Any] = {}
        if gpus:
            changes["gpus"] = tuple(_profile(g, where, {}) for g in gpus)
        if vocabs:
            changes["vocabs"] = tuple(Vocab(_positive(v, "--vocab", where)) for v in vocabs)
        if dtypes:
            changes["dtypes"] = _choices(dtypes, DTYPES, "--dtype", where)
        if max_num_seqs is not None:
            changes["max_num_seqs"] = _positive(max_num_seqs, "--max-num-seqs", where)
        if paths:
            changes["paths"] = _choices(paths, PATHS, "--path", where)
        return replace(self, **changes)


_TOP_KEYS = {"name", "description", "gpus", "vllm", "vocab", "gpu"}
_VLLM_KEYS = {"paths", "max_num_seqs", "num_speculative_tokens", "modes", "seeded", "unseeded", "logits_dtypes",
              "min_p", "fp64_gumbel"}


def load(path: str | Path | None = None) -> BuildPlan:
    """Read and validate a build manifest."""
    file = Path(path) if path is not None else DEFAULT_MANIFEST
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestFileError(f"{file}: no such build manifest") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestFileError(f"{file}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestFileError(f"{file}: not valid TOML: {exc}") from None
    return parse(data, str(file))


def parse(data: dict, where: str) -> BuildPlan:
    _known(data, _TOP_KEYS, "", where)
    vllm = _table(data.get("vllm", {}), "vllm", where)
    _known(vllm, _VLLM_KEYS, "vllm.", where)
    custom = _table(data.get("gpu", {}), "gpu", where)
    vocabs = data.get("vocab")
    if not isinstance(vocabs, list) or not vocabs:
        raise ManifestFileError(f"{where}: 'vocab' must be a non-empty array of tables ([[vocab]])")
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise ManifestFileError(f"{where}: 'gpus' must be a non-empty list of GPU profile names")
    return BuildPlan(
        name=_file_word(data.get("name", Path(where).stem), "name", where),
        paths=_choices(vllm.get("paths", list(PATHS)), PATHS, "vllm.paths", where),
        vocabs=tuple(_vocab(v, i, where) for i, v in enumerate(vocabs)),
        dtypes=_choices(vllm.get("logits_dtypes", list(DTYPES)), DTYPES, "vllm.logits_dtypes", where),
        modes=_choices(vllm.get("modes", list(MODES)), MODES, "vllm.modes", where),
        gpus=tuple(_profile(g, where, custom) for g in gpus),
        max_num_seqs=_positive(vllm.get("max_num_seqs", 256), "vllm.max_num_seqs", where),
        num_speculative_tokens=_natural(vllm.get("num_speculative_tokens", 0), "vllm.num_speculative_tokens", where),
        seeded=_bool(vllm.get("seeded", True), "vllm.seeded", where),
        unseeded=_bool(vllm.get("unseeded", True), "vllm.unseeded", where),
        min_p=_bool(vllm.get("min_p", True), "vllm.min_p", where),
        fp64_gumbel=_bool(vllm.get("fp64_gumbel", False), "vllm.fp64_gumbel", where),
        source=where,
    )


def _known(table: dict, keys: set[str], prefix: str, where: str) -> None:
    for key in table:
        if key not in keys:
            raise ManifestFileError(f"{where}: unknown key '{prefix}{key}' (known: {', '.join(sorted(keys))})")


def _table(value: Any, key: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise ManifestFileError(f"{where}: '{key}' must be a table")
    return value


def _vocab(entry: Any, index: int, where: str) -> Vocab:
    key = f"vocab[{index}]"
    entry = _table(entry, key, where)
    _known(entry, {"size", "models"}, f"{key}.", where)
    models = entry.get("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ManifestFileError(f"{where}: '{key}.models' must be a list of strings")
    return Vocab(_positive(entry.get("size"), f"{key}.size", where), tuple(models))


def _profile(name: Any, where: str, custom: dict) -> GpuProfile:
    if not isinstance(name, str):
        raise ManifestFileError(f"{where}: GPU profile names must be strings, got {name!r}")
    if name in custom:
        _file_word(name, f"gpu.{name}", where)
        spec = _table(custom[name], f"gpu.{name}", where)
        _known(spec, {"arch", "sm_count", "product"}, f"gpu.{name}.", where)
        arch = _string(spec.get("arch"), f"gpu.{name}.arch", where)
        if not arch.startswith("sm_") or not arch[3:].isdigit():
            raise ManifestFileError(f"{where}: 'gpu.{name}.arch' must look like sm_90, got {arch!r}")
        return GpuProfile(name, arch, _positive(spec.get("sm_count"), f"gpu.{name}.sm_count", where),
                          str(spec.get("product", name)))
    if name.lower() not in PROFILES:
        known = ", ".join(sorted(PROFILES))
        raise ManifestFileError(f"{where}: unknown GPU profile {name!r} (known: {known}; or define [gpu.{name}])")
    return PROFILES[name.lower()]


def _choices(values: Any, allowed: tuple[str, ...], key: str, where: str) -> tuple[str, ...]:
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, (list, tuple)) or not values:
        raise ManifestFileError(f"{where}: '{key}' must be a non-empty list")
    for value in values:
        if value not in allowed:
            raise ManifestFileError(f"{where}: '{key}' has unknown value {value!r} (allowed: {', '.join(allowed)})")
    return tuple(dict.fromkeys(values))


def _positive(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ManifestFileError(f"{where}: '{key}' must be a positive integer, got {value!r}")
    return value


def _natural(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ManifestFileError(f"{where}: '{key}' must be a non-negative integer, got {value!r}")
    return value


def _bool(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise ManifestFileError(f"{where}: '{key}' must be true or false, got {value!r}")
    return value


_FILE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def _file_word(value: Any, key: str, where: str) -> str:
    """Names that become part of a bundle's file name: one plain word, no path."""
    text = _string(value, key, where)
    if not _FILE_WORD.fullmatch(text):
        raise ManifestFileError(f"{where}: '{key}' must be a plain name (letters, digits, . _ + -; it names the "
                                f"bundle file), got {text!r}")
    return text


def _string(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ManifestFileError(f"{where}: '{key}' must be a non-empty string")
    return value

