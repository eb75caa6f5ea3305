"""Shared command-line plumbing: common options, size parsing, abort-on-exception."""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile

from ringcomp import log
from ringcomp.log import world_rank
from ringcomp.transport.launch import install_abort_on_exception
from ringcomp.transport.startup import check_timeout
from ringcomp.version import __version__

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


#: the options every Parser adds for its tool's logging (acted on at parse time)
LOGGING_OPTIONS = ("quiet", "verbose")


class Parser(argparse.ArgumentParser):
    """argparse's parser for a command every rank runs: a bad command line prints the usage
    block once (rank 0) and one line on every other rank, not p usage blocks. Every one
    takes ``--version``, ``--quiet`` and ``--verbose``, and sets up the tool's logging
    (``ringcomp.log.configure``) once its command line is parsed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.add_help:
            self.add_argument("--version", action="version",
                              version=f"%(prog)s (ringcomp) {__version__}")
            # SUPPRESS: a subcommand's parser must not reset what the command's parser read
            loud = self.add_mutually_exclusive_group()
            loud.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                              help="warnings and errors only (default: RINGCOMP_LOG, else info)")
            loud.add_argument("-v", "--verbose", action="store_true",
                              default=argparse.SUPPRESS, help="debug messages too")

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        quiet, verbose = (getattr(namespace, name, False) for name in LOGGING_OPTIONS)
        # the first parse sets the level; a later one only where it names a flag (a study
        # parses its training runs' options too, which must not undo the study's --quiet)
        if quiet or verbose or not log.configured():
            try:
                log.configure(quiet, verbose)
            except ValueError as exc:  # a nonsense RINGCOMP_LOG
                self.error(str(exc))
        return namespace, rest

    def error(self, message: str):
        rank = world_rank()
        if rank == 0:
            self.print_usage(sys.stderr)
            self.exit(2, f"{self.prog}: error: {message}\n")
        self.exit(2, f"{self.prog}: error (rank {rank}): {message}\n")


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' -> 4096, '64M' -> 67108864 (binary suffixes, case-insensitive)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in ("K", "M", "G") else ""
    number = t[: len(t) - len(unit)]
    if not number.isdigit():
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 8, 4K, 64M")
    return int(number) * _SUFFIX[unit]


def parse_sizes(text: str) -> list[int]:
    return [parse_size(part) for part in text.split(",") if part.strip()]


def out_path(text: str) -> str:
    """An output file or path prefix (``DIR/name``, extensions added by the tool). Its folder
    is made now and must be writable, so a study cannot run for an hour and then fail to write
    (``argparse.FileType`` acts at parse time too)."""
    folder = os.path.dirname(os.path.abspath(text))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot create {folder}: {exc.strerror}") from None
    try:  # a file of this process's own: every rank of a job parses at once
        with tempfile.NamedTemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{folder} is not writable: {exc.strerror}") from None
    return text


def positive_int(text: str) -> int:
    """A whole number of at least 1 (argparse's ``int`` lets 0 and negatives through)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def parse_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


_RATE = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def format_rate(bps: float | None) -> str:
    """``parse_rate``'s inverse for tables: '1 Gbit/s'; None: 'never'; inf: 'always'."""
    if bps is None:
        return "never"
    if math.isinf(bps):
        return "always"
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


def parse_rate(text: str) -> float:
    """Bits per second: '10Gbps', '100Mbit', '1gbit', '25G', '1e9' (decimal prefixes)."""
    t = text.strip().lower()
    for suffix in ("bps", "bit/s", "bits", "bit", "b/s"):
        t = t.removesuffix(suffix)
    unit = t[-1:].upper() if t[-1:].upper() in _RATE and t[-1:].isalpha() else ""
    try:
        rate = float(t[: len(t) - len(unit)]) * _RATE[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad rate {text!r}: use e.g. 100Mbps, 10Gbps") from None
    if rate <= 0:
        raise argparse.ArgumentTypeError(f"rate must be positive, got {text!r}")
    return rate


def parse_duration(text: str) -> float:
    """Seconds: '10us', '5ms', '0.5s', '2e-6'."""
    t = text.strip().lower()
    for unit in ("ms", "us", "ns", "s"):
        if t.endswith(unit):
            t, scale = t.removesuffix(unit), _TIME[unit]
            break
    else:
        scale = 1.0
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad duration {text!r}: use e.g. 10us, 5ms") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"duration must not be negative, got {text!r}")
    return value


def parse_timeout(text: str) -> float:
    """A deadline in seconds for ``--timeout``: finite, >= 0 (0 = none)."""
    try:
        return check_timeout(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def common_parser() -> argparse.ArgumentParser:
    """Options every ringcomp command takes."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("common ringcomp options")
    group.add_argument("--trace", metavar="DIR", default=None,
                       help="record every hop: DIR/rank-<r>.jsonl, DIR/trace.json (Perfetto), "
                            "DIR/summary.json")
    group.add_argument("--timeout", type=parse_timeout, default=None, metavar="S",
                       help="seconds any wait may block before the job is aborted with a "
                            "message (default: RINGCOMP_TIMEOUT or 300; 0 = no deadline)")
    group.add_argument("--cuda-aware", choices=("auto", "0", "1"), default=None,
                       help="pass GPU buffers to MPI directly (1), stage through host (0), or "
                            "detect (auto, default; env RINGCOMP_CUDA_AWARE)")
    return parent


def apply_common(args) -> None:
    """Turn the common options into the environment the Transport reads; abort on error."""
    if args.timeout is not None:
        os.environ["RINGCOMP_TIMEOUT"] = str(args.timeout)
    if args.cuda_aware is not None:
        os.environ["RINGCOMP_CUDA_AWARE"] = args.cuda_aware
    install_abort_on_exception()


def failed_everywhere(prog: str, exc: Exception, rank: int) -> int:
    """Report an error raised alike on every rank as one line (rank 0); the exit status."""
    if rank == 0:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
    return 2


def human_bytes(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(int(n))
