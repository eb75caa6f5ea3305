#!/usr/bin/env bash
# Every GPU figure docs/gpu.md renders, measured in one go on a machine with a GPU (a few
# minutes on an H100) and written as records with their provenance (GPU model, driver, CUDA
# runtime, MPI, commit); `python -m ringcomp.report docs` then renders them:
#   1. the CUDA kernels bit-equal to their NumPy references, on the device (tests/cuda),
#      then the compressed collectives and training on CuPy buffers at 2 ranks sharing the
#      GPU, equal to the host runs (tests/mpi/test_device_*.py)
#   2. every kernel against a device-to-device copy, 64M float32 -> OUT/gpu-kernels.json
#      (and jobs/gpu-launch-probe.py's diagnostic -> OUT/launch-probe.json)
#   3. the collectives, 4 ranks sharing the GPU (staged through host unless the MPI is
#      CUDA-aware), exact and compressed, every row checked equal to the CPU run bit for bit
#                                                                 -> OUT/gpu-bench-p4.json
#   4. the 1-bit rings at 16 MiB with every hop traced: the codec / staging / wire split
#                                                                 -> OUT/gpu-bench-trace-p4.json
#   5. ResNet-50 (25.6M parameters) on ImageNet-shaped synthetic images, 4 ranks on the GPU:
#      each method's step split into compute, exposed communication, codec and staging,
#      beside PyTorch's DDP                                        -> OUT/gpu-resnet50-p4.json
#   6. the 1-bit rings and trees at 16 MiB with 4 MiB segments instead of 1 MiB (a quarter
#      of the hops, launches and messages), still equal to the CPU run
#                                                                 -> OUT/gpu-bench-seg4m-p4.json
#
#   jobs/gpu-records.sh [OUT]            (default: docs/records)
#
# GPU_MPS=1: the ranks of steps 3 to 6 share the GPU through an MPS server this script
# starts and stops (their kernels then run side by side instead of taking turns). GPU_MPI=DIR:
# steps 3 to 6 run under the CUDA-aware Open MPI that jobs/build-cuda-mpi.sh built into DIR
# (its mpiexec, its libmpi through the mpi4py wheel in DIR/wheels) with the device buffers
# handed to MPI (RINGCOMP_CUDA_AWARE=1). Either adds to the names of those steps' records
# (-mps, -cudaaware, or both: gpu-bench-mps-cudaaware-p4.json). GPU_STEPS picks steps
# (default "1 2 3 4 5 6").
#
# Runs from a checkout without installing it (PYTHONPATH): PYTHON (default python3) needs
# numpy, numba, numba-cuda, cupy, mpi4py, pytest, (step 1) pytest-mpi and (step 5) torch.
# MPIEXEC (default mpiexec) and MPIEXEC_FLAGS (Open MPI as root: --allow-run-as-root
# --oversubscribe) launch the ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-docs/records}
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
read -r -a MPI <<< "${MPIEXEC:-mpiexec} ${MPIEXEC_FLAGS:-}"
STEPS=" ${GPU_STEPS:-1 2 3 4 5 6} "
for want in $STEPS; do  # a setting that would do nothing is refused, not ignored
  [[ "$want" =~ ^[1-6]$ ]] || { echo "GPU_STEPS: unknown step '$want' (steps are 1 to 6)" >&2; exit 2; }
done
[[ "${GPU_MPS:-0}" =~ ^[01]$ ]] || { echo "GPU_MPS must be 0 or 1, got '$GPU_MPS'" >&2; exit 2; }
if [ -n "${GPU_MPI:-}" ]; then
  [[ "$STEPS" == *" 3 "* || "$STEPS" == *" 4 "* || "$STEPS" == *" 5 "* || "$STEPS" == *" 6 "* ]] || {
    echo "GPU_MPI acts on steps 3 to 6 only, and GPU_STEPS='${GPU_STEPS:-}' runs none" >&2
    exit 2; }
  GPU_MPI=$(realpath -m "$GPU_MPI")
  WHEEL=$(compgen -G "$GPU_MPI/wheels/mpi4py-*.whl" | head -1 || true)
  [ -x "$GPU_MPI/bin/mpiexec" ] && [ -n "$WHEEL" ] || {
    echo "GPU_MPI=$GPU_MPI: no bin/mpiexec or wheels/mpi4py-*.whl there" \
      "(build it with jobs/build-cuda-mpi.sh)" >&2; exit 2; }
fi
TRACE=$(mktemp -d)
trap 'rm -rf "$TRACE"' EXIT
mkdir -p "$OUT"
step() { echo "# $(date -u +%H:%M:%S) $*"; }
wanted() { [[ "$STEPS" == *" $1 "* ]]; }
TESTS=passed

if wanted 1; then
  step "1/6 the CUDA kernels against their references, on the device"
  # on several workers where pytest-xdist is there (each compiles its kernels); a failure
  # does not stop the records (the bench checks its own rows) but fails the script at the end
  WORKERS=()
  "$PY" -c "import xdist" 2>/dev/null && WORKERS=(-n 4)
  "$PY" -m pytest -q -p no:cacheprovider "${WORKERS[@]}" tests/cuda || TESTS=failed
  # the collectives and training on real device buffers and streams (the engine's own
  # stream included), against the host runs; ringcomp.torch and the torch.distributed
  # backend on CUDA tensors (skipped where torch sees no GPU)
  if "$PY" -c "import pytest_mpi" 2>/dev/null; then
    "${MPI[@]}" -n 2 "$PY" tests/mpi_pytest.py -q -p no:cacheprovider --with-mpi \
      tests/mpi/test_device_compressed.py tests/mpi/test_device_train.py \
      tests/mpi/test_torch_cuda.py tests/mpi/test_torch_distributed_cuda.py || TESTS=failed
  else
    echo "pytest-mpi is missing: the device MPI tests did not run (carry its wheel)" >&2
    TESTS=failed
  fi
fi
if wanted 2; then
  step "2/6 the kernels against a device copy"
  "$PY" -m ringcomp.experiments kernels --device gpu --elements 64M --out "$OUT/gpu-kernels"
  # where one launch's host time goes, path by path (a diagnostic: OUT/launch-probe.json)
  OUT="$OUT" "$PY" jobs/gpu-launch-probe.py || echo "the launch probe failed" >&2
fi
SUFFIX=
if [ "${GPU_MPS:-0}" = 1 ]; then
  SUFFIX=-mps
  export CUDA_MPS_PIPE_DIRECTORY="$TRACE/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$TRACE/mps-log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  trap 'echo quit | nvidia-cuda-mps-control; rm -rf "$TRACE"' EXIT
fi
if [ -n "${GPU_MPI:-}" ]; then  # mpi4py's wheel loads this libmpi; OPAL_PREFIX: it moved
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TRACE/site" "$WHEEL"
  export PYTHONPATH="$TRACE/site:$PYTHONPATH" MPI4PY_MPIABI=openmpi RINGCOMP_CUDA_AWARE=1 \
    OPAL_PREFIX="$GPU_MPI" PATH="$GPU_MPI/bin:$PATH" \
    LD_LIBRARY_PATH="$GPU_MPI/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  MPI[0]="$GPU_MPI/bin/mpiexec"
  SUFFIX=$SUFFIX-cudaaware
fi
NAME=gpu-bench$SUFFIX
if wanted 3; then
  step "3/6 the collectives, 4 ranks on the GPU"
  "${MPI[@]}" -n 4 "$PY" -m ringcomp.bench --device gpu --sizes 1M,16M \
    --algorithms ring,tree,allgather,mpi --compressors none,marsit,sign,qsgd,topk \
    --record "$OUT/$NAME-p4.json"
fi
if wanted 4; then
  step "4/6 the 1-bit rings' hops, traced"
  "${MPI[@]}" -n 4 "$PY" -m ringcomp.bench --device gpu --sizes 16M --algorithms ring,mpi \
    --compressors marsit,sign --trace "$TRACE" --record "$OUT/$NAME-trace-p4.json"
fi
if wanted 5; then
  step "5/6 ResNet-50 on ImageNet-shaped images, 4 ranks on the GPU"
  "${MPI[@]}" -n 4 "$PY" -m ringcomp.experiments resnet50 --device gpu \
    --out "$OUT/gpu-resnet50$SUFFIX-p4"
fi
if wanted 6; then
  step "6/6 the 1-bit rings and trees with 4 MiB segments"
  "${MPI[@]}" -n 4 "$PY" -m ringcomp.bench --device gpu --sizes 16M --algorithms ring,tree,mpi \
    --compressors none,marsit,sign --segment-bytes 4M --record "$OUT/$NAME-seg4m-p4.json"
fi
step "done (steps$STEPS) in $OUT"
if [ "$TESTS" != passed ]; then
  echo "the device tests FAILED or did not run (step 1): the tables may measure kernels," \
    "collectives or training that are not equal to their references" >&2
  exit 1
fi
