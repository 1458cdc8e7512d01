"""The old name of ``kernelcache.format.envscan`` (the ground floor): importing either gives the one module, so
its names, private helpers and monkeypatches are shared."""

import sys

from ..format import envscan

sys.modules[__name__] = envscan
