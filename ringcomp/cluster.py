"""Running an MPI job on the emulated cluster of ``ringcomp.netns``: ``mpiexec`` inside host
1's namespace, Hydra's ssh launcher replaced by a script that starts each host's proxy in
that host's namespace and its own UTS namespace (own hostname), so MPICH uses TCP between
hosts and shared memory inside one. The library half of ``python -m ringcomp.testbed``,
which the studies use too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from ringcomp.netns import TEMP_PREFIX, Testbed, TestbedError, system_path

#: MPICH over the emulated links: libfabric's tcp provider on the namespaces' eth1
MPI_ENV = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp", "FI_TCP_IFACE": "eth1",
           "MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD": "1000000000"}
#: the environment variable through which ``python -m ringcomp.testbed`` tells the job it
#: runs (a record's provenance: the command that reproduces it, and where it ran)
TESTBED_ENV = "RINGCOMP_TESTBED"


def testbed_env(argv: list[str], hosts: int, ranks_per_host: int, rate: float) -> dict:
    """``TESTBED_ENV`` for a job started by ``argv`` (the testbed's command line up to
    ``--``) on ``hosts`` emulated hosts."""
    return {TESTBED_ENV: json.dumps({
        "command": argv, "placement": f"{hosts} emulated hosts x {ranks_per_host} rank(s) "
                                      f"at {rate / 1e9:g} Gbit/s (network namespaces on one "
                                      "machine, rate-limited veth links)"})}


def testbed_context() -> dict | None:
    """What ``TESTBED_ENV`` says, in a job the testbed started: {"command": the testbed's
    command line up to ``--``, "placement": ...}; None elsewhere."""
    raw = os.environ.get(TESTBED_ENV)
    return json.loads(raw) if raw else None


#: below this many bytes on every link, the command's traffic did not use the links
CONTROL_BYTES = 64 << 10


def launcher_script(testbed: Testbed, directory: str) -> str:
    """The ``-launcher-exec`` stand-in for ssh: ``<script> [-x] HOST COMMAND...`` runs
    COMMAND inside HOST's namespace with that host's own hostname."""
    cases = "\n".join(f'  {testbed.address(h)}) ns={testbed.namespace(h)} ;;'
                      for h in range(1, testbed.hosts + 1))
    path = os.path.join(directory, "launch-in-namespace")
    with open(path, "w") as f:
        f.write(f"""#!/bin/bash
# written by ringcomp.testbed: Hydra calls it like ssh
while [[ $1 == -* ]]; do shift; done
host=$1; shift
case $host in
{cases}
  *) echo "ringcomp.testbed: unknown host $host" >&2; exit 2 ;;
esac
exec ip netns exec "$ns" unshare --uts bash -c "hostname $ns; $*"
""")
    os.chmod(path, 0o755)
    return path


def job_path() -> str:
    """PATH for the job: this interpreter's directory first (a virtual environment's
    mpiexec and python), then the system's, sbin included - ``sudo .venv/bin/python``
    runs with sudo's secure_path, which knows neither."""
    return os.pathsep.join([os.path.dirname(sys.executable), system_path()])


def mpiexec_command(testbed: Testbed, ranks_per_host: int, command: list[str],
                    launcher: str) -> list[str]:
    mpiexec = shutil.which("mpiexec", path=job_path())
    if mpiexec is None:
        raise TestbedError("no mpiexec on PATH (activate the virtual environment)")
    first = testbed.namespace(1)
    hosts = ",".join(f"{testbed.address(h)}:{ranks_per_host}"
                     for h in range(1, testbed.hosts + 1))
    return ["ip", "netns", "exec", first, "unshare", "--uts", "sh", "-c",
            'hostname "$0" && exec "$@"', first, mpiexec, "-launcher", "ssh",
            "-launcher-exec", launcher, "-iface", "eth1", "-hosts", hosts,
            "-n", str(testbed.hosts * ranks_per_host), *command]


def run(testbed: Testbed, ranks_per_host: int, command: list[str], timeout: float,
        env: dict | None = None) -> tuple[int, float]:
    """Run ``command`` on the built testbed; (exit status, seconds). A run past
    ``timeout`` is killed (status 124)."""
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{testbed.tag}-") as directory:
        argv = mpiexec_command(testbed, ranks_per_host, command,
                               launcher_script(testbed, directory))
        # every emulated host has its own hostname, so ringcomp would give each rank all of
        # this machine's cores for its Numba, BLAS and OpenMP threads: share them among all
        # the ranks here (measured: spinning threads made a 64 MB Marsit all-reduce 30x
        # slower, and an MLP's matrix products 100x slower)
        share = str(max(1, (os.cpu_count() or 1) // (testbed.hosts * ranks_per_host)))
        threads = {"NUMBA_NUM_THREADS": share, "OMP_NUM_THREADS": share}
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env={**threads, **os.environ, "PATH": job_path(),
                                           **MPI_ENV, **(env or {})},
                                start_new_session=True)
        try:
            status = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = 124
        except BaseException:  # Ctrl-C: stop the job before the namespaces go
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return status, time.perf_counter() - start
