"""push / pull / install through a real OCI registry (CNCF distribution) on loopback."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from helpers.bundles import pack, rewrite
from helpers.common import clean_env, kc, run_job, tree
from helpers.servers import free_port, htpasswd_line, registry

from kernelcache.errors import ArchMismatch, FingerprintMismatch, IntegrityError, RemoteError, StorageError, UsageError
from kernelcache.format import archive
from kernelcache.remote import oci

pytestmark = pytest.mark.oci
INDEX = "application/vnd.oci.image.index.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    with registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture(scope="module")
def variants(built, bundle90, tmp_path_factory):
    """Real bundles for two GPUs: sm_90 built per GPU model (h200), sm_100 for the arch alone."""
    work = tmp_path_factory.mktemp("variants")
    cache, log, _ = built[100]
    h200 = rewrite(bundle90, work / "vllm-sampler-sm_90-h200.tar.zst", target={"gpu": "h200", "sm_count": 132})
    return {"h200": h200, "sm_100": pack(cache, work / "vllm-sampler-sm_100.tar.zst", log)}


def tags(reg, repo: str) -> list[str]:
    return sorted(json.loads(reg.get(f"/v2/{repo}/tags/list"))["tags"] or [])


def manifest_at(reg, repo: str, ref: str) -> dict:
    return json.loads(reg.get(f"/v2/{repo}/manifests/{ref}", accept=f"{INDEX}, {MANIFEST}"))


def test_push_pull_round_trip_is_byte_identical_and_the_registry_shows_the_contents(reg, bundle90, tmp_path):
    done = kc("push", str(bundle90), f"oci://{reg.host}/kc/roundtrip:v1", "--json", check=True)
    result = json.loads(done.stdout)
    assert [p["reference"] for p in result["pushed"]] == [f"oci://{reg.host}/kc/roundtrip:v1-sm_90"]
    assert tags(reg, "kc/roundtrip") == ["v1", "v1-sm_90"]

    bundle_manifest = archive.read_manifest(bundle90)
    document = manifest_at(reg, "kc/roundtrip", "v1-sm_90")
    assert document["artifactType"] == oci.ARTIFACT_TYPE
    assert document["config"]["mediaType"] == oci.CONFIG_MEDIA_TYPE
    assert document["config"]["digest"] == "sha256:" + archive.bundle_digest(bundle_manifest)
    assert reg.get(f"/v2/kc/roundtrip/blobs/{document['config']['digest']}") == bundle_manifest.to_json()
    notes = document["annotations"]
    assert notes["dev.kernelcache.arch"] == "sm_90" and notes["dev.kernelcache.kernels"] == "21"
    assert notes["dev.kernelcache.triton"] == bundle_manifest.environment.triton
    assert len(notes["dev.kernelcache.fingerprint"]) == 64
    [layer] = document["layers"]
    assert layer["mediaType"] == oci.LAYER_MEDIA_TYPE and layer["size"] == bundle90.stat().st_size
    assert layer["annotations"]["org.opencontainers.image.title"] == bundle90.name

    out = tmp_path / "pulled"
    kc("pull", f"oci://{reg.host}/kc/roundtrip:v1", "--arch", "sm_90", "-o", str(out), check=True)
    assert (out / bundle90.name).read_bytes() == bundle90.read_bytes()
    assert [p.name for p in out.iterdir()] == [bundle90.name]  # no temp file left beside it

    again = json.loads(kc("push", str(bundle90), f"oci://{reg.host}/kc/roundtrip:v1", "--json", check=True).stdout)
    assert again["pushed"][0]["digest"] == result["pushed"][0]["digest"]  # deterministic, idempotent
    assert again["index_digest"] == result["index_digest"]


def test_one_tag_per_variant_and_an_index_that_install_resolves_by_gpu(reg, variants, tmp_path):
    ref = f"oci://{reg.host}/kc/fleet:v0.33"
    for bundle in variants.values():  # as a CI matrix does: one job per arch
        kc("push", str(bundle), ref, check=True)
    assert tags(reg, "kc/fleet") == ["v0.33", "v0.33-sm_100", "v0.33-sm_90-h200"]
    index = manifest_at(reg, "kc/fleet", "v0.33")
    assert index["mediaType"] == INDEX and index["artifactType"] == oci.INDEX_ARTIFACT_TYPE
    listed = {d["annotations"]["dev.kernelcache.variant"]: d for d in index["manifests"]}
    assert set(listed) == {"sm_90-h200", "sm_100"}
    assert listed["sm_90-h200"]["annotations"]["dev.kernelcache.sm_count"] == "132"
    assert listed["sm_100"]["platform"] == {"architecture": "amd64", "os": "linux"}
    for descriptor in index["manifests"]:
        raw = reg.get(f"/v2/kc/fleet/manifests/{descriptor['digest']}", accept=MANIFEST)
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == descriptor["digest"]

    cache = tmp_path / "h200"
    done = kc("install", ref, "--gpu", "h200", "--cache-dir", str(cache), "--json", check=True)
    assert json.loads(done.stdout)["digest"] == archive.bundle_digest(archive.read_manifest(variants["h200"]))
    before = tree(cache)
    _, replay = run_job(tmp_path / "w", cache, 90)  # a pod on an H200: zero compiles after restore
    assert replay and all(r["cache_hit"] for r in replay)
    assert tree(cache) == before

    cache100 = tmp_path / "b200"
    kc("install", ref, "--gpu", "b200", "--cache-dir", str(cache100), check=True)
    _, replay = run_job(tmp_path / "w100", cache100, 100)
    assert replay and all(r["cache_hit"] for r in replay)

    refused = tmp_path / "pcie"
    done = kc("install", ref, "--gpu", "h100-pcie", "--cache-dir", str(refused))
    assert done.returncode == ArchMismatch.exit_code and "no bundle for sm_90, 114 SMs" in done.stderr
    assert not refused.exists()
    done = kc("install", ref, "--cache-dir", str(refused))  # no GPU here and no override
    assert done.returncode == UsageError.exit_code and "--arch or --gpu" in done.stderr

    mirror = tmp_path / "mirror"
    pulled = json.loads(kc("pull", ref, "--all", "-o", str(mirror), "--json", check=True).stdout)
    assert sorted(p["arch"] for p in pulled) == ["sm_100", "sm_90"]
    assert {p.name: p.read_bytes() for p in mirror.iterdir()} == {b.name: b.read_bytes() for b in variants.values()}


def test_install_of_a_variant_tag_or_digest_takes_it_as_is(reg, variants, tmp_path):
    ref = f"oci://{reg.host}/kc/direct:v1"
    pushed = json.loads(kc("push", str(variants["sm_100"]), ref, "--json", check=True).stdout)["pushed"][0]
    by_digest = f"oci://{reg.host}/kc/direct@{pushed['digest']}"
    kc("pull", by_digest, "-o", str(tmp_path / "d"), check=True)
    assert (tmp_path / "d" / variants["sm_100"].name).read_bytes() == variants["sm_100"].read_bytes()
    done = kc("install", pushed["reference"], "--gpu", "h200", "--cache-dir", str(tmp_path / "c"))
    assert done.returncode == ArchMismatch.exit_code and not (tmp_path / "c").exists()
    kc("install", pushed["reference"], "--cache-dir", str(tmp_path / "c"), check=True)


def test_reinstall_from_a_registry_reads_manifests_only_and_still_checks(reg, bundle90, tmp_path):
    ref = f"oci://{reg.host}/kc/again:v1"
    kc("push", str(bundle90), ref, check=True)
    cache = tmp_path / "c"
    kc("install", ref, "--arch", "sm_90", "--cache-dir", str(cache), check=True)
    nowhere = tmp_path / "afile"
    nowhere.write_text("a download dir that cannot exist")  # any blob download would fail with exit 40
    no_download = {"KERNELCACHE_DOWNLOAD_DIR": str(nowhere)}
    for again in (ref, f"{ref}-sm_90"):  # through the index, and the variant tag itself
        done = kc("install", again, "--arch", "sm_90", "--cache-dir", str(cache), env=no_download, check=True)
        assert done.stdout.startswith("already installed")
    done = kc("install", ref, "--arch", "sm_90", "--cache-dir", str(cache),
              env={**no_download, "TRITON_DEFAULT_FP_FUSION": "1"})
    assert done.returncode == FingerprintMismatch.exit_code  # the receipt's manifest is checked like a file's
    done = kc("install", f"{ref}-sm_90", "--gpu", "b200", "--cache-dir", str(cache), env=no_download)
    assert done.returncode == ArchMismatch.exit_code
    done = kc("install", ref, "--arch", "sm_90", "--cache-dir", str(tmp_path / "fresh"), env=no_download)
    assert done.returncode == StorageError.exit_code  # not installed there: it does download


def test_concurrent_pushes_of_different_archs_converge_on_one_index(reg, variants):
    ref = f"oci://{reg.host}/kc/race:v2"
    jobs = [subprocess.Popen([sys.executable, "-m", "kernelcache", "push", str(b), ref], env=clean_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for b in variants.values()]
    for job in jobs:
        _, stderr = job.communicate(timeout=300)
        assert job.returncode == 0, stderr
    listed = {d["annotations"]["dev.kernelcache.variant"] for d in manifest_at(reg, "kc/race", "v2")["manifests"]}
    assert listed == {"sm_90-h200", "sm_100"}


def test_a_corrupted_blob_in_the_registry_is_refused_and_leaves_nothing(bundle90, tmp_path_factory, tmp_path):
    # A registry of its own: blobs are stored once per digest, so corrupting this one in the shared
    # registry would corrupt every repository holding the same bundle.
    with registry(tmp_path_factory.mktemp("corrupt-registry")) as own:
        check_corruption_is_refused(own, bundle90, tmp_path)


def check_corruption_is_refused(reg, bundle90, tmp_path):
    ref = f"oci://{reg.host}/kc/corrupt:v1-sm_90"
    kc("push", str(bundle90), f"oci://{reg.host}/kc/corrupt:v1", check=True)
    layer = manifest_at(reg, "kc/corrupt", "v1-sm_90")["layers"][0]
    blob = reg.blob_path(layer["digest"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 3] ^= 0x55  # same size, other bytes: only the digest check can tell
    blob.write_bytes(bytes(data))

    out = tmp_path / "out"
    done = kc("pull", ref, "-o", str(out))
    assert done.returncode == IntegrityError.exit_code and "sha256" in done.stderr
    assert not out.exists() or not list(out.iterdir())
    cache = tmp_path / "cache"
    done = kc("install", ref, "--cache-dir", str(cache))
    assert done.returncode == IntegrityError.exit_code and not cache.exists()

    blob.write_bytes(bytes(data[: len(data) // 2]))  # truncated in storage
    done = kc("pull", ref, "-o", str(out))
    assert done.returncode in (RemoteError.exit_code, IntegrityError.exit_code), done.stderr
    assert not out.exists() or not list(out.iterdir())


def test_registry_errors_are_one_line_with_their_own_exit_code(reg, bundle90, tmp_path):
    env = {"KERNELCACHE_REMOTE_RETRIES": "0"}
    dead = f"oci://127.0.0.1:{free_port()}/kc/x:v1"
    for args in (["pull", dead, "-o", str(tmp_path)], ["push", str(bundle90), dead]):
        done = kc(*args, env=env)
        assert done.returncode == RemoteError.exit_code and "cannot reach registry" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    done = kc("pull", f"oci://{reg.host}/kc/roundtrip:no-such-tag", "-o", str(tmp_path), env=env)
    assert done.returncode == RemoteError.exit_code and "MANIFEST_UNKNOWN" in done.stderr
    for bad in ("oci://", "oci://host", "oci://host/UPPER:v1", "oci://host/repo:bad tag", "oci://host/r@sha256:12"):
        assert kc("pull", bad, "-o", str(tmp_path)).returncode == UsageError.exit_code, bad
    assert kc("push", str(bundle90), f"oci://{reg.host}/kc/x@sha256:{'0' * 64}").returncode == UsageError.exit_code
    assert list(tmp_path.iterdir()) == []


def test_a_corrupt_bundle_is_never_pushed(reg, bundle90, tmp_path):
    corrupt = tmp_path / "c.tar.zst"
    data = bytearray(bundle90.read_bytes())
    data[-200] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    done = kc("push", str(corrupt), f"oci://{reg.host}/kc/never:v1")
    assert done.returncode in (11, 14)
    with pytest.raises(OSError):  # the repository does not even exist
        reg.get("/v2/kc/never/tags/list")


def test_other_artifacts_are_neither_pulled_as_bundles_nor_overwritten(reg, bundle90, tmp_path):
    import oras.provider

    other = tmp_path / "notes.txt"
    other.write_text("not a kernel cache")
    client = oras.provider.Registry(reg.host, insecure=True)
    client.push(f"{reg.host}/kc/other:v1", files=[str(other)], disable_path_validation=True, quiet=True)
    done = kc("pull", f"oci://{reg.host}/kc/other:v1", "-o", str(tmp_path / "o"))
    assert done.returncode == RemoteError.exit_code and "not a kernelcache bundle" in done.stderr
    done = kc("push", str(bundle90), f"oci://{reg.host}/kc/other:v1")
    assert done.returncode == UsageError.exit_code and "not a kernelcache index" in done.stderr
    assert manifest_at(reg, "kc/other", "v1")["layers"][0]["annotations"]["org.opencontainers.image.title"] == \
        "notes.txt"


def test_references_and_plain_http_rules():
    ref = oci.parse("oci://registry.example.com:5000/team/vllm-kernels:v0.33-cu130")
    assert (ref.host, ref.repository, ref.tag, ref.digest) == ("registry.example.com:5000", "team/vllm-kernels",
                                                              "v0.33-cu130", None)
    assert oci.parse("oci://ghcr.io/org/k").tag == "latest"
    pinned = oci.parse(f"oci://ghcr.io/org/k@sha256:{'a' * 64}")
    assert pinned.tag is None and pinned.reference == f"sha256:{'a' * 64}"
    assert oci.plain_http("127.0.0.1:5000") and oci.plain_http("localhost:5000") and oci.plain_http("[::1]:5000")
    assert not oci.plain_http("registry.example.com")
    os.environ["KERNELCACHE_INSECURE_REGISTRIES"] = "registry.kube-system.svc:5000"
    try:
        assert oci.plain_http("registry.kube-system.svc:5000")
    finally:
        del os.environ["KERNELCACHE_INSECURE_REGISTRIES"]


def test_a_registry_with_credentials(bundle90, tmp_path_factory, tmp_path):
    with registry(tmp_path_factory.mktemp("auth-registry"), htpasswd=htpasswd_line("ci", "s3cret")) as secured:
        ref = f"oci://{secured.host}/kc/private:v1"
        env = {"KERNELCACHE_REMOTE_RETRIES": "0"}
        done = kc("push", str(bundle90), ref, env=env)
        assert done.returncode == RemoteError.exit_code and "credentials" in done.stderr
        wrong = {**env, "KERNELCACHE_REGISTRY_USER": "ci", "KERNELCACHE_REGISTRY_PASSWORD": "nope"}
        assert kc("push", str(bundle90), ref, env=wrong).returncode == RemoteError.exit_code
        right = {**env, "KERNELCACHE_REGISTRY_USER": "ci", "KERNELCACHE_REGISTRY_PASSWORD": "s3cret"}
        kc("push", str(bundle90), ref, env=right, check=True)

        docker = tmp_path / "docker"
        docker.mkdir()
        auth = __import__("base64").b64encode(b"ci:s3cret").decode()
        (docker / "config.json").write_text(json.dumps({"auths": {secured.host: {"auth": auth}}}))
        kc("pull", ref, "--arch", "sm_90", "-o", str(tmp_path / "out"), env={"DOCKER_CONFIG": str(docker)}, check=True)
        assert (tmp_path / "out" / bundle90.name).read_bytes() == bundle90.read_bytes()


def test_python_api_and_chunked_uploads(reg, bundle90, tmp_path, monkeypatch):
    import kernelcache

    monkeypatch.setattr(oci, "CHUNKED_UPLOAD_BYTES", 0)  # what bundles over 256 MiB take: POST, PATCH, PUT
    monkeypatch.setattr(oci, "UPLOAD_CHUNK", 16 << 10)  # several PATCHes for this bundle
    result = kernelcache.push([bundle90], f"oci://{reg.host}/kc/api:v1")
    assert result.variants == ("sm_90",) and result.pushed[0].reference.endswith(":v1-sm_90")
    [landed] = kernelcache.pull(f"oci://{reg.host}/kc/api:v1", tmp_path, arch="sm_90")
    assert landed.path.read_bytes() == bundle90.read_bytes()
    assert landed.digest == archive.bundle_digest(archive.read_manifest(bundle90))
    assert kernelcache.fetch(str(bundle90), tmp_path) == bundle90  # a path stays a path
