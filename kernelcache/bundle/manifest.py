"""The old name of ``kernelcache.format.manifest`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import manifest

sys.modules[__name__] = manifest
