#!/usr/bin/env bash
# A CUDA-aware Open MPI for the GPU machine, built here (a Debian machine with apt and
# PyPI) and carried there: that machine reaches nothing outside itself, and neither PyPI's
# MPI wheels nor its own Open MPI are CUDA-aware.
#
#   jobs/build-cuda-mpi.sh [DEST]          (default: .cuda-mpi, which git ignores)
#
# 1. Open MPI's source: Debian's source package (bookworm: 4.1.4), fetched with
#    `apt-get source` through a private package list (the system's apt sources and state are
#    left alone), or the tarball OMPI_TARBALL names (e.g. openmpi-4.1.x.tar.bz2).
# 2. CUDA's driver header (cuda.h), from NVIDIA's CUDA runtime wheel on PyPI: Open MPI 4.1
#    compiles its CUDA support against it and loads libcuda itself at run time, so no CUDA
#    toolkit is needed to build.
# 3. configure --with-cuda (no Fortran, no OpenSHMEM), make, install into DEST (~7 min on 2
#    cores, 16 MB with the wheel): DEST/bin/mpiexec, DEST/lib/libmpi.so.40.
# 4. mpi4py's PyPI wheel for the GPU machine's Python (cp312) into DEST/wheels: it selects
#    Open MPI's ABI at import (MPI4PY_MPIABI=openmpi) and loads DEST's libmpi.
# jobs/gpu-records.sh GPU_MPI=DEST then runs its collectives under it.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=$(realpath -m "${1:-.cuda-mpi}")
PYTHON=${PYTHON:-python3}
MPI4PY_VERSION=${MPI4PY_VERSION:-4.1.2}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
step() { echo "# $(date -u +%H:%M:%S) $*"; }

step "1/4 Open MPI's source"
if [ -n "${OMPI_TARBALL:-}" ]; then
  [ -f "$OMPI_TARBALL" ] || { echo "OMPI_TARBALL: no file '$OMPI_TARBALL'" >&2; exit 2; }
  tar -xf "$OMPI_TARBALL" -C "$WORK"
else
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] && command -v apt-get >/dev/null || {
    echo "no apt-get or Debian codename here: set OMPI_TARBALL to an Open MPI 4.1 tarball" >&2
    exit 2; }
  mkdir -p "$WORK/apt/lists/partial" "$WORK/apt/parts"
  echo "deb-src http://deb.debian.org/debian $codename main" > "$WORK/apt/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$WORK/apt/sources.list"
            -o "Dir::Etc::SourceParts=$WORK/apt/parts"
            -o "Dir::State::Lists=$WORK/apt/lists" -o "Debug::NoLocking=1"
            -o "APT::Sandbox::User=root")  # (its _apt user cannot write a private tree)
  apt-get "${apt_opts[@]}" -qq update
  (cd "$WORK" && apt-get "${apt_opts[@]}" -qq source --download-only openmpi)
  tar -xf "$WORK"/openmpi_*.orig.tar.* -C "$WORK"
fi
SRC=$(find "$WORK" -maxdepth 1 -type d -name 'openmpi-*' | head -1)
[ -n "$SRC" ] && [ -x "$SRC/configure" ] || { echo "no Open MPI source tree found" >&2; exit 1; }
echo "source: $(basename "$SRC")"

step "2/4 CUDA's driver header"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$WORK/cuda" \
  "nvidia-cuda-runtime-cu12==12.*"
(cd "$WORK/cuda" && "$PYTHON" -m zipfile -e nvidia_cuda_runtime_cu12-*.whl unpacked)
CUDA_HOME=$(dirname "$(dirname "$(find "$WORK/cuda/unpacked" -name cuda.h | head -1)")")
[ -f "$CUDA_HOME/include/cuda.h" ] || { echo "no cuda.h in the CUDA runtime wheel" >&2; exit 1; }

step "3/4 configure --with-cuda, build, install into $DEST"
rm -rf "$DEST"
(cd "$SRC" && ./configure -q --prefix="$DEST" --with-cuda="$CUDA_HOME" \
   --disable-mpi-fortran --disable-oshmem --without-ucx \
   > "$WORK/configure.log" 2>&1 \
 || { tail -30 "$WORK/configure.log" >&2; exit 1; })
make -C "$SRC" -s -j "$(nproc)" > "$WORK/make.log" 2>&1 || { tail -30 "$WORK/make.log" >&2; exit 1; }
make -C "$SRC" -s install > /dev/null
"$DEST/bin/ompi_info" --parsable --all | grep -q "mpi_built_with_cuda_support:value:true" \
  || { echo "the build has no CUDA support (configure did not find cuda.h)" >&2; exit 1; }

step "4/4 mpi4py $MPI4PY_VERSION for the GPU machine's Python 3.12"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DEST/wheels" "mpi4py==$MPI4PY_VERSION"
step "done: $DEST ($(du -sh "$DEST" | cut -f1)), CUDA support: yes"
