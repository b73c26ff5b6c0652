"""The scaling study's outputs in OUT: study.md (table, fit, answer), study.json, trials.csv, PNG plots.

Plots need matplotlib (``pip install -e ".[study]"``); without it the rest is written and the
study says which files it skipped.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from pathlib import Path

from asr.atomic import write_atomically
from asr.study.analysis import PowerLaw, answer, duration, fit_power_law, geometric_means, plateau

COLUMNS = ("trial", "width", "depth", "fraction", "train_hours", "params", "steps", "last_step", "validations",
           "min_val_loss", "min_val_step", "converged", "val_wer", "val_cer", "test_wer", "test_cer", "flops_per_step",
           "seconds_per_step", "audio_hours_seen", "hours_here", "device_hours_here", "cost_here",
           "gpu_seconds_per_step", "hours_gpu", "device_hours_gpu", "cost_gpu")


def fit_or_none(rows: list[dict]) -> PowerLaw | None:
    try:
        return fit_power_law([r["train_hours"] for r in rows], [r["params"] for r in rows], [r["steps"] for r in rows])
    except ValueError:  # fewer than 2 finished trials
        return None


def analyse(study, rows: list[dict]) -> dict:
    """The fit over the converged trials and per data fraction, the plateau, and the one-sentence answer
    (study.json). A trial cut by max_steps only bounds its steps from below, so it is left out of the fit."""
    converged = [r for r in rows if r["converged"]]
    fit = fit_or_none(converged)
    per_fraction = []
    for fraction in sorted({r["fraction"] for r in converged}):
        group = [r for r in converged if r["fraction"] == fraction]
        one = fit_or_none(group)
        per_fraction.append({"fraction": fraction, "train_hours": group[0]["train_hours"], "trials": len(group),
                             "k2": one and one.k2, "r2": one and one.r2,
                             "plateau_params": plateau([r["params"] for r in group], [r["steps"] for r in group])})
    steps_by_size = geometric_means([r["params"] for r in converged], [r["steps"] for r in converged])
    return {
        "a": fit and fit.a, "k1": fit and fit.k1, "k2": fit and fit.k2, "r2": fit and fit.r2,
        "trials": len(rows), "fitted": len(converged), "smooth": study.smooth,
        "units": {"D": "training audio hours", "M": "parameters", "steps": "optimizer steps"},
        "plateau_params": plateau(list(steps_by_size), list(steps_by_size.values())),
        "per_fraction": per_fraction, "gpu": asdict(study.gpu), "answer": answer(rows, study.gpu),
    }


def number(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value:.{digits}g}"


def markdown(study, rows: list[dict], result: dict, missing: list[str]) -> str:
    """study.md: the answer, the fit, one table row per trial, and what is an estimate."""
    gpu = study.gpu
    head = ["trial", "params", "data h", "steps to 1%", "min val/loss", "val WER", "test WER", "GFLOP/step",
            "s/step here", "audio h seen", "time here", f"time on {gpu.name} (est.)"]
    lines = ["# Which model size trains fastest?", "", result["answer"], ""]
    unconverged = [r["trial"] for r in rows if not r["converged"]]
    if unconverged:
        lines += [f"Not converged within max_steps (fewer than patience validations after the minimum; * below): "
                  f"{', '.join(unconverged)}. Their steps are a lower bound, left out of the fit: raise "
                  "max_steps.", ""]
    if result["k2"] is not None or result["k1"] is not None:
        lines += [f"Fit over {result['fitted']} converged trials: log steps = log a + k1 log D - k2 log M with a = "
                  f"{number(result['a'])}, k1 = {number(result['k1'])}, k2 = {number(result['k2'])}, "
                  f"R^2 = {number(result['r2'])} (D in training audio hours, M in parameters).", ""]
    for group in result["per_fraction"]:
        lines.append(f"- fraction {group['fraction']:g} ({group['train_hours']:.3g} h, {group['trials']} trials): "
                     f"k2 = {number(group['k2'])}, R^2 = {number(group['r2'])}, {_plateau(group['plateau_params'])}")
    lines += ["", f"Over all fractions (steps averaged in log space): {_plateau(result['plateau_params'])}.", ""]
    costs = [(key, label) for key, label, price in (("cost_here", "cost here", study.price_per_device_hour),
                                                    ("cost_gpu", f"cost on {gpu.name}", gpu.price_per_device_hour))
             if price]
    head += [label for _, label in costs]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in sorted(rows, key=lambda r: (r["fraction"], r["params"])):
        cells = [r["trial"], f"{r['params'] / 1e6:.2f}M", f"{r['train_hours']:.3g}",
                 f"{r['steps']}{'' if r['converged'] else '*'}",
                 f"{r['min_val_loss']:.4f}", number(r["val_wer"]), number(r["test_wer"]),
                 number(r["flops_per_step"] / 1e9), number(r["seconds_per_step"]), number(r["audio_hours_seen"]),
                 _time(r["hours_here"]), _time(r["hours_gpu"]), *(number(r[key]) for key, _ in costs)]
        lines.append("| " + " | ".join(cells) + " |")
    curve = "val/loss" if study.smooth == 1 else f"the {study.smooth}-validation moving average of val/loss"
    lines += ["", f"Steps to 1% = the first validation within 1% of the minimum of {curve} (--smooth).",
              "", f"Time = steps to converge x seconds per step. Here: the median cost/step_seconds the trial "
              f"measured. On {gpu.devices} x {gpu.name}: an estimate, the trial's model FLOPs per step at an "
              f"assumed MFU of {gpu.mfu:g} of asr.train.cost.GPU_PEAKS, plus {gpu.step_overhead:g} s of overhead per "
              "step (gpu.step_overhead: kernel launches, optimizer, data; without it the estimate flatters small "
              "models)."]
    if missing:
        lines += ["", f"Not finished ({len(missing)}): {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def _plateau(params: float | None) -> str:
    if params is None:
        return "no plateau within the grid (a larger size still took 10% fewer steps)"
    return f"plateau from {params / 1e6:.2f}M parameters (no larger size took 10% fewer steps)"


def _time(hours: float) -> str:
    return duration(hours) if math.isfinite(hours) else "-"


def write_table(rows: list[dict], path: Path) -> None:
    with write_atomically(path) as partial, partial.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def write_report(study, rows: list[dict], missing: list[str], out: Path) -> None:
    """Write study.md, study.json, trials.csv and the plots into ``out``, and print study.md."""
    result = analyse(study, rows)
    text = markdown(study, rows, result, missing)
    for name, content in (("study.md", text), ("study.json", json.dumps(result, indent=1) + "\n")):
        with write_atomically(out / name) as partial:
            partial.write_text(content)
    write_table(rows, out / "trials.csv")
    print(text)
    try:
        import matplotlib
    except ImportError:
        print('asr.study: no matplotlib, so no plots: pip install -e ".[study]", then python -m asr.study --collect '
              f"{out}")
        return
    matplotlib.use("Agg")
    plot(rows, result, out)


def plot(rows: list[dict], result: dict, out: Path) -> None:
    """steps_vs_params.png (log-log, a line per fraction, with the fit), min_val_loss_vs_params.png,
    time_vs_params.png (projected time to converge here and on the named GPU)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fractions = sorted({r["fraction"] for r in rows})
    panels = (("steps_vs_params.png", "steps to within 1% of the minimum val/loss", "steps"),
              ("min_val_loss_vs_params.png", "minimum val/loss", "min_val_loss"),
              ("time_vs_params.png", "projected hours to converge", None))
    for name, label, key in panels:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        for fraction in fractions:
            group = sorted((r for r in rows if r["fraction"] == fraction), key=lambda r: r["params"])
            params = [r["params"] for r in group]
            tag = f"fraction {fraction:g} ({group[0]['train_hours']:.2g} h)"
            if key:
                line, = ax.plot(params, [r[key] for r in group], "o-", label=tag)
            else:
                line, = ax.plot(params, [r["hours_here"] for r in group], "o-", label=f"{tag}, here")
                ax.plot(params, [r["hours_gpu"] for r in group], "s--", color=line.get_color(),
                        label=f"  on {result['gpu']['name']} (estimate)")
            if key == "steps" and result["k2"] is not None:
                fit = PowerLaw(result["a"], result["k1"], result["k2"], result["r2"], result["fitted"])
                ax.plot(params, [fit.steps(group[0]["train_hours"], m) for m in params], ":", color=line.get_color())
        ax.set_xscale("log")
        sizes = sorted({r["params"] for r in rows})
        ax.set_xticks(sizes, [f"{m / 1e6:.2g}M" for m in sizes])  # the grid's sizes, not 10^k crowded by minor labels
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log" if key != "min_val_loss" else "linear")
        ax.set_xlabel("parameters")
        ax.set_ylabel(label)
        if key == "steps" and result["k2"] is not None:
            ax.set_title(f"dotted: fit k1={number(result['k1'])}, k2={number(result['k2'])}, R^2={number(result['r2'])}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        with write_atomically(out / name) as partial:
            fig.savefig(partial, format="png", dpi=110)
        plt.close(fig)
