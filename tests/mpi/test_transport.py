"""Transport: raw bytes of any dtype, private communicator, counters, the GPU buffer path."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import every_rank
from fakedevice import FakeDeviceArray, install_lazy_cupy
from mpi4py import MPI

import ringcomp
from ringcomp.transport.comm import Transport


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", ["float16", "uint16", "uint32", "int8"])
def test_ring_exchange_of_raw_bytes(comm, dtype):
    """float16, bfloat16-as-uint16 and packed bits travel as bytes, unchanged."""
    t = Transport(comm)
    p, r = t.size, t.rank
    send = (np.arange(1000) * (r + 3)).astype(dtype)
    recv = np.empty_like(send)
    before = t.bytes_sent
    incoming = t.irecv(recv, (r - 1) % p, tag=5)
    t.waitall([t.isend(send, (r + 1) % p, tag=5), incoming])
    expected = (np.arange(1000) * ((r - 1) % p + 3)).astype(dtype)
    assert every_rank(comm, recv.tobytes() == expected.tobytes())
    assert t.bytes_sent - before == send.nbytes
    t.close()


@pytest.mark.mpi(min_size=1)
def test_transport_uses_a_private_duplicate(comm):
    t = Transport(comm)
    assert MPI.Comm.Compare(t.comm, comm) == MPI.CONGRUENT
    # a user's pending receive on the world communicator is not matched by ringcomp traffic
    p, r = comm.size, comm.rank
    user_in = np.zeros(4)
    req = comm.Irecv(user_in, source=(r - 1) % p, tag=0)
    y = ringcomp.allreduce(np.full(4, 1.0), comm=t, algorithm="ring")
    comm.Send(np.full(4, float(r)), dest=(r + 1) % p, tag=0)
    req.Wait()
    assert every_rank(comm, np.all(y == p) and np.all(user_in == (r - 1) % p))
    t.close()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("cuda_aware", [False, True])
@pytest.mark.parametrize("algorithm", ["ring", "tree", "dbtree", "rd", "rabenseifner", "mpi",
                                       "allgather"])
def test_device_buffer_path(comm, algorithm, cuda_aware):
    """A host array seen through __cuda_array_interface__ takes the device path: staged
    through host memory (cuda_aware=False) or handed to MPI directly (True), with a stream
    synchronisation before every MPI call; results equal the NumPy path."""
    t = Transport(comm, cuda_aware=cuda_aware)
    x = np.random.default_rng(comm.rank).standard_normal(3001).astype(np.float32)
    expected = ringcomp.allreduce(x, algorithm=algorithm, comm=t)
    dev = FakeDeviceArray.of(x.copy())
    syncs = FakeDeviceArray.syncs
    out = ringcomp.allreduce(dev, algorithm=algorithm, comm=t)
    assert isinstance(out, FakeDeviceArray)
    assert every_rank(comm, np.array_equal(out.host(), expected)), "device path differs"
    if comm.size > 1:
        assert FakeDeviceArray.syncs > syncs, "no stream synchronisation before MPI"
        assert t.device_syncs > 0
    t.close()


@pytest.mark.mpi(min_size=1)
def test_cuda_aware_environment_override(comm, monkeypatch):
    monkeypatch.setenv("RINGCOMP_CUDA_AWARE", "1")
    assert Transport(comm).cuda_aware is True
    monkeypatch.setenv("RINGCOMP_CUDA_AWARE", "0")
    assert Transport(comm).cuda_aware is False
    monkeypatch.setenv("RINGCOMP_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="RINGCOMP_CUDA_AWARE"):
        Transport(comm)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("cuda_aware", [False, True])
def test_gpu_sends_are_held_for_their_kernels_without_waits_or_deadlock(comm, cuda_aware,
                                                                        monkeypatch):
    """A pipelined ring of hops on CuPy buffers whose stream runs nothing until waited for
    (``LazyStream``): each hop's receive is copied in, a 'kernel' adds this rank's values
    and its result is sent on, all only queued. Sending never waits for the stream (the
    send is held until its event passed), yet no rank blocks in MPI on a send it has not
    posted - else this ring would hang - and every rank ends with the sum of all ranks."""
    stream, ndarray = install_lazy_cupy(monkeypatch)
    t = Transport(comm, cuda_aware=cuda_aware, timeout=60)
    p, r, segs = t.size, t.rank, 3
    right, left = (r + 1) % p, (r - 1) % p
    own = [np.full(5, (r + 1) * 10.0 ** s) for s in range(segs)]
    out = [ndarray(np.zeros(5)) for _ in range(segs)]
    for s in range(segs):
        stream.produce(out[s], own[s])
    sends, syncs_in_isend = [], 0
    for _step in range(p - 1):
        incoming = [ndarray(np.zeros(5)) for _ in range(segs)]
        recvs = [t.irecv(buf, left, tag=7) for buf in incoming]
        for s in range(segs):
            before = stream.syncs
            sends.append(t.isend(out[s], right, tag=7))
            syncs_in_isend += stream.syncs - before
        for s in range(segs):
            t.wait(recvs[s])
            out[s] = ndarray(np.zeros(5))  # a fresh buffer: the last one may still be sent
            stream.queue.append(lambda s=s, a=incoming[s], b=out[s]:
                                b.host.__setitem__(..., a.host + own[s]))
    t.waitall(sends)
    stream.synchronize()
    total = p * (p + 1) / 2
    ok = all(np.array_equal(out[s].host, np.full(5, total * 10.0 ** s)) for s in range(segs))
    assert every_rank(comm, ok), "wrong sums: a send read its buffer before its kernel ran"
    assert every_rank(comm, syncs_in_isend == 0), "a send waited for the stream"
    assert every_rank(comm, not t._held)
    t.close()


@pytest.mark.mpi(min_size=1)
def test_waiting_for_a_held_sends_gpu_work_is_under_the_deadline(comm, monkeypatch):
    """The host waiting for the kernels before a held send is a wait like any other: past
    the deadline it aborts with what it waited for, instead of hanging without a word."""
    stream, ndarray = install_lazy_cupy(monkeypatch)
    t = Transport(comm, cuda_aware=False, timeout=60)
    waits = []
    under_deadline = t._under_deadline
    monkeypatch.setattr(t, "_under_deadline", lambda call, pending, what="": (
        waits.append(what), under_deadline(call, pending, what))[1])
    buf, into = ndarray(np.zeros(3)), np.zeros(3)
    stream.produce(buf, np.full(3, 7.0))
    recv = t.irecv(into, t.rank, tag=3)
    t.wait(t.isend(buf, t.rank, tag=3))
    t.wait(recv)
    gpu = [w for w in waits if w.startswith("the GPU work queued before a send of 24 bytes")]
    assert every_rank(comm, len(gpu) == 1 and np.all(into == 7.0)), waits
    t.close()
