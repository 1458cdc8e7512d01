"""The old name of ``kernelcache.format.overlap`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import overlap

sys.modules[__name__] = overlap
