"""The convergence study's tables, rendered into the docs from its records: one record's
tasks (``render``), and its columns side by side across records (a task and a rank count
each, run one at a time)."""

from __future__ import annotations

import math
import shlex

from ringcomp import runs
from ringcomp.results.blocks import renderer


def paired_from_seeds(row: dict, reference: dict) -> tuple[float, float] | None:
    """Mean and 95% half-width of ``row``'s test accuracy minus ``reference``'s, seed by
    seed, from the per-seed accuracies the record keeps; None unless every seed of both
    has one (a diverged run has none)."""
    mine, theirs = row["seed_test_acc"], reference["seed_test_acc"]
    if set(mine) != set(theirs) or None in (*mine.values(), *theirs.values()):
        return None
    diffs = [mine[seed] - theirs[seed] for seed in sorted(mine, key=int)]
    return float(sum(diffs) / len(diffs)), runs.ci95(diffs)


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


#: the comparisons the seeds' claims turn on, paired seed by seed: Marsit against the
#: cascading sign it replaces on the same topology (Marsit's premise), and the two-stage
#: 1-bit scheme and majority vote against Marsit's ring
PAIRS = (("ring+marsit", "ring+sign"), ("torus+marsit", "torus+sign"),
         ("twostage+sign+ef", "ring+marsit"), ("allgather+marsit", "ring+marsit"))
#: the comparisons Marsit's claims stand on (on the ring: against the exact ring, and
#: against the ring's cascading sign it replaces), named after the 8- and 16-rank columns
#: were measured and before the fixed-batch ones, judged at the nominal 95%;
#: every other interval is exploratory and gets a false-discovery-rate mark too
PRIMARY = frozenset({("ring+marsit", "ring"), ("ring+marsit", "ring+sign")})
#: the false-discovery rate of the exploratory intervals' mark (Benjamini-Hochberg)
FDR = 0.05


def _columns(found: list[dict]) -> list[tuple[str, dict]]:
    """(heading, rows by method) per task of every record, in the order given; a heading
    names the task, the rank count and the global batch (samples a step)."""
    return [(f"{task}, p={record['ranks']}{_global_batch(result['base'], record['ranks'])}",
             {row["label"]: row for row in result["rows"]})
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


def _paired(row: dict | None, reference: dict, survivors: set) -> str:
    """Points of test accuracy against ``reference``, seed by seed; bold where the 95%
    interval excludes 0, and a dagger where an exploratory comparison survives the
    false-discovery-rate adjustment (``survivors``: the pairs of rows that do)."""
    if row is None or row is reference:
        return "-"
    paired = paired_from_seeds(row, reference)
    if paired is None:
        return "n/a"
    mean, half = 100 * paired[0], 100 * paired[1]
    text = f"{mean:+.2f} ± {half:.2f}"  # two decimals: a bold row must read as excluding 0
    text = f"**{text}**" if abs(mean) > half else text
    return text + " †" if (id(row), id(reference)) in survivors else text


def _p_value(row: dict, reference: dict) -> float | None:
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


def _fdr_survivors(tested: list[tuple[dict, dict]]) -> tuple[set, int]:
    """The exploratory comparisons (row, reference) whose difference survives the
    Benjamini-Hochberg adjustment at ``FDR`` over all of them, as pairs of ids; and how
    many were adjusted together."""
    from scipy import stats

    found = [(row, ref, _p_value(row, ref)) for row, ref in tested]
    found = [(row, ref, p) for row, ref, p in found if p is not None]
    if not found:
        return set(), 0
    adjusted = stats.false_discovery_control([p for _, _, p in found], method="bh")
    kept = {(id(row), id(ref))
            for (row, ref, _), q in zip(found, adjusted, strict=True) if q < FDR}
    return kept, len(found)


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
    pairs = [(a, b) for a, b in PAIRS if a in methods and b in methods]
    # every interval of the two difference tables; the primary ones are judged alone
    tested = [(rows[m], references[h]) for h, rows in columns for m in methods
              if m in rows and rows[m] is not references[h]]
    tested += [(rows[a], rows[b]) for _, rows in columns for a, b in pairs
               if a in rows and b in rows]
    exploratory = [(row, ref) for row, ref in tested
                   if (row["label"], ref["label"]) not in PRIMARY]
    survivors, adjusted = _fdr_survivors(exploratory)

    def label(a: str, b: str, shown: str) -> str:
        return f"{shown} (primary)" if (a, b) in PRIMARY else shown

    key = ("points of accuracy; **bold**: the 95% interval excludes 0; † also survives a "
           f"{FDR:.0%} false-discovery-rate adjustment (Benjamini-Hochberg over the "
           f"{adjusted} exploratory intervals of both difference tables); the rows marked "
           "(primary) were named after the 8- and 16-rank columns, before the fixed-batch ones, "
           "and are judged alone")
    out += ["", f"Minus {against}, paired seed by seed ({key}):", "", head, rule]
    reference = next(iter(versus)) if len(versus) == 1 else None
    out += [f"| {label(m, reference, m)} | "
            + " | ".join(_paired(rows.get(m), references[h], survivors)
                         for h, rows in columns) + " |"
            for m in methods]
    if pairs:
        out += ["", "Each minus the other named, paired seed by seed (the same marks):", "",
                head.replace("method", "pair"), rule]
        out += [f"| {label(a, b, f'{a} - {b}')} | " + " | ".join(
                    "-" if a not in rows or b not in rows else
                    _paired(rows[a], rows[b], survivors)
                    for _, rows in columns) + " |" for a, b in pairs]
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
    intervals (bold where it excludes 0; the premise's interval is nominal, its
    false-discovery-rate mark is in the full tables)."""
    out = ["Points of test accuracy, paired seed by seed, mean ± 95% t-interval over the "
           "seeds (**bold**: the interval excludes 0, so the sign says below or above; "
           "otherwise no difference was detected, the interval saying how large one could "
           "be); the primary comparisons were named after the 8- and 16-rank columns, "
           "before the fixed-batch ones, and are judged alone, the third is exploratory "
           "(its false-discovery-rate mark is in training.md's tables):", "",
           "| task, ranks, global batch | exact ring | "
           + " | ".join(heading for _, _, heading in CLAIMED) + " |",
           "|---|---:|" + "---:|" * len(CLAIMED)]
    for heading, rows in _columns(found):
        exact = rows.get("ring")
        cells = ["-" if a not in rows or b not in rows else _paired(rows[a], rows[b], set())
                 for a, b, _ in CLAIMED]
        shown = ("-" if exact is None else "diverged" if exact["test_acc"] is None else
                 f"{exact['test_acc']:.3f} ± {exact['test_acc_ci95']:.3f}")
        out.append(f"| {heading} | {shown} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
