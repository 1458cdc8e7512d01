"""Bundles as OCI artifacts: ``push`` to a registry, ``pull`` back (resolving an index by GPU).

Layout in the registry, for ``kernelcache push B1 B2 oci://HOST/REPO:TAG``:

* each bundle is an OCI image manifest (artifactType ``application/vnd.kernelcache.bundle.v1``)
  tagged ``TAG-<arch>[-<gpu>][-<machine>]`` (``v1-sm_90-h200``; the machine only when not x86_64).
  Its config blob is the bundle's own ``manifest.json`` (so the config digest is the bundle digest
  and a registry UI shows every kernel), its one layer the ``.tar.zst`` file, its annotations the
  target, versions and environment fingerprint;
* ``TAG`` is an OCI image index listing every ``TAG-*`` bundle in the repository, each descriptor
  carrying the same annotations and an OCI ``platform``. It is rebuilt from the tag list after
  every push, so CI jobs pushing one arch each converge on one complete index.

Pulling ``TAG`` resolves the index with ``select.choose`` (visible GPUs, or ``--arch``/``--gpu``);
pulling ``TAG-sm_90-h200`` or ``@sha256:…`` takes that bundle as is. Bytes are verified against
the descriptors (size, sha256), the bundle's manifest digest against the config digest, and the
file lands under its final name only then (``transfer.land``).

Signatures are cosign's (https://github.com/sigstore/cosign/blob/main/specs/SIGNATURE_SPEC.md): ``push --sign``
signs each bundle's OCI manifest (and the index) with cosign's simple-signing payload and stores it at the tag
``sha256-<manifest digest>.sig``: an OCI image manifest whose layers are the payloads
(``application/vnd.dev.cosign.simplesigning.v1+json``), each with its base64 signature in the
``dev.cosignproject.cosign/signature`` annotation (and the signer's PEM public key in ``dev.kernelcache.public-key``;
cosign ignores it). So ``cosign verify --key`` accepts what ``push --sign`` stored, and kernelcache accepts what
``cosign sign --key`` stored. ``install`` checks them before it downloads anything (``resolve_bundle``); ``pull``
writes them beside the bundle (``B.tar.zst.sig``, with the OCI manifest they name: bundle/signature.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..bundle.compare import fingerprint
from ..bundle.signature import (
    CONFIG_MEDIA_TYPE,
    LAYER_MEDIA_TYPE,
    SignatureFile,
    SignatureInfo,
    Signed,
    SigningKey,
    check,
    cosign_payload,
    enforce,
    file_sha256,
    keep_beside,
    load_signing_key,
    oci_subject,
)
from ..bundle.trust import Policy
from ..errors import MissingDependency, RemoteError, UsageError
from ..format import archive
from ..format.fingerprint import platform_tag
from ..format.manifest import Manifest
from .select import Candidate, choose
from .transfer import Expected, Landed, land, safe_name, verify

ARTIFACT_TYPE = "application/vnd.kernelcache.bundle.v1"
INDEX_ARTIFACT_TYPE = "application/vnd.kernelcache.index.v1"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ANNOTATION = "dev.kernelcache."
TITLE = "org.opencontainers.image.title"
CHUNK = 1 << 20
CHUNKED_UPLOAD_BYTES = 256 << 20  # larger blobs go up in chunks (POST, PATCH…, PUT), never whole in memory
UPLOAD_CHUNK = 16 << 20
INDEX_ROUNDS = 5
SIGNATURE_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
KEY_ANNOTATION = f"{ANNOTATION}public-key"
IMAGE_CONFIG = "application/vnd.oci.image.config.v1+json"
MAX_SIGNATURES = 16  # layers of a signature manifest read
MAX_PAYLOAD = 64 << 10

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_OCI_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


# -- references ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class OciRef:
    host: str  # "registry.example.com", "127.0.0.1:5000"
    repository: str  # "team/vllm-kernels"
    tag: str | None = "latest"
    digest: str | None = None  # "sha256:…"

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    def at(self, reference: str) -> OciRef:
        if reference.startswith("sha256:"):
            return OciRef(self.host, self.repository, None, reference)
        return OciRef(self.host, self.repository, reference, None)

    def __str__(self) -> str:
        return f"oci://{self.host}/{self.repository}" + (f"@{self.digest}" if self.digest else f":{self.tag}")


def parse(ref: str) -> OciRef:
    """``oci://HOST[:PORT]/REPO[:TAG][@sha256:DIGEST]`` -> ``OciRef`` (UsageError when malformed)."""
    form = "expected oci://HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST]"
    if not ref.startswith("oci://"):
        raise UsageError(f"not an OCI reference: {ref!r}; {form}")
    host, _, rest = ref[len("oci://"):].partition("/")
    rest, _, digest = rest.partition("@")
    repository, tag = rest, None
    if ":" in rest:
        repository, _, tag = rest.rpartition(":")
    if not host or not _REPOSITORY.fullmatch(repository):
        raise UsageError(f"bad OCI reference {ref!r}: repository names are lowercase a-z0-9 ._- parts; {form}")
    if tag is not None and not _TAG.fullmatch(tag):
        raise UsageError(f"bad tag {tag!r} in {ref!r}: up to 128 of A-Za-z0-9_.- (not starting with . or -)")
    if digest and not _DIGEST.fullmatch(digest):
        raise UsageError(f"bad digest {digest!r} in {ref!r}: expected sha256: and 64 lowercase hex digits")
    return OciRef(host, repository, tag if tag is not None or digest else "latest", digest or None)


def plain_http(host: str) -> bool:
    """Loopback registries speak plain HTTP (as docker assumes); others only if listed."""
    name = host.rsplit(":", 1)[0].strip("[]") if host.count(":") <= 1 or host.startswith("[") else host
    listed = {h.strip() for h in os.environ.get("KERNELCACHE_INSECURE_REGISTRIES", "").split(",") if h.strip()}
    if host in listed or name in listed:
        return True
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


# -- what a registry shows: tags and annotations -------------------------------------------------


def variant(manifest: Manifest) -> str:
    """``sm_90``, ``sm_90-h200``, ``sm_90-h200-aarch64``: the part a per-arch tag adds."""
    parts = [manifest.target.arch]
    if manifest.target.gpu:
        parts.append(manifest.target.gpu)
    machine = manifest.environment.platform.split("-")[0]
    if machine != "x86_64":
        parts.append(machine)
    return "-".join(parts)


def variant_tag(tag: str, manifest: Manifest) -> str:
    name = f"{tag}-{variant(manifest)}"
    if not _TAG.fullmatch(name):
        raise UsageError(f"tag {name!r} would be longer than 128 characters; use a shorter tag than {tag!r}")
    return name


def annotations(manifest: Manifest) -> dict[str, str]:
    """What a registry (or ``crane manifest``, ``oras discover``) shows about a bundle."""
    target, env = manifest.target, manifest.environment
    values = {
        "arch": target.arch, "backend": target.backend, "gpu": target.gpu, "sm_count": target.sm_count,
        "variant": variant(manifest), "platform": env.platform, "python": env.python, "triton": env.triton,
        "torch": env.torch, "vllm": env.vllm, "flashinfer": env.flashinfer,
        "fingerprint": fingerprint(env), "digest": archive.bundle_digest(manifest),
        "kernels": len(manifest.kernels), "build.mode": manifest.build.mode,
        "serves": _serves(manifest),
    }
    found = {f"{ANNOTATION}{k}": str(v) for k, v in values.items() if v is not None}
    found["org.opencontainers.image.created"] = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(manifest.build.source_date_epoch))
    found["org.opencontainers.image.description"] = (
        f"kernelcache bundle: {len(manifest.kernels)} Triton kernels for {target.arch}"
        + (f" ({target.gpu})" if target.gpu else "") + f", triton {env.triton}, {env.python} {env.platform}")
    return found


def oci_platform(platform: str) -> dict[str, str]:
    machine, _, system = platform.partition("-")
    return {"architecture": _OCI_ARCH.get(machine, machine), "os": system or "linux"}


# -- push ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pushed:
    bundle: Path
    reference: str  # oci://HOST/REPO:TAG-variant
    digest: str  # of the OCI manifest
    size: int
    signature: str | None = None  # oci://HOST/REPO:sha256-<digest>.sig, where push signed it


@dataclass(frozen=True)
class PushResult:
    pushed: tuple[Pushed, ...]
    index: str  # oci://HOST/REPO:TAG
    index_digest: str
    variants: tuple[str, ...]  # every variant the index lists now

    def to_dict(self) -> dict:
        return {"index": self.index, "index_digest": self.index_digest, "variants": list(self.variants),
                "pushed": [{"bundle": str(p.bundle), "reference": p.reference, "digest": p.digest,
                            "signature": p.signature} for p in self.pushed]}


def push(bundles: str | os.PathLike | Sequence[str | os.PathLike], reference: str,
         sign: str | os.PathLike | None = None) -> PushResult:
    """Push bundles (one per variant) under ``TAG-<variant>`` and rebuild the index at ``TAG``.

    ``sign``: a private key file; each bundle's OCI manifest and the index are signed as cosign signs images."""
    ref = parse(reference)
    if ref.digest:
        raise UsageError("push needs a tag, not a digest: oci://HOST/REPO:TAG")
    signer = load_signing_key(sign) if sign is not None else None  # a bad key fails before anything is uploaded
    paths = [Path(bundles)] if isinstance(bundles, (str, os.PathLike)) else [Path(b) for b in bundles]
    manifests = [verify(p) for p in paths]  # never push a bundle that does not verify
    tags = [variant_tag(ref.tag, m) for m in manifests]
    if len(set(tags)) < len(tags):
        raise UsageError(f"two bundles would both be tagged {_first_duplicate(tags)}: push one bundle per variant")
    client = _connect(ref)
    _check_index_tag(client, ref)
    pushed = tuple(_push_one(client, ref.at(t), p, m, signer) for p, m, t in zip(paths, manifests, tags))
    index_digest, listed = _publish_index(client, ref)
    if signer is not None:
        _push_signature(client, ref, index_digest, signer)
    return PushResult(pushed, str(ref), index_digest, listed)


def _push_one(client, ref: OciRef, path: Path, manifest: Manifest, signer: SigningKey | None = None) -> Pushed:
    config = manifest.to_json()
    with tempfile.TemporaryDirectory(prefix="kernelcache-push-") as work:
        config_path = Path(work) / "manifest.json"
        config_path.write_bytes(config)
        config_desc = _upload(client, ref, config_path, CONFIG_MEDIA_TYPE)
    layer_desc = _upload(client, ref, path, LAYER_MEDIA_TYPE)
    layer_desc["annotations"] = {TITLE: safe_name(path.name, f"{variant(manifest)}.tar.zst")}
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": ARTIFACT_TYPE,
        "config": config_desc,
        "layers": [layer_desc],
        "annotations": annotations(manifest),
    }
    raw = _canonical(document)
    _put_manifest(client, ref, raw, OCI_MANIFEST)
    signature = _push_signature(client, ref, _sha256(raw), signer) if signer is not None else None
    return Pushed(path, str(ref), _sha256(raw), len(raw), signature)


def _upload(client, ref: OciRef, path: Path, media_type: str) -> dict:
    from .registry import container, error_text

    descriptor = {"mediaType": media_type, "digest": "sha256:" + file_sha256(path), "size": path.stat().st_size}
    box = container(ref.host, ref.repository)
    chunked = descriptor["size"] > CHUNKED_UPLOAD_BYTES
    response = client.upload_blob(str(path), box, dict(descriptor), do_chunked=chunked, chunk_size=UPLOAD_CHUNK)
    if response.status_code not in (200, 201, 202):
        raise RemoteError(f"{ref}: uploading {path.name} failed: {error_text(response)}")
    return descriptor


def _put_manifest(client, ref: OciRef, raw: bytes, media_type: str) -> None:
    from .registry import container, error_text

    url = f"{client.prefix}://{container(ref.host, ref.repository).manifest_url(ref.reference)}"
    response = client.do_request(url, "PUT", data=raw, headers={"Content-Type": media_type})
    if response.status_code not in (200, 201):
        raise RemoteError(f"{ref}: the registry refused the manifest: {error_text(response)}")


# -- the index -----------------------------------------------------------------------------------


def _check_index_tag(client, ref: OciRef) -> None:
    """Never overwrite a tag that holds something other than a kernelcache index."""
    found = _get_manifest(client, ref, missing_ok=True)
    if found is None:
        return
    media_type, document, _ = found
    if media_type != OCI_INDEX or document.get("artifactType") != INDEX_ARTIFACT_TYPE:
        raise UsageError(f"{ref} already holds {document.get('artifactType') or media_type}, not a kernelcache "
                         "index; push under another tag")


def _publish_index(client, ref: OciRef) -> tuple[str, tuple[str, ...]]:
    """Rebuild the index from the tag list until a re-list adds nothing (concurrent pushers)."""
    for _ in range(INDEX_ROUNDS):
        tags = _variant_tags(client, ref)
        entries = [entry for entry in (_index_entry(client, ref, t) for t in tags) if entry is not None]
        entries.sort(key=lambda e: e["annotations"].get(f"{ANNOTATION}variant", ""))
        document = {"schemaVersion": 2, "mediaType": OCI_INDEX, "artifactType": INDEX_ARTIFACT_TYPE,
                    "manifests": entries, "annotations": {f"{ANNOTATION}index": ref.tag}}
        raw = _canonical(document)
        _put_manifest(client, ref, raw, OCI_INDEX)
        if set(_variant_tags(client, ref)) <= set(tags):
            break
    listed = tuple(e["annotations"].get(f"{ANNOTATION}variant", "") for e in entries)
    return _sha256(raw), listed


def _variant_tags(client, ref: OciRef) -> list[str]:
    from .registry import container

    pattern = re.compile(rf"{re.escape(ref.tag)}-sm_\d+[af]?(?:-[a-z0-9][a-z0-9-]*)?")
    try:
        tags = client.get_tags(container(ref.host, ref.repository))
    except ValueError as exc:
        raise RemoteError(f"{ref}: cannot list tags: {exc}") from None
    return sorted(t for t in tags if pattern.fullmatch(t))


def _index_entry(client, base: OciRef, tag: str) -> dict | None:
    found = _get_manifest(client, base.at(tag), missing_ok=True)
    if found is None:
        return None
    media_type, document, raw_digest_size = found
    if media_type != OCI_MANIFEST or document.get("artifactType") != ARTIFACT_TYPE:
        return None
    notes = document.get("annotations") or {}
    if tag != f"{base.tag}-{notes.get(f'{ANNOTATION}variant')}":
        return None  # a tag that only looks like one of ours
    digest, size = raw_digest_size
    keep = {k: v for k, v in notes.items() if k.startswith(ANNOTATION)}
    entry = {"mediaType": OCI_MANIFEST, "digest": digest, "size": size, "artifactType": ARTIFACT_TYPE,
             "annotations": keep}
    if keep.get(f"{ANNOTATION}platform"):
        entry["platform"] = oci_platform(keep[f"{ANNOTATION}platform"])
    return entry


# -- signatures (cosign's layout) ----------------------------------------------------------------


def signature_tag(digest: str) -> str:
    """The tag cosign stores the signatures of the manifest ``sha256:HEX`` at: ``sha256-HEX.sig``."""
    return digest.replace(":", "-", 1) + ".sig"


def _push_signature(client, ref: OciRef, digest: str, signer: SigningKey) -> str:
    """Sign the manifest ``digest`` as ``cosign sign --key`` does and add it to its signature tag (a signature by
    this key that is there already is kept instead); the tag's reference."""
    at = ref.at(signature_tag(digest))
    payload = cosign_payload(f"{ref.host}/{ref.repository}", digest.removeprefix("sha256:"))
    found = _get_manifest(client, at, missing_ok=True)
    layers = [x for x in (found[1].get("layers") or []) if x.get("mediaType") == SIGNATURE_MEDIA_TYPE] if found else []
    if any(_signs(layer, payload, signer) for layer in layers):
        return str(at)
    with tempfile.TemporaryDirectory(prefix="kernelcache-sign-") as work:
        blob = Path(work) / "payload.json"
        blob.write_bytes(payload)
        layer = _upload(client, at, blob, SIGNATURE_MEDIA_TYPE)
        layer["annotations"] = {SIGNATURE_ANNOTATION: base64.b64encode(signer.sign(payload)).decode(),
                                KEY_ANNOTATION: signer.public.pem}
        layers.append(layer)
        config = Path(work) / "config.json"
        config.write_bytes(_canonical({"architecture": "", "os": "", "config": {},
                                       "rootfs": {"type": "layers", "diff_ids": [x["digest"] for x in layers]}}))
        document = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": _upload(client, at, config, IMAGE_CONFIG),
                    "layers": layers}
    _put_manifest(client, at, _canonical(document), OCI_MANIFEST)
    return str(at)


def _signs(layer: dict, payload: bytes, signer: SigningKey) -> bool:
    """Whether a signature layer already holds this payload, signed by this key."""
    if layer.get("digest") != _sha256(payload):
        return False
    try:
        signature = base64.b64decode((layer.get("annotations") or {}).get(SIGNATURE_ANNOTATION, ""), validate=True)
    except (binascii.Error, TypeError):
        return False
    return signer.public.verifies(payload, signature)


def _signatures(client, ref: OciRef, digest: str, raw: bytes | None) -> SignatureFile | None:
    """The signatures stored for the manifest ``digest`` (``raw``: its bytes, kept in the signature file), as a
    signature file; None when its signature tag does not exist; ``ValueError`` when it holds no readable one."""
    found = _get_manifest(client, ref.at(signature_tag(digest)), missing_ok=True)
    if found is None:
        return None
    layers = [x for x in found[1].get("layers") or [] if x.get("mediaType") == SIGNATURE_MEDIA_TYPE]
    entries = [e for e in (_signed(client, ref, x) for x in layers[:MAX_SIGNATURES]) if e is not None]
    if not entries:
        raise ValueError(f"{signature_tag(digest)} holds no readable cosign signature")
    return SignatureFile(tuple(entries), raw)


def _signed(client, ref: OciRef, layer: dict) -> Signed | None:
    """One signature layer: its payload blob (checked against its digest) and the signature in its annotation."""
    notes = layer.get("annotations") or {}
    size, digest = layer.get("size"), layer.get("digest")
    if not isinstance(size, int) or not 0 < size <= MAX_PAYLOAD or not _DIGEST.fullmatch(str(digest)):
        return None
    try:
        signature = base64.b64decode(str(notes.get(SIGNATURE_ANNOTATION, "")), validate=True)
        payload = b"".join(_blob_chunks(client, ref, digest, MAX_PAYLOAD))
    except (binascii.Error, RemoteError):
        return None
    key = notes.get(KEY_ANNOTATION)
    if _sha256(payload) != digest or not signature:
        return None
    return Signed(payload, signature, key if isinstance(key, str) else None)


def _check_signature(client, ref: OciRef, raw: bytes, policy: Policy) -> SignatureInfo:
    """The signatures of the bundle manifest ``ref`` pins (``raw``: its bytes, which name the file and the bundle
    digest), checked against ``policy`` before anything is downloaded."""
    digest = str(ref.digest)
    subject = oci_subject(digest.removeprefix("sha256:"), raw)
    try:
        found = _signatures(client, ref, digest, raw)
    except ValueError as exc:
        info = SignatureInfo("invalid", reason=str(exc))
        enforce(info, policy.require, str(ref))
        return info
    return check(found, subject, policy, str(ref), f"no {signature_tag(digest)} tag in the registry")


def _keep_signature(client, ref: OciRef, digest: str, raw: bytes, bundle: Path) -> None:
    """Write the signatures of a pulled bundle beside it, with the OCI manifest they name (remove a stale file
    when there are none)."""
    try:
        found = _signatures(client, ref, digest, raw)
    except ValueError:
        found = None
    keep_beside(bundle, found.to_json() if found is not None else None)


# -- pull ----------------------------------------------------------------------------------------


def pull(reference: str, output_dir: str | os.PathLike, arch: str | None = None, gpu: str | None = None,
         every: bool = False, verify_members: bool = True,
         accept: Callable[[Manifest], None] | None = None) -> list[Landed]:
    """Download the bundle for this machine (or ``every`` bundle of an index) into ``output_dir``."""
    ref = parse(reference)
    client = _connect(ref)
    media_type, document, raw = _fetch_manifest(client, ref)
    if media_type == OCI_INDEX:
        documents = [(r, *_fetch_manifest(client, r)[1:]) for r in _resolve(ref, document, arch, gpu, every)]
    else:
        documents = [(ref, document, raw)]
    names: set[str] = set()
    landed = []
    for r, d, raw_manifest in documents:
        landed.append(_download(client, r, d, Path(output_dir), names, verify_members, accept))
        _keep_signature(client, r, _sha256(raw_manifest), raw_manifest, landed[-1].path)
    return landed


def resolve_bundle(reference: str, arch: str | None = None, gpu: str | None = None,
                   policy: Policy | None = None) -> tuple[str, str, SignatureInfo | None]:
    """(bundle digest, ``oci://…@sha256:`` of its OCI manifest, its signatures as checked against ``policy``) for
    the bundle ``reference`` picks here (no ``policy``: signatures not read).

    Reads the index, the manifest and its signature tag, no blob: ``install`` uses it to find a bundle already
    installed, and downloads through the pinned reference otherwise (one manifest read, and no tag that moved in
    between). The config blob is the bundle's ``manifest.json``: its descriptor digest is the bundle's."""
    ref = parse(reference)
    client = _connect(ref)
    media_type, document, raw = _fetch_manifest(client, ref)
    if media_type == OCI_INDEX:
        ref = _resolve(ref, document, arch, gpu, every=False)[0]
        _, document, raw = _fetch_manifest(client, ref)
    _, config = _bundle_parts(ref, document)
    pinned = ref.at(_sha256(raw))
    signature = _check_signature(client, pinned, raw, policy) if policy is not None else None
    return str(config["digest"]).removeprefix("sha256:"), str(pinned), signature


def _resolve(ref: OciRef, index: dict, arch: str | None, gpu: str | None, every: bool) -> list[OciRef]:
    candidates = [_candidate(d) for d in index.get("manifests", []) if d.get("artifactType") == ARTIFACT_TYPE]
    if every:
        return [ref.at(c.reference) for c in candidates]
    gpus = []
    if arch is None and gpu is None:
        from ..plan.gpus import visible_gpus

        gpus = visible_gpus()
    chosen = choose(candidates, gpus, arch=arch, gpu=gpu, platform=platform_tag())
    return [ref.at(chosen.reference)]


def _serves(manifest: Manifest) -> str | None:
    """The device names a bundle whose kernels the device name decided serves (JSON: profile -> device name)."""
    keys = manifest.device_keys
    return None if keys is None else json.dumps(keys.serves, sort_keys=True, separators=(",", ":"))


def _candidate(descriptor: dict) -> Candidate:
    notes = descriptor.get("annotations") or {}
    sm_count = notes.get(f"{ANNOTATION}sm_count")
    return Candidate(arch=notes.get(f"{ANNOTATION}arch", "sm_0"), gpu=notes.get(f"{ANNOTATION}gpu"),
                     sm_count=int(sm_count) if sm_count and sm_count.isdigit() else None,
                     platform=notes.get(f"{ANNOTATION}platform"), reference=descriptor["digest"],
                     serves=_serves_note(notes.get(f"{ANNOTATION}serves")))


def _serves_note(text: str | None) -> tuple[str, ...] | None:
    """The device names of a ``serves`` annotation; None (no such note: any product of the SM count) if absent
    or unreadable, which install's own check then backs."""
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return tuple(sorted(str(v) for v in found.values())) if isinstance(found, dict) else None


def _download(client, ref: OciRef, document: dict, output_dir: Path, names: set[str],
              verify_members: bool, accept: Callable[[Manifest], None] | None = None) -> Landed:
    layer, config = _bundle_parts(ref, document)
    notes = document.get("annotations") or {}
    fallback = f"{ref.repository.rsplit('/', 1)[-1]}-{notes.get(f'{ANNOTATION}variant', 'bundle')}.tar.zst"
    name = safe_name((layer.get("annotations") or {}).get(TITLE), fallback)
    name = fallback if name in names else name
    names.add(name)
    expected = Expected(sha256=layer["digest"].removeprefix("sha256:"), size=layer["size"],
                        bundle_digest=config["digest"].removeprefix("sha256:"))
    return land(_blob_chunks(client, ref, layer["digest"]), output_dir / name, expected, str(ref), verify_members,
                accept)


def _bundle_parts(ref: OciRef, document: dict) -> tuple[dict, dict]:
    config = document.get("config") or {}
    layers = [x for x in document.get("layers") or [] if x.get("mediaType") == LAYER_MEDIA_TYPE]
    if config.get("mediaType") != CONFIG_MEDIA_TYPE or len(layers) != 1:
        kind = document.get("artifactType") or config.get("mediaType") or document.get("mediaType")
        raise RemoteError(f"{ref} is not a kernelcache bundle (it is {kind})")
    layer = layers[0]
    if not _DIGEST.fullmatch(str(layer.get("digest"))) or not isinstance(layer.get("size"), int):
        raise RemoteError(f"{ref}: the bundle layer has no valid sha256 digest and size")
    return layer, config


def _blob_chunks(client, ref: OciRef, digest: str, limit: int | None = None) -> Iterator[bytes]:
    """The blob's bytes as they arrive; ``RemoteError`` past ``limit`` bytes."""
    import requests

    from .registry import container, error_text

    response = client.get_blob(container(ref.host, ref.repository), digest, stream=True)
    with response:
        if response.status_code != 200:
            raise RemoteError(f"{ref}: cannot download blob {digest[:19]}…: {error_text(response)}")
        seen = 0
        try:
            for chunk in response.iter_content(chunk_size=CHUNK):
                seen += len(chunk)
                if limit is not None and seen > limit:
                    raise RemoteError(f"{ref}: blob {digest[:19]}… is larger than {limit} bytes")
                yield chunk
        except requests.RequestException as exc:
            raise RemoteError(f"{ref}: the download broke off: {type(exc).__name__}") from None


# -- registry plumbing ---------------------------------------------------------------------------


def _connect(ref: OciRef):
    try:
        from .registry import connect
    except ImportError as exc:
        raise MissingDependency(f"oci:// needs the oras package ({exc}): pip install 'kernelcache[oci]'") from None
    return connect(ref.host, plain_http(ref.host), ref.repository)


def _get_manifest(client, ref: OciRef, missing_ok: bool = False):
    """(media type, parsed document, (digest, size)), checked against ``ref.digest`` if pinned."""
    found = _fetch_manifest(client, ref, missing_ok)
    if found is None:
        return None
    media_type, document, raw = found
    return media_type, document, (_sha256(raw), len(raw))


def _fetch_manifest(client, ref: OciRef, missing_ok: bool = False):
    """(media type, parsed document, the manifest's bytes), checked against ``ref.digest`` if pinned."""
    from .registry import container, error_text

    url = f"{client.prefix}://{container(ref.host, ref.repository).manifest_url(ref.reference)}"
    response = client.do_request(url, "GET", headers={"Accept": f"{OCI_INDEX}, {OCI_MANIFEST}"})
    if response.status_code == 404 and missing_ok:
        return None
    if response.status_code != 200:
        raise RemoteError(f"{ref}: {error_text(response)}")
    raw = response.content
    digest = _sha256(raw)
    if ref.digest and digest != ref.digest:
        raise RemoteError(f"{ref}: the registry returned a manifest with digest {digest}, not the one asked for")
    try:
        document = json.loads(raw)
    except ValueError:
        raise RemoteError(f"{ref}: the registry returned a manifest that is not JSON") from None
    if not isinstance(document, dict):
        raise RemoteError(f"{ref}: the registry returned a manifest that is not a JSON object")
    media_type = document.get("mediaType") or response.headers.get("Content-Type", "").split(";")[0]
    return media_type, document, raw


def _canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _sha256(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _first_duplicate(items: list[str]) -> str:
    seen: set[str] = set()
    return next(x for x in items if x in seen or seen.add(x))

