"""The convergence study's columns side by side: one table across its records (a task and
a rank count each, run one at a time), rendered into the docs."""

from __future__ import annotations

from ringcomp.experiments.convergence import paired_from_seeds
from ringcomp.results.blocks import renderer

#: the comparisons the seeds' claims turn on, paired seed by seed: Marsit against the
#: cascading sign it replaces on the same topology (Marsit's premise), and the two-stage
#: 1-bit scheme and majority vote against Marsit's ring
PAIRS = (("ring+marsit", "ring+sign"), ("torus+marsit", "torus+sign"),
         ("twostage+sign+ef", "ring+marsit"), ("allgather+marsit", "ring+marsit"))


def _columns(found: list[dict]) -> list[tuple[str, dict]]:
    """(heading, rows by method) per task of every record, in the order given."""
    return [(f"{task}, p={record['ranks']}", {row["label"]: row for row in result["rows"]})
            for record in found for task, result in record["tasks"].items()]


def _accuracy(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["test_acc"] is None:
        return "diverged"
    return f"{row['test_acc']:.3f} ± {row['test_acc_ci95']:.3f} ({row['lr']:g})"


def _paired(row: dict | None, reference: dict) -> str:
    """Points of test accuracy against the column's first method, seed by seed; bold
    where the 95% interval excludes 0."""
    if row is None or row is reference:
        return "-"
    paired = paired_from_seeds(row, reference)
    if paired is None:
        return "n/a"
    mean, half = 100 * paired[0], 100 * paired[1]
    text = f"{mean:+.2f} ± {half:.2f}"  # two decimals: a bold row must read as excluding 0
    return f"**{text}**" if abs(mean) > half else text


@renderer("convergence", many=True)
def render_columns(found: list[dict]) -> str:
    """Tables with a column per task and rank count: test accuracy (mean ± 95% t-interval
    over the seeds, the rate in brackets), the paired difference to each column's first
    method (the exact ring), and the paired differences of ``PAIRS``; the differences are
    derived from the per-seed accuracies."""
    columns = _columns(found)
    methods = list(dict.fromkeys(m for _, rows in columns for m in rows))
    # each column's rows carry the method their paired differences are against
    references = {heading: rows[next(iter(rows.values()))["versus"]]
                  for heading, rows in columns}
    versus = {ref["label"] for ref in references.values()}
    seeds = sorted({len(r["seeds"]) for r in found})
    head = "| method | " + " | ".join(h for h, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    out = [f"Test accuracy, mean ± 95% t-interval over {'/'.join(map(str, seeds))} seeds, "
           "at each method's tuned rate (in brackets):", "", head, rule]
    out += [f"| {m} | " + " | ".join(_accuracy(rows.get(m)) for _, rows in columns) + " |"
            for m in methods]
    against = "the exact ring" if versus == {"ring"} else ", ".join(sorted(versus))
    out += ["", f"Minus {against}, paired seed by seed (points of accuracy; **bold**: the "
            "95% interval excludes 0):", "", head, rule]
    out += [f"| {m} | " + " | ".join(_paired(rows.get(m), references[h])
                                     for h, rows in columns) + " |"
            for m in methods]
    pairs = [(a, b) for a, b in PAIRS if a in methods and b in methods]
    if pairs:
        out += ["", "Each minus the other named, paired seed by seed (points of accuracy; "
                "**bold**: the 95% interval excludes 0):", "", head.replace("method", "pair"),
                rule]
        out += [f"| {a} - {b} | " + " | ".join(
                    "-" if a not in rows or b not in rows else _paired(rows[a], rows[b])
                    for _, rows in columns) + " |" for a, b in pairs]
    return "\n".join(out) + "\n"
