"""The compressed ring's walk compiled whole: its reduce-scatter and all-gather as Numba
functions that make their own MPI calls (bound and run by ``compressed_ring_native``)."""

from __future__ import annotations

import numba

from ringcomp.collectives import native_codecs as codecs
from ringcomp.collectives.ring_native import (
    _forward,
    _join,
    _post,
    _received,
    _send,
    _sent,
)
from ringcomp.kernels.rng_numba import call_key, hop_stream
from ringcomp.transport.mpicalls import IRECV
from ringcomp.transport.walkstate import BAD_PAYLOAD


@numba.njit(nogil=True, cache=True)
def _reduce_scatter(rule, spec, x, slots, scratch, bounds, sizes, thr, key, rider, order,
                    right, left, fns, comm, byte, tag, reqs, statuses, state):
    """The compressed ring's reduce-scatter of ``x`` (steps 1-2 of
    ``compressed_ring_allreduce``) over ``p = bounds.size - 1`` ranks, every chunk one
    non-empty segment whose payload is ``sizes[c]`` bytes, with the exact ring of
    ``rider`` (``_rider``: input, output, its two scratch halves, chunk bounds; every
    chunk one segment, possibly empty) after each chunk's payload; returns 0, the first
    MPI error code or a ``walkstate`` code (stopped, a message of another size, a payload
    out of range).

    Steps (chunk c = [bounds[c], bounds[c + 1]); rs = order[PHASE_RS], ``right``,
    ``left``: the rank's ``schedule.ring``):
      1. Encode chunk rs[0] into slot 0 (hop 0's stream), send it right, then the rider's
         chunk rs[0]; post step 0's receives (payload into slot p, the rider's into its
         even half).
      2. Step s: post step s + 1's receives (slots p and p + 1, the rider's halves,
         alternate by step), wait for chunk rs[s + 1], join this rank's values to it
         into slot 1 + s (hop s + 1's stream, from the call's ``key``: seed, step,
         bucket; Marsit's threshold ``thr[s]``) and send that right, except at the last
         step: slot p - 1 then holds the final payload of the chunk it owns. Then the rider's
         chunk: its output = its input + incoming (that operand order), sent right but at
         the last step.
      3. Wait for every send.
    Requests: sends in [0, 2p), payload receives in [2p, 2p + 2), the rider's in
    [2p + 2, 2p + 4). The messages, their order and tags are the Python walk's; every
    wait notes where it is in ``state`` and checks what arrived (``ring_native``).
    """
    p = bounds.size - 1
    rs = order[0]
    rx, rout, rbounds = rider[0], rider[1], rider[3]
    rn = rbounds[1:] - rbounds[:-1]  # the rider's chunks' elements (0: no message)
    rsize = rx.itemsize
    call = call_key(key[0], key[1], key[2])
    first = rs[0]
    lo, hi = bounds[first], bounds[first + 1]
    codecs.encode(rule, spec, x[lo:hi], slots[0][:sizes[first]], hop_stream(call, 0),
                  lo)  # 1.
    rc = _send(fns, state, slots[0].ctypes.data, sizes[first], byte, right, tag, comm, reqs,
               0)
    if rc:
        return rc
    rc, sends = _forward(fns, state, rn[first] > 0, rx, rbounds[first], rn[first] * rsize,
                         byte, right, tag, comm, reqs, 1)
    if rc:
        return rc
    rc = _post_step(fns[IRECV], slots, rider, sizes, rn, rs, 0, byte, left, tag, comm, reqs)
    if rc:
        return rc
    for step in range(p - 1):  # 2.
        if step + 1 < p - 1:
            rc = _post_step(fns[IRECV], slots, rider, sizes, rn, rs, step + 1, byte, left,
                            tag, comm, reqs)
            if rc:
                return rc
        c = rs[step + 1]
        rc = _received(fns, state, reqs, 2 * p + step % 2, statuses, byte, 0, step, left,
                       tag, sizes[c])
        if rc:
            return rc
        lo, hi = bounds[c], bounds[c + 1]
        if codecs.join(rule, spec, slots[p + step % 2][:sizes[c]], x[lo:hi],
                       slots[1 + step][:sizes[c]], scratch, thr[step],
                       hop_stream(call, step + 1), lo):
            return BAD_PAYLOAD
        rc, sends = _forward(fns, state, step < p - 2, slots[1 + step], 0, sizes[c], byte,
                             right, tag, comm, reqs, sends)
        if rc:
            return rc
        if rn[c] == 0:
            continue
        rc = _received(fns, state, reqs, 2 * p + 2 + step % 2, statuses, byte, 0, step, left,
                       tag, rn[c] * rsize)
        if rc:
            return rc
        rc, sends = _join(fns, state, rx, rout, rider[2][step % 2], rbounds[c], rn[c],
                          step < p - 2, byte, right, tag, comm, reqs, sends)
        if rc:
            return rc
    return _sent(fns, state, sends, reqs, statuses, 0, right, tag)  # 3.


@numba.njit(nogil=True)
def _post_step(recv, slots, rider, sizes, rn, rs, step, byte, left, tag, comm, reqs):
    """Post the reduce-scatter's receives of ``step``: chunk rs[step + 1]'s payload, then
    its rider segment if it has one (into the scratch half of the step's parity)."""
    p = sizes.size
    c = rs[step + 1]
    half = step % 2
    rc = _post(recv, slots[p + half].ctypes.data, sizes[c], byte, left, tag, comm, reqs,
               2 * p + half)
    if rc or rn[c] == 0:
        return rc
    return _post(recv, rider[2][half].ctypes.data, rn[c] * rider[0].itemsize, byte, left,
                 tag, comm, reqs, 2 * p + 2 + half)


@numba.njit(nogil=True, cache=True)
def _allgather(rule, spec, out, slots, bounds, sizes, rider, order, right, left, fns, comm,
               byte, tag, reqs, statuses, state):
    """The compressed ring's all-gather (steps 4-5): the final payloads forwarded unchanged
    and each decoded into ``out`` once forwarded, each followed by its chunk of the
    rider's output (``_rider``) received in place and forwarded; returns 0, the first MPI
    error code or a ``walkstate`` code.

    Steps (ag = order[PHASE_AG], ``schedule.ring``'s): 1. post every receive, chunk
    ag[s + 1] at step s: its payload into slot p + 2 + s
    (request 2p + s), its rider segment into the rider's output (request 3p + s); 2. send
    the owned chunk's final payload (slot p - 1) and rider segment, decode the payload;
    3. at step s wait, forward but at the last step, decode; the rider's segment likewise,
    undecoded; 4. wait for every send.
    """
    p = bounds.size - 1
    ag = order[1]
    recv = fns[IRECV]
    rout, rbounds = rider[1], rider[3]
    rn = rbounds[1:] - rbounds[:-1]
    rsize = rout.itemsize
    for step in range(p - 1):  # 1.
        c = ag[step + 1]
        rc = _post(recv, slots[p + 2 + step].ctypes.data, sizes[c], byte, left, tag, comm,
                   reqs, 2 * p + step)
        if rc:
            return rc
        if rn[c]:
            rc = _post(recv, rout[rbounds[c]:].ctypes.data, rn[c] * rsize, byte, left, tag,
                       comm, reqs, 3 * p + step)
            if rc:
                return rc
    own = ag[0]  # 2.
    rc = _send(fns, state, slots[p - 1].ctypes.data, sizes[own], byte, right, tag, comm,
               reqs, 0)
    if rc:
        return rc
    rc, sends = _forward(fns, state, rn[own] > 0, rout, rbounds[own], rn[own] * rsize, byte,
                         right, tag, comm, reqs, 1)
    if rc:
        return rc
    if codecs.decode(rule, spec, slots[p - 1][:sizes[own]],
                     out[bounds[own]:bounds[own + 1]]):
        return BAD_PAYLOAD
    for step in range(p - 1):  # 3.
        c = ag[step + 1]
        rc = _received(fns, state, reqs, 2 * p + step, statuses, byte, 1, step, left, tag,
                       sizes[c])
        if rc:
            return rc
        rc, sends = _forward(fns, state, step < p - 2, slots[p + 2 + step], 0, sizes[c],
                             byte, right, tag, comm, reqs, sends)
        if rc:
            return rc
        if codecs.decode(rule, spec, slots[p + 2 + step][:sizes[c]],
                         out[bounds[c]:bounds[c + 1]]):
            return BAD_PAYLOAD
        if rn[c] == 0:
            continue
        rc = _received(fns, state, reqs, 3 * p + step, statuses, byte, 1, step, left, tag,
                       rn[c] * rsize)
        if rc:
            return rc
        rc, sends = _forward(fns, state, step < p - 2, rout, rbounds[c], rn[c] * rsize, byte,
                             right, tag, comm, reqs, sends)
        if rc:
            return rc
    return _sent(fns, state, sends, reqs, statuses, 1, right, tag)  # 4.


@numba.njit(nogil=True, cache=True)
def _walk(rule, spec, x, out, slots, scratch, bounds, sizes, thr, key, rider, order, right,
          left, fns, comm, byte, tag, reqs, statuses, state):
    """Both halves in one call, for a call with no agreement between them (``check_input``
    off: its input was checked before the call); 0 or the first error code."""
    rc = _reduce_scatter(rule, spec, x, slots, scratch, bounds, sizes, thr, key, rider,
                         order, right, left, fns, comm, byte, tag, reqs, statuses, state)
    if rc:
        return rc
    return _allgather(rule, spec, out, slots, bounds, sizes, rider, order, right, left, fns,
                      comm, byte, tag + 1, reqs, statuses, state)
