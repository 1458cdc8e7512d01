"""Bundle signatures: made with a key file, checked against a policy (bundle/trust.py) before an install parses
anything of the bundle.

What is signed. A bundle's digest (the sha256 of its manifest.json, docs/FORMAT.md) names its contents; the sha256
of the ``.tar.zst`` file names its bytes, which an install can check before it reads any of them. A signature is
over a small JSON *payload* that names them:

* kernelcache's payload (``kernelcache sign``, ``build --sign``): ``{"critical": {"bundle": {"digest":
  "sha256:<manifest.json>", "sha256": "sha256:<file>"}, "type": "kernelcache bundle signature"}, "optional":
  {"name": "<file name>"}}``;
* cosign's simple-signing payload (``push --sign``, or ``cosign sign --key`` of the bundle's OCI manifest):
  ``{"critical": {"identity": {"docker-reference": "HOST/REPO"}, "image": {"docker-manifest-digest":
  "sha256:<OCI manifest>"}, "type": "cosign container image signature"}, "optional": null}``. That OCI manifest
  names the file (its one layer) and the bundle digest (its config blob is the manifest.json), so the signature
  file of a pulled bundle keeps the manifest's bytes (``oci_manifest``).

The scheme follows the key, as cosign's does: ECDSA P-256 with SHA-256 (a DER signature), or Ed25519. Keys are PEM
files: a PKCS#8 or SEC1 private key signs, a SubjectPublicKeyInfo public key is trusted. The ``cryptography``
package does every operation (``pip install 'kernelcache[sign]'``), imported only when a signature is made or
checked.

The signature file beside a bundle, ``B.tar.zst.sig``: ``{"kernelcache_signature": 1, "signatures": [{"payload":
base64, "signature": base64, "public_key": PEM or null}], "oci_manifest": base64 or null}``. A signature may carry
its signer's public key: with no trusted key given it is checked with that one, which proves the bytes are the
ones signed but not who signed them; its fingerprint is reported as the signer.

Checking (``evaluate``): each signature is verified with every trusted key (with no trusted key, with the key it
carries), and its payload must name this bundle. ``SignatureInfo.status`` says the outcome: ``trusted`` (a
trusted key signed this bundle), ``signed`` (no trusted key given; a signature verifies with the key it carries),
``unsigned``, or a failure: ``mismatch`` (a valid signature names another bundle), ``untrusted`` (none verifies
with a trusted key), ``invalid`` (unreadable, or not valid under the key it carries), ``unverifiable`` (no
trusted key given and the signature carries none, or cryptography is missing). Under a policy that requires a
signature anything but ``trusted`` is refused (``enforce``): ``unsigned`` with ``UnsignedBundle`` (17),
``mismatch`` with ``SignatureMismatch`` (19), the rest with ``UntrustedSignature`` (18). Without one, a failure is a
warning.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import (
    KeyFileError,
    MissingDependency,
    SignatureMismatch,
    UnsignedBundle,
    UntrustedSignature,
)
from .trust import NO_POLICY, SUFFIX, VALID, Policy, describe, fingerprint_der, pem_der, signature_path

KERNELCACHE_TYPE = "kernelcache bundle signature"
COSIGN_TYPE = "cosign container image signature"
# The bundle as an OCI artifact (remote/oci.py lays it out): its config blob is the manifest.json, its one layer
# the .tar.zst file.
CONFIG_MEDIA_TYPE = "application/vnd.kernelcache.manifest.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.kernelcache.bundle.v1.tar+zstd"
FORMAT = 1
MAX_FILE_BYTES = 1 << 20  # a signature file larger than this is not one
MAX_SIGNATURES = 64
CHUNK = 1 << 20
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# The DER SubjectPublicKeyInfo header of each key type, followed by the raw key: id-ecPublicKey on prime256v1 with
# an uncompressed point (RFC 5480), id-Ed25519 (RFC 8410). A public key in exactly this form is built from its
# raw bytes (cryptography's ``from_encoded_point`` / ``from_public_bytes``, which check it), without importing
# cryptography's serialization module: about 30 ms of an install on 2 cores. Any other encoding goes through it.
_SPKI = {bytes.fromhex("3059301306072a8648ce3d020106082a8648ce3d030107034200"): ("ecdsa-p256", 65),
         bytes.fromhex("302a300506032b6570032100"): ("ed25519", 32)}


def _crypto(module: str = "serialization"):
    """A module of ``cryptography.hazmat.primitives`` (``serialization``, ``asymmetric.ec``, ...), or
    ``MissingDependency``."""
    try:
        from importlib import import_module

        return import_module(f"cryptography.hazmat.primitives.{module}")
    except ImportError as exc:
        raise MissingDependency(f"signatures need the cryptography package ({exc}): "
                                "pip install 'kernelcache[sign]'") from None


# -- keys ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublicKey:
    """A public key kernelcache checks signatures with: ``ecdsa-p256`` or ``ed25519``."""

    fingerprint: str  # trust.fingerprint_der of its SubjectPublicKeyInfo
    algorithm: str
    key: Any = field(compare=False, repr=False)  # cryptography's key object

    def verifies(self, payload: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            if self.algorithm == "ed25519":
                self.key.verify(signature, payload)
            else:
                self.key.verify(signature, payload, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            return False
        return True

    @property
    def pem(self) -> str:
        serialization = _crypto()
        return self.key.public_bytes(serialization.Encoding.PEM,
                                     serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@dataclass(frozen=True)
class SigningKey:
    """A private key kernelcache signs with, and its public half."""

    public: PublicKey
    key: Any = field(compare=False, repr=False)

    def sign(self, payload: bytes) -> bytes:
        if self.public.algorithm == "ed25519":
            return self.key.sign(payload)
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return self.key.sign(payload, ec.ECDSA(hashes.SHA256()))


def load_public_key(path: str | os.PathLike) -> PublicKey:
    """A trusted key file: one PEM public key (``KeyFileError`` for anything else)."""
    return public_key(_read_key(path), path)


def public_key(data: bytes, path: str | os.PathLike) -> PublicKey:
    """The PEM public key ``data`` (read from ``path``, for messages)."""
    der = pem_der(data)
    for header, (algorithm, size) in _SPKI.items():
        if der is not None and der.startswith(header) and len(der) == len(header) + size:
            raw = der[len(header):]
            try:
                if algorithm == "ed25519":
                    key = _crypto("asymmetric.ed25519").Ed25519PublicKey.from_public_bytes(raw)
                else:
                    ec = _crypto("asymmetric.ec")
                    key = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
            except ValueError as exc:
                raise KeyFileError(f"{path} is not a valid {algorithm} public key ({exc})") from None
            return PublicKey(fingerprint_der(der), algorithm, key)
    serialization = _crypto()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not a PEM public key{_hint(data, exc, wanted='public')}") from None
    return _public(key, path)


def load_signing_key(path: str | os.PathLike) -> SigningKey:
    """A signing key file: one unencrypted PEM private key (``KeyFileError`` for anything else)."""
    data = _read_key(path)
    serialization = _crypto()
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:  # cryptography: "Password was not given but private key is encrypted"
        raise KeyFileError(f"{path} is an encrypted private key; kernelcache reads unencrypted PEM keys (keep "
                           "the key in the CI job's secret store instead)") from None
    except ValueError as exc:
        raise KeyFileError(f"{path} is not a PEM private key{_hint(data, exc, wanted='private')}") from None
    return SigningKey(_public(key.public_key(), path), key)


def trusted_keys(paths) -> tuple[PublicKey, ...]:
    return tuple(load_public_key(p) for p in paths)


def _read_key(path: str | os.PathLike) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read(1 << 16)
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror or exc}") from None


def _public(key, path: str | os.PathLike) -> PublicKey:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(key, ed25519.Ed25519PublicKey):
        algorithm = "ed25519"
    elif isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        algorithm = "ecdsa-p256"
    else:
        kind = (f"ECDSA {key.curve.name}" if isinstance(key, ec.EllipticCurvePublicKey)
                else type(key).__name__.removesuffix("PublicKey").lstrip("_"))
        raise KeyFileError(f"{path} holds an {kind} key; kernelcache signs with ed25519 or ECDSA P-256 keys")
    serialization = _crypto()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return PublicKey(fingerprint_der(der), algorithm, key)


def _hint(data: bytes, exc: Exception, wanted: str) -> str:
    """Why a key file of the ``wanted`` kind ("public" or "private") did not load: the other kind's PEM label names
    the mix-up; a file of the wanted label whose body does not parse gets cryptography's error, whole."""
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in data or b"ENCRYPTED COSIGN PRIVATE KEY" in data:
        return (": it is a cosign-encrypted key, which only cosign reads; make the key pair with openssl and "
                "`cosign import-key-pair` it (docs/DEPLOYING.md)")
    if wanted == "public" and b"PRIVATE KEY-----" in data:
        return ": it is a private key; trust its public half (openssl pkey -in KEY -pubout)"
    if wanted == "private" and b"PUBLIC KEY-----" in data:
        return ": it is a public key; sign with the private one"
    return f" ({' '.join(str(exc).split())})" if str(exc) else ""  # whole: a cut one ended mid-word


# -- what a signature names ----------------------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """What names a bundle, as hex sha256 digests (None where not known): its file, its manifest.json (the bundle
    digest), its OCI manifest."""

    sha256: str | None = None
    digest: str | None = None
    oci_manifest: str | None = None

    def named_by(self, statement: Subject) -> bool:
        """Whether a payload's ``statement`` names this bundle: every digest both know agrees, and they share one."""
        pairs = ((statement.sha256, self.sha256), (statement.digest, self.digest),
                 (statement.oci_manifest, self.oci_manifest))
        known = [(a, b) for a, b in pairs if a is not None and b is not None]
        return bool(known) and all(a == b for a, b in known)

    def short(self) -> str:
        for label, value in (("sha256", self.sha256), ("OCI manifest", self.oci_manifest), ("digest", self.digest)):
            if value is not None:
                return f"{label} {value[:16]}…"
        return "nothing"


def _hex(value: Any) -> str:
    match = _DIGEST.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError(f"not a sha256 digest: {value!r}")
    return match.group(1)


def oci_subject(digest: str, raw: bytes | None) -> Subject:
    """What the OCI manifest with hex ``digest`` names: the file (its one bundle layer) and the bundle digest (its
    config blob), read from ``raw`` when those are the manifest's bytes; else only the manifest itself."""
    if raw is None or hashlib.sha256(raw).hexdigest() != digest:
        return Subject(oci_manifest=digest)
    try:
        document = json.loads(raw)
        layers = [x for x in document.get("layers") or [] if x.get("mediaType") == LAYER_MEDIA_TYPE]
        config = document.get("config") or {}
        if len(layers) != 1 or config.get("mediaType") != CONFIG_MEDIA_TYPE:
            return Subject(oci_manifest=digest)
        return Subject(_hex(layers[0].get("digest")), _hex(config.get("digest")), digest)
    except (ValueError, AttributeError, TypeError):
        return Subject(oci_manifest=digest)


def statement(payload: bytes, oci_manifest: bytes | None = None) -> Subject | None:
    """What a payload names (kernelcache's or cosign's), or None when it is neither."""
    try:
        critical = json.loads(payload)["critical"]
        if critical["type"] == KERNELCACHE_TYPE:
            return Subject(_hex(critical["bundle"]["sha256"]), _hex(critical["bundle"]["digest"]))
        if critical["type"] == COSIGN_TYPE:
            return oci_subject(_hex(critical["image"]["docker-manifest-digest"]), oci_manifest)
    except (ValueError, KeyError, TypeError):
        return None
    return None


def bundle_payload(subject: Subject, name: str) -> bytes:
    """kernelcache's payload for a bundle file (``subject``: its sha256 and digest)."""
    critical = {"bundle": {"digest": f"sha256:{subject.digest}", "sha256": f"sha256:{subject.sha256}"},
                "type": KERNELCACHE_TYPE}
    return json.dumps({"critical": critical, "optional": {"name": name}}, sort_keys=True,
                      separators=(",", ":")).encode()


def cosign_payload(repository: str, digest: str) -> bytes:
    """cosign's simple-signing payload for the OCI manifest with hex ``digest`` in ``repository`` (HOST/REPO),
    with its keys in the order cosign writes them."""
    critical = {"identity": {"docker-reference": repository}, "image": {"docker-manifest-digest": f"sha256:{digest}"},
                "type": COSIGN_TYPE}
    return json.dumps({"critical": critical, "optional": None}, separators=(",", ":")).encode()


# -- the signature file --------------------------------------------------------------------------


@dataclass(frozen=True)
class Signed:
    """One signature: the payload, the signature over it, and the signer's PEM public key if it came with one."""

    payload: bytes
    signature: bytes
    public_key: str | None = None

    def to_dict(self) -> dict:
        return {"payload": _b64(self.payload), "signature": _b64(self.signature), "public_key": self.public_key}

    @classmethod
    def from_dict(cls, data: Any) -> Signed:
        if not isinstance(data, dict) or not isinstance(data.get("public_key"), str | None):
            raise ValueError("a signature entry needs payload, signature and public_key")
        return cls(_unb64(data.get("payload")), _unb64(data.get("signature")), data.get("public_key"))


@dataclass(frozen=True)
class SignatureFile:
    """What ``B.tar.zst.sig`` holds: signatures, and the OCI manifest a cosign payload names (pulled with it)."""

    signatures: tuple[Signed, ...]
    oci_manifest: bytes | None = None

    def to_json(self) -> bytes:
        data = {"kernelcache_signature": FORMAT, "signatures": [s.to_dict() for s in self.signatures],
                "oci_manifest": _b64(self.oci_manifest) if self.oci_manifest is not None else None}
        return json.dumps(data, indent=1, sort_keys=True).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> SignatureFile:
        """The file ``data`` holds; ``ValueError`` with the reason when it holds none."""
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("kernelcache_signature") != FORMAT:
            raise ValueError(f"not a kernelcache signature file (format {FORMAT})")
        entries = document.get("signatures")
        if not isinstance(entries, list) or not 0 < len(entries) <= MAX_SIGNATURES:
            raise ValueError(f"it lists no signatures, or more than {MAX_SIGNATURES}")
        raw = document.get("oci_manifest")
        return cls(tuple(Signed.from_dict(e) for e in entries), _unb64(raw) if raw is not None else None)

    @classmethod
    def read(cls, path: str | os.PathLike) -> SignatureFile | None:
        """The signature file at ``path``; None when there is none; ``ValueError`` when it is not one."""
        try:
            with open(path, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ValueError(f"cannot read it: {exc.strerror or exc}") from None
        if len(data) > MAX_FILE_BYTES:
            raise ValueError(f"it is larger than {MAX_FILE_BYTES} bytes")
        return cls.from_json(data)

    def write(self, path: str | os.PathLike) -> None:
        _replace(Path(path), self.to_json())


def keep_beside(bundle: str | os.PathLike, data: bytes | None) -> None:
    """Put a signature file's bytes beside a bundle that just landed (a download), or remove a stale one when the
    source has none: a signature file never outlives the bundle it was fetched with."""
    target = Path(signature_path(bundle))
    if data is None:
        target.unlink(missing_ok=True)
    else:
        _replace(target, data)


def _replace(target: Path, data: bytes) -> None:
    """Replace ``target`` in one rename: a reader sees the old file or the new one."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise ValueError("expected base64 text")
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"bad base64: {exc}") from None


# -- checking ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignatureInfo:
    """Who signed a bundle, as a check found it (the statuses: this module's docstring)."""

    status: str
    signers: tuple[str, ...] = ()  # key fingerprints: the signers found (valid ones, for a valid status)
    digest: str | None = None  # the bundle digest a valid signature names, when its payload names one
    reason: str = ""  # why it is not valid
    trusted_keys: tuple[str, ...] = ()  # fingerprints of the trusted keys it was checked with

    @property
    def valid(self) -> bool:
        return self.status in VALID

    def describe(self) -> str:
        """One phrase for people: ``signed by sha256:1a2b3c4d5e6f… (a trusted key)``."""
        return describe(self.to_dict())

    def to_dict(self) -> dict:
        return {"status": self.status, "signers": list(self.signers), "digest": self.digest, "reason": self.reason,
                "trusted_keys": list(self.trusted_keys)}

    @classmethod
    def from_dict(cls, data: Any) -> SignatureInfo:
        if not isinstance(data, dict) or not isinstance(data.get("status"), str):
            raise ValueError("not a signature record")
        return cls(data["status"], tuple(str(s) for s in data.get("signers") or ()), data.get("digest"),
                   str(data.get("reason", "")), tuple(str(k) for k in data.get("trusted_keys") or ()))


def evaluate(found: SignatureFile, subject: Subject, keys: tuple[PublicKey, ...]) -> SignatureInfo:
    """Check every signature of ``found`` against ``subject`` with the trusted ``keys`` (with none: with the key
    each carries)."""
    trusted = tuple(sorted({k.fingerprint for k in keys}))
    good: list[tuple[PublicKey, Subject]] = []
    elsewhere: list[tuple[PublicKey, Subject | None]] = []
    for signed in found.signatures:
        signer = _verifier(signed, keys)
        if signer is not None:
            named = statement(signed.payload, found.oci_manifest)
            (good if named is not None and subject.named_by(named) else elsewhere).append((signer, named))
    if good:
        digest = next((named.digest for _, named in good if named.digest), None)
        return SignatureInfo("trusted" if keys else "signed", tuple(sorted({s.fingerprint for s, _ in good})), digest,
                             trusted_keys=trusted)
    if elsewhere:
        signer, named = elsewhere[0]
        return SignatureInfo("mismatch", (signer.fingerprint,), reason=(
            f"the signature by key {signer.fingerprint[:19]}… names {named.short() if named else 'nothing'}, not "
            f"this bundle ({subject.short()})"), trusted_keys=trusted)
    carried = tuple(sorted({k.fingerprint for k in map(_carried, found.signatures) if k is not None}))
    if keys:
        who = f"signed by {', '.join(c[:19] + '…' for c in carried)}" if carried else "its signature"
        return SignatureInfo("untrusted", carried, reason=(
            f"{who} does not verify with a trusted key ({', '.join(k[:19] + '…' for k in trusted)})"),
            trusted_keys=trusted)
    if carried:
        return SignatureInfo("invalid", carried, reason="the signature does not verify with the key it carries")
    return SignatureInfo("unverifiable", reason="the signature carries no public key; give --trusted-key to check it")


def _verifier(signed: Signed, keys: tuple[PublicKey, ...]) -> PublicKey | None:
    """The key that verifies ``signed``: a trusted one, or with none given, the key it carries."""
    candidates = keys or tuple(k for k in (_carried(signed),) if k is not None)
    return next((k for k in candidates if k.verifies(signed.payload, signed.signature)), None)


def _carried(signed: Signed) -> PublicKey | None:
    if signed.public_key is None:
        return None
    try:
        return public_key(signed.public_key.encode(), "the signature's key")
    except KeyFileError:
        return None


def enforce(info: SignatureInfo, require: bool, where: str) -> None:
    """Under a policy that requires a signature, refuse anything but a trusted one (with its own exit code)."""
    if not require or info.status == "trusted":
        return
    if info.status == "unsigned":
        raise UnsignedBundle(f"{where} is not signed ({info.reason or 'no signature'}) and a signature is required "
                             "(--require-signature)")
    if info.status == "mismatch":
        raise SignatureMismatch(f"{where}: {info.reason}")
    raise UntrustedSignature(f"{where}: {info.reason}")


def check(found: SignatureFile | None, subject: Subject, policy: Policy, where: str, missing: str) -> SignatureInfo:
    """Evaluate (``found`` None: unsigned, ``missing`` saying where none was found) and enforce ``policy``."""
    keys = trusted_keys(policy.keys)  # a bad key file is refused whether or not there is a signature
    if found is None:
        info = SignatureInfo("unsigned", reason=missing, trusted_keys=tuple(sorted({k.fingerprint for k in keys})))
    else:
        try:
            info = evaluate(found, subject, keys)
        except MissingDependency as exc:  # only without trusted keys: loading them needs cryptography too
            info = SignatureInfo("unverifiable", reason=str(exc))
    enforce(info, policy.require, where)
    return info


def check_file(bundle: str | os.PathLike, policy: Policy = NO_POLICY) -> SignatureInfo:
    """The signature beside a bundle file, checked before anything of the bundle is parsed (the file is hashed
    only when a signature is there); raises under ``policy`` as ``enforce`` says."""
    path = Path(bundle)
    sig = Path(signature_path(path))
    try:
        found = SignatureFile.read(sig)
    except ValueError as exc:
        keys = trusted_keys(policy.keys)
        info = SignatureInfo("invalid", reason=f"{sig.name} is not a signature file: {exc}",
                             trusted_keys=tuple(sorted({k.fingerprint for k in keys})))
        enforce(info, policy.require, path.name)
        return info
    subject = Subject(sha256=file_sha256(path)) if found is not None else Subject()
    return check(found, subject, policy, path.name, f"no {SUFFIX} file beside it")


def file_sha256(path: str | os.PathLike) -> str:
    """The hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Recorded(Protocol):
    """What an install recorded of a bundle's signature: a cachedir ``Receipt`` (cachedir/state.py, a floor above)."""

    signature: SignatureInfo | None


def signature_info(source: str | os.PathLike | Recorded, trusted: tuple[str, ...] = ()) -> SignatureInfo:
    """Who signed a bundle file (checked now, with the ``trusted`` key files if given) or an installed bundle (its
    cachedir ``Receipt``: what its install found; ``unrecorded`` for an install from before signatures)."""
    if isinstance(source, str | os.PathLike):
        return check_file(source, Policy(False, tuple(trusted)))
    return source.signature or SignatureInfo("unrecorded", reason="installed before kernelcache recorded signatures")


# -- signing -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignResult:
    bundle: Path
    signature: Path
    signer: str  # the key's fingerprint
    algorithm: str
    sha256: str
    digest: str

    def to_dict(self) -> dict:
        return {"bundle": str(self.bundle), "signature": str(self.signature), "signer": self.signer,
                "algorithm": self.algorithm, "sha256": self.sha256, "digest": self.digest}


def sign(bundle: str | os.PathLike, key: str | os.PathLike | SigningKey) -> SignResult:
    """Sign a bundle file: verify every member (a bundle that does not verify is never signed), then write
    ``B.tar.zst.sig`` with kernelcache's payload. Signatures another key made over the same file stay."""
    signer = key if isinstance(key, SigningKey) else load_signing_key(key)
    path = Path(bundle)
    subject = Subject(file_sha256(path), _verified_digest(path))
    payload = bundle_payload(subject, path.name)
    signed = Signed(payload, signer.sign(payload), signer.public.pem)
    sig = Path(signature_path(path))
    kept, oci_manifest = _kept(sig, subject, signer.public.fingerprint)
    SignatureFile((*kept, signed), oci_manifest).write(sig)
    return SignResult(path, sig, signer.public.fingerprint, signer.public.algorithm, subject.sha256 or "",
                      subject.digest or "")


def _verified_digest(path: Path) -> str:
    from ..format.archive import bundle_digest, iter_members, read_manifest

    seen = [manifest for manifest, _, _ in iter_members(path)][-1:]  # every member read and checked
    return bundle_digest(seen[0] if seen else read_manifest(path))


def _kept(sig: Path, subject: Subject, fingerprint: str) -> tuple[tuple[Signed, ...], bytes | None]:
    """The signatures of an existing signature file that name this bundle and are not ``fingerprint``'s."""
    try:
        found = SignatureFile.read(sig)
    except ValueError:
        return (), None
    if found is None:
        return (), None
    kept = []
    for signed in found.signatures:
        named = statement(signed.payload, found.oci_manifest)
        carried = _carried(signed)
        if named is not None and subject.named_by(named) and (carried is None or carried.fingerprint != fingerprint):
            kept.append(signed)
    return tuple(kept), found.oci_manifest if kept else None
