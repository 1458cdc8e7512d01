"""The ground floor: the bundle format and the vocabulary every stage reads -- the manifest and its canonical JSON,
the archive's reading and writing rules, the environment fingerprint, key and scan, the Triton identity record, the
cache-key pattern and the compile-log records. It imports no stage: only kernelcache.errors and the hooks of a served
process (hooks/, standard library only)."""
