"""One cache directory and the state kernelcache keeps in it: nothing else knows this layout.

A cache dir is a Triton cache (one directory per cache key, as Triton lays it out) plus kernelcache's
own state under ``<cache>/.kernelcache/``:

* ``lock``: the file lock every writer of the state holds (install, roll-forward, sweep);
* ``installed/<digest>.json``: one ``Receipt`` per installed bundle, written last, so it exists
  only once every entry of the bundle is in place;
* ``journal/<digest>.json``: the entries an install is publishing and the receipt it will write;
  a journal left behind by a killed install is rolled forward (``recover``) by the next command;
* ``staging/``: bundles being extracted on the same filesystem, so publishing is a rename;
* ``flashinfer/site-<digest>/``: FlashInfer's provider registration for the installed modules
  (``flashinfer_site.py``);
* ``fingerprints/<key digest>.json``: environment fingerprints computed here before, each with the
  key it holds for (``fingerprints.py``), so an installed bundle is checked without importing Triton;
* ``checked/<hash of a bundle path>.json``: what an accepted install of that bundle file was checked against
  (``checked.py``), so the next no-op install answers without reading the bundle;
* ``served/<hash of its inputs>.json``: the variables ``env`` / ``run`` computed, with the stamps they rested on
  (runtime/served.py), so the next pod start only checks them;
* ``log.jsonl``: one line per finished install.

``layout.py`` says where a cache dir and its state are, as strings (what the pod-start fast path reads with
the standard library alone), and holds the one table of the names above. ``state.py`` owns ``CacheDir``, the value
a verb resolves its cache dir into once (``CacheDir.at``) and hands down, with the paths, the lock and the receipts
(parsed in one place: a receipt that is not JSON, lacks its digest, or whose manifest does not parse is *bad*;
lookups ignore it and an install replaces it, a read-only base refuses it). ``publish.py`` owns journals,
publishing and recovery.
"""

# Loaded on first use (PEP 562): importing a light module of this package (layout.py, checked.py, on every
# pod start) must not import the ones below, with their dataclasses and pathlib.
_EXPORTS = {
    **dict.fromkeys(("Journal", "atomic_write", "complete_entry", "publish_entries", "recover", "sweep",
                     "write_receipt"), "publish"),
    **dict.fromkeys(("STATE_DIR", "CacheDir", "Receipt", "ReceiptScan", "lock_timeout"), "state"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module  # here, as the modules: a pod start's fast path imports this package

    return getattr(import_module(f"{__name__}.{module}"), name)
