"""Serial tests share helpers with the MPI tests (tests/fakedevice.py, tests/registered.py)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))


@pytest.fixture(autouse=True)
def tools_logging_undone():
    """A tool run in process configures logging (``ringcomp.log``): the next test starts
    from the library's default again, whatever order the tests run in."""
    yield
    from ringcomp import log

    log.reset()


@pytest.fixture(scope="module")
def sbin_on_path():
    """Root's daemons and network tools live in the sbin directories, which a CI runner's
    or ``env -i``'s PATH may leave out (for the Slurm and testbed modules)."""
    from ringcomp.netns import system_path

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", system_path())
        yield


class SelfTransport:
    """A one-rank stand-in for the collective calls checkpoints make."""

    rank, size = 0, 1

    def barrier(self):
        pass

    def allgather_obj(self, obj):
        return [obj]

    def bcast_obj(self, obj, root=0):
        return obj
