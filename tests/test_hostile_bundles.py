"""Hostile and broken bundles: each is refused with one line and its own exit code, and nothing is left.

The corpus is in tests/helpers/hostile.py. Every case runs through the real ``kernelcache install`` command
(click's runner, in this process, so 80 cases and 200 bit flips take seconds); one case per exit
code also runs as a separate process, as users run it. After each refusal the test checks that the
cache dir shows nothing new, that staging, journal and receipts are empty, and that nothing
appeared outside the cache (where an escaping member would have landed).
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import pytest
import zstandard
from click.testing import CliRunner
from helpers.common import kc, tree
from helpers.hostile import CASES, Base, Case, flips, load_base, regular
from helpers.hostile import bundle as hostile_bundle

from kernelcache.cachedir import STATE_DIR
from kernelcache.cli import main
from kernelcache.errors import BundleError, FingerprintMismatch, IntegrityError
from kernelcache.format import archive

BUNDLE_CODES = {cls.exit_code for cls in BundleError.__subclasses__()}
FOREIGN = "F" * 52  # an entry Triton wrote before the install; it must survive untouched


class Sandbox:
    """A cache dir with a foreign entry, a neighbour file, and an 'outside' dir escapes would hit."""

    def __init__(self, root: Path):
        self.root = root
        self.cache = root / "sandbox" / "cache"
        self.outside = root / "outside"
        (self.cache / FOREIGN).mkdir(parents=True)
        (self.cache / FOREIGN / "k.json").write_text("{}")
        (root / "sandbox" / "neighbour.txt").write_text("keep")
        self.outside.mkdir()
        self.before = tree(root / "sandbox")

    def install(self, bundle: Path, *flags: str):
        args = ["install", str(bundle), "--cache-dir", str(self.cache), "--no-gpu-check", *flags]
        return CliRunner().invoke(main, args)

    def assert_untouched(self) -> None:
        after = tree(self.root / "sandbox")
        visible = {k: v for k, v in after.items() if f"/{STATE_DIR}/" not in f"/{k}"}
        assert visible == self.before
        state = self.cache / STATE_DIR
        leftovers = [p for p in state.rglob("*") if p.is_file() and p.name != "lock"] if state.exists() else []
        assert leftovers == []
        assert list(self.outside.rglob("*")) == []


@pytest.fixture(scope="module")
def base(small_bundle, tmp_path_factory) -> Base:
    return load_base(small_bundle, tmp_path_factory.mktemp("escape-target") / "outside" / "escaped.txt")


def write_case(case: Case, base: Base, sandbox: Sandbox, path: Path) -> Path:
    base.escape = sandbox.outside / "escaped.txt"
    path.write_bytes(case.build(base))
    return path


def test_the_unmodified_base_installs(base, tmp_path):
    """The control: the same builder without a defect gives a bundle that installs."""
    sandbox = Sandbox(tmp_path)
    bundle = write_case(Case("valid", BundleError, lambda b: hostile_bundle(b)), base, sandbox,
                        tmp_path / "valid.tar.zst")
    result = sandbox.install(bundle)
    assert result.exit_code == 0, result.output
    assert all((sandbox.cache / name).is_file() for name, _ in base.members)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_bundle_is_refused_and_leaves_nothing(case, base, tmp_path):
    sandbox = Sandbox(tmp_path)
    bundle = write_case(case, base, sandbox, tmp_path / "hostile.tar.zst")
    flags = [x for item in (case.limits or {}).items() for x in item]
    result = sandbox.install(bundle, *flags)

    assert result.exit_code == case.error.exit_code, (result.exit_code, result.stderr, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernelcache: error: "), result.stderr
    sandbox.assert_untouched()
    assert not [t for t in threading.enumerate() if t.name.startswith("kernelcache-")]  # read-ahead stopped


def test_every_failure_class_has_its_own_exit_code():
    codes = {c.error: c.error.exit_code for c in CASES}
    assert len(set(codes.values())) == len(codes) == 6
    assert set(codes.values()) <= BUNDLE_CODES


ONE_PER_CODE = ["traversal-nested", "symlink-outside", "sha256-mismatch", "zstd-bomb-trailing-zeros",
                "manifest-unknown-schema-version", "truncated-at-half", "group-file-names-outside-file"]


@pytest.mark.parametrize("name", ONE_PER_CODE)
def test_refusal_as_a_separate_process(name, base, tmp_path):
    """One case per exit code through ``python -m kernelcache``, exactly as users run it."""
    case = next(c for c in CASES if c.name == name)
    sandbox = Sandbox(tmp_path)
    bundle = write_case(case, base, sandbox, tmp_path / "hostile.tar.zst")
    done = kc("install", str(bundle), "--cache-dir", str(sandbox.cache), "--no-gpu-check")
    assert done.returncode == case.error.exit_code, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    sandbox.assert_untouched()


def test_a_damaged_bundle_built_elsewhere_is_refused_as_damaged(base, tmp_path):
    """Planning reads only the manifest. When it finds the bundle was built for another environment, the
    rest of the file is checked before saying so: a damaged file is reported as damaged (its own exit code),
    an intact one as a mismatch."""
    elsewhere = copy.deepcopy(base.manifest)
    elsewhere["environment"]["platform"] = "aarch64-linux"
    name, data = base.member(".cubin")
    damaged = [(n, bytes([d[0] ^ 1]) + d[1:] if n == name else d) for n, d in base.members]
    for label, members, error in (("intact", base.members, FingerprintMismatch),
                                  ("damaged", damaged, IntegrityError)):
        sandbox = Sandbox(tmp_path / label)
        path = tmp_path / f"{label}.tar.zst"
        path.write_bytes(hostile_bundle(base, elsewhere, [regular(n, d) for n, d in members]))
        result = sandbox.install(path)
        assert result.exit_code == error.exit_code, (label, result.stderr)
        sandbox.assert_untouched()


FLIPS = 200


def test_seeded_bit_flips_in_the_file_are_refused_or_change_nothing(small_bundle, tmp_path):
    """200 single-bit flips anywhere in a real bundle file. The zstd content checksum and the tar,
    manifest and sha256 checks refuse all of them, except a flip that changes no decoded byte (in
    the frame header's window-size byte, which only sizes the decoder's buffer, about 2 bytes in
    14 KB): such a bundle decodes to the identical stream, and installs the identical files.
    """
    data = small_bundle.read_bytes()
    clean = _decode(data)
    outcomes = _flip_and_install(data, tmp_path, wrap=lambda flipped: flipped, original=_members(small_bundle),
                                 accept=lambda flipped: _decode(flipped) == clean)
    (tmp_path / "flips-file.json").write_text(json.dumps(outcomes))
    assert sum(outcomes.values()) == FLIPS
    assert outcomes.get(0, 0) <= 3, outcomes  # measured: 0 or 1 of 200, by where the header bytes fall


def _decode(data: bytes) -> bytes | None:
    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except zstandard.ZstdError:
        return None


def test_seeded_bit_flips_inside_the_tar_never_corrupt(small_bundle, tmp_path):
    """200 flips in the decompressed tar, recompressed as valid zstd, so the tar, manifest and sha256
    checks are what must catch them. A flip in padding or in an unused header byte changes nothing
    that is read; such a bundle may install, and then every file must be byte-identical to the
    original's. Everything else is refused with nothing left behind.
    """
    tar_bytes = zstandard.ZstdDecompressor().decompressobj().decompress(small_bundle.read_bytes())
    outcomes = _flip_and_install(tar_bytes, tmp_path, wrap=lambda flipped: zstandard.ZstdCompressor(
        level=3, write_checksum=True).compress(flipped), original=_members(small_bundle))
    (tmp_path / "flips-tar.json").write_text(json.dumps(outcomes))
    assert sum(outcomes.values()) == FLIPS
    assert sum(n for code, n in outcomes.items() if code != 0) >= FLIPS // 2, outcomes


def _flip_and_install(data: bytes, tmp_path: Path, wrap, original: dict[str, bytes],
                      accept=lambda flipped: True) -> dict[int, int]:
    """Install each flipped bundle: refused and nothing left, or (if ``accept``) installed intact."""
    outcomes: dict[int, int] = {}
    for i, (offset, bit, flipped) in enumerate(flips(data, FLIPS, seed=6)):
        sandbox = Sandbox(tmp_path / f"f{i}")
        bundle = tmp_path / f"f{i}" / "flipped.tar.zst"
        bundle.write_bytes(wrap(flipped))
        result = sandbox.install(bundle)
        outcomes[result.exit_code] = outcomes.get(result.exit_code, 0) + 1
        if result.exit_code == 0:
            assert accept(flipped), f"flip at byte {offset} bit {bit} changed the stream and was installed"
            installed = {name: (sandbox.cache / name).read_bytes() for name in original if "__grp__" not in name}
            assert installed == {n: d for n, d in original.items() if "__grp__" not in n}, (offset, bit)
            continue
        assert result.exit_code in BUNDLE_CODES, (offset, bit, result.exit_code, result.stderr, result.exception)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        sandbox.assert_untouched()
    return outcomes


def _members(bundle: Path) -> dict[str, bytes]:
    return {name: data for _, name, data in archive.iter_members(bundle)}


def test_limits_flags_and_env_agree(small_bundle, tmp_path, monkeypatch):
    sandbox = Sandbox(tmp_path)
    monkeypatch.setenv("KERNELCACHE_MAX_MEMBERS", "4")
    assert sandbox.install(small_bundle).exit_code == 15
    monkeypatch.delenv("KERNELCACHE_MAX_MEMBERS")
    assert archive.Limits.from_env(members=4).members == 4
    assert sandbox.install(small_bundle, "--max-total", "not-a-size").exit_code == 2
    assert sandbox.install(small_bundle, "--max-members", "1000", "--max-total", "1G").exit_code == 0
