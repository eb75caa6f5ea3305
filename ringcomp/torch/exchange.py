"""The ``"ringcomp"`` backend's calls made of point-to-point messages: all-to-all (even and
uneven), gather and scatter, with the sizes every rank passed checked against each other."""

from __future__ import annotations

import numpy as np

from ringcomp.torch.backend_tensors import refused, view


def exchange(transport, name: str, sends: list, recvs: list) -> None:
    """Every rank sends ``sends[j]`` to rank j and receives ``recvs[j]`` from it (None or
    an empty array: no message), its own block copied.

    1. Post the receives, from the next rank on (rank r: r+1, r+2, ...).
    2. Copy this rank's own block.
    3. Post the sends in the same order, so that no two ranks start on the same peer.
    4. Wait for all of them under the transport's deadline.

    Invariant: rank i's ``sends[j]`` is as long in bytes as rank j's ``recvs[i]`` (the
    callers agree the sizes first); each receive checks its byte count as it completes.
    """
    r, p = transport.rank, transport.size
    peers = [(r + k) % p for k in range(1, p)]
    nbytes = sum(a.nbytes for a in sends if a is not None)
    with transport.exclusive(name):
        tag = transport.begin_op(name, "pairwise", nbytes)
        pending = [transport.irecv(recvs[j], j, tag) for j in peers
                   if recvs[j] is not None and recvs[j].nbytes]
        if recvs[r] is not None and recvs[r].nbytes:
            recvs[r].reshape(-1)[...] = sends[r].reshape(-1)
        pending += [transport.isend(sends[j], j, tag) for j in peers
                    if sends[j] is not None and sends[j].nbytes]
        transport.waitall(pending)


def _rows(tensor, splits: list, p: int, call: str, what: str) -> list[int]:
    """``splits`` (rows of dimension 0 per rank; empty: equal parts) checked against
    ``tensor``."""
    rows = tensor.shape[0] if tensor.dim() else 1
    if not splits:
        if rows % p:
            raise refused(call, f"an {what} of {rows} rows does not split into {p} equal "
                                f"parts (pass its split sizes)")
        return [rows // p] * p
    splits = [int(s) for s in splits]
    if len(splits) != p or min(splits) < 0 or sum(splits) != rows:
        raise refused(call, f"{what} split sizes {splits}: need {p} sizes >= 0 summing to "
                            f"its {rows} rows")
    return splits


def _row(tensor) -> int:
    """Elements in one row of dimension 0."""
    return int(np.prod(tensor.shape[1:], dtype=np.int64)) if tensor.dim() else 1


def _blocks(array: np.ndarray, rows: list[int]) -> list[np.ndarray]:
    flat = array.reshape(sum(rows), array.size // max(sum(rows), 1))
    bounds = np.cumsum([0, *rows])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def all_to_all_single(group, output, tensor, output_splits, input_splits) -> None:
    """``all_to_all_single``: rank i's input block j (``input_splits[j]`` rows) is rank j's
    output block i; every rank's sizes are checked against the others' before any message."""
    call, p = "all_to_all_single", group.size()

    def prepare():
        if output.dtype != tensor.dtype:
            raise refused(call, f"output {output.dtype}, input {tensor.dtype}")
        out, a = view(output, call), view(tensor, call)
        outs, ins = _rows(output, output_splits, p, call, "output"), _rows(
            tensor, input_splits, p, call, "input")
        return (out, a, outs, ins), (str(tensor.dtype), _row(tensor), _row(output), ins, outs)

    (out, a, outs, ins), shared = group.prepared_shared(prepare)
    _agree_pairs(call, shared)
    exchange(group.transport, call, _blocks(a, ins), _blocks(out, outs))


def all_to_all(group, outputs: list, inputs: list) -> None:
    """``all_to_all``: rank i's ``inputs[j]`` is rank j's ``outputs[i]``."""
    call, p = "all_to_all", group.size()

    def prepare():
        if len(outputs) != p or len(inputs) != p:
            raise refused(call, f"{len(inputs)} inputs and {len(outputs)} outputs for a "
                                f"group of {p}")
        for o, t in zip(outputs, inputs, strict=True):
            if o.dtype != t.dtype:
                raise refused(call, f"output {o.dtype}, input {t.dtype}")
        outs, ins = [view(t, call) for t in outputs], [view(t, call) for t in inputs]
        return (outs, ins), (str(inputs[0].dtype), 1, 1, [a.size for a in ins],
                             [o.size for o in outs])

    (outs, ins), shared = group.prepared_shared(prepare)
    _agree_pairs(call, shared)
    exchange(group.transport, call, ins, outs)


def _agree_pairs(call: str, shared: list) -> None:
    """Every rank's (dtype, elements in an input row, in an output row, rows to each rank,
    rows from each rank): the same verdict on every rank, so that all raise or none does."""
    dtypes = [dtype for dtype, *_ in shared]
    if len(set(dtypes)) > 1:
        raise refused(call, f"ranks passed different dtypes: {dtypes}")
    for i, (_, row_in, _, sends, _) in enumerate(shared):
        for j, (_, _, row_out, _, receives) in enumerate(shared):
            if sends[j] * row_in != receives[i] * row_out:
                raise refused(call, f"rank {i} sends {sends[j] * row_in} elements to rank "
                                    f"{j}, which expects {receives[i] * row_out}")


def _rooted(group, call: str, tensor, listed: list, root: int, what: str):
    """(this rank's ``tensor`` as an array, the root's ``listed`` - one per rank, each as
    large as its ``tensor`` - or p Nones elsewhere), every rank's dtype and size judged
    against the others': what ``gather`` and ``scatter`` exchange."""
    p, r = group.size(), group.rank()

    def prepare():
        mine, many = view(tensor, call), [None] * p
        if r == root:
            if len(listed) != p:
                raise refused(call, f"{len(listed)} {what} on the root for a group of {p}")
            many = [view(t, call) for t in listed]
            if any(m.size != mine.size or m.dtype != mine.dtype for m in many):
                raise refused(call, f"the root's {what} {[tuple(t.shape) for t in listed]} "
                                    f"for its {tuple(tensor.shape)} {tensor.dtype}")
        return (mine, many), (str(tensor.dtype), mine.size)

    (mine, many), shared = group.prepared_shared(prepare)
    if len(set(shared)) > 1:
        raise refused(call, f"ranks passed different tensors (dtype, elements): "
                            f"{[tuple(s) for s in shared]}")
    return mine, many


def gather(group, outputs: list, tensor, root: int) -> None:
    """``gather``: every rank's ``tensor`` into the root's ``outputs[rank]``."""
    a, outs = _rooted(group, "gather", tensor, outputs, root, "outputs")
    sends = [a if j == root else None for j in range(group.size())]
    exchange(group.transport, "gather", sends, outs)


def scatter(group, output, inputs: list, root: int) -> None:
    """``scatter``: the root's ``inputs[rank]`` into every rank's ``output``."""
    out, ins = _rooted(group, "scatter", output, inputs, root, "inputs")
    exchange(group.transport, "scatter", ins,
             [out if j == root else None for j in range(group.size())])
