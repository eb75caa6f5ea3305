"""The convergence study's tables, rendered into the docs from its records: one record's
tasks (``render``), and its columns side by side across records (a task and a rank count
each, run one at a time)."""

from __future__ import annotations

import shlex

from ringcomp.experiments.convergence_family import (
    FAMILY,
    FDR,
    PAIRS,
    PRIMARY,
    key,
    paired_from_seeds,
    survivors,
)
from ringcomp.results.blocks import renderer


@renderer("convergence")
def render(record: dict) -> str:
    """Per task: each method's rate, test accuracy (mean ± 95% t-interval over seeds) and
    its difference to the first method paired seed by seed, derived again here from the
    per-seed accuracies (bold where the interval excludes 0)."""
    out = []
    for task, result in record["tasks"].items():
        rows = result["rows"]
        reference = rows[0]
        out += [f"**{task}** ({record['ranks']} ranks; `{result['base']}`; test seeds "
                f"{', '.join(map(str, record['seeds']))}, sweep seeds "
                f"{', '.join(map(str, record['sweep_seeds']))})", "",
                f"| method | rates swept | lr | test accuracy | minus {reference['label']}, "
                "paired (points) |", "|---|---|---:|---:|---:|"]
        for row in rows:
            swept = ", ".join(f"{float(lr):g}" for lr in sorted(row["validation"], key=float))
            acc = ("diverged" if row["test_acc"] is None else
                   f"{row['test_acc']:.3f} ± {row['test_acc_ci95']:.3f}")
            paired = paired_from_seeds(row, reference) if row is not reference else None
            diff = "-"
            if paired is not None:
                mean, half = 100 * paired[0], 100 * paired[1]
                diff = f"{mean:+.1f} ± {half:.1f}"
                diff = f"**{diff}**" if abs(mean) > half else diff
            out.append(f"| {row['label']} | {swept} | {row['lr']:g} | {acc} | {diff} |")
        out.append("")
    return "\n".join(out)


def _columns(found: list[dict]) -> list[tuple[str, dict, tuple]]:
    """(heading, rows by method, (record, task)) per task of every record, in the order
    given; a heading names the task, the rank count and the global batch (samples a
    step)."""
    return [(f"{task}, p={record['ranks']}{_global_batch(result['base'], record['ranks'])}",
             {row["label"]: row for row in result["rows"]}, (record, task))
            for record in found for task, result in record["tasks"].items()]


def _global_batch(base: str, ranks: int) -> str:
    """", B=<samples a step>" from a task's training options (the last ``--batch-size``
    given is each rank's), or "" where they name none."""
    words, size = shlex.split(base), None
    for i, word in enumerate(words):
        if word == "--batch-size" and i + 1 < len(words):
            size = words[i + 1]
        elif word.startswith("--batch-size="):
            size = word.split("=", 1)[1]
    return "" if size is None else f", B={int(size) * ranks}"


def _accuracy(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["test_acc"] is None:
        return "diverged"
    return f"{row['test_acc']:.3f} ± {row['test_acc_ci95']:.3f} ({row['lr']:g})"


def _paired(row: dict | None, reference: dict, column: tuple, kept: set) -> str:
    """Points of test accuracy against ``reference``, seed by seed; bold where the 95%
    interval excludes 0, and a dagger where the comparison survives the family's
    false-discovery-rate adjustment (``kept``: the names of those that do; ``column``:
    the record and task it belongs to)."""
    if row is None or row is reference:
        return "-"
    paired = paired_from_seeds(row, reference)
    if paired is None:
        return "n/a"
    mean, half = 100 * paired[0], 100 * paired[1]
    text = f"{mean:+.2f} ± {half:.2f}"  # two decimals: a bold row must read as excluding 0
    text = f"**{text}**" if abs(mean) > half else text
    return text + " †" if key(*column, row, reference) in kept else text


def _family_key(size: int) -> str:
    """What the marks of a difference table mean."""
    return ("points of accuracy; **bold**: the 95% interval excludes 0; † also survives a "
            f"{FDR:.0%} false-discovery-rate adjustment (Benjamini-Hochberg) over one family "
            f"of {size} intervals, the same for every table: every comparison of the "
            f"{len(FAMILY)} convergence records (the 8- and 16-rank, fixed-batch, sketch and "
            "second-rate columns), the rows marked (primary) among them; those two were "
            "named after the 8- and 16-rank columns were measured, before the fixed-batch "
            "ones")


@renderer("convergence", many=True)
def render_columns(found: list[dict]) -> str:
    """Tables with a column per task and rank count: test accuracy (mean ± 95% t-interval
    over the seeds, the rate in brackets), the paired difference to each column's first
    method (the exact ring), and the paired differences of ``PAIRS``; the differences are
    derived from the per-seed accuracies."""
    columns = _columns(found)
    methods = list(dict.fromkeys(m for _, rows, _ in columns for m in rows))
    # each column's rows carry the method their paired differences are against
    references = {heading: rows[next(iter(rows.values()))["versus"]]
                  for heading, rows, _ in columns}
    versus = {ref["label"] for ref in references.values()}
    seeds = sorted({len(r["seeds"]) for r in found})
    head = "| method | " + " | ".join(h for h, _, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    out = [f"Test accuracy, mean ± 95% t-interval over {'/'.join(map(str, seeds))} seeds, "
           "at each method's tuned rate (in brackets):", "", head, rule]
    out += [f"| {m} | " + " | ".join(_accuracy(rows.get(m)) for _, rows, _ in columns) + " |"
            for m in methods]
    against = "the exact ring" if versus == {"ring"} else ", ".join(sorted(versus))
    pairs = [(a, b) for a, b in PAIRS if a in methods and b in methods]
    kept, size = survivors(found)

    def label(a: str, b: str, shown: str) -> str:
        return f"{shown} (primary)" if (a, b) in PRIMARY else shown

    out += ["", f"Minus {against}, paired seed by seed ({_family_key(size)}):", "", head,
            rule]
    reference = next(iter(versus)) if len(versus) == 1 else None
    out += [f"| {label(m, reference, m)} | "
            + " | ".join(_paired(rows.get(m), references[h], column, kept)
                         for h, rows, column in columns) + " |"
            for m in methods]
    if pairs:
        out += ["", "Each minus the other named, paired seed by seed (the same marks):", "",
                head.replace("method", "pair"), rule]
        out += [f"| {label(a, b, f'{a} - {b}')} | " + " | ".join(
                    "-" if a not in rows or b not in rows else
                    _paired(rows[a], rows[b], column, kept)
                    for _, rows, column in columns) + " |" for a, b in pairs]
    return "\n".join(out) + "\n"


#: the view's columns: (row, reference, heading) - the two primary comparisons, then
#: Marsit's premise (the cascading sign against exact), exploratory
CLAIMED = (("ring+marsit", "ring", "Marsit (ring) - exact (primary)"),
           ("ring+marsit", "ring+sign", "Marsit (ring) - cascading sign (primary)"),
           ("ring+sign", "ring", "cascading sign - exact (exploratory)"))


@renderer("convergence", view="marsit-claims")
def render_claims(found: list[dict]) -> str:
    """Marsit's claims read from the convergence records: a row per task and rank count,
    the exact ring's accuracy, and the paired differences of ``CLAIMED`` with their 95%
    intervals (bold where it excludes 0) and the family's false-discovery-rate mark."""
    kept, size = survivors(found)
    out = ["Points of test accuracy, paired seed by seed, mean ± 95% t-interval over the "
           "seeds (**bold**: the interval excludes 0, so the sign says below or above; "
           "otherwise no difference was detected, the interval saying how large one could "
           f"be; † the difference also survives a {FDR:.0%} false-discovery-rate "
           f"adjustment over the one family of {size} comparisons training.md's tables "
           "share); the primary comparisons were named after the 8- and 16-rank columns, "
           "before the fixed-batch ones, the third is exploratory:", "",
           "| task, ranks, global batch | exact ring | "
           + " | ".join(heading for _, _, heading in CLAIMED) + " |",
           "|---|---:|" + "---:|" * len(CLAIMED)]
    for heading, rows, column in _columns(found):
        exact = rows.get("ring")
        cells = ["-" if a not in rows or b not in rows else
                 _paired(rows[a], rows[b], column, kept) for a, b, _ in CLAIMED]
        shown = ("-" if exact is None else "diverged" if exact["test_acc"] is None else
                 f"{exact['test_acc']:.3f} ± {exact['test_acc_ci95']:.3f}")
        out.append(f"| {heading} | {shown} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
