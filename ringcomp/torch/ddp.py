"""For users who keep DDP: a comm hook running ringcomp's collective on each DDP bucket, and
torch.distributed's gloo group started from an MPI launch."""

import os

import numpy as np
import torch

from ringcomp.kernels.arrays import array_module
from ringcomp.torch import addresses
from ringcomp.torch.flat import handover, tensor_as_array
from ringcomp.torch.options import HOOK_OPTIONS, checked, reducer
from ringcomp.transport.agree import everywhere
from ringcomp.transport.cache import get_transport


def rank0_address(comm=None) -> str:
    """``tcp://host:port`` of a port free now on rank 0 (a failure on rank 0 is raised on
    every rank), with the address of rank 0 this rank routes to: 127.0.0.1 on one node;
    across nodes the one on a network this host shares, else rank 0's resolved name
    (``ringcomp.torch.addresses.route_to``) - where a torch.distributed store of an MPI
    launch listens. Where this host's name resolves to nothing but the interface was
    found, ``GLOO_SOCKET_IFNAME`` is set to it, unless set already. Collective over
    ``comm``'s ranks."""
    transport = get_transport(comm)
    one_node = transport.local_size == transport.size  # collective: every rank asks

    def on_rank0():
        if transport.rank != 0:
            return None
        where = None if one_node else {"resolved": addresses.resolved_host(),
                                       "interfaces": addresses.ipv4_interfaces()}
        return addresses.free_port(), where

    port, where = transport.bcast_obj(everywhere(transport, on_rank0))
    host, interface = addresses.route_to(where)
    if interface and addresses.resolved_host() is None:
        # gloo advertises the address its host's name resolves to: without one it would
        # offer its peers 127.0.0.1 (its own user's setting wins)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
    return f"tcp://{host}:{port}"


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
