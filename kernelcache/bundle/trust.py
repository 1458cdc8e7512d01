"""What an install demands of a bundle's signature, and key fingerprints, with the standard library alone.

The pod-start fast path (cachedir/checked.py, from kernelcache/entry.py) reads these before anything heavier is
imported; the signatures themselves are made and checked in bundle/signature.py.

A *policy* is ``require`` (refuse a bundle without a valid signature by one of ``keys``) and ``keys``, the
trusted public key files. Each comes from its flag (``--require-signature``, ``--trusted-key``) when given,
else from the environment: ``KERNELCACHE_REQUIRE_SIGNATURE`` (``1``/``true``/``yes`` or ``0``/``false``/``no``)
and ``KERNELCACHE_TRUSTED_KEYS`` (key files separated by ``:``), so an init container's command stays short.

A key's *fingerprint* is ``sha256:`` and the hex sha256 of its DER SubjectPublicKeyInfo: the bytes inside the
``-----BEGIN PUBLIC KEY-----`` block that ``openssl pkey -pubout`` and cosign write.
"""

from __future__ import annotations

import os

REQUIRE_VARIABLE = "KERNELCACHE_REQUIRE_SIGNATURE"
KEYS_VARIABLE = "KERNELCACHE_TRUSTED_KEYS"
SUFFIX = ".sig"  # the signature file beside a bundle: B.tar.zst.sig
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
_BEGIN, _END = b"-----BEGIN PUBLIC KEY-----", b"-----END PUBLIC KEY-----"


class Policy:
    """``require``: refuse a bundle without a valid signature by one of ``keys``, the trusted key files (a tuple of
    paths). A plain class: a namedtuple, typing's NamedTuple or a dataclass would cost every pod start (the fast
    path reads the policy) the import of collections, typing or dataclasses."""

    __slots__ = ("require", "keys")

    def __init__(self, require: bool, keys: tuple[str, ...]) -> None:
        self.require, self.keys = require, keys


NO_POLICY = Policy(False, ())
VALID = ("trusted", "signed")  # the statuses of a signature check that found a valid signature (bundle/signature.py)


def policy(require: bool | None = None, keys=None) -> Policy:
    """The policy from the flags, each left ``None`` falling back to its environment variable.

    ``UsageError`` for an unreadable ``KERNELCACHE_REQUIRE_SIGNATURE`` and for a requirement with no trusted key."""
    if require is None:
        text = os.environ.get(REQUIRE_VARIABLE, "").strip().lower()
        if text not in _TRUE + _FALSE:
            raise _usage_error(f"{REQUIRE_VARIABLE} must be 1 or 0 (true/false, yes/no), got {text!r}")
        require = text in _TRUE
    if keys is None:
        keys = [k for k in os.environ.get(KEYS_VARIABLE, "").split(os.pathsep) if k.strip()]
    found = Policy(bool(require), tuple(os.fspath(k) for k in keys))
    if found.require and not found.keys:
        raise _usage_error(f"--require-signature needs at least one --trusted-key (or {KEYS_VARIABLE})")
    return found


def _usage_error(message: str) -> Exception:
    from ..errors import UsageError  # here: every pod start reads a policy, and errors.py (38 classes) costs it 1-3 ms

    return UsageError(message)


def describe(signature: dict | None) -> str:
    """One phrase for people of a signature check (``SignatureInfo.to_dict()``): ``signed by sha256:1a2b3c4d5e6f…
    (a trusted key)``, ``unsigned``, ``mismatch: the signature by …``."""
    signature = signature or {"status": "unrecorded"}
    status, reason = str(signature.get("status")), signature.get("reason")
    if status not in VALID:
        return status + (f": {reason}" if reason else "")
    who = ", ".join(str(s)[:19] + "…" for s in signature.get("signers") or ())
    trust = "a trusted key" if status == "trusted" else "the key it carries; no trusted key given"
    return f"signed by {who} ({trust})"


def said(signature: dict | None) -> str:
    """What an install's line adds for a valid signature: ``; signed by sha256:1a2b… (a trusted key)``; nothing for
    an unsigned bundle (a bad signature is one of its warnings)."""
    return f"; {describe(signature)}" if signature and signature.get("status") in VALID else ""


def signature_path(bundle: str | os.PathLike) -> str:
    """Where a bundle's signature file sits: beside it, ``B.tar.zst.sig``."""
    return os.fspath(bundle) + SUFFIX


def fingerprint_der(der: bytes) -> str:
    """The fingerprint of a DER SubjectPublicKeyInfo."""
    from ..hooks.kernelcache_records import sha256_hex

    return "sha256:" + sha256_hex(der)


def pem_der(data: bytes) -> bytes | None:
    """The DER bytes of a file holding one PEM public key, or None for anything else (the caller then reads it
    with the cryptography package, which says what is wrong with it)."""
    if data.count(b"-----BEGIN") != 1 or data.count(_BEGIN) != 1 or data.count(_END) != 1:
        return None
    import base64  # here: only a policy with trusted keys reads one, and base64 costs a no-op install 5-25 ms
    import binascii

    body = data.partition(_BEGIN)[2].partition(_END)[0]
    try:
        return base64.b64decode(b"".join(body.split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def pem_fingerprint(data: bytes) -> str | None:
    """The fingerprint of a file holding one PEM public key, or None (``pem_der``)."""
    der = pem_der(data)
    return fingerprint_der(der) if der is not None else None


def key_fingerprints(keys) -> tuple[str, ...] | None:
    """The sorted fingerprints of the key files ``keys``, or None when one cannot be read this way."""
    found = []
    for key in keys:
        try:
            with open(key, "rb") as handle:
                found.append(pem_fingerprint(handle.read(1 << 16)))
        except OSError:
            return None
    return None if None in found else tuple(sorted(set(found)))  # type: ignore[arg-type]
