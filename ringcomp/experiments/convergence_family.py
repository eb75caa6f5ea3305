"""The one false-discovery-rate family of the convergence study's paired comparisons, the
same for every table that shows one of them.

1. The family is every comparison the records of ``FAMILY`` make: in each task and rank
   count, every method against the column's reference (the exact ring) and every pair of
   ``PAIRS`` both present; the primary comparisons (``PRIMARY``) among them.
2. Each comparison's two-sided paired t-test over the seeds, then Benjamini-Hochberg at
   ``FDR`` over the whole family at once.
3. Invariant: a comparison is named by its task, rank count, training options and the two
   methods, so its mark is the same whichever block renders it, and a block showing some
   of the family's records adjusts over all of them, not over what it shows. Records
   outside ``FAMILY`` (a new study's) join the family of the block that shows them.
"""

from __future__ import annotations

import math
import os

from ringcomp import runs
from ringcomp.results.record import ROOT, load

#: every convergence record under docs/records (a test holds it so): the accuracy columns
#: (8 and 16 ranks, the fixed-global-batch ones), the sketches' and Marsit's second rates',
#: named here once for every table - fixed after they were measured, not before
FAMILY = (*(f"convergence-{name}.json" for name in (
    "p8-mlp", "p8-cnn", "p8-mlp-skew", "p8-cnn-skew", "p8-teacher",
    "p16-mlp", "p16-cnn", "p16-mlp-skew", "p16-cnn-skew", "p16-teacher",
    "p4-b64", "p16-b64", "p8-countsketch")), "marsit-rates-p8.json")
#: the comparisons the seeds' claims turn on, paired seed by seed: Marsit against the
#: cascading sign it replaces on the same topology (Marsit's premise), and the two-stage
#: 1-bit scheme and majority vote against Marsit's ring
PAIRS = (("ring+marsit", "ring+sign"), ("torus+marsit", "torus+sign"),
         ("twostage+sign+ef", "ring+marsit"), ("allgather+marsit", "ring+marsit"))
#: the comparisons Marsit's claims stand on (on the ring: against the exact ring, and
#: against the ring's cascading sign it replaces), named after the 8- and 16-rank columns
#: were measured and before the fixed-batch ones; in the family like every other
PRIMARY = frozenset({("ring+marsit", "ring"), ("ring+marsit", "ring+sign")})
#: the false-discovery rate of the family's mark (Benjamini-Hochberg)
FDR = 0.05


def paired_from_seeds(row: dict, reference: dict) -> tuple[float, float] | None:
    """Mean and 95% half-width of ``row``'s test accuracy minus ``reference``'s, seed by
    seed, from the per-seed accuracies the record keeps; None unless every seed of both
    has one (a diverged run has none)."""
    mine, theirs = row["seed_test_acc"], reference["seed_test_acc"]
    if set(mine) != set(theirs) or None in (*mine.values(), *theirs.values()):
        return None
    diffs = [mine[seed] - theirs[seed] for seed in sorted(mine, key=int)]
    return float(sum(diffs) / len(diffs)), runs.ci95(diffs)


def p_value(row: dict, reference: dict) -> float | None:
    """The two-sided paired t-test's p of ``row`` against ``reference`` over the seeds
    (below 0.05 exactly where the 95% t-interval excludes 0); None without one."""
    if paired_from_seeds(row, reference) is None:
        return None
    from scipy import stats

    seeds = sorted(row["seed_test_acc"], key=int)
    diffs = [row["seed_test_acc"][s] - reference["seed_test_acc"][s] for s in seeds]
    if not any(d != diffs[0] for d in diffs):  # no spread: identical runs, or a constant gap
        return 1.0 if diffs[0] == 0 else 0.0
    p = float(stats.ttest_1samp(diffs, 0.0).pvalue)
    return p if math.isfinite(p) else None


def key(record: dict, task: str, row: dict, reference: dict) -> tuple:
    """A comparison's name: task, rank count, training options, the two methods."""
    return (task, record["ranks"], record["tasks"][task]["base"], row["label"],
            reference["label"])


def comparisons(record: dict) -> list[tuple[tuple, dict, dict]]:
    """Step 1 for one record: (name, row, reference) of every comparison it makes."""
    found = []
    for task, result in record["tasks"].items():
        rows = {row["label"]: row for row in result["rows"]}
        reference = rows[next(iter(rows.values()))["versus"]]
        pairs = [(row, reference) for row in rows.values() if row is not reference]
        pairs += [(rows[a], rows[b]) for a, b in PAIRS if a in rows and b in rows]
        found += [(key(record, task, row, ref), row, ref) for row, ref in pairs]
    return found


def family_records() -> list[dict]:
    """The records of ``FAMILY``, from docs/records (every one must be there)."""
    return [load(os.path.join(ROOT, "docs", "records", name)) for name in FAMILY]


def survivors(shown: list[dict]) -> tuple[set, int]:
    """Step 2: the names of the comparisons that survive the adjustment over the family
    (``family_records`` and any record of ``shown`` outside it), and the family's size."""
    from scipy import stats

    tested = {}
    for record in [*family_records(), *shown]:
        for name, row, ref in comparisons(record):
            if name in tested and (tested[name][0]["seed_test_acc"], tested[name][1][
                    "seed_test_acc"]) != (row["seed_test_acc"], ref["seed_test_acc"]):
                raise ValueError(f"two records compare {name[3]} with {name[4]} on {name[0]} "
                                 f"at {name[1]} ranks with the same options and other "
                                 "accuracies: which one the family holds is ambiguous")
            tested.setdefault(name, (row, ref))  # a record shown again is no new test
    found = [(name, p_value(row, ref)) for name, (row, ref) in tested.items()]
    found = [(name, p) for name, p in found if p is not None]
    if not found:
        return set(), 0
    adjusted = stats.false_discovery_control([p for _, p in found], method="bh")
    return ({name for (name, _), q in zip(found, adjusted, strict=True) if q < FDR},
            len(found))
