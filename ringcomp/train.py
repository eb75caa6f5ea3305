"""``mpirun -n 16 python -m ringcomp.train``: data-parallel training over ringcomp's all-reduce."""

from __future__ import annotations

import logging
import sys

from ringcomp.cli import apply_common, failed_everywhere
from ringcomp.errors import EverywhereError
from ringcomp.runner import run
from ringcomp.training.config import OPTIONS, agree, parse
from ringcomp.transport.cache import get_transport
from ringcomp.transport.launch import launched

log = logging.getLogger("ringcomp.train")  # not __name__: "__main__" under python -m

#: the global batch the default --lr is tuned for (4 ranks x --batch-size 8)
TUNED_GLOBAL_BATCH = 32


def without_launcher(args) -> str:
    """What to say when the job is one process that no launcher started: the launcher line,
    and the rule that moves the default rate to this global batch (linear scaling, the
    learning rate in proportion to the global batch: lr 0.025 on one rank reached 0.978
    test accuracy on the default task in 3 epochs, where lr 0.1 diverged to 0.078)."""
    text = ("ringcomp.train: one rank, started without an MPI launcher; for N ranks run "
            "`mpiexec -n N python -m ringcomp.train` (`make run`: 4).")
    # (parse resolved "auto": Marsit is decided there, once)
    if args.lr == OPTIONS["lr"][0] and args.optimizer != "marsit":  # its eta_l: a sign step
        scaled = args.lr * args.batch_size / TUNED_GLOBAL_BATCH
        text += (f" The default --lr {args.lr:g} is tuned for a global batch of "
                 f"{TUNED_GLOBAL_BATCH} (4 ranks x 8); scale it with the global batch: "
                 f"--lr {scaled:g} for this global batch of {args.batch_size}.")
    return text


def main(argv=None) -> int:
    args = parse(argv)
    apply_common(args)
    transport = get_transport()
    agree(transport, args)
    if transport.size == 1 and not launched():
        log.warning(without_launcher(args))
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
