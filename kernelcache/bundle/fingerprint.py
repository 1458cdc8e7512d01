"""The old name of ``kernelcache.format.fingerprint`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import fingerprint

sys.modules[__name__] = fingerprint
