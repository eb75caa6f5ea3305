"""``python -m ringcomp.testbed --hosts 4 --ranks-per-host 1 --rate 1gbit -- COMMAND...``: run
an MPI command on an emulated cluster of rate-limited hosts on this machine (root only).

1. Build the namespaces, bridge and tbf-limited links (``ringcomp.netns``).
2. Run ``mpiexec`` inside host 1's namespace with one group of ranks per host
   (``ringcomp.cluster``): Hydra's ssh launcher with a wrapper that starts each host's
   proxy inside that host's namespace and its own UTS namespace (own hostname), so MPICH
   uses TCP (libfabric's tcp provider on eth1) between hosts and shared memory inside one.
3. Read the qdisc byte counters: how much really crossed each link.
4. Tear everything down, also on error, timeout or interrupt.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys

from ringcomp import cli
from ringcomp.cli import parse_rate
from ringcomp.cluster import CONTROL_BYTES, run, testbed_env
from ringcomp.netns import Testbed, TestbedError, cleanup, leftovers

log = logging.getLogger("ringcomp.testbed")  # not __name__: "__main__" under python -m


def parser() -> argparse.ArgumentParser:
    p = cli.Parser(
        prog="python -m ringcomp.testbed",
        description="Run an MPI command on an emulated cluster: N network namespaces on a "
                    "bridge, each host's link limited to --rate in both directions, TCP "
                    "between hosts, shared memory inside one. Root only. Prints how many "
                    "bytes crossed each link; always tears the namespaces down.")
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts, 2..8 (default: 2)")
    p.add_argument("--ranks-per-host", type=int, default=1, help="MPI ranks per host")
    p.add_argument("--rate", type=parse_rate, default=parse_rate("1gbit"),
                   help="link rate each way, e.g. 100mbit, 1gbit, 25gbit (default: 1gbit)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds before the command is killed (default: 600)")
    p.add_argument("--cleanup", action="store_true",
                   help="instead: remove what testbeds killed with kill -9 left behind "
                        "(namespaces, the processes in them, temporary files)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="after --: the program and its arguments (run under mpiexec)")
    return p


def clean_up() -> int:
    """``--cleanup``: remove a killed testbed's remains; say what went."""
    try:
        removed = cleanup()
    except (TestbedError, OSError) as err:
        print(f"ringcomp.testbed: {err}", file=sys.stderr)
        return 2
    for item in removed:
        log.info(f"removed {item}")
    log.info(f"cleanup: {len(removed)} leftover(s) removed")
    return 0


def warn_leftovers() -> None:
    """A testbed killed with kill -9 could not tear down: say so, and how to clean up."""
    with contextlib.suppress(OSError):
        found = leftovers()
        if found:
            log.warning(f"found {len(found)} leftover(s) of a killed testbed "
                        f"({', '.join(found[:4])}{' ...' if len(found) > 4 else ''}): remove "
                        "them with python -m ringcomp.testbed --cleanup")


def main(argv=None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.cleanup:
        if command:
            cli.error("--cleanup runs no command")
        return clean_up()
    if not command:
        cli.error("give the command after --, e.g. -- python -m ringcomp.bench")
    if args.ranks_per_host < 1:
        cli.error("--ranks-per-host must be >= 1")
    if not args.timeout > 0:
        cli.error("--timeout must be > 0 seconds")
    warn_leftovers()
    # SIGTERM (a batch system's kill) unwinds like Ctrl-C, so the teardown still runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with Testbed(args.hosts, args.rate) as testbed:
            prefix = ["sudo", ".venv/bin/python", "-m", "ringcomp.testbed",
                      *(argv if argv is not None else sys.argv[1:])]
            prefix = prefix[:prefix.index("--")] if "--" in prefix else prefix[:-len(command)]
            status, seconds = run(testbed, args.ranks_per_host, command, args.timeout,
                                  env=testbed_env(prefix, args.hosts, args.ranks_per_host,
                                                  args.rate))
            sent = testbed.sent_bytes()
    except (TestbedError, ValueError) as err:
        print(f"ringcomp.testbed: {err}", file=sys.stderr)
        return 2
    for h, (out, into) in enumerate(sent, 1):
        log.info(f"host {h}: sent {out / 1e6:.2f} MB, received {into / 1e6:.2f} MB over its "
                 f"{args.rate / 1e9:g} Gbit/s link")
    if all(out < CONTROL_BYTES and into < CONTROL_BYTES for out, into in sent):
        log.warning("almost nothing crossed the emulated links - the command did not "
                    "communicate between hosts")
    if status == 124:
        log.warning(f"killed after {args.timeout:g} s (--timeout)")
    log.info(f"{seconds:.2f} s, exit status {status}")
    return status


if __name__ == "__main__":
    sys.exit(main())
