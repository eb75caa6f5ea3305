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
#: a colour of its own for each compressor (tab20's order), so a compressor reads the same
#: in every figure; a name not listed takes the grey at the end
_COMPRESSORS = ("none", "fp16", "bf16", "sign", "marsit", "topk", "randomk", "qsgd",
                "terngrad", "countsketch", "powersgd")


def _marker(index: int) -> str:
    """The ``index``-th series' marker: with colour ``index % 10`` (``series_style``) no
    two of the first 100 series share both."""
    return _MARKERS[(index + index // len(_MARKERS)) % len(_MARKERS)]


def series_style(index: int) -> dict:
    """Colour and marker of the ``index``-th series of a figure: unique for 100 series
    (colour i % 10, marker shifted every ten)."""
    return {"color": pyplot().get_cmap("tab10").colors[index % 10], "marker": _marker(index)}


def method_style(method: str, index: int) -> dict:
    """Matplotlib style of ``algorithm+compressor[+ef]``: colour by compressor (fixed:
    ``_COMPRESSORS``), line by algorithm, marker by the series' ``index`` in its figure,
    so a method reads the same in every figure and no two series look alike."""
    algorithm, _, compressor = method.partition("+")
    base = compressor.split("+")[0].split(":")[0] or "none"
    colours = pyplot().get_cmap("tab20").colors
    colour = colours[2 * _COMPRESSORS.index(base)] if base in _COMPRESSORS else colours[14]
    return {"color": colour, "linestyle": _LINESTYLES.get(algorithm, "-"),
            "marker": _marker(index)}


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
