#!/usr/bin/env bash
# jobs/gpu-records.sh on a lent GPU machine in one call, within a time budget: what a
# session with a few minutes of GPU time runs (docs/gpu.md, "On a lent machine").
#
# Prepared on the CPU machine, in the checkout's root (both folders are ignored by git):
#   jobs/build-cuda-mpi.sh                      -> .cuda-mpi (the CUDA-aware Open MPI)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     -d .whl numpy==2.4.6 pytest-mpi           -> .whl (NumPy 2.5 breaks numba-cuda there)
# then, carrying .cuda-mpi and .whl, on the lent machine:
#   RINGCOMP_COMMIT=$(git rev-parse HEAD) LIMIT=520 jobs/gpu-lent.sh OUT_DIR [PHASES...]
#
# PHASES, run in the order given while time is left (default: staged aware tests):
#   staged   steps 2-5 (kernels, collectives, traced hops, ResNet-50) under the machine's MPI
#   aware    steps 3 and 5 under the CUDA-aware Open MPI in .cuda-mpi
#   tests    step 1 (the CUDA kernels and the device MPI tests on the GPU)
#   resnet   step 5 alone, staged then CUDA-aware (a ResNet-50 change measured again)
#   seg4m    step 6 (4 MiB segments)
# Each phase gets what is left of LIMIT seconds (default 520); one with under 30 s left is
# skipped and says so. Everything it wrote, with each phase's log, ends in
# OUT_DIR/records.tgz (one file: the lent machine returns few). The copy's own .git names
# another commit there: git is kept out (GIT_DIR) and the records take RINGCOMP_COMMIT.
set -u
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: RINGCOMP_COMMIT=SHA jobs/gpu-lent.sh OUT_DIR [PHASES...]" >&2
                  exit 2; }
OUT_DIR=$1; shift
PHASES=("$@"); [ ${#PHASES[@]} -gt 0 ] || PHASES=(staged aware tests)
[[ "${RINGCOMP_COMMIT:-}" =~ ^[0-9a-f]{40}$ ]] || {
  echo "RINGCOMP_COMMIT must be the full 40-digit commit the copy was made at" >&2; exit 2; }
LIMIT=${LIMIT:-520}
[[ "$LIMIT" =~ ^[0-9]+$ ]] || { echo "LIMIT must be whole seconds, got '$LIMIT'" >&2; exit 2; }
for phase in "${PHASES[@]}"; do  # an unknown phase is refused before anything runs
  case $phase in staged|aware|tests|resnet|seg4m) ;;
    *) echo "unknown phase '$phase' (staged, aware, tests, resnet, seg4m)" >&2; exit 2 ;;
  esac
done
# where the archive goes, checked before anything runs (not found unwritable at the end)
{ mkdir -p "$OUT_DIR" && touch "$OUT_DIR/records.tgz"; } 2>/dev/null || {
  echo "OUT_DIR '$OUT_DIR': cannot write records.tgz there" >&2; exit 2; }
RECORDS=$(mktemp -d)
trap 'tar czf "$OUT_DIR/records.tgz" -C "$RECORDS" .; ls -l "$RECORDS"' EXIT
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/ringcomp-site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/ringcomp-site
fi
export GIT_DIR=/nonexistent-ringcomp-git PYTHONUNBUFFERED=1 \
  MPIEXEC_FLAGS=${MPIEXEC_FLAGS:---allow-run-as-root --oversubscribe}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
START=$SECONDS
records() {  # records NAME VAR=VALUE...: gpu-records.sh with what is left of LIMIT
  local name=$1; shift
  local left=$(( LIMIT - (SECONDS - START) ))
  if [ "$left" -lt 30 ]; then echo "## skipped $name: ${left} s left"; return; fi
  echo "## $(date -u +%T) $name (${left} s left)"
  timeout -k 5 "$left" env "$@" jobs/gpu-records.sh "$RECORDS" > "$RECORDS/$name.log" 2>&1
  echo "## $(date -u +%T) $name: exit $?"
  grep -v "NumbaPerformanceWarning\|warn(errors" "$RECORDS/$name.log" | tail -25
}
for phase in "${PHASES[@]}"; do
  case $phase in
    staged) records staged GPU_STEPS="2 3 4 5" ;;
    aware) records aware GPU_MPI=.cuda-mpi GPU_STEPS="3 5" ;;
    tests) records tests GPU_STEPS="1" ;;
    resnet) records resnet GPU_STEPS="5"
            records resnet-aware GPU_MPI=.cuda-mpi GPU_STEPS="5" ;;
    seg4m) records seg4m GPU_STEPS="6" ;;
  esac
done
