"""The old name of ``kernelcache.format.canonical`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import canonical

sys.modules[__name__] = canonical
