"""Making and reading bundles: pack, inspect, diff and merge, sign, the target environment of a cross build.

The format itself (manifest, archive, canonical JSON, fingerprint) lives on the ground floor, ``kernelcache.format``."""
