"""Staleness judged by behaviour: the value records' digests, stamped on sub-communicators
and checked again against the code (``experiments.digests``), at every rank count."""

from __future__ import annotations

import os

import pytest
from conftest import every_rank
from mpi4py import MPI

from ringcomp.experiments import digests
from ringcomp.experiments.miniatures import digest
from ringcomp.results.record import provenance, write
from ringcomp.transport.cache import get_transport

PARTS = ["train:exact", "train:--compressor sign", "hops:ring+qsgd"]


def test_a_stamp_on_the_first_ranks_is_what_any_ranks_of_that_count_compute(comm):
    """``stamp`` computes each part on the first n ranks; any other n ranks (or a world
    of n) must give the same digest, or CI's re-run at n ranks could not check it."""
    transport = get_transport(comm)
    stamped = digests.stamp(transport, PARTS)
    counts = [n for n in digests.RANKS if n <= comm.size]
    assert every_rank(comm, set(stamped) == {f"{p}@{n}" for p in PARTS for n in counts})
    for n in counts:  # the last n ranks: another sub-communicator of that size
        inside = comm.rank >= comm.size - n
        sub = comm.Split(0 if inside else MPI.UNDEFINED, comm.rank)
        same = True
        if inside:
            small = get_transport(sub)
            same = all(digest(small, p) == stamped[f"{p}@{n}"] for p in PARTS)
            small.close("checked")
            sub.Free()
        assert every_rank(comm, same)
    # options that train differently give different digests
    here = {p: digest(transport, p) for p in PARTS}
    assert every_rank(comm, len(set(here.values())) == len(PARTS))


@pytest.fixture
def records_dir(mpi_tmp_path):
    return str(mpi_tmp_path)


def test_check_names_each_value_record_whose_digest_moved_or_is_missing(comm, records_dir):
    """Against the code now at this rank count: a record whose digest matches passes, one
    whose digest differs is named with its re-measure command, a value record without
    digests fails, one whose digests were computed under other BLAS kernels is named with
    the kernels to check under, and a timing record is never judged."""
    transport = get_transport(comm)
    key = f"train:exact@{comm.size}"
    now = digest(transport, "train:exact")
    paths = {name: os.path.join(records_dir, f"{name}.json")
             for name in ("current", "moved", "bare", "timing", "blas")}
    if comm.rank == 0:
        for name, kind, stamped in (("current", "convergence", {key: now}),
                                    ("moved", "hops", {key: "0" * 16, "train:exact@99": "x"}),
                                    ("bare", "target-tuning", None),
                                    ("timing", "bench", None),
                                    ("blas", "convergence", {key: now})):
            prov = provenance([f"measure-{name}"], "", None, stamped)
            if name == "blas":
                prov["digests_blas"] = "Elsewhere"  # another CPU's kernels: bits differ
            write(paths[name], kind, prov, {})
    comm.barrier()
    problems, compared = digests.check(transport, list(paths.values()))
    assert every_rank(comm, len(problems) == 3 and compared == 2)  # current and moved
    bare, blas, moved = sorted(problems)  # by file name
    assert every_rank(comm, "blas.json: its digests were computed under OpenBLAS's "
                      "Elsewhere kernels" in blas and "OPENBLAS_CORETYPE=Elsewhere" in blas)
    assert every_rank(comm, "bare.json: a target-tuning record without digests" in bare
                      and "`measure-bare`" in bare)
    assert every_rank(comm, "moved.json: the code no longer gives its values (1 of its "
                      f"digests moved: {key})" in moved and "`measure-moved`" in moved)
