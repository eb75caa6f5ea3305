"""Run the whole test suite: every CPU kernel compiled into Numba's cache first, then the
system tests (Slurm, emulated links) beside the CUDA kernels under Numba's simulator, serial
pytest, the commands written in README.md and docs/, then the MPI suite under mpiexec at
1..5 ranks, the value records' digests at 4 and 5 ranks, then every kernel the simulator
ran compiled for a GPU by NVVM.

Each mpiexec runs under an outer timeout; pytest-timeout (thread method) bounds every test;
ranks other than 0 log to files that are shown when a run fails. Prints one closing line
``N passed, N failed, N skipped`` over all runs and exits non-zero on any failure.

Usage: python tests/run_suite.py [--ranks 1,2,3,4,5] [--timeout 900] [-k EXPR] [--serial-only]
Environment: MPIEXEC (default: mpiexec on PATH), MPIEXEC_FLAGS (extra launcher flags, e.g.
``--oversubscribe`` for Open MPI), RINGCOMP_TEST_TIMEOUT (seconds per MPI test, default 120).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
#: MPI test files that need device arrays: CuPy on a GPU, or the stand-ins under the simulator
DEVICE_FILES = ("tests/mpi/test_device_compressed.py", "tests/mpi/test_device_train.py")
#: the world size each device file runs at
DEVICE_RANKS = (3, 2)
#: run at 1 to 3 ranks: what depends on the rank count in training and in the torch
#: adapters beyond one even and one odd count past one (the data's shards, uneven splits,
#: bucket ownership) is the collectives', which the other files take to 5 ranks; on 2
#: cores these were half of the 5-rank run (about 50 of 100 s) and 42 of the 4-rank run's
#: 98 s, and without any of them the 4- and 5-rank ranks do not import torch (~5 s of CPU
#: each with the optimizer's first import of torch._dynamo)
TRAINING_FILES = ("tests/mpi/test_train.py", "tests/mpi/test_torch.py",
                  "tests/mpi/test_torch_train.py", "tests/mpi/test_torch_semantics.py",
                  "tests/mpi/test_torch_horovod.py", "tests/mpi/test_torch_cuda.py",
                  "tests/mpi/test_torch_distributed_cuda.py")
#: the largest world size the training files run at
TRAINING_MAX_RANKS = 3
#: the rank counts of the value records' digests (``experiments.digests.RANKS``)
DIGEST_RANKS = (4, 5)
#: the OpenBLAS kernels the digests are checked under (``experiments.digests.DIGEST_BLAS``;
#: a serial test keeps the two equal: this script does not import ringcomp)
DIGEST_BLAS = "Haswell"
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


#: one stage's output at a time: a stage run beside another prints its whole log when it ends
_PRINT = threading.Lock()


def say(text: str) -> None:
    with _PRINT:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()


def run(cmd: list[str], timeout: float, env: dict, live: bool = True) -> tuple[int, str]:
    """Run ``cmd`` under ``timeout``; (exit status, output). ``live`` prints the output as
    it comes; otherwise the command is announced and its output printed whole at its end
    (a stage that runs beside another)."""
    line = "$ " + " ".join(shlex.quote(c) for c in cmd)
    say(line if live else f"# started beside another stage (its log follows when it ends)"
                          f"\n{line}")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    lines: list[str] = [] if live else [line + "\n"]

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if live:
                say(line)

    timed_out = threading.Event()

    def kill():
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):  # it ended as the time ran out
            os.killpg(proc.pid, signal.SIGKILL)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    killer = threading.Timer(timeout, kill)
    killer.start()
    # wait4: this child's CPU time (and its reaped descendants': mpiexec's ranks), which
    # RUSAGE_CHILDREN would mix with a stage running beside it
    _, status, usage = os.wait4(proc.pid, 0)
    killer.cancel()
    proc.returncode = rc = 124 if timed_out.is_set() else os.waitstatus_to_exitcode(status)
    if timed_out.is_set():
        lines.append(f"\nTIMEOUT after {timeout:.0f} s: killed\n")
        if live:
            say(lines[-1])
    reader.join(timeout=10)
    wall, cpu = time.time() - t0, usage.ru_utime + usage.ru_stime
    # the CPU time says how much of the two cores a stage kept busy (a stage well below
    # them is waiting: on processes' start, on daemons, on emulated links)
    lines.append(f"# exit {rc} after {wall:.1f} s (cpu {cpu:.1f} s: "
                 f"{cpu / max(wall, 1e-9):.2f} cores)\n")
    say(lines[-1] if live else "".join(lines))
    return rc, "".join(lines)


def tally(output: str) -> dict:
    """Counts from pytest's last summary line."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    summary = [ln for ln in output.splitlines() if re.search(r"\d+ (passed|failed|error|"
                                                            r"skipped|deselected)", ln)]
    if summary:
        for number, word in COUNTS.findall(summary[-1]):
            key = "errors" if word.startswith("error") else word
            if key in counts:
                counts[key] += int(number)
    return counts


TEST_FRAME = re.compile(r'File "([^"]*tests/[^"]*\.py)", line (\d+), in (\w+)')


def problems(output: str) -> list[str]:
    """What to repeat at the very end of the log, where CI shows it: the failed and erroring
    tests, and for a run that pytest-timeout ended (it exits at once, without a summary) the
    innermost test-code frames of its stack dump, which name the test that hung."""
    found = [ln.strip() for ln in output.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    if "+ Timeout +" in output:
        dump = output[output.find("+ Timeout +"):]
        frames = [f"{os.path.relpath(path, ROOT)}:{line} in {name}"
                  for path, line, name in TEST_FRAME.findall(dump)]
        found.append("TIMEOUT (pytest-timeout ended the run); test code on the stacks: "
                     + ("; ".join(dict.fromkeys(frames[-4:])) or "none"))
    if "TIMEOUT after" in output:
        found.append("TIMEOUT: the outer bound killed the run")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2,3,4,5", help="MPI world sizes to run")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds for each mpiexec run (outer bound)")
    parser.add_argument("-k", default=None, help="pytest -k expression")
    parser.add_argument("--serial-only", action="store_true")
    parser.add_argument("--mpi-only", action="store_true")
    args = parser.parse_args()

    env = dict(os.environ)
    # MPICH's shared-memory collectives can busy-spin at lower thread levels; see README.
    env.setdefault("MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD", "1000000000")
    # more ranks than cores throughout: a waiting MPICH rank sleeps instead of yielding in
    # a busy loop (the 5-rank stage: 100 -> 92 s, a third of its system time)
    env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Python's compiled bytecode kept: where PYTHONDONTWRITEBYTECODE is set (as on this
    # project's machines), every process of a run - thousands of ranks, tools and jobs -
    # compiled every module of the project it imported again, about 0.2 s of CPU each;
    # the run keeps the bytecode in a directory of its own instead, so nothing is still
    # written beside the sources
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env.setdefault("PYTHONPYCACHEPREFIX",
                       os.path.join(tempfile.gettempdir(), "ringcomp-test-pycache"))
    pytest_args = ["-q", "-p", "no:cacheprovider", "-rfE"] + (["-k", args.k] if args.k else [])
    total = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    broken = []
    # the simulator stages' launched kernels and argument kinds (``cuda_launch``)
    launch_log = tempfile.mkdtemp(prefix="ringcomp-launches-")
    details: list[str] = []

    # the CUDA simulator stage's thread adds to these beside the system tests
    tally_lock = threading.Lock()

    def count(name: str, rc: int, counts: dict, found: list[str], ok=(0, 5)) -> bool:
        """Add a run's counts; record it if it broke (an exit status not in ``ok``: pytest
        exits 5 when a rank count collects nothing). True if it did."""
        with tally_lock:
            for key in total:
                total[key] += counts[key]
            if rc in ok:
                return False
            broken.append(f"{name} (exit {rc})")
            details.extend(f"{name}: {line}" for line in found)
            return True

    def stage(name: str, cmd: list[str], stage_env: dict, live: bool = True) -> bool:
        """Run one pytest process; add its counts; record it if it broke. True if it did.
        ``live``: see ``run``."""
        rc, out = run(cmd, args.timeout, stage_env, live)
        return count(name, rc, tally(out), problems(out))

    pytest_cmd = [sys.executable, "-m", "pytest"] + pytest_args
    mpiexec = shlex.split(env.get("MPIEXEC", "")) or [shutil.which("mpiexec") or "mpiexec"]
    flags = shlex.split(env.get("MPIEXEC_FLAGS", ""))
    mpi_pytest = [sys.executable, "tests/mpi_pytest.py"] + pytest_args + ["--with-mpi"]
    per_test = env.get("RINGCOMP_TEST_TIMEOUT", "120")
    sim_env = dict(env, NUMBA_ENABLE_CUDASIM="1", RINGCOMP_LAUNCH_LOG=launch_log)

    def serial_stage() -> None:
        # the serial tests and every command and code block of README.md and docs/ (as
        # written or in its smoke form), in one pytest run on two xdist workers stealing
        # work. Signal method: a serial test past its timeout fails with a traceback and the
        # run goes on (the thread method, needed under MPI, ends the whole process
        # uncounted). Two workers: most serial tests run one process on one core, and a
        # documented command spends much of its time in mpiexec's start-up and ranks
        # waiting on each other (the commands one at a time kept 0.93 of the two cores
        # busy, two 1.85: 465 -> 258 s); each worker has its own scratch directory, each
        # testbed its own namespaces. One run, not two, so that neither ends on one
        # worker's last long test while the other idles (measured: 461-487 s against
        # 266 + 213 s as two runs, inside this host's noise)
        stage("serial and documented commands", pytest_cmd + [
            "--timeout-method=signal", "--durations=40", "-n", "2", "--dist", "worksteal",
            "-m", "not system", "tests/serial", "tests/docs"], env)

    def mpi_stages() -> None:
        for n in [int(v) for v in args.ranks.split(",") if v.strip()]:
            logdir = tempfile.mkdtemp(prefix=f"ringcomp-tests-{n}-")
            # the device files run below, under the simulator (here they would only skip)
            cmd = mpiexec + ["-n", str(n)] + flags + mpi_pytest + [
                "tests/mpi", f"--timeout={per_test}", "--timeout-method=thread",
                "--durations=10"] + [
                f"--ignore={path}" for path in DEVICE_FILES] + [
                f"--ignore={path}" for path in TRAINING_FILES if n > TRAINING_MAX_RANKS]
            if stage(f"{n} ranks", cmd, dict(env, RINGCOMP_TEST_LOGDIR=logdir)):
                logs = []
                for name in sorted(os.listdir(logdir)):
                    with open(os.path.join(logdir, name)) as f:
                        logs.append(f"--- {name} (last 4000 characters) ---\n"
                                    f"{f.read()[-4000:]}")
                say("\n".join(logs))
            shutil.rmtree(logdir, ignore_errors=True)
        # the compressed collectives on (stand-in) device buffers with the simulated CUDA
        # kernels at an odd rank count (odd sizes find ring bugs), the training loop at 2:
        # its GPU-equals-CPU checks compare two runs at the same rank count, and the
        # collectives it calls are the file before's, run at 3
        for ranks, path in zip(DEVICE_RANKS, DEVICE_FILES, strict=True):
            stage(f"CUDA simulator, {ranks} ranks", mpiexec + ["-n", str(ranks)] + flags
                  + mpi_pytest + [path, "--timeout=300", "--timeout-method=thread"],
                  sim_env)
        # staleness judged by behaviour: every value record's digests against the code now
        # (``ringcomp/experiments/digests.py``); a record whose digest moved fails, named
        # with its re-measure command
        for n in DIGEST_RANKS if not args.k else ():
            rc, out = run(mpiexec + ["-n", str(n)] + flags + [
                sys.executable, "-m", "ringcomp.experiments", "digests", "--check"],
                args.timeout, dict(env, OPENBLAS_CORETYPE=DIGEST_BLAS))
            one = dict.fromkeys(total, 0) | {"passed" if rc == 0 else "failed": 1}
            count(f"digests at {n} ranks", rc, one,
                  [line for line in out.splitlines() if line.startswith("docs/records/")],
                  ok=(0,))

    def warm_up() -> None:
        rc, out = run([sys.executable, "tests/warm_kernels.py"], args.timeout, env)
        count("kernel warm-up", rc, dict.fromkeys(total, 0), out.splitlines()[-5:])

    def cuda_simulator() -> None:
        # the CUDA kernels under Numba's CUDA simulator: its own processes, since the variable
        # must be set before numba.cuda is first imported; two workers (the simulator's
        # threads share one GIL: one process uses one core; 57 -> 43 s)
        stage("CUDA simulator", pytest_cmd + ["--timeout-method=signal", "-n", "2",
                                              "tests/cuda"], sim_env, live=False)

    if not args.mpi_only:
        # 1. every CPU kernel compiled into Numba's on-disk cache, by two processes (one per
        # element type: they compile nothing twice), before anything else: on a fresh clone
        # each rank of every mpiexec that first needs a kernel otherwise compiles it (the
        # Slurm array job took 42 s beside a one-process warm-up, 10 s after it); ~60 s on
        # a fresh clone, ~2 s on a warm one
        warm_up()
        # 2. the system tests (Slurm's daemons, emulated links: they time their own jobs and
        # links, and beside the other serial tests Slurm's jobs timed out) keep under a core
        # busy; beside them only the CUDA simulator's tests, which time nothing (back to
        # back 78 + 63 s, side by side 90-103 s)
        sim = threading.Thread(target=cuda_simulator)
        sim.start()
        stage("serial, system", pytest_cmd + ["--timeout-method=signal", "--durations=5",
                                               "-m", "system", "tests/serial"], env)
        sim.join()
    # 3. the rest one stage after another. Side by side (the serial stages beside the MPI
    # ranks), each keeps ~1.5 of the 2 cores busy alone, yet together they took as long
    # as one after the other: the MPI stages wait on messages between oversubscribed
    # ranks, and every process more on the cores lengthens each of those waits
    if not args.mpi_only:
        serial_stage()
    if not args.serial_only:
        mpi_stages()
    if not args.mpi_only:
        # 4. every kernel the simulator stages launched, compiled for a GPU by NVVM (the
        # simulator never compiles: it accepts code NVVM refuses); ~6 s
        stage("CUDA kernels through NVVM", pytest_cmd + ["--timeout-method=signal", "-n", "2",
                                                          "tests/nvvm"],
              dict(env, RINGCOMP_LAUNCH_LOG=launch_log))
    shutil.rmtree(launch_log, ignore_errors=True)

    failed = total["failed"] + total["errors"]
    if broken and failed == 0:
        failed = len(broken)  # a crash or timeout that pytest could not count
    for line in details:
        print(line)
    print(f"\nruns with problems: {', '.join(broken) if broken else 'none'}")
    print(f"{total['passed']} passed, {failed} failed, {total['skipped']} skipped")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
