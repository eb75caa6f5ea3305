"""Staleness judged by behaviour: value records carry the digests of their miniature runs, and
``python -m ringcomp.experiments digests --check`` computes them again.

1. A study of computed values (``VALUE_KINDS``) names the parts its methods use
   (``set_defaults(digest_parts=fn(args) -> parts)``); ``python -m ringcomp.experiments``
   stamps them (``stamp``) before the study starts: the miniature of every part
   (``miniatures``) at each of ``RANKS`` that the job has, on a sub-communicator of that
   many ranks, handed to the study as ``args.digests``; its record's provenance keeps
   them as ``{part@ranks: digest}``.
2. ``make test`` runs ``digests --check`` at 4 and at 5 ranks: every part a record under
   ``docs/records`` names at that rank count is computed again, and every record whose
   digest no longer matches is named with its re-measure command (exit 1). A value record
   with no digests fails too. Timing records carry none and never fail for age.

A matrix product's bits depend on the kernels OpenBLAS picks for the CPU (its AVX-512 and
AVX2 kernels give other digests), so a record names the kernels its digests were computed
under (``digests_blas``) and is compared only under the same ones. ``make test`` checks
under ``DIGEST_BLAS`` (``OPENBLAS_CORETYPE=Haswell``: they run on every AVX2 machine);
``make convergence`` and ``make hops`` set it, and a value study run without it warns.
"""

from __future__ import annotations

import glob
import logging
import os

from mpi4py import MPI

from ringcomp.cli import common_parser
from ringcomp.experiments.miniatures import MINIATURES, digest
from ringcomp.results.record import ROOT, blas_kernels, load
from ringcomp.transport.cache import get_transport

log = logging.getLogger(__name__)

#: the rank counts a digest is computed at: 4 (a 2 x 2 torus, a power of two for the trees)
#: and 5 (odd: finds ring bugs; prime: the torus is a ring there)
RANKS = (4, 5)
#: the record kinds of computed values: each must carry digests
VALUE_KINDS = ("convergence", "target-tuning", "hops")
#: the OpenBLAS kernels (``OPENBLAS_CORETYPE``) ``make test`` computes digests under
DIGEST_BLAS = "Haswell"
#: where the records the docs render live
RECORDS = os.path.join(ROOT, "docs", "records")


def stamp(transport, parts) -> dict:
    """``{part@n: digest}`` of every part, for each ``n`` of ``RANKS`` up to the job's size,
    each computed on the first ``n`` ranks (collective; every rank returns the same)."""
    parts = sorted(set(parts))
    kernels = blas_kernels()
    if kernels != DIGEST_BLAS and transport.rank == 0:
        log.warning(f"OpenBLAS runs its {kernels} kernels here: this record's digests can "
                    f"be checked only under them, and make test checks under "
                    f"{DIGEST_BLAS}'s (set OPENBLAS_CORETYPE={DIGEST_BLAS} for a record "
                    "meant for the docs)")
    found = {}
    for n in (n for n in RANKS if n <= transport.size):
        inside = transport.rank < n
        sub = transport.comm.Split(0 if inside else MPI.UNDEFINED, transport.rank)
        if inside:
            small = get_transport(sub)
            found.update({f"{part}@{n}": digest(small, part) for part in parts})
            small.close("its digests are done")
            sub.Free()
        log.info(f"digests of {len(parts)} parts at {n} ranks done")
        transport.barrier()
    return transport.bcast_obj(found)


def value_records(paths=None) -> dict[str, dict]:
    """path -> record of every value record among ``paths`` (default: ``docs/records``)."""
    paths = paths or sorted(glob.glob(os.path.join(RECORDS, "*.json")))
    try:
        found = {path: load(os.path.abspath(path)) for path in paths}
    except (OSError, ValueError) as err:  # every rank reads the same: every rank stops
        raise SystemExit(f"ringcomp.experiments digests: {err}") from None
    return {path: r for path, r in found.items() if r.get("kind") in VALUE_KINDS}


def check(transport, paths=None) -> tuple[list[str], int]:
    """Every value record's digests at this job's rank count against the code now: one line
    per record that differs or has none, and how many records were compared (the same on
    every rank)."""
    size, problems, kernels, compared = transport.size, [], blas_kernels(), 0
    found = value_records(paths)
    wanted = sorted({key.rsplit("@", 1)[0] for r in found.values()
                     if r["provenance"].get("digests_blas") == kernels
                     for key in r["provenance"].get("digests", {})
                     if key.endswith(f"@{size}")})
    now = {f"{part}@{size}": digest(transport, part) for part in wanted}
    for path, r in found.items():
        prov, name = r["provenance"], os.path.relpath(path, ROOT)
        stamped = prov.get("digests")
        if not stamped:
            problems.append(f"{name}: a {r['kind']} record without digests: re-measure with "
                            f"`{prov['command']}`")
            continue
        if not any(key.endswith(f"@{size}") for key in stamped):
            continue  # none at this rank count: nothing to compare here
        if prov.get("digests_blas") != kernels:
            problems.append(f"{name}: its digests were computed under OpenBLAS's "
                            f"{prov.get('digests_blas')} kernels, this check runs under "
                            f"{kernels}'s: check with OPENBLAS_CORETYPE="
                            f"{prov.get('digests_blas')} (make test: {DIGEST_BLAS})")
            continue
        compared += 1
        moved = [key for key in stamped if key in now and stamped[key] != now[key]]
        if moved:
            problems.append(f"{name}: the code no longer gives its values ({len(moved)} of "
                            f"its digests moved: {', '.join(moved)}): re-measure with "
                            f"`{prov['command']}`")
    return problems, compared


def main(args) -> int:
    transport = get_transport()
    if args.parts:
        found = stamp(transport, args.parts)
        if transport.rank == 0:
            for key, value in found.items():
                print(f"{value}  {key}")
        return 0
    problems, compared = check(transport, args.records or None)
    if transport.rank == 0:
        for line in problems:
            print(line)
        verdict = (f"{len(problems)} records fail" if problems else
                   f"{compared} records compared, every one matches" if compared else
                   f"no record has digests at {transport.size} ranks (they are at "
                   f"{' and '.join(map(str, RANKS))})")
        print(f"# digests at {transport.size} ranks: {verdict}")
    return 1 if problems else 0


def add_parser(sub) -> None:
    """This tool's sub-parser of ``python -m ringcomp.experiments``."""
    p = sub.add_parser("digests", parents=[common_parser()],
                       help="check that the value records' digests still match the code")
    p.add_argument("records", nargs="*", metavar="RECORD",
                   help="records to check (default: every value record in docs/records)")
    p.add_argument("--check", action="store_true", dest="compare",
                   help="compute every digest the records name at this rank count and "
                        "compare (the default action; exit 1 naming each stale record)")
    p.add_argument("--parts", nargs="+", metavar="PART",
                   help="print the digests of these parts instead (train:OPTIONS, "
                        "hops:ALGORITHM+COMPRESSOR) at 4 and 5 ranks")
    p.set_defaults(run=main, mpi=True, check=check_args)


def check_args(args, parser) -> None:
    if args.parts and (args.compare or args.records):
        parser.error("--parts prints digests; it takes no --check and no RECORD")
    bad = [part for part in args.parts or () if part.partition(":")[0] not in MINIATURES
           or not part.partition(":")[2]]
    if bad:
        parser.error(f"unknown digest parts {bad}; parts are "
                     f"{', '.join(kind + ':...' for kind in MINIATURES)}")
