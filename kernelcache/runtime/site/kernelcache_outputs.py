"""The old name of ``kernelcache.hooks.kernelcache_outputs``, the served process's hooks on the ground floor:
importing either gives the one module, so its names, private helpers and monkeypatches are shared."""

import sys

from ...hooks import kernelcache_outputs

sys.modules[__name__] = kernelcache_outputs
