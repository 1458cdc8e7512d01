#!/usr/bin/env python3
"""What a signature check adds to an install: one bundle installed unsigned, signed, and signed under a policy.

    python scripts/bench_signature.py --bundle B [--runs 15] [--key-type ecdsa-p256|ed25519] [--parts]
                                      [--before DIR]

The variants, each with its own copy of B (so each keeps its own record of an accepted install):

* ``before`` (with ``--before DIR``, a kernelcache tree from before signatures, e.g. ``git archive main``): B
  alone, that tree's code: what an unsigned install cost before;
* ``unsigned``: B alone, no policy: what every install did before signatures (the signature path is one ``stat``);
* ``checked``: B with ``B.sig`` (``kernelcache sign``), no policy: the signature is checked with the key it carries
  and reported;
* ``policy``: B with ``B.sig``, ``--require-signature --trusted-key PUB``.

The scenarios: ``cold-install`` (into a fresh cache dir: the check hashes the file, imports cryptography and
verifies, before anything of the bundle is read), ``noop-install`` (answered from the kept record: the signature
file's ``stat`` and the trusted key's fingerprint, computed with the standard library), ``run-bundle``
(``run --bundle B -- /bin/true``, the same record; reported as the time added to ``/bin/true``). Rounds interleave
the variants and each runs the commands as scripts/bench_podstart.py does (its helpers: a bare venv that sees
``--python``'s packages but not its ``.pth`` files, an empty working dir, byte-compiled sources), so the medians
differ by the check alone. ``--parts`` also times, in fresh processes, the check's pieces: hashing B, importing
cryptography, loading the key and verifying.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_podstart as podstart  # noqa: E402 -- the pod-start benchmark's runner, shared

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("cold-install", "noop-install", "run-bundle")
VARIANTS = ("unsigned", "checked", "policy")

KEYGEN = r"""
import sys
from pathlib import Path
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
key = ec.generate_private_key(ec.SECP256R1()) if sys.argv[1] == "ecdsa-p256" else ed25519.Ed25519PrivateKey.generate()
Path(sys.argv[2]).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()))
Path(sys.argv[3]).write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                            serialization.PublicFormat.SubjectPublicKeyInfo))
"""

PARTS = r"""
import json, sys, time
import dataclasses, typing  # what the installer has imported by the time it checks a signature
parts, t = {}, time.perf_counter()
from kernelcache.bundle.signature import SignatureFile, Subject, evaluate, file_sha256, load_public_key
parts["import kernelcache.bundle.signature"] = time.perf_counter() - t; t = time.perf_counter()
sha256 = file_sha256(sys.argv[1])
parts["sha256 of the bundle file"] = time.perf_counter() - t; t = time.perf_counter()
keys = (load_public_key(sys.argv[2]),)
parts["read the trusted key (imports cryptography's key module)"] = time.perf_counter() - t; t = time.perf_counter()
info = evaluate(SignatureFile.read(sys.argv[1] + ".sig"), Subject(sha256=sha256), keys)
assert info.status == "trusted", info
parts["read the signature file and verify (the first ECDSA check imports its backend)"] = time.perf_counter() - t
print(json.dumps(parts))
"""


class Variant(podstart.Source):
    """A pod-start source whose install and run commands carry the variant's signature flags."""

    def __init__(self, label: str, python: str, bundle: Path, work: Path, flags: list[str], root: Path = ROOT):
        super().__init__(label, root, python, bundle, work)
        self.flags = flags

    def argv(self, scenario: str) -> list[str]:
        argv = super().argv(scenario)
        if scenario == "run-bundle":
            at = argv.index("--")
            return argv[:at] + self.flags + argv[at:]
        return argv + self.flags

    def prepare(self) -> None:
        super().prepare()
        podstart.timed(self.argv("noop-install"), self.env)  # the record under this variant's policy


def variants(python: str, bundle: Path, work: Path, key_type: str, before: Path | None) -> list[Variant]:
    keys = work / "keys"
    keys.mkdir(parents=True)
    private, public = keys / "kernelcache.key", keys / "kernelcache.pub"
    subprocess.run([python, "-c", KEYGEN, key_type, str(private), str(public)], check=True)
    made = []
    if before is not None:
        copy = work / "bundles" / "before" / bundle.name
        copy.parent.mkdir(parents=True)
        shutil.copy(bundle, copy)
        made.append(Variant("before", python, copy, work, [], before.resolve()))
    for label in VARIANTS:
        copy = work / "bundles" / label / bundle.name
        copy.parent.mkdir(parents=True)
        shutil.copy(bundle, copy)
        flags = ["--require-signature", "--trusted-key", str(public)] if label == "policy" else []
        made.append(Variant(label, python, copy, work, flags))
        if label != "unsigned":
            subprocess.run(made[-1].kc("sign", str(copy), "--key", str(private)), check=True, env=made[-1].env,
                           cwd=podstart.quiet_dir(), capture_output=True)
    return made


def measure(sources: list[Variant], runs: int) -> dict:
    """{variant: {scenario: [(wall, cpu) seconds per round]}}; "direct" is /bin/true run directly."""
    results: dict = {s.label: {k: [] for k in (*SCENARIOS, "direct")} for s in sources}
    for _ in range(runs):
        for source in sources:
            for scenario in SCENARIOS:
                results[source.label][scenario].append(podstart.timed(source.argv(scenario), source.env))
            results[source.label]["direct"].append(podstart.timed(["/bin/true"], source.env))
            for cold in source.work.glob("cold*"):
                shutil.rmtree(cold, ignore_errors=True)
    return results


def render(results: dict, runs: int) -> str:
    """Per scenario and variant: median wall [IQR] and median CPU (user + sys of the process tree), and each
    median's difference from the baselines'. CPU time is what a loaded box perturbs least."""
    bases = [b for b in ("before", "unsigned") if b in results]
    header = " | ".join(f"vs `{b}`: wall / CPU (ms)" for b in bases)
    lines = [f"| scenario | variant | median wall (ms) | IQR (ms) | median CPU (ms) | {header} |",
             "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in bases) + " |"]

    def median(label: str, scenario: str, which: int) -> float:
        return statistics.median(r[which] for r in results[label][scenario])

    for scenario in SCENARIOS:
        for label, rows in results.items():
            shift = [median(label, "direct", i) if scenario == "run-bundle" else 0.0 for i in (0, 1)]
            wall = podstart.summary([r[0] for r in rows[scenario]])
            added = [f"{(median(label, scenario, 0) - median(b, scenario, 0)) * 1e3:+.1f} / "
                     f"{(median(label, scenario, 1) - median(b, scenario, 1)) * 1e3:+.1f}" if b != label else ""
                     for b in bases]
            lines.append(f"| {scenario} | {label} | **{(wall['median'] - shift[0]) * 1e3:.1f}** | "
                         f"{(wall['p25'] - shift[0]) * 1e3:.1f}-{(wall['p75'] - shift[0]) * 1e3:.1f} | "
                         f"{(median(label, scenario, 1) - shift[1]) * 1e3:.1f} | " + " | ".join(added) + " |")
    return "\n".join(lines) + f"\n\n{runs} interleaved rounds; run-bundle: the time added to /bin/true run directly."


def parts(source: Variant, public: Path, runs: int) -> str:
    rows: dict[str, list[float]] = {}
    for _ in range(runs):
        done = subprocess.run([source.python, "-c", PARTS, str(source.bundle), str(public)], env=source.env,
                              capture_output=True, text=True, cwd=podstart.quiet_dir(), check=True)
        for name, seconds in json.loads(done.stdout).items():
            rows.setdefault(name, []).append(seconds)
    lines = ["| part of a check (fresh process) | median (ms) | min-max (ms) |", "| --- | --- | --- |"]
    lines += [f"| {name} | {statistics.median(v) * 1e3:.1f} | {min(v) * 1e3:.1f}-{max(v) * 1e3:.1f} |"
              for name, v in rows.items()]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", required=True, type=Path)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--key-type", choices=("ecdsa-p256", "ed25519"), default="ecdsa-p256")
    parser.add_argument("--parts", action="store_true", help="Also time the pieces of a check.")
    parser.add_argument("--before", type=Path, default=None, help="A kernelcache tree from before signatures.")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kc-signature-"))
    python = podstart.bare_venv(args.python, work / "venv", [])
    sources = variants(python, args.bundle.resolve(), work, args.key_type, args.before)
    print(f"before: {podstart.machine(python)}", flush=True)
    for source in sources:
        source.prepare()
        source.check_imported()
    print(render(measure(sources, args.runs), args.runs))
    if args.parts:
        print(parts(sources[-1], work / "keys" / "kernelcache.pub", args.runs))
    version = subprocess.run([python, "-c", "import cryptography; print(cryptography.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    print(f"after: {podstart.machine(python)}; cryptography {version}; {args.key_type} key")
    print(f"trees: {', '.join(f'{s.label}={s.root} ({s.commit()})' for s in sources)}; bundle: {args.bundle} "
          f"({args.bundle.stat().st_size / 2**20:.2f} MiB)")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
