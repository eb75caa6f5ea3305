# Sourced by every batch script: the repository, its virtual environment and the launcher.
#
#   RINGCOMP_HOME      repository to run from (default: the directory sbatch was run in)
#   RINGCOMP_VENV      virtual environment with ringcomp installed (default: $RINGCOMP_HOME/.venv)
#   RINGCOMP_LAUNCHER  mpirun (default: mpirun -n $SLURM_NTASKS) | srun (srun --mpi=pmi2,
#                      what the MPICH wheel speaks; --mpi=pmix does not work with it)
cd "${RINGCOMP_HOME:-${SLURM_SUBMIT_DIR:-.}}"
export PATH="${RINGCOMP_VENV:-$PWD/.venv}/bin:$PATH"
# MPICH's shared-memory collectives may busy-spin below MPI_THREAD_MULTIPLE (README, pitfalls)
export MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD=${MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD:-1000000000}
export PYTHONUNBUFFERED=1

launch() {
  case "${RINGCOMP_LAUNCHER:-mpirun}" in
    mpirun) mpirun -n "${SLURM_NTASKS:-4}" "$@" ;;
    srun)   srun --mpi=pmi2 "$@" ;;
    *) echo "RINGCOMP_LAUNCHER must be mpirun or srun, not '$RINGCOMP_LAUNCHER'" >&2
       return 2 ;;
  esac
}
