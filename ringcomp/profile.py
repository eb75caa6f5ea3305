"""``mpirun -n P python -m ringcomp.profile [train options] --profile OUT.json``: measure the
profile every planner reads (forward and per-tensor backward times agreed across ranks,
fitted all-reduce and codec costs) without training, and print what it found."""

from __future__ import annotations

import logging
import sys

from ringcomp.cli import apply_common, failed_everywhere
from ringcomp.errors import EverywhereError
from ringcomp.torch.job import make_trainer
from ringcomp.training.config import agree, parse
from ringcomp.transport.agree import everywhere
from ringcomp.transport.cache import get_transport

log = logging.getLogger("ringcomp.profile")  # not __name__: "__main__" under python -m


def describe(profile) -> str:
    a, b = profile.exact
    lines = [f"# profile: {len(profile.sizes)} tensors, {sum(profile.sizes) / 1e6:.2f} MB, "
             f"{profile.ranks} ranks, {profile.algorithm}, compressor {profile.compressor}",
             f"forward {1e3 * profile.forward_s:.2f} ms, backward "
             f"{1e3 * sum(profile.backward_s):.2f} ms, optimizer + statistics "
             f"{1e3 * profile.update_s:.2f} ms",
             f"exact all-reduce: {1e3 * a:.3f} ms + {b * 1e9:.3f} ns/byte "
             f"(alpha/beta/gamma {profile.costs})"]
    if profile.compressed is not None:
        ca, cb = profile.compressed
        da, db = profile.codec
        lines += [f"compressed all-reduce: {1e3 * ca:.3f} ms + {cb * 1e9:.3f} ns/byte",
                  f"encode + decode: {1e3 * da:.3f} ms + {db * 1e9:.3f} ns/byte"]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv, acting_alone={"profile", "profile_steps"},
                 prog="python -m ringcomp.profile",
                 description="Measure the profile every planner reads (forward and "
                             "per-tensor backward times, fitted all-reduce and codec costs) "
                             "without training, with the training options; --profile "
                             "OUT.json is required.")
    if not args.profile:
        raise SystemExit("python -m ringcomp.profile: --profile OUT.json is required (where "
                         "to write the profile)")
    apply_common(args)
    transport = get_transport()
    agree(transport, args)
    try:
        trainer = everywhere(transport, lambda: make_trainer(args, transport))
        profile = trainer.profile()
    except EverywhereError as exc:  # the same on every rank: one line, no abort
        return failed_everywhere("python -m ringcomp.profile", exc, transport.rank)
    trainer.reducer.close()
    if transport.rank == 0:
        print(describe(profile))
        log.info(f"profile in {args.profile} (read instead of measured when it exists)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
