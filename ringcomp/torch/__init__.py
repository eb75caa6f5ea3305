"""ringcomp for PyTorch: Horovod's DistributedOptimizer and broadcasts over ringcomp's
collectives and compressors (``pip install ringcomp[torch]``).

Names load on first use, so ``ringcomp.torch.job`` (which picks a job's trainer) imports
without PyTorch installed."""

import importlib

_HOMES = {"DistributedOptimizer": "optimizer", "HookState": "ddp", "Marsit": "marsit_optimizer",
          "SyncBatchNorm": "sync_batchnorm",
          "broadcast_optimizer_state": "startup_state", "broadcast_parameters": "startup_state",
          "init_process_group": "ddp", "ringcomp_hook": "ddp"}
#: Horovod's calls on tensors (``import ringcomp.torch as hvd``)
_HOMES.update({name: "horovod" for name in (
    "Adasum", "Average", "Compression", "Max", "Min", "Product", "Sum", "allgather",
    "allgather_object", "allreduce", "allreduce_", "alltoall", "broadcast", "broadcast_",
    "broadcast_object", "grouped_allreduce", "join")})
_HOMES.update({name: "horovod_async" for name in (
    "allgather_async", "allreduce_async", "allreduce_async_", "broadcast_async",
    "broadcast_async_", "poll", "synchronize")})
_HOMES.update({name: "horovod_world" for name in (
    "barrier", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "gloo_built", "gloo_enabled", "init", "is_homogeneous", "is_initialized", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "rank", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline")})

_HOMES.update({name: "horovod_groups" for name in (
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_allgather", "reducescatter", "grouped_reducescatter", "reducescatter_async")})
_HOMES.update({name: "horovod_refused" for name in (
    "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
    "alltoall_async", "sparse_allreduce_async", "elastic")})

__all__ = sorted(_HOMES)
# no submodule may share a public name: once imported, the package attribute would be
# the module (hvd.broadcast was broadcast.py after a broadcast_parameters call)



def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'ringcomp.torch' has no attribute {name!r}")
    try:
        module = importlib.import_module(f"ringcomp.torch.{_HOMES[name]}")
    except ModuleNotFoundError as err:
        if err.name != "torch" and not (err.name or "").startswith("torch."):
            raise
        raise ModuleNotFoundError(
            f"ringcomp.torch.{name} needs PyTorch, which is not installed here: pip install "
            f"'ringcomp[torch]' (any torch 2.1 to 2.x), or install torch first as "
            f"https://pytorch.org/get-started shows for your CUDA", name="torch") from None
    return getattr(module, name)
