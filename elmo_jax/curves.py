"""The training curves of a run folder as a PNG: the training loss (sampled or full softmax, per
log window) and the held-out perplexity against steps, with the demo corpus's floor as a line.
Drawn from WORKDIR/metrics.jsonl by `elmo-jax plot` and at the end of training, with matplotlib
(the `plot` extra: pip install 'elmo_jax[plot]')."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from elmo_jax.errors import MissingFile, UserError
from elmo_jax.outputs import replacing
from elmo_jax.workdir import Workdir

log = logging.getLogger(__name__)

NO_MATPLOTLIB = "drawing needs matplotlib: pip install 'elmo_jax[plot]' (or pip install matplotlib)"


def read_metrics(path: Path) -> dict[str, list[dict]]:
    """metrics.jsonl -> its "train" and "eval" records in step order. A step recorded twice (a
    run resumed from an earlier checkpoint recomputes the steps after it) keeps its last record."""
    if not path.is_file():
        raise MissingFile(f"{path} not found: not a training workdir, or no step logged yet")
    by_step: dict[str, dict[int, dict]] = {"train": {}, "eval": {}}
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record: dict[str, Any] = {
                k: math.nan if v is None else v for k, v in json.loads(line).items()
            }  # null: not finite
            by_step[record["kind"]][record["step"]] = record
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{path}: line {n} is not a metrics record ({e})") from None
    return {kind: [records[s] for s in sorted(records)] for kind, records in by_step.items()}


def plot_curves(workdir: str | Path, output: str | Path | None = None, overwrite: bool = True) -> Path:
    """Draws the run's curves into `output` (default WORKDIR/training_curves.png), replacing it
    only where `overwrite`; returns its path."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise UserError(NO_MATPLOTLIB) from None
    run = Workdir(workdir)
    metrics = read_metrics(run.metrics_jsonl)
    if not metrics["train"] and not metrics["eval"]:
        raise UserError(f"{run.metrics_jsonl}: no records to draw")
    sampled = run.saved_config().train.sample_softmax if run.config_json.is_file() else True

    figure = Figure(figsize=(11, 4.2), layout="constrained")
    loss, heldout = figure.subplots(1, 2)
    train = metrics["train"]
    steps = [r["step"] for r in train]
    loss.plot(steps, [r["loss"] for r in train], color="black", label="mean of both directions")
    loss.plot(steps, [r["loss_forward"] for r in train], color="tab:blue", lw=0.8, alpha=0.7, label="forward")
    loss.plot(steps, [r["loss_backward"] for r in train], color="tab:orange", lw=0.8, alpha=0.7, label="backward")
    loss.set(
        xlabel="step",
        ylabel="cross entropy per token (nats)",
        title=f"training loss ({'sampled' if sampled else 'full'} softmax, mean of each log window)",
    )

    evals = metrics["eval"]
    # Periodic evaluations may read only the first held-out sentences; the final one reads all.
    full = max((r["tokens"] for r in evals), default=0)
    some = max((r["tokens"] for r in evals if r["tokens"] < full), default=0)
    for part, label, style in (
        ([r for r in evals if r["tokens"] < full], f"on the first {int(some):,} held-out tokens", "o"),
        ([r for r in evals if r["tokens"] == full], f"on all {int(full):,} held-out tokens", "*"),
    ):
        steps = [r["step"] for r in part]
        for key, color in (("forward_perplexity", "tab:blue"), ("backward_perplexity", "tab:orange")):
            heldout.plot(steps, [r[key] for r in part], style, color=color, ms=4 if style == "o" else 9, alpha=0.8)
        heldout.plot(steps, [r["perplexity"] for r in part], style + "-", color="black", ms=5 if style == "o" else 11,
                     label=f"mean of both directions, {label}")  # fmt: skip
    heldout.plot([], [], "s", color="tab:blue", label="forward")
    heldout.plot([], [], "s", color="tab:orange", label="backward")
    floor = next((r["floor_perplexity"] for r in evals if "floor_perplexity" in r), None)
    if floor is not None:
        heldout.axhline(floor, color="tab:green", ls="--", label=f"the corpus's floor, {floor:.2f}")
    if evals:
        last = evals[-1]
        heldout.annotate(
            f"{last['perplexity']:.2f} at step {last['step']:,}",
            (last["step"], last["perplexity"]),
            xytext=(-12, 28),
            textcoords="offset points",
            ha="right",
            arrowprops={"arrowstyle": "-", "color": "gray"},
        )
    heldout.set_yscale("log")
    for axis in (heldout.yaxis.set_major_formatter, heldout.yaxis.set_minor_formatter):
        axis(FuncFormatter(lambda y, _: f"{y:g}"))
    heldout.set(xlabel="step", ylabel="perplexity (log scale)", title="held-out perplexity (full softmax)")
    for axes in (loss, heldout):
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    figure.suptitle(str(run.path))

    target = Path(output) if output is not None else run.curves_png
    with replacing(target, overwrite, (run.metrics_jsonl,)) as tmp:
        figure.savefig(tmp, format="png", dpi=110)
    return target


def plot_after_training(workdir: Workdir) -> None:
    """The run's curves into the workdir, or a line saying how to get them."""
    try:
        log.info("training curves: %s", plot_curves(workdir.path))
    except UserError as e:
        log.info("training curves not drawn: %s", e)
