"""Figure style and saving, shared by every report and study (PNG + SVG, headless)."""

from __future__ import annotations


def pyplot():
    """``matplotlib.pyplot`` on the headless Agg backend. Imported on first use: it is the
    heaviest import of the package and only figures need it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_LINESTYLES = {"ring": "-", "tree": "--", "dbtree": "-.", "twostage": ":", "allgather": (0, (1, 4))}
_MARKERS = "osD^vP*X<>"


def method_style(method: str, index: int) -> dict:
    """Matplotlib style of ``algorithm+compressor``: colour by compressor, line by
    algorithm, so a method reads the same in every figure."""
    plt = pyplot()
    algorithm, _, compressor = method.partition("+")
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = palette[sum(map(ord, compressor)) % len(palette)]
    return {"color": colour, "linestyle": _LINESTYLES.get(algorithm, "-"),
            "marker": _MARKERS[index % len(_MARKERS)]}


def legend_beside(ax, **options) -> None:
    """The axes' legend to their right, where it covers no data (inside, a legend of many
    methods hid the curves it names)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, **options)


def whole_numbers(axis) -> None:
    """Ticks at whole numbers only, for counts (steps, ranks): no half steps."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig, out: str) -> list[str]:
    """Write ``fig`` as ``out``.png and ``out``.svg, close it, return the paths (the
    bounding box grown to hold legends beside the axes)."""
    fig.tight_layout()
    written = []
    for ext in ("png", "svg"):
        fig.savefig(f"{out}.{ext}", dpi=110, bbox_inches="tight")
        written.append(f"{out}.{ext}")
    pyplot().close(fig)
    return written


def plot_hops(tables: dict[str, list[dict]], out: str, metric: str = "rel_err") -> list[str]:
    """One panel per trace directory: ``metric`` against the number of ranks aggregated so
    far, a line per method and size. Writes ``out``.png and ``out``.svg."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(tables), figsize=(6.5 * len(tables), 4.8), squeeze=False)
    for ax, (name, rows) in zip(axes[0], tables.items(), strict=True):
        for i, key in enumerate(sorted({(r["alg"], r["bytes"]) for r in rows})):
            pts = sorted((r["contributors"], r[metric]) for r in rows
                         if (r["alg"], r["bytes"]) == key)
            ax.plot([k for k, _ in pts], [v for _, v in pts], **method_style(key[0], i),
                    label=f"{key[0]} ({key[1] // 1024} KiB)")
        ax.set_xlabel("ranks aggregated (hops + 1)")
        whole_numbers(ax.xaxis)
        ax.set_ylabel({"rel_err": "relative L2 error vs exact partial sum",
                       "cosine": "cosine with exact partial sum",
                       "error": "rel. L2 error vs exact partial sum\n(mean of signs for "
                                "sign bits)"}.get(metric, metric))
        ax.set_title(name)
        ax.grid(alpha=0.3)
        legend_beside(ax, fontsize=8)
    return save_figure(fig, out)
