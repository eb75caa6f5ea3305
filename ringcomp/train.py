"""``mpirun -n 16 python -m ringcomp.train``: data-parallel training over ringcomp's all-reduce."""

from __future__ import annotations

import sys

from ringcomp.cli import apply_common, failed_everywhere
from ringcomp.errors import EverywhereError
from ringcomp.runner import run
from ringcomp.training.config import agree, parse
from ringcomp.transports import get_transport


def main(argv=None) -> int:
    args = parse(argv)
    apply_common(args)
    transport = get_transport()
    agree(transport, args)
    try:
        summary = run(args, transport)
    except EverywhereError as exc:  # the same on every rank: one line, no abort
        return failed_everywhere("python -m ringcomp.train", exc, transport.rank)
    if transport.rank == 0:
        acc = summary["test_acc"]
        acc = "n/a" if acc is None else f"{acc:.4f}"
        print(f"# {summary['steps']} steps on {summary['ranks']} ranks in "
              f"{summary['wall_s']:.1f} s: {args.eval_on} accuracy {acc}, compute "
              f"{summary['compute_s']:.1f} s, update {summary['update_s']:.1f} s, "
              f"communication "
              f"{summary['comm_s']:.1f} s ({summary['exposed_comm_s']:.1f} s exposed), "
              f"{summary['wire_bytes'] / 1e6:.1f} MB sent by rank 0")
        if args.stop_at:
            print(f"# --stop-at {args.stop_at:g}: " + (
                f"reached at step {summary['reached_step']}" if summary["reached_step"]
                else f"not reached in {summary['steps']} steps"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
