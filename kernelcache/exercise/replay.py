"""Exercise task: compile recorded misses again, under the worker's active (fake or real) target.

``run(records)`` takes ``MissTarget`` records (kernelcache.plan.misses) and, for each, imports the
JIT function by module and qualname (unwrapping autotuners and heuristics), checks the record is
for the arch the worker targets, and calls ``JITFunction.preload(specialization_data)``, which
compiles exactly that specialization into the worker's cache. It then checks the compiled key is
the one the miss had. Any record that fails to import, preload or reproduce its key fails the
task: a build must not quietly ship a bundle that still misses.
"""

from __future__ import annotations

import base64
import importlib
import json


def run(records: list[dict]) -> dict:
    from triton.runtime import driver

    arch = driver.active.get_current_target().arch
    replayed, failed = [], []
    for record in records:
        try:
            key = _replay(record, arch)
        except Exception as exc:  # noqa: BLE001 -- collected, then the task fails with all of them
            failed.append({"key": record.get("key"), "kernel": record.get("kernel"),
                           "error": f"{type(exc).__name__}: {exc}"})
            continue
        if key != record["key"]:
            failed.append({"key": record["key"], "kernel": record.get("kernel"),
                           "error": f"replay compiled key {key}, not the key of the miss"})
        else:
            replayed.append(key)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} misses could not be replayed: {json.dumps(failed)}")
    return {"replayed": len(replayed), "keys": replayed}


def _replay(record: dict, arch: int) -> str:
    if record["capability"] != arch:
        raise ValueError(f"recorded for sm_{record['capability']}, this worker targets sm_{arch}")
    fn = jit_function(record["fn_module"], record["fn_qualname"])
    data = json.loads(record["specialization_data"])
    data["key"] = data.get("key") or f"kernelcache-replay:{record['key']}"  # preload's in-memory key
    kernel = fn.preload(json.dumps(data))
    kernel = kernel.result() if hasattr(kernel, "result") else kernel
    return base64.b32encode(bytes.fromhex(kernel.hash)).decode().rstrip("=")


def jit_function(module: str, qualname: str):
    """The ``JITFunction`` behind ``module.qualname`` (through Autotuner / Heuristics wrappers)."""
    from triton.runtime.jit import JITFunction

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction):
        inner = getattr(obj, "fn", None)
        if inner is None or inner is obj:
            raise TypeError(f"{module}.{qualname} is not a @triton.jit function")
        obj = inner
    return obj
