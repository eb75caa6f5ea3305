"""The package as an index would ship it: the sdist's contents, and the wheel installed
(not editable) into a fresh virtual environment, its console scripts running a two-rank job."""

from __future__ import annotations

import glob
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIEXEC = os.environ.get("MPIEXEC", "").split() or [shutil.which("mpiexec") or "mpiexec"]
SCRIPTS = ("ringcomp-train", "ringcomp-bench", "ringcomp-info", "ringcomp-report",
           "ringcomp-experiments", "ringcomp-perfmodel", "ringcomp-simulate",
           "ringcomp-profile", "ringcomp-testbed", "ringcomp-warm")


def _build(hook: str, out) -> str:
    """Run setuptools' PEP 517 ``hook`` (build_wheel / build_sdist) on the checkout, in a
    process of its own (it writes build/ and the egg-info there); the artefact's path."""
    done = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                           f"print(build_meta.{hook}({str(out)!r}))"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return os.path.join(out, done.stdout.strip().splitlines()[-1])


def test_the_sdist_carries_tests_docs_licence_and_the_version_once(tmp_path):
    import ringcomp

    sdist = _build("build_sdist", tmp_path)
    assert os.path.basename(sdist) == f"ringcomp-{ringcomp.__version__}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for path in ("LICENSE", "README.md", "setup.cfg", "pyproject.toml", "Makefile",
                 "docs/architecture.md", "docs/records/convergence-p8-cnn.json",
                 "tests/run_suite.py", "tests/serial/test_packaging.py",
                 "tests/mpi/conftest.py", "jobs/train.sbatch", "ringcomp/kernels/signs_ref.py"):
        assert path in names, path
    assert not [name for name in names if "__pycache__" in name or name.endswith(".pyc")]


@pytest.mark.timeout(600)
def test_the_wheel_installed_in_a_fresh_venv_runs_its_console_scripts(tmp_path):
    before = _editable_ringcomp()
    """Not the editable checkout: the wheel's own files, in a new environment whose only
    link to this one is its dependencies (the running interpreter's site-packages on the
    path, where the checkout's editable hook is not run), from a folder outside the
    checkout. Every console script answers --version; ringcomp-train runs two ranks."""
    import ringcomp

    wheel = _build("build_wheel", tmp_path / "dist")
    with zipfile.ZipFile(wheel) as z:
        entry_points = z.read(next(n for n in z.namelist()
                                   if n.endswith(".dist-info/entry_points.txt"))).decode()
    for script in SCRIPTS:
        assert f"{script} = " in entry_points, script
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # the new environment's own pip, offline, before it can see this one: pip run from
    # here with --prefix would uninstall this environment's (editable) ringcomp
    done = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index",
                           "--no-compile", "--disable-pip-version-check", wheel],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    purelib = subprocess.run([python, "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], check=True,
                             capture_output=True, text=True).stdout.strip()
    deps = [p for p in site.getsitepackages() + [sysconfig.get_paths()["purelib"]]
            if os.path.isdir(p)]
    with open(os.path.join(purelib, "deps.pth"), "w") as f:  # numpy, mpi4py, ... only
        f.write("\n".join(dict.fromkeys(deps)) + "\n")
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
               MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD="1000000000", PYTHONUNBUFFERED="1")
    for key in ("PMI_SIZE", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE", "PYTHONPATH"):
        env.pop(key, None)
    # the MPICH wheel's libmpi sits in this environment's prefix, where mpi4py looks for it
    # (a site MPI is on the loader's path anyway)
    embedded = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmpi.so.[0-9]*")))
    if embedded:
        env.setdefault("MPI4PY_LIBMPI", embedded[0])
    where = subprocess.run([python, "-c", "import ringcomp; print(ringcomp.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert where.stdout.strip().startswith(str(venv)), where.stdout  # the wheel's copy
    # as a user runs them: by name, from the venv's bin on PATH (side by side: each one
    # starts MPI, a second apiece)
    started = {script: subprocess.Popen([script, "--version"], cwd=tmp_path, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True) for script in SCRIPTS}
    for script, proc in started.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0 and ringcomp.__version__ in stdout, (script, stderr)
    job = subprocess.run(MPIEXEC + ["-n", "2", "ringcomp-train", "--epochs", "1",
                                    "--no-progress"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "test accuracy" in job.stdout, job.stdout
    assert _editable_ringcomp() == before  # this environment's own ringcomp untouched


def _editable_ringcomp() -> str:
    """Where this environment imports ringcomp from outside the checkout's folder."""
    out = subprocess.run([sys.executable, "-c", "import ringcomp; print(ringcomp.__file__)"],
                         cwd="/", capture_output=True, text=True, timeout=120)
    return out.stdout.strip() or out.stderr
