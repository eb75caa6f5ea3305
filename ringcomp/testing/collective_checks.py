"""The kit's checks of a compressor inside the collectives, on every rank of a communicator."""

from __future__ import annotations

import pickle

import numpy as np

from ringcomp.collectives import compressed_algorithms
from ringcomp.compression import ErrorFeedback, Key
from ringcomp.plans.call import allreduce
from ringcomp.testing.codec_checks import carried, codecs, sample
from ringcomp.testing.replay import REPLAYS, SEG_BYTES
from ringcomp.testing.verdict import judged
from ringcomp.transport.cache import get_transport

#: a call's key (seed, step, bucket) in the collective checks
SEED, STEP, BUCKET = 5, 2, 1


def algorithms_for(comp) -> list[str]:
    """The algorithms a compressor runs on: every compressed form, or (a compressor that
    wraps an exact all-reduce, PowerSGD) two exact ones."""
    return ["ring", "tree"] if comp.wraps_exact else compressed_algorithms()


def _data(rank: int, n: int, dtype) -> np.ndarray:
    return sample("normal", n, dtype, seed=100 + rank)


def hop_rule_as_declared(spec: str, comm=None) -> None:
    """The hop rule does what its class declares: a cascade's ``join`` is decode, add,
    re-encode with the hop's key; linear payloads add (``add(encode(a), encode(b))``
    decodes to ``decode(encode(a)) + decode(encode(b))`` or to ``decode(encode(a + b))``,
    within one rounding to 8 significant bits - bf16's, the coarsest payload that adds:
    fp16's and bf16's sums round once more, a sketch's decoding is not itself linear); a
    Marsit merge keeps, element by element, one of the two payloads' signs.
    Single-process, on every rank alike."""

    def find():
        comp = codecs(spec)
        if comp.wraps_exact:
            return None  # no hop rule: factors are summed exactly
        for dtype in (np.float32, np.float64):
            n = 777
            a, b = _data(0, n, dtype), _data(1, n, dtype)
            pa, pb = comp.encode(a, Key(seed=1)), comp.encode(b, Key(seed=1))
            da, db = (comp.decode(p, n, np.empty(n, dtype)) for p in (pa, pb))
            joined = comp.decode(comp.join(pa, b, 1, Key(seed=1, hop=1), np.empty(n, dtype)),
                                 n, np.empty(n, dtype))
            if comp.cascades:
                again = comp.decode(comp.encode(da + b, Key(seed=1, hop=1)), n,
                                    np.empty(n, dtype))
                if not np.array_equal(joined, again):
                    return (f"join is not decode + add + re-encode ({np.dtype(dtype).name}: "
                            f"{np.count_nonzero(joined != again)} of {n} elements differ)")
            elif comp.linear:
                both = comp.decode(comp.add(pa, pb, n), n, np.empty(n, dtype))
                whole = comp.decode(comp.encode(a + b, Key(seed=1)), n, np.empty(n, dtype))
                tiny = 1e-5 * np.abs(whole).max()
                off = ~(np.isclose(both, whole, rtol=2**-7, atol=tiny)
                        | np.isclose(both, da + db, rtol=2**-7, atol=tiny))
                if off.any():
                    return (f"linear payloads do not add: decode(add(encode(a), encode(b))) "
                            f"is neither decode(a) + decode(b) nor decode(encode(a + b)) at "
                            f"{np.count_nonzero(off)} of {n} elements ({np.dtype(dtype).name})")
            elif comp.signs_only and not np.all((joined == da) | (joined == db)):
                return "a merge made values that are neither payload's sign"
        return None

    judged(comm, spec, "hop rule as declared", find)


def matches_replay(spec: str, comm=None) -> None:
    """Every compressed algorithm's result is the same bytes on every rank and equals the
    single-process replay of its hop order with the compressor's own hop operations
    (``ringcomp.testing.replay``), at several lengths (0, 1, p + 1, 777, 5000) in
    float32 and float64; PowerSGD: the same bytes on every rank."""
    transport = get_transport(comm)

    def find():
        comp = codecs(spec)
        for algorithm in algorithms_for(comp):
            for dtype in (np.float32, np.float64):
                for n in (0, 1, transport.size + 1, 777, 5000):
                    x = _data(transport.rank, n, dtype)
                    y = allreduce(x, algorithm=algorithm, compressor=spec, seed=SEED,
                                  step=STEP, bucket=BUCKET, segment_bytes=SEG_BYTES,
                                  comm=transport)
                    where = f"{algorithm} at {transport.size} ranks, {n} " \
                            f"{np.dtype(dtype).name} elements"
                    if any(other != y.tobytes() for other in transport.allgather_obj(
                            y.tobytes())):
                        return f"{where}: the ranks' results differ"
                    if comp.wraps_exact:
                        continue
                    replay = REPLAYS.get(algorithm)
                    if replay is None:  # a new compressed form: its replay is its oracle
                        return f"{algorithm} has no replay in ringcomp.testing.replay.REPLAYS"
                    expected = replay(codecs(spec), transport.allgather_obj(x),
                                      Key(SEED, STEP, BUCKET))
                    if not np.array_equal(y, expected):
                        wrong = np.flatnonzero(y != expected)
                        return (f"{where}: {wrong.size} elements differ from the "
                                f"single-process replay (first: index {wrong[0]}, "
                                f"{y[wrong[0]]!r} against {expected[wrong[0]]!r})")
        return None

    judged(comm, spec, "hop composition", find)


def error_feedback_invariant(spec: str, comm=None) -> None:
    """With error feedback, at every step the output plus every rank's new residual is
    every rank's input plus its old residual: nothing is lost or made up, only delayed
    (on the all-gather scheme, or for PowerSGD on the ring, whose outputs are sums of
    what each rank's payload stands for). Compressors of signs only take Marsit's global
    compensation instead: not applicable."""
    transport = get_transport(comm)

    def find():
        comp = codecs(spec)
        if comp.signs_only:
            return None
        algorithm = "ring" if comp.wraps_exact else "allgather"
        memory, old, n = ErrorFeedback(), np.zeros(777, np.float32), 777
        for step in range(4):
            x = _data(transport.rank + 10 * step, n, np.float32)
            y = allreduce(x, algorithm=algorithm, compressor=comp, error_feedback=memory,
                          seed=SEED, step=step, bucket=BUCKET, comm=transport)
            new = next(iter(memory.residuals.values()))
            went_in = np.sum(transport.allgather_obj(x + old), axis=0)
            kept = np.sum(transport.allgather_obj(new), axis=0)
            scale = np.abs(went_in).max() + np.abs(kept).max()
            if not np.allclose(y + kept, went_in, rtol=0, atol=1e-4 * scale):
                worst = np.argmax(np.abs(y + kept - went_in))
                return (f"step {step} on {algorithm}: output + residuals differs from inputs "
                        f"+ old residuals by {abs(y + kept - went_in)[worst]:.3g} at index "
                        f"{worst} (scale {scale:.3g})")
            old = new.copy()
        return None

    judged(comm, spec, "error feedback's invariant", find)


def state_round_trip(spec: str, comm=None) -> None:
    """``state_dict()`` returns a copy of everything the compressor carries between calls,
    which pickles, and which ``load_state_dict`` restores on a new instance: after a call,
    the next call of the original and of the restored instance give the same bytes (a
    resumed run continues as if never stopped), whatever is written into the dict after."""
    transport = get_transport(comm)

    def find():
        original, restored = codecs(spec), codecs(spec)
        algorithm = algorithms_for(original)[0]
        x = _data(transport.rank, 777, np.float32)
        allreduce(x, algorithm=algorithm, compressor=original, seed=SEED, step=0,
                  bucket=BUCKET, comm=transport)
        state = original.state_dict()
        restored.load_state_dict(pickle.loads(pickle.dumps(state)))
        for value in state.values():  # the dict is a copy: writing it changes nothing
            if isinstance(value, np.ndarray) and value.flags.writeable:
                value[...] = 0
        ys = [allreduce(x, algorithm=algorithm, compressor=comp, seed=SEED, step=1,
                        bucket=BUCKET, comm=transport) for comp in (original, restored)]
        if not np.array_equal(*ys):
            return (f"after a call on {algorithm}, the instance restored from its state_dict "
                    f"gives other results than the original ({np.count_nonzero(ys[0] != ys[1])}"
                    f" of 777 elements differ)")
        fresh = codecs(spec)
        fresh.load_state_dict({})
        if fresh.state_dict():
            return "load_state_dict({}) left state behind"
        return None

    judged(comm, spec, "state dict round trip", find)


def refuses_non_finite(spec: str, comm=None) -> None:
    """NaN on one rank or Inf on another raises FloatingPointError on every rank (no payload
    can carry them), on every algorithm; finite input within the declared range sums to
    finite values or is refused the same way - never a silent Inf."""
    transport = get_transport(comm)

    def find():
        comp = codecs(spec)
        limit = carried(comp)
        for algorithm in algorithms_for(comp):
            for bad, rank in ((np.nan, transport.size - 1), (np.inf, 0)):
                x = _data(transport.rank, 777, np.float32)
                if transport.rank == rank:
                    x[5] = bad
                try:
                    allreduce(x, algorithm=algorithm, compressor=spec, comm=transport)
                except FloatingPointError:
                    continue
                return f"{algorithm}: {bad} on rank {rank} was not refused with " \
                       f"FloatingPointError on rank {transport.rank}"
            x = (_data(transport.rank, 777, np.float32) * limit / (8 * transport.size))
            try:
                y = allreduce(x.astype(np.float32), algorithm=algorithm, compressor=spec,
                              comm=transport)
            except FloatingPointError:
                continue
            if not np.isfinite(y).all():
                return (f"{algorithm}: finite input up to {np.abs(x).max():.3g} (within the "
                        f"declared range) summed to {np.count_nonzero(~np.isfinite(y))} "
                        f"non-finite values")
        return None

    judged(comm, spec, "non-finite refused", find)
