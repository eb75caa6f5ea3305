"""Serial tests share helpers with the MPI tests (tests/simulate.py, tests/fakedevice.py)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
