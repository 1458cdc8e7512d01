"""The old name of ``kernelcache.hooks.kernelcache_walks``, the served process's hooks on the ground floor:
importing either gives the one module, so its names, private helpers and monkeypatches are shared."""

import sys

from ...hooks import kernelcache_walks

sys.modules[__name__] = kernelcache_walks
