"""What the independent probes share: vLLM's code under kernelcache's fake target, with every compile recorded.

Only kernelcache's fake driver is used (``fake_target.activate``, "the same fake target" as the build); the
CUDA platform vLLM sees is the probes' own minimal one, not the exercise code's. ``start`` must run before
the probe imports torch or vLLM's sampler modules; ``report`` prints one JSON line per compile() call:
{"name", "key", "hit"}.
"""

import base64
import json
import os


def start(capability: int, sm_count: int) -> list[dict]:
    """Set the environment, attach the compile listener, activate the fake target and a CUDA platform with
    ``sm_count`` SMs; returns the list every compile() is appended to."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["VLLM_USE_FLASHINFER_SAMPLER"] = "0"
    os.environ["TQDM_DISABLE"] = "1"
    import triton

    events = []

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        key = base64.b32encode(bytes.fromhex(metadata["hash"])).decode().rstrip("=")
        events.append({"name": src.name, "key": key, "hit": cache_hit})

    triton.knobs.compilation.listener = listener
    from kernelcache.exercise import fake_target

    fake_target.activate(capability, sm_count, prebuild=False)

    import vllm.platforms
    from vllm.platforms.interface import Platform, PlatformEnum

    class ProbeCuda(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"

        @classmethod
        def num_compute_units(cls, device_id=0):
            return sm_count

    vllm.platforms._current_platform = ProbeCuda()
    return events


def report(events: list[dict]) -> None:
    for event in events:
        print(json.dumps(event))
