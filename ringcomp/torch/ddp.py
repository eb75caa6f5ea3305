"""For users who keep DDP: a comm hook running ringcomp's collective on each DDP bucket, and
torch.distributed's gloo group started from an MPI launch."""

import socket

import numpy as np
import torch

from ringcomp.kernels.arrays import array_module
from ringcomp.torch.flat import handover, tensor_as_array
from ringcomp.torch.options import HOOK_OPTIONS, checked, reducer
from ringcomp.transport.agree import everywhere
from ringcomp.transport.cache import get_transport


def rank0_address(comm=None) -> str:
    """``tcp://host:port`` of a port free now on rank 0, the same string on every rank of
    ``comm``'s launch (broadcast over MPI; a failure on rank 0 is raised on every rank):
    where a torch.distributed store of an MPI launch listens."""
    transport = get_transport(comm)
    one_node = transport.local_size == transport.size  # collective: every rank asks

    def on_rank0():
        if transport.rank != 0:
            return None
        with socket.socket() as s:  # a port free now (the store binds it right after)
            s.bind(("", 0))
            port = s.getsockname()[1]
        host = "127.0.0.1" if one_node else socket.gethostbyname(socket.gethostname())
        return f"tcp://{host}:{port}"

    return transport.bcast_obj(everywhere(transport, on_rank0))


def init_process_group(comm=None, backend: str = "gloo") -> None:
    """``torch.distributed.init_process_group`` for the ranks of an MPI launch: rank 0's
    address and a free port are broadcast over MPI (no MASTER_ADDR/PORT to set)."""
    import torch.distributed as dist

    transport = get_transport(comm)
    dist.init_process_group(backend, init_method=rank0_address(comm), rank=transport.rank,
                            world_size=transport.size)


class HookState:
    """What ``ringcomp_hook`` needs: the options (as the DistributedOptimizer's: algorithm,
    compressor, error_feedback, seed, segment_bytes, shadow, torus; checked and agreed on
    every rank), a ``tracer`` (a ``ringcomp.trace.Tracer``, this rank's choice: every
    bucket's hops, and with ``shadow=True`` their error) and ringcomp's background engine,
    which runs each bucket's collective off DDP's thread."""

    def __init__(self, comm=None, *, tracer=None, **options):
        self.transport = get_transport(comm)
        self.options, self.compressor = checked(self.transport, options, HOOK_OPTIONS,
                                                "HookState", marsit_optimizer=False,
                                                tracer=tracer)
        # DDP keeps the buckets and waits for them itself: the reducer only sends
        self.reducer = reducer(self.transport, self.options, self.compressor, [], np, tracer,
                               rebuckets=True)
        self.steps = 0

    def close(self) -> None:
        self.reducer.close()


# no ``from __future__ import annotations`` here: DDP checks this return annotation as an
# object, and a string annotation fails its check
def ringcomp_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook (``model.register_comm_hook(HookState(...), ringcomp_hook)``): the
    bucket's flat gradient is all-reduced by ringcomp (any algorithm x compressor), averaged
    over ranks, and handed back through a Future that DDP waits on. Every bucket of a step
    shares the step number that keys the compressors' random streams. On a GPU the
    engine waits for the stream that produced the bucket, and the averaged bucket is
    complete before the Future is set."""
    buffer = bucket.buffer()
    array = tensor_as_array(buffer)
    future: torch.futures.Future = torch.futures.Future()

    def done(reduced) -> None:  # on the engine's thread (its GPU already current)
        try:
            xp = array_module(array)
            xp.divide(reduced.result(), state.transport.size, out=array)
            if xp is not np:  # before DDP's stream reads the bucket
                xp.cuda.get_current_stream().synchronize()
            future.set_result(buffer)
        except BaseException as exc:  # DDP raises it in backward's wait
            future.set_exception(exc)

    state.reducer.send(array, bucket.index(), state.steps, state.compressor is not None,
                       before=handover(buffer)).add_done_callback(done)
    if bucket.is_last():
        state.steps += 1
    return future
