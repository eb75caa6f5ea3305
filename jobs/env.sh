# Sourced by every batch script: the repository, its virtual environment and the launcher.
#
#   RINGCOMP_HOME      repository to run from (default: the directory sbatch was run in)
#   RINGCOMP_VENV      virtual environment with ringcomp installed (default: $RINGCOMP_HOME/.venv)
#   RINGCOMP_LAUNCHER  mpirun (default: mpirun -n $SLURM_NTASKS) | srun (srun --mpi=pmi2,
#                      what the MPICH wheel speaks; --mpi=pmix does not work with it)
#   RINGCOMP_LAUNCH_FLAGS  the launcher's own flags, put before the command: a site Open
#                      MPI's ("--bind-to none --mca btl ^openib"), or srun's ("--mpi=pmix"
#                      for a site MPI built with PMIx, which replaces the --mpi=pmi2 above)
cd "${RINGCOMP_HOME:-${SLURM_SUBMIT_DIR:-.}}"
export PATH="${RINGCOMP_VENV:-$PWD/.venv}/bin:$PATH"
# MPICH's shared-memory collectives may busy-spin below MPI_THREAD_MULTIPLE (README, pitfalls)
export MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD=${MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD:-1000000000}
export PYTHONUNBUFFERED=1

launch() {
  local flags=()
  read -r -a flags <<< "${RINGCOMP_LAUNCH_FLAGS:-}"
  case "${RINGCOMP_LAUNCHER:-mpirun}" in
    mpirun) mpirun -n "${SLURM_NTASKS:-4}" "${flags[@]}" "$@" ;;
    srun)   # the PMI the flags name, else the one the MPICH wheel speaks
            if [[ " ${flags[*]} " == *" --mpi="* ]]; then srun "${flags[@]}" "$@"
            else srun --mpi=pmi2 "${flags[@]}" "$@"; fi ;;
    *) echo "RINGCOMP_LAUNCHER must be mpirun or srun, not '$RINGCOMP_LAUNCHER'" >&2
       return 2 ;;
  esac
}
