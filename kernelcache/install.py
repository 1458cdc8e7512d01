"""Install a bundle into a Triton cache directory: plan first, then execute atomically.

``plan_install`` only reads: the bundle's signature (bundle/signature.py: checked against the policy before
anything of the bundle is parsed, so a refused bundle leaves nothing behind), the manifest, this environment's
fingerprint, the visible GPUs and what the cache already holds. The fingerprint comes from the record the cache
dir keeps of it (cachedir/fingerprints.py) when the ``EnvironmentKey`` it was computed under still holds; only
otherwise is Triton imported and libtriton hashed, and the new record is kept once the bundle is
installed (or found installed). A bundle already installed is thus checked without importing Triton or torch. It returns
an ``InstallPlan`` that says what would happen and why a bundle would be refused.
``InstallPlan.execute`` then, under a per-cache-dir file lock:

1. rolls forward an install a killed process left half-published, and removes stale staging dirs
   and temporary files;
2. returns at once if another process installed the same bundle meanwhile;
3. extracts into ``<cache>/.kernelcache/staging/`` (same filesystem), verifying every member's
   size and sha256 before anything is renamed; each Triton group file is checked and written
   pointing at the final absolute paths; a vLLM compile tree's AOT directories are unpacked there
   too (cachedir/vllm_tree.py), entries of the bundle like the others;
4. writes, before publishing anything, a journal of the entries to publish and the receipt under a
   pending name (so the publish step allocates no space); renames each entry into place (a whole
   directory in one ``rename`` where the key is new; file by file, group file last, where Triton
   left a partial one; complete entries already there are left alone); renames the receipt into
   place; drops the journal.

What a reader can see (docs/RELIABILITY.md): never a partial entry, because Triton only trusts an
entry once its group file exists and every entry appears in one rename. The receipt, which is
what kernelcache itself trusts, appears only once every entry is in place. A kill during the
publish step can leave a subset of complete entries and a journal; the next kernelcache command
on that cache dir (install, env, run, activate) completes it. An ``OSError`` during the publish
step (a full disk, a permission change) moves the entries published so far back out, so the
cache is as it was.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .bundle.signature import SignatureInfo, check_file
from .bundle.trust import NO_POLICY, Policy, policy, signature_path
from .cachedir import CacheDir, Journal, Receipt, atomic_write, publish_entries, recover
from .cachedir.checked import Checked, bundle_identity, find_checked, remember_checked
from .cachedir.fingerprints import load_fingerprint, save_fingerprint, save_triton_key, seed_triton_key
from .cachedir.flashinfer_site import write_site
from .cachedir.layout import LOCK, SKELETON
from .cachedir.vllm_tree import stage
from .errors import (
    ArchMismatch,
    EntryError,
    FingerprintMismatch,
    IntegrityError,
    KernelcacheError,
    SignatureMismatch,
    StorageError,
)
from .format import archive
from .format.cachekey import KEY_PATTERN
from .format.envkey import EnvironmentKey, KnownEnvironment, environment_key
from .format.envscan import distribution_version, gpu_witness, package_dir
from .format.fingerprint import Difference, choices_refusal, compare, compare_gpu, local_environment
from .format.identity import environment_from
from .format.manifest import AUTOTUNE_SUFFIX, Environment, Kernel, Manifest
from .plan.gpus import GpuProbe


@dataclass(frozen=True)
class InstallResult:
    cache_dir: Path
    digest: str
    action: str  # "installed" | "already-installed"
    written: int = 0
    present: int = 0
    seconds: float = 0.0
    warnings: tuple[str, ...] = ()
    signature: SignatureInfo | None = None  # who signed the bundle, as this install checked it
    choices: str = ""  # the bundle's autotune choices: "installed", "skipped" (timed on another product), "": none

    def to_dict(self) -> dict:
        return {**asdict(self), "cache_dir": str(self.cache_dir), "warnings": list(self.warnings),
                "signature": self.signature.to_dict() if self.signature is not None else None}


@dataclass(frozen=True)
class InstallPlan:
    bundle: Path
    manifest: Manifest
    digest: str
    cache_dir: Path
    differences: tuple[Difference, ...] = ()
    force: bool = False
    limits: archive.Limits = field(default_factory=archive.Limits.from_env)
    fingerprint: KnownEnvironment | None = None  # computed for this plan: kept once the bundle is accepted
    triton_key: str | None = None  # triton_key() here, known from the bundle's identity record
    checked_under: str | None = None  # the EnvironmentKey digest the fingerprint was taken or found under
    gpu: str | None = None  # the GPU witness taken before the probe ran (None: no GPU check)
    identity: list[int] | None = None  # the bundle file's, taken before its manifest was read
    signature: SignatureInfo | None = None  # the bundle's signature, checked before its manifest was read
    signature_identity: list[int] | None = None  # the signature file's, taken before it was read
    choices_skipped: str | None = None  # why its autotune choices stay out (timed on another GPU product)
    serve: str | None = None  # the command the server runs, for a compile artifact's hash (default: the bundle's)

    @property
    def blocking(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differences if d.blocking)

    @property
    def choices(self) -> bool:
        """Whether the bundle's autotune choices are installed with its kernels."""
        return self.manifest.tuning is not None and self.choices_skipped is None

    @property
    def choices_state(self) -> str:
        return "" if self.manifest.tuning is None else "installed" if self.choices else "skipped"

    @property
    def already_installed(self) -> bool:
        return CacheDir(self.cache_dir).installed_complete(self.digest, self.manifest, self.choices)

    def check(self) -> list[str]:
        """Raise if the bundle would miss here (unless forced); return warnings."""
        if self.blocking and not self.force:
            cls = ArchMismatch if all(d.field.startswith("gpu[") for d in self.blocking) else FingerprintMismatch
            raise cls(
                f"bundle {self.bundle.name} was built for another environment ({len(self.blocking)} field(s) "
                f"differ); its kernels would be recompiled here. --force installs it anyway",
                [(d.field, d.bundle, d.local) for d in self.blocking],
            )
        warnings = [f"{d.field}: bundle {d.bundle}, here {d.local} ({d.why})" for d in self.differences]
        if self.signature is not None and not self.signature.valid and self.signature.status != "unsigned":
            warnings.append(f"signature: {self.signature.describe()}")
        if self.blocking:
            warnings.insert(0, "FORCED: installing a bundle whose fingerprint does not match; expect compiles")
        if self.choices_skipped and self.manifest.tuning is not None:
            warnings.append(self.choices_skipped)
        return warnings

    def execute(self) -> InstallResult:
        warnings = tuple(self.check())
        started = time.perf_counter()
        if self.manifest.engine is not None and not self.force:
            from .enginecompile import check_bundle

            # vLLM's hash here: refused (exit 23) before anything is written
            check_bundle(self.bundle, self.limits, self.serve)
        cache = CacheDir(self.cache_dir)
        if self.already_installed and not cache.pending_journals():  # else: under the lock, rolled forward first
            self._keep_fingerprint(cache)
            return InstallResult(self.cache_dir, self.digest, "already-installed", seconds=0.0, warnings=warnings,
                                 signature=self.signature, choices=self.choices_state)
        # What a refused install removes again: the dirs it is about to create, deepest first.
        made = [d for d in (cache.state, *cache.state.parents) if not d.exists()]
        cache.ensure_state()
        try:
            with cache.locked():
                recover(cache, locked=True)
                if self.already_installed:
                    self._keep_fingerprint(cache)
                    return InstallResult(self.cache_dir, self.digest, "already-installed",
                                         seconds=time.perf_counter() - started, warnings=warnings,
                                         signature=self.signature, choices=self.choices_state)
                written, present = _install_locked(self, cache)
                if self.manifest.flashinfer:
                    write_site(self.cache_dir)  # FlashInfer's provider registration, while the dir is writable
        except BaseException as exc:
            remove_skeleton(cache, made)
            if isinstance(exc, OSError):
                raise StorageError(f"cannot install into {self.cache_dir}: {exc.strerror or exc}") from None
            raise
        self._keep_fingerprint(cache)  # only once installed: a bundle refused while extracting leaves nothing
        return InstallResult(self.cache_dir, self.digest, "installed", written, present,
                             time.perf_counter() - started, warnings, self.signature, self.choices_state)

    def _keep_fingerprint(self, cache: CacheDir) -> None:
        if self.fingerprint is not None:
            save_fingerprint(cache, self.fingerprint)
            save_triton_key(cache, self.fingerprint.key, self.triton_key)

    def remember(self) -> None:
        """After an install or no-op that found no blocking difference: keep what it was checked against and the
        warnings it gave, so the next no-op install of this file answers (with the same warnings) without reading
        it (cachedir/checked.py). A forced install is never kept: it is checked, and said loudly, every time."""
        if self.blocking or self.checked_under is None or self.identity is None or self.manifest.engine is not None:
            return  # a compile artifact is checked against vLLM's hash here at every install
        from .remote import fits

        files = [f.path for f in self.manifest.files(self.choices)]
        signed = (self.signature_identity, self.signature.to_dict() if self.signature is not None else None)
        remember_checked(CacheDir(self.cache_dir), self.bundle, self.identity, self.digest, files,
                         self.checked_under, self.gpu, self.check(), signed, self.choices_state, fits(self.manifest))


def remove_skeleton(cache: CacheDir, made: list[Path]) -> None:
    """After a refused install into a cache dir it created (``made``: the state dir, then the cache dir, those that
    were absent): remove them again while they hold nothing but the empty state skeleton (the lock file, empty
    ``staging``, ``installed`` and ``journal`` dirs). A journal that stays (publishing began) keeps everything."""
    if cache.state not in made:
        return
    for sub in SKELETON:
        with contextlib.suppress(OSError):
            (cache.state / sub).rmdir()
    with contextlib.suppress(OSError):
        (cache.state / LOCK).unlink()
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty: anything another process wrote meanwhile stays


def plan_install(bundle: str | os.PathLike, cache_dir: str | os.PathLike | None = None, force: bool = False,
                 check_gpu: bool = True, limits: archive.Limits | None = None,
                 signature_policy: Policy = NO_POLICY, signature: SignatureInfo | None = None) -> InstallPlan:
    """The plan for a bundle file. Its signature (``B.tar.zst.sig``) is checked first: under ``signature_policy``
    an unsigned bundle or one no trusted key signed is refused before anything of it is read. ``signature``: the
    check already made where the file came from (a registry's signature of the manifest that pinned its bytes)."""
    return plan_install_at(bundle, CacheDir.at(cache_dir), force, check_gpu, limits, signature_policy, signature)


def plan_install_at(bundle: str | os.PathLike, cache: CacheDir, force: bool = False, check_gpu: bool = True,
                    limits: archive.Limits | None = None, signature_policy: Policy = NO_POLICY,
                    signature: SignatureInfo | None = None) -> InstallPlan:
    """``plan_install`` into a cache dir already resolved."""
    path = Path(bundle)
    lim = limits or archive.Limits.from_env()
    identity = bundle_identity(path)
    signature_identity = bundle_identity(signature_path(path))
    signature = signature or check_file(path, signature_policy)
    witness = gpu_witness() if check_gpu and not os.environ.get("KERNELCACHE_NO_GPU_PROBE") else None
    probe = GpuProbe.start() if check_gpu else None  # its child starts while the manifest is read
    try:
        manifest, member = archive.read_manifest_member(path, lim)
        root = cache.root
        digest = archive.bundle_digest(manifest, member, known=lambda d: cache.receipt_path(d).is_file())
        if signature.digest is not None and signature.digest != digest:
            raise SignatureMismatch(f"{path.name}: its signature names bundle {signature.digest[:16]}…, and the file "
                                    f"now holds {digest[:16]}… (it changed while it was read)")
        plan = plan_install_manifest(path, manifest, root, force, check_gpu, lim, probe, digest)
        if (plan.blocking and not force) or plan.already_installed:
            # Only the manifest was read: a damaged file whose manifest still parses must be refused as damaged,
            # not as built for another environment, nor answered "already installed" because a good copy was
            # (its record then answers the next no-op of this file unread). An accepted bundle is checked by
            # extracting it.
            for _ in archive.iter_members(path, lim):
                pass
        return replace(plan, gpu=witness, identity=identity, signature=signature,
                       signature_identity=signature_identity)
    finally:
        if probe is not None:
            probe.close()


def plan_install_manifest(path: Path, manifest: Manifest, cache_dir: Path, force: bool = False,
                          check_gpu: bool = True, limits: archive.Limits | None = None,
                          probe: GpuProbe | None = None, digest: str | None = None) -> InstallPlan:
    """The plan for a bundle whose manifest is already read (from the file, or from a receipt).

    ``probe``: a GPU probe already started; ``digest``: the manifest's digest when already known."""
    lim = limits or archive.Limits.from_env()
    check_entries(manifest)
    here = Fingerprinted(None)
    try:
        here = environment_here(manifest.environment.ptxas or [manifest.target.arch], CacheDir(cache_dir), manifest)
    except KernelcacheError:
        if not force:
            raise
    # Versions as importlib.metadata finds them, read without importing it (envscan.distribution_version: ~15 ms).
    tvm_ffi = distribution_version("apache-tvm-ffi") if manifest.flashinfer else None
    differences = compare(manifest, here.environment, tvm_ffi=tvm_ffi) if here.environment is not None else []
    skipped = None
    if check_gpu:
        gpus = (probe or GpuProbe.start()).result()
        differences += compare_gpu(manifest.target, gpus, manifest.device_keys)
        skipped = choices_refusal(manifest.tuning, gpus)
    return InstallPlan(path, manifest, digest or archive.bundle_digest(manifest), cache_dir, tuple(differences),
                       force, lim, here.record, here.triton_key, here.key.digest if here.key else None,
                       choices_skipped=skipped)


@dataclass(frozen=True)
class Fingerprinted:
    """This environment's fingerprint, the record to keep when it had to be taken, and ``triton_key()``
    when the bundle's identity record gave it."""

    environment: Environment | None
    record: KnownEnvironment | None = None
    triton_key: str | None = None
    key: EnvironmentKey | None = None  # what it was taken or found under; None when that changed meanwhile


def environment_here(archs: Iterable[str], cache: CacheDir, manifest: Manifest | None = None) -> Fingerprinted:
    """This environment's fingerprint, from the cheapest source that is certain:

    1. the cache dir's record, when it was computed under the key that holds now (it names every file,
       binary and variable the fingerprint reads) and covers ``archs``;
    2. the bundle's identity record (format/identity.py), when this Triton's files are the ones it names
       (by content: a few ms) and nothing here makes Triton read another ptxas or another variable;
    3. Triton itself (an import and ``triton_key()``'s hash of libtriton.so).
    A key that changed meanwhile (a pip running beside us) yields no record to keep."""
    wanted = set(archs)
    key = environment_key()
    known = load_fingerprint(cache, key)
    if known is not None and known.covers(key, wanted):
        return Fingerprinted(known.environment, key=key)
    identity = manifest.triton_identity if manifest is not None else None
    if identity is not None and key.triton:
        found = environment_from(identity, manifest.environment, sorted(wanted), package_dir("triton"),
                                 distribution_version)
        if found is not None:
            stable = environment_key() == key
            return Fingerprinted(found, KnownEnvironment(key, found) if stable else None, identity.triton_key,
                                 key if stable else None)
    seed_triton_key(cache)  # an earlier install's, if Triton's files still hold it: no libtriton hash
    environment = local_environment(sorted(wanted | set(known.environment.ptxas if known else ())))
    stable = environment_key() == key
    return Fingerprinted(environment, KnownEnvironment(key, environment) if stable else None, None,
                         key if stable else None)


def install_if_present(digest: str, cache: CacheDir, force: bool = False, check_gpu: bool = True, source: str = "",
                       accept: Callable[[Manifest], None] | None = None,
                       signature: SignatureInfo | None = None) -> InstallResult | None:
    """The bundle ``digest`` is already installed in ``cache``: check it against this environment
    (from its receipt's manifest) as an install would, and return the no-op result. ``None``: not there.
    ``signature``: what the check of the bundle's signature found (at its source), for the result."""
    receipt = cache.receipt(digest)  # a bad receipt is not found: a real install replaces it
    if receipt is None:
        return None
    manifest = receipt.manifest
    if archive.bundle_digest(manifest) != digest or not cache.installed_complete(digest, manifest,
                                                                                 receipt.choices):
        return None
    root = cache.root
    if accept is not None:
        accept(manifest)
    plan = plan_install_manifest(Path(source or digest), manifest, root, force, check_gpu)
    plan = replace(plan, signature=signature)
    if not plan.already_installed:  # its autotune choices were left out, and this GPU takes them: install it
        return None
    return plan.execute()


def install(bundle: str | os.PathLike, cache_dir: str | os.PathLike | None = None, force: bool = False,
            check_gpu: bool = True, limits: archive.Limits | None = None, arch: str | None = None,
            gpu: str | None = None, require_signature: bool | None = None,
            trusted_keys: Sequence[str | os.PathLike] | None = None, serve: str | None = None) -> InstallResult:
    """Verify, check against this environment, and publish a bundle. Idempotent.

    ``bundle`` is a file, a URL (``file://``, ``http(s)://``, ``s3://``, ...) or ``oci://HOST/REPO:TAG``;
    ``arch`` / ``gpu`` pick the bundle from an OCI index and refuse a bundle built for anything else.
    An ``oci://`` bundle already installed is found from three registry manifest reads, with no download.
    ``require_signature`` / ``trusted_keys`` (None: ``KERNELCACHE_REQUIRE_SIGNATURE`` / ``KERNELCACHE_TRUSTED_KEYS``):
    refuse a bundle that no trusted key signed, before anything is downloaded, extracted or published
    (bundle/trust.py). ``--force`` does not override a signature policy. ``serve``: the command the server runs, which
    a bundle's compile artifact is checked against (vLLM's hash of it here; default: the bundle's serve command).
    """
    cache, signature_policy = CacheDir.at(cache_dir), policy(require_signature, trusted_keys)
    if limits is None:  # a bundle given explicit limits is read again under them
        found = find_checked(bundle, cache.root, check_gpu, signature_policy, arch, gpu)
        if found is not None:
            return checked_result(found)
    return install_into(bundle, cache, force, check_gpu, limits, arch, gpu, signature_policy, serve=serve)


def checked_result(found: Checked) -> InstallResult:
    """The no-op install's result, from the record of the check that accepted the bundle here before."""
    return InstallResult(Path(found.cache_dir), found.digest, "already-installed", warnings=found.warnings,
                         signature=SignatureInfo.from_dict(found.signature), choices=found.choices)


def install_into(bundle: str | os.PathLike, cache: CacheDir, force: bool = False, check_gpu: bool = True,
                 limits: archive.Limits | None = None, arch: str | None = None, gpu: str | None = None,
                 signature_policy: Policy = NO_POLICY, serve: str | None = None) -> InstallResult:
    """``install`` into a cache dir already resolved, under a signature policy already read, once its caller asked
    whether this bundle file was checked here before (cachedir/checked.py ``find_checked``: the command's front
    door asks, once) and had no answer."""
    from .remote import check_target, check_wanted, is_remote, local_bundle

    source: str | os.PathLike = bundle
    signature = None
    check_wanted(arch, gpu)  # a bad or unknown arch / gpu fails before any bundle is read or the registry asked
    if str(bundle).startswith("oci://"):
        from .remote.oci import resolve_bundle

        digest, source, signature = resolve_bundle(str(bundle), arch, gpu, signature_policy)
        result = install_if_present(digest, cache, force, check_gpu, source=str(bundle),
                                    accept=lambda manifest: check_target(manifest, arch, gpu, str(bundle)),
                                    signature=signature)
        if result is not None:
            return result
    with local_bundle(source, arch=arch, gpu=gpu) as path:
        # An oci:// download's bytes are the ones its checked signature names (the pinned manifest's layer digest).
        plan = plan_install_at(path, cache, force, check_gpu, limits, signature_policy, signature)
        plan = replace(plan, serve=serve)
        result = plan.execute()
        if not is_remote(source):
            plan.remember()
        return result


# -- checks on what a bundle declares --------------------------------------------------------------


def check_entries(manifest: Manifest) -> None:
    """Every kernel and module lives in its own Triton key dir; a kernel has its metadata and group; an autotune
    choice is one ``<key>/<kernel>.autotune.json`` in a key dir of its own."""
    for item in (*manifest.kernels, *manifest.modules):
        kind = "kernel" if isinstance(item, Kernel) else "module"
        if not KEY_PATTERN.fullmatch(item.key):
            raise EntryError(f"{kind} key {item.key!r} is not a Triton cache key")
        names = {f.path for f in item.files}
        outside = sorted(p for p in names if os.path.dirname(p) != item.key)
        if outside:
            raise EntryError(f"{kind} {item.key} lists {outside[0]!r}, outside its own directory")
        if isinstance(item, Kernel):
            needed = {f"{item.key}/{item.name}.json", f"{item.key}/__grp__{item.name}.json"}
            if not needed <= names:
                raise EntryError(f"kernel {item.name} ({item.key}) lacks {sorted(needed - names)[0]!r}")
    if manifest.tuning is not None:
        check_choices(manifest)


def check_choices(manifest: Manifest) -> None:
    """Each autotune file alone in a Triton key dir that no kernel, module or other choice uses."""
    taken = {os.path.dirname(f.path) for f in manifest.files(choices=False)}
    for record in manifest.tuning.files:
        key, _, name = record.path.partition("/")
        if not KEY_PATTERN.fullmatch(key) or "/" in name or not name.endswith(AUTOTUNE_SUFFIX):
            raise EntryError(f"autotune choice {record.path!r} is not <key>/<kernel>{AUTOTUNE_SUFFIX}")
        if key in taken:
            raise EntryError(f"autotune choice {record.path!r} shares its key dir with another entry")
        taken.add(key)


# -- staging and publishing (the cache dir's own state: cachedir/) --------------------------------


def entry_dirs(manifest: Manifest, choices: bool = True) -> list[str]:
    """The directories a bundle publishes, relative to the cache root (one per kernel, module or choice)."""
    return sorted({os.path.dirname(f.path) for f in manifest.files(choices)})


def _install_locked(plan: InstallPlan, cache: CacheDir) -> tuple[int, int]:
    staging = cache.staging / f"{plan.digest[:16]}-{os.getpid()}"
    journal = cache.journal_path(plan.digest)
    try:
        extracted = archive.extract(plan.bundle, staging, plan.limits,
                                    rewrite=relocated_groups(plan.manifest, plan.cache_dir))
        if extracted != plan.manifest:  # what was planned (and its signature checked) is what gets published
            raise IntegrityError(f"{plan.bundle.name} changed while it was installed: it holds another bundle now")
        # vLLM's AOT directories, unpacked in staging: published as entries, so none is missing once the receipt is in
        entries = sorted({*entry_dirs(plan.manifest, plan.choices), *stage(staging, plan.manifest)})
        receipt = Receipt(plan.digest, plan.manifest, tuple(entries), str(plan.bundle), str(plan.cache_dir),
                          time.time(), os.getpid(), plan.signature,
                          plan.choices_skipped if plan.choices_state == "skipped" else "")
        pending = cache.receipt_path(plan.digest).with_name(f".{plan.digest}.json.pending")
        atomic_write(pending, receipt.to_json().encode())
        try:
            atomic_write(journal, Journal(staging.name, tuple(entries), receipt).to_json().encode())
        except BaseException:
            pending.unlink(missing_ok=True)  # no journal, nothing published: leave no receipt-sized file either
            raise
        written, present = _publish_or_undo(plan.cache_dir, staging, entries, pending, journal)
    finally:
        # A journal still there means publishing began and was cut short (Ctrl-C, SIGTERM, an undo that
        # failed): its staging dir is what the next command's roll-forward publishes, so it stays.
        if not journal.exists():
            shutil.rmtree(staging, ignore_errors=True)
    with contextlib.suppress(OSError):  # the install is complete; a full disk only loses the log line
        cache.log({"event": "extracted", "digest": plan.digest, "pid": os.getpid(), "written": written,
                   "present": present, "time": time.time()})
    return written, present


def _publish_or_undo(cache_dir: Path, staging: Path, entries: list[str], pending: Path,
                     journal: Path) -> tuple[int, int]:
    """Publish, then the receipt; on an OSError move back what this call published, then re-raise."""
    moved: list[tuple[Path, Path]] = []
    try:
        counts = publish_entries(cache_dir, staging, entries, moved)
        os.replace(pending, pending.with_name(pending.name.removeprefix(".").removesuffix(".pending")))
    except OSError:
        if _undo(moved):
            journal.unlink(missing_ok=True)
            pending.unlink(missing_ok=True)
        raise
    journal.unlink()
    return counts


def _undo(moved: list[tuple[Path, Path]]) -> bool:
    """Move published entries back into staging. False: the journal must stay to roll forward."""
    try:
        for source, target in reversed(moved):
            os.rename(target, source)
    except OSError:
        return False
    return True


def relocated_groups(manifest: Manifest, cache_dir: Path) -> dict[str, Callable[[bytes], bytes]]:
    """What each kernel's group file becomes on disk: checked, and its children pointed at their final
    absolute paths (Triton's group files name their children by absolute path, so a moved cache would miss).
    Applied by the extraction while the file is in memory."""
    return {f"{k.key}/__grp__{k.name}.json": functools.partial(_relocated, k, cache_dir) for k in manifest.kernels}


def _relocated(kernel: Kernel, cache_dir: Path, data: bytes) -> bytes:
    present = {os.path.basename(f.path) for f in kernel.files}
    final = {}
    for name, rel in _group_children(data, kernel).items():
        base = os.path.basename(rel)
        if base not in present or base.startswith("__grp__"):
            raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) names {rel!r}, not in its entry")
        final[name] = str(cache_dir / kernel.key / base)
    if f"{kernel.name}.json" not in final:
        raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) does not list {kernel.name}.json")
    return json.dumps({"child_paths": final}).encode()


def _group_children(data: bytes, kernel: Kernel) -> dict[str, str]:
    try:
        children = json.loads(data)["child_paths"]
    except (ValueError, KeyError, TypeError) as exc:
        raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) is malformed: {exc!r}") from None
    if not isinstance(children, dict) or not all(isinstance(v, str) for v in children.values()):
        raise EntryError(f"group file of kernel {kernel.name} ({kernel.key}) has no child_paths mapping")
    return children
