"""Compile the CPU kernels once, into Numba's on-disk cache, before the suite's stages.

On a fresh clone every process that first needs a kernel compiles it (each rank of every
``mpiexec`` in the tests, each at once); run first, it compiles what most of them need -
``python -m ringcomp.warm``'s list: every compressor's codec and hop rule, the finite check
and the exact and compressed rings' compiled walks, in a process per element type on the
usable cores - so they load it instead. Correctness is not its business (the tests check
every kernel); ``tests/run_suite.py`` runs it first, alone.
"""

import sys

from ringcomp import warm

sys.exit(warm.main(["--quiet"]))
