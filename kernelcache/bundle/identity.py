"""The old name of ``kernelcache.format.identity`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import identity

sys.modules[__name__] = identity
