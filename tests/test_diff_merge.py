"""diff and merge on real bundles: what they report, what they refuse, and that a merge still hits."""

from __future__ import annotations

import json

import pytest
from helpers.bundles import pack, pack_without, rewrite, tamper
from helpers.common import kc, run_job, tree

from kernelcache.bundle.compare import diff, fingerprint, merge
from kernelcache.errors import MergeConflict, UsageError
from kernelcache.format import archive

FIRST = {"add_kernel", "scale_kernel"}
SECOND = {"row_max_kernel", "gumbel_argmax_kernel"}


@pytest.fixture(scope="module")
def halves(built, tmp_path_factory):
    """Two real bundles of one environment: one without FIRST's kernels, one without SECOND's."""
    cache, log, _ = built[90]
    work = tmp_path_factory.mktemp("halves")
    return (pack_without(cache, log, work / "second.tar.zst", FIRST, work),
            pack_without(cache, log, work / "first.tar.zst", SECOND, work))


@pytest.fixture(scope="module")
def bundle100(built, tmp_path_factory):
    cache, log, _ = built[100]
    return pack(cache, tmp_path_factory.mktemp("b100") / "test-sm_100.tar.zst", log)


def names(bundle) -> set[str]:
    return {k.name for k in archive.read_manifest(bundle).kernels}


def test_halves_are_what_the_merge_tests_assume(halves, bundle90):
    second, first = halves
    assert names(second) == SECOND and names(first) == FIRST and names(bundle90) == FIRST | SECOND


def test_diff_of_a_bundle_with_itself_is_empty(bundle90):
    result = diff(bundle90, bundle90)
    assert result.identical and result.same_fingerprint and not result.entries
    done = kc("diff", str(bundle90), str(bundle90), "--exit-code", check=True)
    assert "identical" in done.stdout


def test_diff_lists_kernels_and_variants_added_and_removed(halves, bundle90):
    second, _ = halves
    result = diff(second, bundle90)
    full = archive.read_manifest(bundle90)
    expected_added = {k.key for k in full.kernels if k.name in FIRST}
    assert {e.key for e in result.entries if e.change == "added"} == expected_added
    assert result.kernels_added == tuple(sorted(FIRST)) and result.kernels_removed == ()
    assert result.same_fingerprint and not result.target
    add = [e for e in result.entries if e.name == "add_kernel"]
    assert len(add) == 9 and all("BLOCK=1024" in e.detail and "x_ptr:" in e.detail for e in add)

    reverse = json.loads(kc("diff", str(bundle90), str(second), "--json", check=True).stdout)
    assert reverse["kernels_removed"] == sorted(FIRST)
    assert {e["key"] for e in reverse["entries"] if e["change"] == "removed"} == expected_added
    assert kc("diff", str(bundle90), str(second), "--exit-code").returncode == 1


def test_diff_names_target_and_fingerprint_fields(bundle90, bundle100, tmp_path):
    result = diff(bundle90, bundle100)
    fields = {c.field for c in result.target} | {c.field for c in result.environment}
    assert "target.arch" in fields and "environment.ptxas[sm_100]" in fields
    assert not result.same_fingerprint  # ptxas is hashed per arch
    other = rewrite(bundle90, tmp_path / "env.tar.zst", torch="2.99.0",
                    env_vars={"TRITON_DEFAULT_FP_FUSION": "0"})
    changes = {c.field: c for c in diff(bundle90, other).environment}
    assert changes["environment.torch"].blocking is False
    assert changes["environment.env_vars[TRITON_DEFAULT_FP_FUSION]"].b == "0"
    assert changes["environment.env_vars[TRITON_DEFAULT_FP_FUSION]"].a is None
    table = kc("diff", str(bundle90), str(other), check=True).stdout
    assert "DIFFERENT" in table and "TRITON_DEFAULT_FP_FUSION" in table and "not in any key" in table


def test_diff_reports_same_key_with_other_bytes(bundle90, tmp_path):
    tampered, key = tamper(bundle90, tmp_path / "t.tar.zst", "row_max_kernel")
    [change] = diff(bundle90, tampered).entries
    assert (change.change, change.key, change.name) == ("changed", key, "row_max_kernel")
    assert ".cubin" in change.detail


def test_merge_of_two_halves_installs_and_hits_every_kernel(halves, bundle90, tmp_path):
    second, first = halves
    merged = tmp_path / "merged.tar.zst"
    done = kc("merge", str(second), str(first), "-o", str(merged), check=True)
    assert "wrote" in done.stdout
    manifest = archive.read_manifest(merged)
    full = archive.read_manifest(bundle90)
    assert {k.key for k in manifest.kernels} == {k.key for k in full.kernels}
    assert {m.key for m in manifest.modules} == {m.key for m in full.modules}
    assert manifest.build.mode == "merge" and len(manifest.build.plan["merged_from"]) == 2
    assert diff(bundle90, merged).entries == ()

    cache = tmp_path / "cache"
    kc("install", str(merged), "--cache-dir", str(cache), check=True)
    before = tree(cache)
    _, replay = run_job(tmp_path / "w", cache, 90)
    assert len(replay) == len(full.kernels) and all(r["cache_hit"] for r in replay)
    assert tree(cache) == before


def test_merge_is_symmetric_and_deterministic(halves, tmp_path):
    second, first = halves
    one, two = tmp_path / "ab.tar.zst", tmp_path / "ba.tar.zst"
    merge(second, first, one)
    merge(first, second, two)
    assert one.read_bytes() == two.read_bytes()


def test_merge_refuses_different_targets(bundle90, bundle100, tmp_path):
    out = tmp_path / "x.tar.zst"
    done = kc("merge", str(bundle90), str(bundle100), "-o", str(out))
    assert done.returncode == MergeConflict.exit_code and "different targets" in done.stderr
    assert not out.exists()
    h200 = rewrite(bundle90, tmp_path / "h200.tar.zst", target={"gpu": "h200", "sm_count": 132})
    with pytest.raises(MergeConflict, match="target"):
        merge(bundle90, h200, out)


def test_merge_refuses_different_fingerprints_and_warns_on_torch(bundle90, tmp_path):
    out = tmp_path / "x.tar.zst"
    other = rewrite(bundle90, tmp_path / "py.tar.zst", python="cp399")
    done = kc("merge", str(bundle90), str(other), "-o", str(out))
    assert done.returncode == MergeConflict.exit_code and "environment.python" in done.stderr
    assert not out.exists()
    torch = rewrite(bundle90, tmp_path / "torch.tar.zst", torch="2.99.0")
    done = kc("merge", str(bundle90), str(torch), "-o", str(out), check=True)
    assert "environment.torch" in done.stderr
    merged, original = archive.read_manifest(out), archive.read_manifest(bundle90)
    assert fingerprint(merged.environment) == fingerprint(original.environment)
    assert merged.environment.torch == original.environment.torch  # A's, as the warning says


def test_merge_refuses_a_key_whose_bytes_differ(bundle90, tmp_path):
    tampered, key = tamper(bundle90, tmp_path / "t.tar.zst", "gumbel_argmax_kernel")
    out = tmp_path / "x.tar.zst"
    done = kc("merge", str(bundle90), str(tampered), "-o", str(out))
    assert done.returncode == MergeConflict.exit_code and key in done.stderr
    assert not out.exists() and not list(tmp_path.glob(".kernelcache-merge-*"))


def test_merge_refuses_a_corrupt_input_and_writes_nothing(bundle90, tmp_path):
    corrupt = tmp_path / "c.tar.zst"
    data = bytearray(bundle90.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    out = tmp_path / "x.tar.zst"
    done = kc("merge", str(bundle90), str(corrupt), "-o", str(out))
    assert done.returncode in (11, 14) and done.stderr.startswith("kernelcache: error:")
    assert not out.exists()
    with pytest.raises(UsageError):
        merge(bundle90, bundle90, tmp_path / "no" / "such" / "dir.tar.zst")
