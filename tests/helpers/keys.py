"""Real key pairs for the signature tests, written as the PEM files users keep (PKCS#8 private, SPKI public)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def write_pair(where: Path, name: str, algorithm: str = "ecdsa-p256") -> tuple[Path, Path, str]:
    """(private key file, public key file, fingerprint) of a fresh ``ecdsa-p256`` or ``ed25519`` key pair."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    key = ec.generate_private_key(ec.SECP256R1()) if algorithm == "ecdsa-p256" else ed25519.Ed25519PrivateKey.generate()
    private, public = where / f"{name}.key", where / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return private, public, "sha256:" + hashlib.sha256(der).hexdigest()
