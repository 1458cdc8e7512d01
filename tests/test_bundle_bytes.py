"""Bundles are byte-identical for the same inputs: a real compiled cache packed twice, from two paths at two times,
and a fixed cache packed under a fixed environment to the bytes recorded from the code before the house renovation
(main at c0b64d5): moving modules between floors changes no byte of a bundle.

``python tests/test_bundle_bytes.py`` prints the digests of the fixed bundle (to record them again, on purpose, when
the format changes on purpose)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import zstandard

# The tar stream and digest recorded from main at c0b64d5; the compressed bytes recorded again, on purpose, when
# bundles moved from zstd level 19 to level 12 with a window as long as the stream (issue 27), with zstandard
# 0.25.0. The tar stream is kernelcache's alone; the compressed bytes are also zstandard's, so they are compared
# under the zstandard version they were recorded with.
RECORDED = {"tar_sha256": "25d8662ee24493c0ae841aa6464b5c62ff65bb03273a6b6075fc8ac023e03401",
            "bundle_sha256": "c072bb6bbf511a6fe1c82ccc0bc2c6a88e154ca66455c74812dcc66d041ed9ef",
            "digest": "00440ae5b41b2243173359481df6bc2e1c2a679ed4ffdfd0e15a37387f467b53", "zstandard": "0.25.0"}


def _key(seed: str) -> str:
    return base64.b32encode(hashlib.sha256(seed.encode()).digest()).decode().rstrip("=")


def fixed_cache(root: Path) -> Path:
    """A Triton cache as Triton lays it out, with fixed bytes: one kernel (group file, metadata, cubin, its IR) and
    one launcher module."""
    kernel = root / _key("add_kernel")
    kernel.mkdir(parents=True)
    (kernel / "add_kernel.cubin").write_bytes(bytes(range(256)) * 4)
    (kernel / "add_kernel.json").write_text(json.dumps({"name": "add_kernel", "num_warps": 4, "num_stages": 3,
                                                        "target": {"backend": "cuda", "arch": 90, "warp_size": 32}}))
    (kernel / "add_kernel.ttir").write_text("tt.func public @add_kernel(%x_ptr: !tt.ptr<f32>, %n: i32) attributes")
    children = {f"add_kernel.{s}": str(kernel / f"add_kernel.{s}") for s in ("cubin", "json", "ttir")}
    (kernel / "__grp__add_kernel.json").write_text(json.dumps({"child_paths": children}))
    launcher = root / _key("launcher")
    launcher.mkdir()
    (launcher / "__triton_launcher.so").write_bytes(b"\x7fELF" + bytes(1000))
    return root


def fixed_bundle(work: Path) -> Path:
    """The fixed cache packed under a fixed target, environment and build record."""
    from kernelcache.bundle.make import make_bundle
    from kernelcache.format.manifest import Build, Environment, Target
    from kernelcache.harvest import harvest

    cache = fixed_cache(work / "cache")
    environment = Environment(python="cp312", platform="x86_64-linux", triton="3.6.0", triton_key_sha256="0" * 64,
                              ptxas={"sm_90": "ptxas: NVIDIA (R) Ptx optimizing assembler\nV12.8.93"},
                              env_vars={"TRITON_DEFAULT_FP_FUSION": "1"}, torch="2.10.0")
    build = Build(tool="kernelcache test", mode="pack", source_date_epoch=1700000000)
    return make_bundle(work / "fixed.tar.zst", harvest(cache).entries, Target("cuda", "sm_90"), environment,
                       build).path


def digests(bundle: Path) -> dict[str, str]:
    from kernelcache.format.archive import bundle_digest, read_manifest

    raw = bundle.read_bytes()
    tar = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True).read()
    return {"tar_sha256": hashlib.sha256(tar).hexdigest(), "bundle_sha256": hashlib.sha256(raw).hexdigest(),
            "digest": bundle_digest(read_manifest(bundle)), "zstandard": zstandard.__version__}


def test_a_fixed_cache_packs_to_the_bytes_recorded_before_the_renovation(tmp_path):
    from kernelcache.format.archive import read_manifest

    bundle = fixed_bundle(tmp_path)
    manifest = read_manifest(bundle)
    assert [(k.name, k.signature) for k in manifest.kernels] == [("add_kernel", {"x_ptr": "*fp32", "n": "i32"})]
    assert [m.kind for m in manifest.modules] == ["launcher"]
    found = digests(bundle)
    assert found["digest"] == RECORDED["digest"]
    assert found["tar_sha256"] == RECORDED["tar_sha256"]
    if found["zstandard"] == RECORDED["zstandard"]:
        assert found["bundle_sha256"] == RECORDED["bundle_sha256"]


def test_a_real_cache_packs_to_the_same_bytes_from_another_path_at_another_time(built, tmp_path):
    from helpers.bundles import pack

    cache, log, _ = built[90]
    moved = tmp_path / "elsewhere" / "cache"
    shutil.copytree(cache, moved)
    for path in moved.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
    first, second = pack(cache, tmp_path / "a.tar.zst", log), pack(moved, tmp_path / "b.tar.zst", log)
    assert first.read_bytes() == second.read_bytes()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        sys.stdout.write(json.dumps(digests(fixed_bundle(Path(scratch))), indent=1) + "\n")


class KeptFrames(dict):
    """``format.archive.Frames`` over a dict, counting what was taken."""

    taken = 0

    def get(self, key, accept):
        frame = super().get(key)
        if frame is None or not accept(frame):
            return None
        self.taken += 1
        return frame

    def put(self, key, frame):
        self[key] = frame


def test_a_kept_frame_is_taken_only_when_it_decompresses_to_the_stream():
    from kernelcache.format.archive import compressed, frame_key

    stream, other = os.urandom(1000) * 50, os.urandom(1000) * 50
    frames = KeptFrames()
    first = compressed(stream, 19, frames)
    assert first == compressed(stream, 19) and list(frames) == [frame_key(stream, 19)] and frames.taken == 0
    assert compressed(stream, 19, frames) == first and frames.taken == 1
    assert frame_key(stream, 3) != frame_key(stream, 19) != frame_key(other, 19)
    frames[frame_key(stream, 19)] = compressed(other, 19)  # a frame of another stream under this stream's key
    assert compressed(stream, 19, frames) == first and frames[frame_key(stream, 19)] == first
    for bad in (first[:-4], first + b"\0", first + first, compressed(stream + b"x", 19)):  # cut short, trailing
        frames[frame_key(stream, 19)] = bad  # data (which the reader refuses), two frames, a longer stream
        assert compressed(stream, 19, frames) == first and frames[frame_key(stream, 19)] == first


def test_the_window_covers_the_stream_within_what_decoders_accept_by_default():
    """Near-copies of one kernel lie far apart in a bundle's stream: the window spans the whole stream, up to zstd's
    default decoder limit (128 MiB), so ``zstd -d`` and any other default decoder read every bundle."""
    from kernelcache.format.archive import MAX_WINDOW_LOG, compressed, window_log

    assert [window_log(n) for n in (1, 1024, 1025, 3 << 20, 1 << 27, 1 << 33)] == [10, 10, 11, 22, 27, 27]
    assert MAX_WINDOW_LOG == 27
    block = os.urandom(1 << 20)
    stream = block + os.urandom(2 << 20) + block  # the same MiB again, 3 MiB on
    frame = compressed(stream, 12)
    assert zstandard.get_frame_parameters(frame).window_size == 1 << 22
    assert len(frame) < len(stream) - len(block) + 4096  # the second copy cost next to nothing
    assert zstandard.ZstdDecompressor().decompressobj().decompress(frame) == stream
