"""``python -m ringcomp.experiments {hops}``: run a study under mpiexec, print and plot it."""

from __future__ import annotations

import argparse
import sys

from ringcomp.cli import apply_common, common_parser, parse_list
from ringcomp.experiments import hops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ringcomp.experiments",
        description="Studies behind the README's figures; run under mpiexec. Rank 0 prints "
                    "the tables and writes the plots and a JSON of the numbers.")
    sub = parser.add_subparsers(dest="study", required=True)
    h = sub.add_parser("hops", parents=[common_parser()],
                       help="error per hop and bias over steps of every aggregation scheme")
    h.add_argument("--methods", type=parse_list, default=hops.DEFAULT_METHODS,
                   help="algorithm+compressor pairs (default: %(default)s)")
    h.add_argument("--elements", type=int, default=1 << 15,
                   help="vector length per rank (default: %(default)s)")
    h.add_argument("--steps", type=int, default=64,
                   help="repetitions with fresh random keys, averaged (default: %(default)s)")
    h.add_argument("--seed", type=int, default=0)
    h.add_argument("--out", default="hops", help="output path prefix (default: %(default)s)")
    args = parser.parse_args(argv)
    apply_common(args)
    return hops.main(args)


if __name__ == "__main__":
    sys.exit(main())
