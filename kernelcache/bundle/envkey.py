"""The old name of ``kernelcache.format.envkey`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import envkey

sys.modules[__name__] = envkey
