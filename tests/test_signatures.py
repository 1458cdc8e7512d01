"""Signed bundles: ``sign`` / ``build --sign`` / ``push --sign`` make signatures, ``install`` / ``run`` /
``activate()`` refuse under a policy what no trusted key signed, before anything is extracted.

Real keys (ECDSA P-256 and Ed25519, PEM files), real bundles, the CLI as users run it, and the loopback registry
the suite starts (tests/helpers/servers.py); openssl's own verifier checks what ``push --sign`` stores, as cosign
would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bundles import tamper
from helpers.common import clean_env, entry_point, kc, tree
from helpers.keys import write_pair
from helpers.servers import http_server, registry

from kernelcache.bundle.signature import SignatureFile, file_sha256, signature_info
from kernelcache.bundle.trust import pem_fingerprint
from kernelcache.errors import (
    KeyFileError,
    SignatureMismatch,
    UnsignedBundle,
    UntrustedSignature,
    UsageError,
)
from kernelcache.format import archive

pytest.importorskip("cryptography")
NO_PROBE = {"KERNELCACHE_NO_GPU_PROBE": "1"}
WATCHED = ("kernelcache.install", "zstandard", "click", "cryptography")
FULL = ["kernelcache.install", "zstandard", "cryptography"]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path, str]]:
    where = tmp_path_factory.mktemp("keys")
    return {"ec": write_pair(where, "ec"), "ed": write_pair(where, "ed", "ed25519"),
            "other": write_pair(where, "other")}


@pytest.fixture
def signed(small_bundle, keys, tmp_path) -> Path:
    """A copy of the small bundle, signed with the ECDSA key."""
    bundle = tmp_path / "b.tar.zst"
    shutil.copy(small_bundle, bundle)
    kc("sign", str(bundle), "--key", str(keys["ec"][0]), check=True)
    return bundle


def policy(keys, name: str = "ec") -> list[str]:
    return ["--require-signature", "--trusted-key", str(keys[name][1])]


def install(bundle, cache: Path, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return kc("install", str(bundle), "--cache-dir", str(cache), *flags, env={**NO_PROBE, **(env or {})})


def refused(done: subprocess.CompletedProcess, code: int, words: str, cache: Path) -> None:
    """One line, its own exit code, and nothing of the bundle in the cache dir."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr[-800:]
    assert len(lines) == 1 and lines[0].startswith("kernelcache: error:") and words in lines[0], lines
    assert not cache.exists() or not [p for p in tree(cache) if ".kernelcache/" not in f"{p}"], tree(cache)


# -- signing, and installing under a policy ---------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["ec", "ed"])
def test_a_signed_bundle_installs_under_a_policy_and_says_who_signed(small_bundle, keys, algorithm, tmp_path):
    bundle = tmp_path / "b.tar.zst"
    shutil.copy(small_bundle, bundle)
    made = json.loads(kc("sign", str(bundle), "--key", str(keys[algorithm][0]), "--json", check=True).stdout)[0]
    assert made["signer"] == keys[algorithm][2] and made["sha256"] == file_sha256(bundle)
    assert made["digest"] == archive.bundle_digest(archive.read_manifest(bundle))
    assert bundle.read_bytes() == small_bundle.read_bytes()  # signing never touches the bundle

    done = install(bundle, tmp_path / "c", *policy(keys, algorithm), "--json")
    assert done.returncode == 0, done.stderr
    signature = json.loads(done.stdout)["signature"]
    assert signature["status"] == "trusted" and signature["signers"] == [keys[algorithm][2]]
    [receipt] = (tmp_path / "c" / ".kernelcache" / "installed").glob("*.json")
    assert json.loads(receipt.read_text())["signature"]["signers"] == [keys[algorithm][2]]
    text = install(bundle, tmp_path / "c", *policy(keys, algorithm)).stdout
    assert f"signed by {keys[algorithm][2][:19]}… (a trusted key)" in text


def test_without_a_policy_a_signature_is_still_checked_and_reported(signed, keys, tmp_path):
    done = install(signed, tmp_path / "c")
    assert done.returncode == 0 and "(the key it carries; no trusted key given)" in done.stdout, done.stderr
    info = kc("inspect", str(signed), check=True).stdout
    assert f"signature: signed by {keys['ec'][2][:19]}…" in info
    assert json.loads(kc("inspect", str(signed), "--json", check=True).stdout)["signature"]["status"] == "signed"

    broken = tmp_path / "broken" / signed.name
    broken.parent.mkdir()
    shutil.copy(signed, broken)
    Path(f"{broken}.sig").write_bytes(flipped_signature(Path(f"{signed}.sig")))
    done = install(broken, tmp_path / "c2")
    assert done.returncode == 0 and done.stdout.startswith("installed "), done.stderr  # no policy: reported
    assert "warning: signature: invalid: the signature does not verify with the key it carries" in done.stderr
    done = install(signed, tmp_path / "c3", "--trusted-key", str(keys["other"][1]))
    assert done.returncode == 0 and "warning: signature: untrusted" in done.stderr, done.stderr


def flipped_signature(sig: Path) -> bytes:
    """The signature file with one bit of its signature flipped (still base64, still JSON)."""
    data = json.loads(sig.read_text())
    raw = bytearray(base64.b64decode(data["signatures"][0]["signature"]))
    raw[len(raw) // 2] ^= 0x01
    data["signatures"][0]["signature"] = base64.b64encode(bytes(raw)).decode()
    return json.dumps(data).encode()


# -- bad input: each refused with one line and its own exit code, before anything is extracted ----


def unsigned(bundle: Path, keys, tmp: Path) -> Path:
    Path(f"{bundle}.sig").unlink()
    return bundle


def tampered_bundle(bundle: Path, keys, tmp: Path) -> Path:
    """Other cubin bytes under a consistent manifest, beside the old bundle's valid signature."""
    other, _ = tamper(bundle, tmp / "t.tar.zst", archive.read_manifest(bundle).kernels[0].name)
    shutil.move(other, bundle)
    return bundle


def tampered_member(bundle: Path, keys, tmp: Path) -> Path:
    """One byte of the file changed (its manifest still the signed one)."""
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0x20
    bundle.write_bytes(bytes(data))
    return bundle


def tampered_signature(bundle: Path, keys, tmp: Path) -> Path:
    sig = Path(f"{bundle}.sig")
    sig.write_bytes(flipped_signature(sig))
    return bundle


def tampered_payload(bundle: Path, keys, tmp: Path) -> Path:
    """The signed payload rewritten to name this file's sha256 (with the old signature)."""
    sig = Path(f"{bundle}.sig")
    data = json.loads(sig.read_text())
    payload = json.loads(base64.b64decode(data["signatures"][0]["payload"]))
    payload["optional"]["name"] = "renamed.tar.zst"
    data["signatures"][0]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    sig.write_text(json.dumps(data))
    return bundle


def wrong_key(bundle: Path, keys, tmp: Path) -> Path:
    kc("sign", str(bundle), "--key", str(keys["other"][0]), check=True)
    sig = json.loads(Path(f"{bundle}.sig").read_text())
    Path(f"{bundle}.sig").write_text(json.dumps({**sig, "signatures": sig["signatures"][1:]}))  # only other's
    return bundle


def another_bundles_signature(bundle: Path, keys, tmp: Path) -> Path:
    """A valid signature of another bundle (by the trusted key) beside this one."""
    other, _ = tamper(bundle, tmp / "other.tar.zst", archive.read_manifest(bundle).kernels[0].name)
    kc("sign", str(other), "--key", str(keys["ec"][0]), check=True)
    shutil.copy(f"{other}.sig", f"{bundle}.sig")
    return bundle


def truncated_signature(bundle: Path, keys, tmp: Path) -> Path:
    sig = Path(f"{bundle}.sig")
    sig.write_bytes(sig.read_bytes()[: sig.stat().st_size // 2])
    return bundle


def garbage_signature(bundle: Path, keys, tmp: Path) -> Path:
    Path(f"{bundle}.sig").write_bytes(b"\x00garbage\xff" * 40)
    return bundle


BAD = {
    unsigned: (UnsignedBundle, "b.tar.zst is not signed (no .sig file beside it)"),
    tampered_bundle: (SignatureMismatch, "names sha256"),
    tampered_member: (SignatureMismatch, "names sha256"),
    tampered_signature: (UntrustedSignature, "does not verify with a trusted key"),
    tampered_payload: (UntrustedSignature, "does not verify with a trusted key"),
    wrong_key: (UntrustedSignature, "does not verify with a trusted key"),
    another_bundles_signature: (SignatureMismatch, "not this bundle"),
    truncated_signature: (UntrustedSignature, "is not a signature file"),
    garbage_signature: (UntrustedSignature, "is not a signature file"),
}


@pytest.mark.parametrize("change", BAD, ids=lambda f: f.__name__)
def test_under_a_policy_a_bad_signature_is_refused_before_anything_is_extracted(signed, keys, change, tmp_path):
    bundle = change(signed, keys, tmp_path)
    error, words = BAD[change]
    cache = tmp_path / "c"
    refused(install(bundle, cache, *policy(keys)), error.exit_code, words, cache)
    env = {"KERNELCACHE_REQUIRE_SIGNATURE": "1", "KERNELCACHE_TRUSTED_KEYS": str(keys["ec"][1])}
    refused(install(bundle, cache, env=env), error.exit_code, words, cache)  # the init container's short form
    done = kc("run", "--bundle", str(bundle), "--cache-dir", str(cache), *policy(keys), "--", "/bin/true",
              env=NO_PROBE)
    refused(done, error.exit_code, words, cache)
    assert install(bundle, cache, "--force", *policy(keys)).returncode == error.exit_code  # --force is no override


def test_activate_refuses_under_a_policy_from_the_environment(small_bundle, keys, tmp_path):
    probe = ("import kernelcache\n"
             "try:\n"
             f"    kernelcache.activate(bundle={str(small_bundle)!r}, cache_dir={str(tmp_path / 'c')!r})\n"
             "except kernelcache.errors.UnsignedBundle as exc:\n"
             "    print('refused', exc)\n")
    env = clean_env(KERNELCACHE_REQUIRE_SIGNATURE="yes", KERNELCACHE_TRUSTED_KEYS=str(keys["ec"][1]), **NO_PROBE)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.startswith("refused") and "is not signed" in done.stdout, done.stderr[-2000:]
    assert not (tmp_path / "c").exists()


def test_a_bundle_replaced_after_its_check_publishes_nothing(signed, keys, tmp_path):
    from kernelcache.bundle.trust import policy as make_policy
    from kernelcache.errors import IntegrityError
    from kernelcache.install import plan_install

    plan = plan_install(signed, tmp_path / "c", check_gpu=False,
                        signature_policy=make_policy(True, [str(keys["ec"][1])]))
    assert plan.signature.status == "trusted"
    other, _ = tamper(signed, tmp_path / "other.tar.zst", plan.manifest.kernels[0].name)
    shutil.move(other, signed)  # after the check, before the extraction
    with pytest.raises(IntegrityError, match="changed while it was installed"):
        plan.execute()
    assert not [p for p in tree(tmp_path / "c") if ".kernelcache/" not in p]


@pytest.mark.parametrize("case, code, words", [
    ("a text file as the trusted key", KeyFileError.exit_code, "is not a PEM public key"),
    ("the private key as the trusted key", KeyFileError.exit_code, "it is a private key; trust its public half"),
    ("a missing trusted key", KeyFileError.exit_code, "cannot read key file"),
    ("a policy without a key", UsageError.exit_code, "needs at least one --trusted-key"),
    ("a garbage KERNELCACHE_REQUIRE_SIGNATURE", UsageError.exit_code, "KERNELCACHE_REQUIRE_SIGNATURE must be 1 or 0"),
])
def test_a_policy_that_cannot_be_read_is_refused(signed, keys, case, code, words, tmp_path):
    text = tmp_path / "notes.pub"
    text.write_text("-----BEGIN PUBLIC KEY-----\nnot a key\n-----END PUBLIC KEY-----\n")
    flags, env = {
        "a text file as the trusted key": (["--require-signature", "--trusted-key", str(text)], {}),
        "the private key as the trusted key": (["--trusted-key", str(keys["ec"][0])], {}),
        "a missing trusted key": (["--require-signature", "--trusted-key", str(tmp_path / "nope.pub")], {}),
        "a policy without a key": (["--require-signature"], {}),
        "a garbage KERNELCACHE_REQUIRE_SIGNATURE": ([], {"KERNELCACHE_REQUIRE_SIGNATURE": "maybe"}),
    }[case]
    refused(install(signed, tmp_path / "c", *flags, env=env), code, words, tmp_path / "c")


@pytest.mark.parametrize("key, words", [
    ("public", "it is a public key; sign with the private one"),
    ("text", "is not a PEM private key"),
    ("rsa", "holds an RSA key; kernelcache signs with ed25519 or ECDSA P-256 keys"),
])
def test_a_signing_key_that_is_not_one_is_refused_before_anything_is_read(small_bundle, keys, key, words, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    path = {"public": keys["ec"][1], "text": tmp_path / "k.txt", "rsa": tmp_path / "rsa.key"}[key]
    (tmp_path / "k.txt").write_text("hello")
    (tmp_path / "rsa.key").write_bytes(rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    bundle = tmp_path / "b.tar.zst"
    shutil.copy(small_bundle, bundle)
    done = kc("sign", str(bundle), "--key", str(path))
    assert done.returncode == KeyFileError.exit_code and words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not Path(f"{bundle}.sig").exists()


@pytest.mark.parametrize("wanted, label, wrong_hint", [
    ("trusted", "PUBLIC KEY", "sign with the private one"),
    ("signing", "PRIVATE KEY", "trust its public half"),
])
def test_a_damaged_key_of_the_right_kind_is_not_called_the_other_kind(wanted, label, wrong_hint, tmp_path):
    """A PEM file of the wanted label whose body does not parse: the message says it is not a PEM key of that kind
    and gives cryptography's error whole, not the hint for a key of the other kind (issue 41)."""
    from kernelcache.bundle.signature import load_public_key, load_signing_key

    path = tmp_path / "damaged.pem"
    path.write_text(f"-----BEGIN {label}-----\nnot a key\n-----END {label}-----\n")
    load = load_public_key if wanted == "trusted" else load_signing_key
    with pytest.raises(KeyFileError) as raised:
        load(path)
    message = str(raised.value)
    assert f"is not a PEM {label.split()[0].lower()} key (" in message and wrong_hint not in message, message
    assert message.endswith(")"), message


def test_keys_made_as_deploying_md_says_work(small_bundle, tmp_path):
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    key, pub = tmp_path / "kernelcache.key", tmp_path / "kernelcache.pub"
    subprocess.run([openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
                   check=True, capture_output=True)
    subprocess.run([openssl, "pkey", "-in", str(key), "-pubout", "-out", str(pub)], check=True, capture_output=True)
    bundle = tmp_path / "b.tar.zst"
    shutil.copy(small_bundle, bundle)
    kc("sign", str(bundle), "--key", str(key), check=True)
    done = install(bundle, tmp_path / "c", "--require-signature", "--trusted-key", str(pub), "--json")
    assert json.loads(done.stdout)["signature"]["signers"] == [pem_fingerprint(pub.read_bytes())], done.stderr


# -- the pod-start fast path -----------------------------------------------------------------------


def test_the_noop_fast_path_holds_the_policy(signed, small_bundle, keys, tmp_path):
    cache = tmp_path / "c"
    plain = tmp_path / "plain.tar.zst"
    shutil.copy(small_bundle, plain)
    for bundle in (plain, signed):  # accepted without a policy: each keeps a record
        first, done = entry_point("install", str(bundle), "--cache-dir", str(cache), watched=WATCHED)
        assert first["exit"] == 0, done.stderr
        again, done = entry_point("install", str(bundle), "--cache-dir", str(cache), watched=WATCHED)
        assert again == {"exit": 0, "imported": []}, done.stderr
    with_policy = ["--cache-dir", str(cache), *policy(keys)]
    done = entry_point("install", str(plain), *with_policy, watched=WATCHED)
    assert done[0]["exit"] == UnsignedBundle.exit_code  # the record of a policy-free accept vouches for nothing

    full, done = entry_point("install", str(signed), *with_policy, watched=WATCHED)
    assert full == {"exit": 0, "imported": FULL}, done.stderr  # checked in full with the trusted key, once
    quick, done = entry_point("install", str(signed), *with_policy, watched=WATCHED)
    assert quick == {"exit": 0, "imported": []}, done.stderr
    assert "(a trusted key)" in done.stdout
    env = {"KERNELCACHE_REQUIRE_SIGNATURE": "1", "KERNELCACHE_TRUSTED_KEYS": str(keys["ec"][1])}
    quick, done = entry_point("install", str(signed), "--cache-dir", str(cache), watched=WATCHED, **env)
    assert quick == {"exit": 0, "imported": []}, done.stderr

    other = entry_point("install", str(signed), "--cache-dir", str(cache), *policy(keys, "other"), watched=WATCHED)
    assert other[0]["exit"] == UntrustedSignature.exit_code  # other trusted keys: checked again, and refused
    tampered_signature(signed, keys, tmp_path)  # a new signature file since the record
    done = entry_point("install", str(signed), *with_policy, watched=WATCHED)
    assert done[0]["exit"] == UntrustedSignature.exit_code, done[1].stderr
    run = entry_point("run", "--bundle", str(signed), *with_policy, "--", "/bin/true", watched=WATCHED)
    assert run[0]["exit"] == UntrustedSignature.exit_code


def test_signature_info_of_a_file_and_of_an_installed_bundle_and_ls(signed, small_bundle, keys, tmp_path):
    from kernelcache.cachedir import CacheDir

    assert signature_info(small_bundle).status == "unsigned"
    assert signature_info(signed).signers == (keys["ec"][2],)
    assert signature_info(signed, (str(keys["ec"][1]),)).status == "trusted"
    assert signature_info(signed, (str(keys["other"][1]),)).status == "untrusted"
    assert install(signed, tmp_path / "c", *policy(keys)).returncode == 0
    [receipt] = CacheDir(tmp_path / "c").receipts()
    assert signature_info(receipt).status == "trusted" and signature_info(receipt).signers == (keys["ec"][2],)
    [listed] = json.loads(kc("ls", "--cache-dir", str(tmp_path / "c"), "--json", check=True).stdout)["bundles"]
    assert listed["signature"]["signers"] == [keys["ec"][2]] and listed["signature"]["status"] == "trusted"
    table = kc("ls", "--cache-dir", str(tmp_path / "c"), env={"COLUMNS": "400"}, check=True).stdout
    assert f"{keys['ec'][2][:19]}… (trusted)" in table


def test_a_signature_file_round_trips_and_refuses_what_it_is_not(signed):
    found = SignatureFile.read(Path(f"{signed}.sig"))
    assert found is not None and SignatureFile.from_json(found.to_json()) == found
    for bad in (b"{}", b"[]", b'{"kernelcache_signature": 1, "signatures": []}',
                b'{"kernelcache_signature": 1, "signatures": [{"payload": "!", "signature": "", "public_key": null}]}'):
        with pytest.raises(ValueError):
            SignatureFile.from_json(bad)


# -- URLs: the signature sits beside the bundle -------------------------------------------------------


def test_a_url_bundle_brings_the_signature_beside_it(signed, small_bundle, keys, tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(signed, served / "signed.tar.zst")
    shutil.copy(f"{signed}.sig", served / "signed.tar.zst.sig")
    shutil.copy(small_bundle, served / "plain.tar.zst")
    with http_server(served) as base:
        done = install(f"{base}/signed.tar.zst", tmp_path / "c", *policy(keys), "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["signature"]["status"] == "trusted", done.stderr
        refused(install(f"{base}/plain.tar.zst", tmp_path / "c2", *policy(keys)), UnsignedBundle.exit_code,
                "is not signed", tmp_path / "c2")
        out = tmp_path / "pulled"
        kc("pull", f"{base}/signed.tar.zst", "-o", str(out), check=True)
        assert Path(f"{out}/signed.tar.zst.sig").read_bytes() == Path(f"{signed}.sig").read_bytes()
        (served / "signed.tar.zst.sig").unlink()  # the source drops its signature: the pulled copy's goes too
        kc("pull", f"{base}/signed.tar.zst", "-o", str(out), check=True)
        assert not Path(f"{out}/signed.tar.zst.sig").exists()
    done = install(signed.as_uri(), tmp_path / "c3", *policy(keys))  # file:// too
    assert done.returncode == 0 and "(a trusted key)" in done.stdout, done.stderr


# -- oci:// ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reg(tmp_path_factory):
    with registry(tmp_path_factory.mktemp("sig-registry")) as server:
        yield server


def oci_manifest(reg, repo: str, ref: str) -> tuple[dict, bytes]:
    raw = reg.get(f"/v2/{repo}/manifests/{ref}", accept="application/vnd.oci.image.manifest.v1+json, "
                                                          "application/vnd.oci.image.index.v1+json")
    return json.loads(raw), raw


@pytest.mark.oci
def test_push_sign_stores_a_cosign_signature_that_install_and_pull_check(reg, small_bundle, keys, tmp_path):
    ref = f"oci://{reg.host}/kc/signed:v1"
    pushed = json.loads(kc("push", str(small_bundle), ref, "--sign", str(keys["ec"][0]), "--json",
                           check=True).stdout)["pushed"][0]
    digest = pushed["digest"]
    tag = "sha256-" + digest.removeprefix("sha256:") + ".sig"
    assert pushed["signature"] == f"oci://{reg.host}/kc/signed:{tag}"
    document, _ = oci_manifest(reg, "kc/signed", tag)
    [layer] = document["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = reg.get(f"/v2/kc/signed/blobs/{layer['digest']}")
    assert json.loads(payload)["critical"] == {"identity": {"docker-reference": f"{reg.host}/kc/signed"},
                                               "image": {"docker-manifest-digest": digest},
                                               "type": "cosign container image signature"}
    openssl_verifies(keys["ec"][1], payload, layer["annotations"]["dev.cosignproject.cosign/signature"], tmp_path)
    kc("push", str(small_bundle), ref, "--sign", str(keys["ec"][0]), check=True)  # again: no second signature
    assert len(oci_manifest(reg, "kc/signed", tag)[0]["layers"]) == 1

    cache = tmp_path / "c"
    done = install(ref, cache, "--arch", "sm_90", *policy(keys), "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["signature"]["status"] == "trusted", done.stderr
    out = tmp_path / "pulled"
    kc("pull", ref, "--arch", "sm_90", "-o", str(out), check=True)
    pulled = out / small_bundle.name
    assert SignatureFile.read(Path(f"{pulled}.sig")).oci_manifest == oci_manifest(reg, "kc/signed", digest)[1]
    done = install(pulled, tmp_path / "offline", *policy(keys), "--json")  # the chain holds offline
    assert done.returncode == 0 and json.loads(done.stdout)["signature"]["status"] == "trusted", done.stderr
    assert install(pulled, tmp_path / "o2", *policy(keys, "other")).returncode == UntrustedSignature.exit_code


def openssl_verifies(public: Path, payload: bytes, signature_b64: str, tmp: Path) -> None:
    """openssl's ECDSA-with-SHA256 check of a DER signature, the scheme cosign verifies --key signatures with."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    (tmp / "payload").write_bytes(payload)
    (tmp / "sig.der").write_bytes(base64.b64decode(signature_b64))
    done = subprocess.run([openssl, "dgst", "-sha256", "-verify", str(public), "-signature", str(tmp / "sig.der"),
                           str(tmp / "payload")], capture_output=True, text=True)
    assert done.returncode == 0 and "Verified OK" in done.stdout, done.stdout + done.stderr


@pytest.mark.oci
def test_oci_refusals_come_before_any_download(reg, small_bundle, bundle90, keys, tmp_path):
    nowhere = tmp_path / "afile"
    nowhere.write_text("a download dir that cannot exist")  # any blob download would fail with exit 40
    no_download = {"KERNELCACHE_DOWNLOAD_DIR": str(nowhere)}
    kc("push", str(small_bundle), f"oci://{reg.host}/kc/plain:v1", check=True)
    kc("push", str(small_bundle), f"oci://{reg.host}/kc/other:v1", "--sign", str(keys["other"][0]), check=True)
    cache = tmp_path / "c"
    refused(install(f"oci://{reg.host}/kc/plain:v1", cache, "--arch", "sm_90", *policy(keys), env=no_download),
            UnsignedBundle.exit_code, "no sha256-", cache)
    refused(install(f"oci://{reg.host}/kc/other:v1", cache, "--arch", "sm_90", *policy(keys), env=no_download),
            UntrustedSignature.exit_code, "does not verify with a trusted key", cache)

    assert install(f"oci://{reg.host}/kc/plain:v1", cache, "--arch", "sm_90").returncode == 0  # without a policy
    refused(install(f"oci://{reg.host}/kc/plain:v1", cache, "--arch", "sm_90", *policy(keys), env=no_download),
            UnsignedBundle.exit_code, "no sha256-", tmp_path / "unused")  # installed already, still refused


@pytest.mark.oci
def test_a_signature_tag_that_names_another_manifest_is_refused(reg, small_bundle, bundle90, keys, tmp_path):
    signed = json.loads(kc("push", str(small_bundle), f"oci://{reg.host}/kc/swap:a", "--sign", str(keys["ec"][0]),
                           "--json", check=True).stdout)["pushed"][0]["digest"]
    victim = json.loads(kc("push", str(bundle90), f"oci://{reg.host}/kc/swap:b", "--json",
                           check=True).stdout)["pushed"][0]["digest"]
    _, raw = oci_manifest(reg, "kc/swap", "sha256-" + signed.removeprefix("sha256:") + ".sig")
    put_manifest(reg, "kc/swap", "sha256-" + victim.removeprefix("sha256:") + ".sig", raw)
    cache = tmp_path / "c"
    refused(install(f"oci://{reg.host}/kc/swap:b-sm_90", cache, *policy(keys)), SignatureMismatch.exit_code,
            "not this bundle", cache)
    done = install(f"oci://{reg.host}/kc/swap:b-sm_90", cache)  # no policy: installed, and said
    assert done.returncode == 0 and "warning: signature: mismatch" in done.stderr, done.stderr


def put_manifest(reg, repo: str, tag: str, raw: bytes) -> None:
    import urllib.request

    request = urllib.request.Request(f"http://{reg.host}/v2/{repo}/manifests/{tag}", data=raw, method="PUT",
                                     headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    urllib.request.urlopen(request, timeout=10).close()


@pytest.mark.oci
def test_a_signature_laid_out_as_cosign_signs_is_accepted(reg, small_bundle, keys, tmp_path):
    """The tag, layer and annotation cosign writes, made here with openssl's signer and plain registry calls."""
    import oras.provider

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    digest = json.loads(kc("push", str(small_bundle), f"oci://{reg.host}/kc/cosigned:v1", "--json",
                           check=True).stdout)["pushed"][0]["digest"]
    payload = json.dumps({"critical": {"identity": {"docker-reference": f"{reg.host}/kc/cosigned"},
                                       "image": {"docker-manifest-digest": digest},
                                       "type": "cosign container image signature"}, "optional": None},
                         separators=(",", ":")).encode()
    (tmp_path / "payload").write_bytes(payload)
    subprocess.run([openssl, "dgst", "-sha256", "-sign", str(keys["ec"][0]), "-out", str(tmp_path / "sig"),
                    str(tmp_path / "payload")], check=True)
    client = oras.provider.Registry(reg.host, insecure=True)
    box = client.get_container(f"{reg.host}/kc/cosigned")
    layer = {"mediaType": "application/vnd.dev.cosign.simplesigning.v1+json", "size": len(payload),
             "digest": "sha256:" + hashlib.sha256(payload).hexdigest(),
             "annotations": {"dev.cosignproject.cosign/signature":
                             base64.b64encode((tmp_path / "sig").read_bytes()).decode()}}
    config = b"{}"
    (tmp_path / "config").write_bytes(config)
    for path, descriptor in ((tmp_path / "payload", layer),
                             (tmp_path / "config", {"mediaType": "application/vnd.oci.image.config.v1+json",
                                                    "size": 2, "digest": "sha256:" +
                                                    hashlib.sha256(config).hexdigest()})):
        client.upload_blob(str(path), box, dict(descriptor))
    document = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 2,
                           "digest": "sha256:" + hashlib.sha256(config).hexdigest()},
                "layers": [layer]}
    put_manifest(reg, "kc/cosigned", "sha256-" + digest.removeprefix("sha256:") + ".sig", json.dumps(document).encode())
    done = install(f"oci://{reg.host}/kc/cosigned:v1", tmp_path / "c", "--arch", "sm_90", *policy(keys), "--json")
    assert done.returncode == 0, done.stderr
    digest = archive.bundle_digest(archive.read_manifest(small_bundle))
    assert json.loads(done.stdout)["signature"] == {"status": "trusted", "signers": [keys["ec"][2]], "digest": digest,
                                                    "reason": "", "trusted_keys": [keys["ec"][2]]}
