"""The PyTorch study's tables (step time against DDP, accuracy): its record's code and renderer."""

from __future__ import annotations

from ringcomp import measured, records

#: what the study's times and accuracies depend on
CODE = records.code_files("ringcomp/experiments/torch_ddp.py", "ringcomp/training/reducer.py",
                          "ringcomp/training/engine.py", "ringcomp/comm.py", "ringcomp/api.py",
                          "ringcomp/torch/*.py", *measured.CODEC_CODE)


def format_tables(result: dict) -> str:
    """Step time of every speed method against DDP's gloo all-reduce, then the accuracy
    table, as the study prints them."""
    speed = result["speed"]
    base = next((r["step_ms"] for r in speed if r["method"] == "ddp-gloo"), None)
    lines = [f"# step time, {result['speed_model']} ({result['parameters'] / 1e6:.2f}M "
             f"parameters), {result['ranks']} ranks, batch {result['batch_size']}/rank, "
             f"{result['threads']} threads/rank",
             f"{'method':<20}{'ms/step':>9}{'[min-max]':>17}{'vs ddp-gloo':>13}{'MB/step':>9}"]
    for r in speed:
        ratio = f"{r['step_ms'] / base:.2f}x" if base else "-"
        spread = (f"[{r['step_min_ms']:.2f}-{r['step_max_ms']:.2f}]" if "step_min_ms" in r
                  else "-")
        lines.append(f"{r['method']:<20}{r['step_ms']:>9.2f}{spread:>17}{ratio:>13}"
                     f"{r['wire_bytes'] / 1e6:>9.3f}")
    timed = {r.get("timed_steps") for r in speed}
    if len(timed) == 1 and None not in timed:
        lines.append(f"# ms/step: median over {timed.pop()} timed steps (the slowest rank's)")
    lines += [f"# {result['model']} on digits, {result['steps']} steps, lr {result['lr']}, "
              f"seed {result['seed']}",
              f"{'method':<20}{'test acc':>9}{'KB/step':>9}{'ms/step':>9}"]
    for r in result["table"]:
        lines.append(f"{r['method']:<20}{r['test_acc']:>9.3f}{r['wire_bytes'] / 1e3:>9.1f}"
                     f"{r['step_ms']:>9.2f}")
    return "\n".join(lines)


@records.renderer("torch-ddp", code=CODE)
def render(record: dict) -> str:
    return f"```text\n{format_tables(record)}\n```\n"
