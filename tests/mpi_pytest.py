"""Run pytest on one MPI rank; ranks > 0 write to ``$RINGCOMP_TEST_LOGDIR/rank-<r>.log``.

The redirection must happen before pytest starts (pytest keeps its own copy of stdout), so
the suite runner launches ``mpiexec -n N python tests/mpi_pytest.py <pytest args>``.
"""

import os
import sys

from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
logdir = os.environ.get("RINGCOMP_TEST_LOGDIR")
if logdir and rank > 0:
    log = os.open(os.path.join(logdir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                  0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)

import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))
