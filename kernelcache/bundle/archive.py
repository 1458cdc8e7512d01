"""The old name of ``kernelcache.format.archive`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import archive

sys.modules[__name__] = archive
