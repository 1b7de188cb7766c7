# Decided before any module of this package is imported: the mypyc-compiled core, or the
# pure-Python one when there is no build or it is out of date (see protocol/core_build.py).
from protocol.core_build import decide

decide()
