"""How each command in README.md and docs/ runs in the suite: as written, smoke form, or not.

A rule matches a command (whitespace collapsed, comments dropped) by regular expression;
the first rule that matches decides (a ``chain`` rule changes the command and lets the
rules below it decide the rest). ``smoke`` is a replacement (``re.sub`` on the
command) giving the form that runs: the same code path with fewer sizes, steps or seeds.
``needs`` names what the command cannot run without (``root``, ``gpu``, ``slurm``,
``site-mpi``, ``never``); where that is missing the command is skipped with ``why``.
docs/testing.md says the same in prose.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass

#: a variable set before a command, as a record's footer names them
#: (``NUMBA_ENABLE_CUDASIM=1``, ``OPENBLAS_L2_SIZE=512``: digits in a name too)
ASSIGNMENT = r"[A-Z_][A-Z0-9_]*=\S+"
#: the launcher, after that environment, without its rank count
_LAUNCHER = r"(?:" + ASSIGNMENT + r" )*(?:\.venv/bin/)?(?:mpiexec|mpirun)"
#: a launch
_MPI = _LAUNCHER + r"(?: -n \d+)?"
_PY = r"(?:\.venv/bin/)?python3? -m"
#: the convergence study's smoke: one epoch (``--quick``), one seed, one rate (the rate
#: grid and its growth past an edge are tests/serial's)
_QUICK = "--quick --seeds 0 --lrs 0.1"
#: text that marks a synopsis (``FILE...``, ``[options]``, ``<tool>``) rather than a command
PLACEHOLDER = re.compile(r"\[|\.\.\.|<[a-z ]+>|(?<![$\w])(?:FILE|DIR|PATH|STUDY|NS)\b(?!=)")


@dataclass(frozen=True)
class Rule:
    pattern: str
    why: str
    smoke: str | None = None  # None: runs as written (unless ``needs`` is missing)
    needs: str | None = None
    chain: bool = False  # after this rule's change, the rules below it still apply


RULES = (
    # not here at all
    Rule(r"^make clean\b", "removes the environment the suite itself runs in", needs="never"),
    Rule(r"^make test\b", "is the suite itself", needs="never"),
    Rule(r"MPI=site|^module load", "needs a site MPI (a cluster's module)", needs="site-mpi"),
    Rule(r"^make \.\.\.|python -m ringcomp\.<tool>$|^(?:mpiexec|mpirun)$",
         "names a pattern, not a command", needs="never"),
    Rule(r"\b(?:srun|sbatch)\b|sweep-<job id>",
         "runs under Slurm (tests/serial/test_jobs.py runs the batch scripts on a real one)",
         needs="slurm"),
    Rule(r"--device gpu", "needs a GPU (the device path runs on stand-ins in tests/mpi)",
         needs="gpu"),
    Rule(r"^make (network|time-to-accuracy)\b|^sudo .*experiments (network|time-to-accuracy)\b"
         r"|experiments (network|time-to-accuracy) -",
         "builds emulated hosts for an hour or more; tests/serial/test_testbed.py runs both "
         "studies on two hosts", needs="never"),
    Rule(r"-m pytest\b", "is part of the suite itself (tests/run_suite.py)", needs="never"),
    Rule(r"^make horovod-examples\b", "needs a Horovod checkout (Horovod's examples are not "
         "kept here); with HOROVOD_EXAMPLES set, tests/docs/test_horovod_examples.py runs "
         "them", needs="never"),
    Rule(r"ringcomp\.report docs$", "rewrites the docs in place; --check renders the same "
         "blocks without writing", smoke=r"ringcomp.report docs --check"),
    # synopses and names in prose: the tool (or study) parses and prints its options
    Rule(r"-n N\b", "a rank count left to the reader: runs at 2", smoke=r"-n 2"),
    Rule(r"^(?:" + _MPI + r" )?" + _PY + r" (ringcomp\.\w+(?: [a-z][\w-]*)?)"
         r"(?: (?:[A-Z<\[].*|\.\.\..*))$",
         "a synopsis: the tool parses and prints its options", smoke=r"python -m \1 --help"),
    Rule(r"^" + _PY + r" ringcomp\.(?!info$|perfmodel$|simulate$)(\w+(?: [a-z][\w-]*)?)$",
         "names a tool or study in prose: it parses and prints its options",
         smoke=r"python -m ringcomp.\1 --help"),
    Rule(r"^" + _PY + r" ringcomp\.(\w+) (--resume|--cleanup)$",
         "names an option in prose", smoke=r"python -m ringcomp.\1 --help"),
    # slow: their smoke forms
    Rule(r"\bringcomp\.experiments digests --check$",
         "is the suite's own digests stage (tests/run_suite.py)", needs="never"),
    Rule(r"^(" + _LAUNCHER + r") -n (?:[5-9]|1\d) "
         r"(?=.*\btorus\b)",
         "the rank count is the reader's choice: 4 ranks, the torus's smallest grid",
         smoke=r"\1 -n 4 ", chain=True),
    Rule(r"^(" + _LAUNCHER + r") -n (?:[3-9]|1\d) "
         r"(?!.*\b(?:digests|torus|tour\.py))",
         "the rank count is the reader's choice, not a code path: 2 ranks (the MPI suite "
         "runs every algorithm at 1-5 ranks; here each rank more costs its start-up, ~2 "
         "cpu-s with torch, and a share of the two cores). Kept: the digests, recorded at "
         "their rank count, and the torus (and the README's tour, which runs one), which "
         "needs a grid of 4",
         smoke=r"\1 -n 2 ", chain=True),
    Rule(r"^make (convergence|hops|run|bench)(.*) (CONVERGENCE_NP|NP)=(?:[3-9]|1\d)\b(.*)$",
         "the rank count is the reader's choice, not a code path: 2 ranks",
         smoke=r"make \1\2 \3=2\4", chain=True),
    Rule(r"^make (hops|bench)\b(?!.* NP=)", "their default 4 ranks: 2 (`make run` runs as "
         "written: it is the main job)", smoke=r"make \1 NP=2", chain=True),
    Rule(r"^make convergence\b(?!.* CONVERGENCE_NP=)", "its default 8 ranks: 2",
         smoke=r"make convergence CONVERGENCE_NP=2", chain=True),
    Rule(r"^(" + _MPI + r" (?:\.venv/bin/)?python -m ringcomp\.bench)((?:(?!--sizes).)*)$",
         "the full table takes ~35 s on 2 cores: two sizes, three repetitions",
         smoke=r"\1\2 --sizes 4K,1M --iters 3"),
    Rule(r"^(" + _MPI + r" python -m ringcomp\.bench) --sizes \S*(?:16|64)M\S*(.*)$",
         "16 and 64 MB rows take up to a minute on 2 cores: 4 KB and 64 KB, three "
         "repetitions (the later --iters wins)",
         smoke=r"\1 --sizes 4K,64K --iters 3\2"),
    Rule(r"^(" + _MPI + r" python -m ringcomp\.bench)((?:(?!--iters).)*)$",
         "up to 200 repetitions per row at small sizes (about 20 s): three",
         smoke=r"\1\2 --iters 3"),
    Rule(r"^make bench( NP=\d+)?$", "the full table: two sizes, three repetitions",
         smoke=r'make bench\1 BENCH_ARGS="--sizes 4K,1M --iters 3"'),
    Rule(r"^(" + _MPI + r" (?:\.venv/bin/)?python -m ringcomp\.train .*--model torch:\S+.*)"
         r"--epochs \d+(.*)$",
         "a PyTorch model's epochs on 2 cores (3 of the small ResNet: 35 s of CPU): one",
         smoke=r"\1--epochs 1\2"),
    Rule(r"^(" + _MPI + r" python -m ringcomp\.train .*)--epochs \d\d+(.*)$",
         "tens of epochs: 3 (still past a checkpoint every 100 steps on digits at 4 ranks)",
         smoke=r"\1--epochs 3\2"),
    Rule(r'^(make run .*TRAIN_ARGS="[^"]*)"$', "ten epochs at 16 ranks: one epoch",
         smoke=r'\1 --epochs 1"'),
    Rule(r"^(make convergence.*)$",
         "hours: --quick (1 epoch), one rate, one seed, the exact ring (the study's own "
         "command runs the Marsit ring too)",
         smoke=rf'\1 STUDY_ARGS="{_QUICK} --methods ring"'),
    Rule(r"^(.*ringcomp\.experiments convergence --tasks \S+,.*)$",
         "hours: --quick (1 epoch), one rate, one seed, the exact ring on every task named",
         smoke=rf"\1 {_QUICK} --methods ring"),
    Rule(r"^(.*ringcomp\.experiments convergence.* --methods \S*?ring\+marsit-s[\d.]+)"
         r"(?:,ring\+marsit-s[\d.]+)+(.*)$",
         "Marsit at several second rates is one code path at each: the first rate only",
         smoke=r"\1\2", chain=True),
    Rule(r"^(.*ringcomp\.experiments convergence.* --methods \S+ --tasks [\w-]+),[\w,-]+(.*)$",
         "the methods it names on several tasks: the same code path on the first task only",
         smoke=r"\1\2", chain=True),
    Rule(r"^(.*ringcomp\.experiments convergence.* --methods .*)$",
         "hours: --quick (1 epoch), one rate, one seed, the methods it names",
         smoke=rf"\1 {_QUICK}"),
    Rule(r"^(.*ringcomp\.experiments convergence.*)$",
         "hours: --quick (1 epoch), one rate, one seed, the exact ring (the Marsit ring and "
         "the others run where a command names its methods)",
         smoke=rf"\1 {_QUICK} --methods ring"),
    Rule(r"^(make hops.*)$", "64 steps of 32K elements: 2 steps of 1K",
         smoke=r'\1 STUDY_ARGS="--steps 2 --elements 1024"'),
    Rule(r"^(.*ringcomp\.experiments hops.*)$", "64 steps of 32K elements: 2 steps of 1K",
         smoke=r"\1 --steps 2 --elements 1024"),
    Rule(r"^(.*ringcomp\.experiments codecs.*)$",
         "about 8 minutes: one small size of everything at 2 ranks, no emulated cluster",
         smoke=r"\1 --ranks 2 --sizes 256K --auto-sizes 4K --iters 3 --kernel-elements 64K "
               r"--split-ranks 2 --split-size 256K --startup-ranks 2 --startup-runs 3 "
               r"--testbed-hosts 0"),
    Rule(r"^(.*ringcomp\.experiments kernels.*)$",
         "16M elements through every kernel and backend: 64K (the later option wins)",
         smoke=r"\1 --elements 64K"),
    Rule(r"^(.*ringcomp\.experiments torch.*)$",
         "minutes: the accuracy and speed tables at a few steps",
         smoke=r"\1 --steps 6 --speed-steps 4 --warmup 1 --speed-model torch:mlp:64x64"),
    Rule(r"^(.*ringcomp\.experiments train-time.*)$",
         "minutes: one repetition of 20 steps, exact and Marsit (the later options win)",
         smoke=r"\1 --repeats 1 --methods marsit --train-args '--steps 20'"),
    Rule(r"^(?:sudo )?(" + _PY + r" ringcomp\.testbed) --hosts \d+ (.*) -- "
         r"(.*ringcomp\.experiments validate.*)$",
         "four emulated hosts and six methods: two hosts, one method, one plan",
         smoke=r"\1 --hosts 2 \2 -- \3 --methods none --plans mgwfbp", needs="root"),
    Rule(r"^(.*ringcomp\.experiments validate.*)$", "one method, one plan",
         smoke=r"\1 --methods none --plans mgwfbp"),
    Rule(r"^(.*ringcomp\.experiments tune-for-target .*)$",
         "an hour: one epoch of a small task, two rates, one seed, exact (at two "
         "momenta) and sign (the later options win)",
         smoke=r"\1 --base '--model mlp:64 --dataset synthetic --samples 1024 --features 64 "
               r"--epochs 1 --batch-size 8 --eval-every 16' --methods ring,ring-m0.5,ring+sign "
               r"--lrs 0.03,0.1 --seeds 0 --sweep-seeds 100"),
    Rule(r"^(?:sudo )?(" + _PY + r" ringcomp\.testbed) --hosts \d+ (.*) -- (.*) --sizes \S+",
         "four emulated hosts and 64 MB: two hosts and 64 KB",
         smoke=r"\1 --hosts 2 \2 -- \3 --sizes 64K", needs="root"),
)


def has(need: str | None) -> bool:
    """Whether this machine has what a rule needs."""
    if need is None:
        return True
    if need == "root":
        return os.geteuid() == 0 and shutil.which("tc") is not None
    if need == "gpu":
        return os.environ.get("RINGCOMP_DOCS_GPU") == "1"
    if need == "slurm":
        return False  # the batch scripts are tested on their own (tests/serial/test_jobs.py)
    return False


def normalize(command: str) -> str:
    """One line: continuations joined, whitespace collapsed, a trailing comment dropped."""
    command = command.replace("\\\n", " ")
    command = re.sub(r"\s+#.*$", "", command.strip())
    return " ".join(command.split())


def decide(command: str) -> tuple[str | None, Rule | None]:
    """(the command that runs here, or None; the rule that decided, or None: as written)."""
    decided = None
    for rule in RULES:
        if re.search(rule.pattern, command):
            if not has(rule.needs):
                return None, rule
            command = re.sub(rule.pattern, rule.smoke, command) if rule.smoke else command
            decided = rule
            if not rule.chain:
                return command, rule
    if decided is not None:
        return command, decided
    if PLACEHOLDER.search(command):
        raise ValueError(f"documented command {command!r} has a placeholder no rule in "
                         "tests/docs/smoke.py handles")
    return command, None
