"""What `elmo-jax plan` prints: a compiled step's kernels, memory and estimated time on its
target, and the paper's run at that rate (docs/archive/PERFORMANCE_LOG.md, "Projected time of
the paper's run")."""

from __future__ import annotations

from elmo_jax.plan import hlo, rates
from elmo_jax.plan.kernels import Program, summarize, top
from elmo_jax.plan.program import CompiledEmbed, CompiledStep
from elmo_jax.plan.targets import Target
from elmo_jax.settings import RECIPE_GLOBAL_BATCH

PAPER_TOKENS = 7.69e9  # 10 passes over LM1B's 768,648,884 training tokens
# A global batch above this many times the recipe's is warned about (docs/TRAINING.md, "Batch size").
LARGE_BATCH_FACTOR = 4
# Distinct words per token of a chunk of text to embed (21% in benchmarks/speed/allennlp_embed.py's).
NEW_WORDS_PER_TOKEN = 0.2


def wire_bytes(kind: str, result_bytes: float, n: int) -> float:
    """Bytes each of n devices sends over its link for a collective whose result holds
    `result_bytes` (ring algorithms): an all-reduce sends 2 (n - 1) / n of its buffer, an
    all-gather (n - 1) / n of its result, a reduce-scatter (n - 1) / n of its input (n results)."""
    share = (n - 1) / n
    factor = {"all-reduce": 2 * share, "all-gather": share, "reduce-scatter": share * n}.get(kind, share)
    return factor * result_bytes


def estimate(step: CompiledStep, target: Target) -> dict:
    """Everything `plan` reports, as one JSON-able dict. Times are floors from the program's
    shapes (each kernel: max(FLOPs / peak for its dtype, bytes / bandwidth) + one launch);
    the collectives send their ring algorithms' bytes over the link (`wire_bytes`), not
    overlapped."""
    program = Program(step.hlo, target.platform)
    kernels = program.kernels()
    local = [k for k in kernels if k.part != "collectives"]
    totals = summarize(local, target)
    comm = hlo.communication_bytes(step.hlo)
    n = step.devices
    comm_s = sum(wire_bytes(kind, size, n) for kind, size in comm.items()) / target.link_bytes_per_s
    step_s = totals["total"]["seconds"] + comm_s
    tokens = step.per_device_batch * step.unroll_steps * n
    flops = totals["total"]["flops"]
    compute_s = sum(k.runs * k.flops / target.peak(k.dtype) for k in local if k.flops)
    capacity = target.memory_bytes * target.usable_memory
    expected = rates.expected(kernels, target, comm_s)
    if expected is not None:
        expected["tokens_per_s"] = tokens / expected["step_s"]
        expected["paper_hours"] = PAPER_TOKENS / expected["tokens_per_s"] / 3600
    return {
        "target": target.name,
        "devices": n,
        "per_device_batch": step.per_device_batch,
        "unroll_steps": step.unroll_steps,
        "lstm_schedule": step.lstm_schedule,
        "lstm_cell": step.lstm_cell,
        "char_conv": step.char_conv,
        "char_blocks": step.char_blocks,
        "softmax_kernel": step.softmax_kernel,
        "never_run": rates.never_run(kernels),
        "changed_since_measured": rates.changed_since_measured(kernels),
        "compile_s": round(step.compile_s, 1),
        "kernels": {
            "per_step": sum(k.runs for k in kernels),
            "outside_loops": sum(k.runs for k in kernels if not k.loop),
            "loops": [
                {
                    "source": loop.source,
                    "trips": loop.trips,
                    "trips_known": loop.known,
                    "kernels_per_iteration": sum(k.runs for k in kernels if k.loop == loop.body) // loop.trips,
                    "matmul": loop.matmul,
                }
                for loop in program.loops()
            ],
        },
        "memory": {**step.memory, "needs": step.needs_bytes, "capacity": int(capacity)},
        "flops": flops,
        "hbm_bytes": totals["total"]["bytes"],
        "compute_floor_s": compute_s,
        "memory_floor_s": totals["total"]["bytes"] / target.hbm_bytes_per_s,
        "launches_s": totals["total"]["kernels"] * target.launch_s,
        "collective_bytes": comm,
        "collectives_s": comm_s,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "paper_hours": PAPER_TOKENS / (tokens / step_s) / 3600,
        "expected": expected,
        "global_batch": step.per_device_batch * n,
        "recipe_global_batch": RECIPE_GLOBAL_BATCH,
        "parts": totals["parts"],
        "top_kernels": top(local, target),
    }


# How the header names our LSTM cells (lstm_cell); XLA's is not named.
_LSTM_CELLS = {"pallas": ", Pallas LSTM cell", "fused": ", Pallas LSTM cell with the gates' matmuls fused"}


def _char_cnn(result: dict) -> str:
    """ ", Pallas char CNN" with its kernels' blocks, or ", XLA's char CNN"."""
    if result["char_conv"] != "pallas":
        return ", XLA's char CNN"
    blocks = ", ".join(
        f"{kernel.removeprefix('char_cnn_').replace('_', ' ')} {rows} x {columns}"
        for kernel, (rows, columns) in result.get("char_blocks", {}).items()
    )
    return f", Pallas char CNN (words x filters a block: {blocks})" if blocks else ", Pallas char CNN"


def describe(result: dict, target: Target) -> list[str]:
    """The lines printed above the JSON."""
    r, GB = result, 1e9
    m, k = r["memory"], r["kernels"]
    loops = "; ".join(
        f"{loop['trips']} x {loop['kernels_per_iteration']} ({_scope(loop['source'])}"
        f"{', matmuls' if loop['matmul'] else ''}{'' if loop['trips_known'] else ', trip count unknown: once'})"
        for loop in sorted(k["loops"], key=lambda loop: -loop["trips"] * loop["kernels_per_iteration"])
    )
    lines = [
        f"{target.description} x {r['devices']}, {r['per_device_batch']} rows per device x {r['unroll_steps']} steps, "
        f"{r['lstm_schedule']} LSTM schedule{_LSTM_CELLS.get(r['lstm_cell'], '')}"
        f"{_char_cnn(r)}{', Pallas sampled softmax' if r['softmax_kernel'] == 'pallas' else ''} "
        f"(compiled in {r['compile_s']:.0f} s, without the device)",
        f"kernels per step: {k['per_step']:,} ({k['outside_loops']} outside loops; loop iterations x kernels: {loops})",
        f"device memory: arguments {m['argument'] / GB:.2f} GB, temporaries {m['temp'] / GB:.2f} GB, outputs "
        f"{m['output'] / GB:.2f} GB ({m['alias'] / GB:.2f} GB of them in the arguments' buffers): needs "
        f"{m['needs'] / GB:.2f} GB of {m['capacity'] / GB:.1f} GB usable"
        + (" (does not fit)" if m["needs"] > m["capacity"] else ""),
    ]
    if "largest_batch" in r:
        lines.append(
            f"largest per-device batch that fits: {r['largest_batch']} rows (compiled: {r['batches_compiled']})"
        )
    lines += [
        f"per step: {r['flops'] / 1e12:.2f} TFLOP, {r['hbm_bytes'] / GB:.1f} GB of HBM traffic; floors: compute "
        f"{r['compute_floor_s'] * 1e3:.1f} ms, memory {r['memory_floor_s'] * 1e3:.1f} ms, launches "
        f"{r['launches_s'] * 1e3:.1f} ms, collectives {r['collectives_s'] * 1e3:.1f} ms "
        f"({sum(r['collective_bytes'].values()) / 2**20:.0f} MiB)",
        f"floor step {r['step_s'] * 1e3:.1f} ms (each kernel at the larger of its bytes' and FLOPs' times at the "
        f"peaks, {target.launch_s * 1e6:g} us a launch): "
        f"{r['tokens_per_s']:,.0f} tokens/s, the paper's run ({PAPER_TOKENS:.3g} tokens) in {r['paper_hours']:.1f} "
        f"hours",
        *_expected_lines(r["expected"]),
        *_never_run_lines(r["never_run"]),
        *_changed_lines(r["changed_since_measured"]),
        *_fused_lines(r["lstm_cell"]),
        f"those hours: {r['devices']} device(s) at a global batch of {r['global_batch']:,} rows "
        f"({r['global_batch'] / RECIPE_GLOBAL_BATCH:.1f}x the paper's {RECIPE_GLOBAL_BATCH})",
        *large_batch_note(r["global_batch"]),
        "by part (kernels, GB, floor ms: bytes and FLOPs at the peaks, a launch each):",
    ]
    for name, p in r["parts"].items():
        lines.append(f"  {name:14s} {p['kernels']:6,d} {p['bytes'] / GB:8.2f} {p['seconds'] * 1e3:8.2f}")
    lines.append("top kernels (runs, floor ms of all runs, GFLOP and MB per run, dtype, part, JAX op):")
    for t in r["top_kernels"]:
        lines.append(
            f"  {t['runs']:4d} {t['seconds'] * 1e3:7.2f} {t['flops'] / 1e9:8.2f} {t['bytes'] / 1e6:9.1f} "
            f"{t['dtype'] or '-':5s} {t['part']:12s} {t['source'][-70:] or t['name']}"
        )
    return lines


def _expected_lines(e: dict | None) -> list[str]:
    """The expected step, where its rates come from, and the kernels furthest above their floors."""
    if e is None:
        return [
            "expected step: none for this target (no run measured on one, and its compiler's kernels are not a "
            "GPU's): the floor only"
        ]
    source = f"the {e['rates_from'].upper()}'s" + (" (borrowed: none measured on this GPU)" if e["borrowed"] else "")
    lines = [
        f"expected step {e['step_s'] * 1e3:.1f} ms: {e['tokens_per_s']:,.0f} tokens/s, the paper's run in "
        f"{e['paper_hours']:.1f} hours (each kernel class's floor at {source} measured rates, fitted "
        f"{e['fitted']} on {e['runs']} runs; each run predicted without it within {e['leave_one_out_worst']:.0%})",
        "furthest above their floors (expected - floor ms, runs, class, part, JAX op):",
    ]
    for k in e["furthest_above_floor"]:
        lines.append(
            f"  {k['above_floor_s'] * 1e3:7.2f} {k['runs']:4d} {k['kind']:14s} {k['part']:12s} "
            f"{k['source'][-60:] or k['name']}"
        )
    return lines


def _never_run_lines(never_run: dict[str, float]) -> list[str]:
    """Our kernels in the program that no device has run: checked only by the tests, interpreted
    on a CPU; an expected time borrows the rate fitted on the measured ones."""
    if not never_run:
        return []
    names = ", ".join(f"{name} ({'with' if flops else 'no'} matmuls)" for name, flops in never_run.items())
    return [
        f"never run on a device: {names}: their numbers are checked only interpreted on a CPU (the tests), and an "
        f"expected time borrows the rate of the Pallas class, fitted on our LSTM cell's kernels "
        f"({', '.join(rates.MEASURED_PALLAS)}), which had no matmuls then"
    ]


def _changed_lines(changed: list[str]) -> list[str]:
    """Our measured kernels in the program whose code has changed since their measured run."""
    if not changed:
        return []
    how = "; ".join(f"{name}: {rates.CHANGED_SINCE_MEASURED[name]}" for name in changed)
    return [
        f"changed since their measured run: {', '.join(changed)} ({how}): their numbers since are checked only "
        "interpreted on a CPU, and the Pallas class's rate is their old code's"
    ]


def _fused_lines(lstm_cell: str) -> list[str]:
    """What the bytes and FLOPs of lstm_cell=fused leave out, and why it is not the default."""
    if lstm_cell != "fused":
        return []
    return [
        "lstm_cell=fused: its backward kernel reads W's part from L2 once per 32-row block and computes a block's "
        "gradients again for each of 8 blocks of the product's columns, which neither the bytes nor the FLOPs "
        "here count: its expected time is optimistic (docs/PERFORMANCE.md); not the default until "
        "benchmarks/gpu.sh has timed it on a GPU"
    ]


def large_batch_note(global_batch: int) -> list[str]:
    """A warning line where the global batch is more than LARGE_BATCH_FACTOR x the recipe's."""
    if global_batch <= LARGE_BATCH_FACTOR * RECIPE_GLOBAL_BATCH:
        return []
    return [
        f"note: {global_batch:,} rows a step is {global_batch / RECIPE_GLOBAL_BATCH:.1f}x the paper's "
        f"{RECIPE_GLOBAL_BATCH}: per token it learns worse, and these hours are not the paper's result's; "
        'see docs/TRAINING.md, "Batch size and learning rate" (config.train.lr_batch_scaling)'
    ]


def _scope(source: str) -> str:
    """A loop's JAX op, shortened to the scope it ran in and the pass: ".../lstm/while" -> "lstm",
    ".../transpose(jvp())/lstm/while" -> "lstm backward"."""
    scope = source.split("/")[-2] if "/" in source else source
    return f"{scope} backward" if "transpose(" in source else scope


def estimate_embed(compiled: CompiledEmbed, target: Target) -> dict:
    """What `plan --mode=embed` reports, as one JSON-able dict: each program's kernels, memory
    and time floor per call (as `estimate`'s), the LSTM positions and distinct words per second
    they give (a word: the token encoder, and in the layers schedule its row of the gate table),
    and the tokens per second of a text with NEW_WORDS_PER_TOKEN."""
    from elmo_jax.embed import WINDOW

    programs = {}
    for name, (text, memory) in compiled.programs.items():
        kernels = Program(text, target.platform).kernels()
        totals = summarize(kernels, target)["total"]
        programs[name] = {
            "kernels": totals["kernels"],
            "flops": totals["flops"],
            "hbm_bytes": totals["bytes"],
            "seconds": totals["seconds"],
            "memory": memory,
            "top_kernels": top(kernels, target, 5),
        }
    positions = compiled.rows * WINDOW / programs["LSTM window"]["seconds"]
    gates = programs["gate table"]["seconds"] / compiled.table_rows if "gate table" in programs else 0.0
    words = 1 / (programs["token encoder"]["seconds"] / compiled.words + gates)
    return {
        "mode": "embed",
        "target": target.name,
        "devices": compiled.devices,
        "rows": compiled.rows,
        "window": WINDOW,
        "words": compiled.words,
        "columns": compiled.columns,
        "table_rows": compiled.table_rows,
        "lstm_schedule": compiled.lstm_schedule,
        "compile_s": round(compiled.compile_s, 1),
        "programs": programs,
        "positions_per_s": positions,
        "words_per_s": words,
        "new_words_per_token": NEW_WORDS_PER_TOKEN,
        "tokens_per_s": 1 / (1 / positions + NEW_WORDS_PER_TOKEN / words),
    }


def describe_embed(result: dict, target: Target) -> list[str]:
    """The lines printed above `plan --mode=embed`'s JSON."""
    r, GB = result, 1e9
    lines = [
        f"{target.description} x {r['devices']}: embedding, {r['rows']} sentence rows x {r['window']} steps per LSTM "
        f"call, {r['words']} words of {r['columns']} characters per token encoder call, {r['lstm_schedule']} LSTM "
        f"schedule (compiled in {r['compile_s']:.0f} s, without the device)",
        "per call (kernels, TFLOP, GB of HBM traffic, floor ms, device memory GB: arguments + temporaries):",
    ]
    for name, p in r["programs"].items():
        m = p["memory"]
        lines.append(
            f"  {name:14s} {p['kernels']:6,d} {p['flops'] / 1e12:8.3f} {p['hbm_bytes'] / GB:8.3f} "
            f"{p['seconds'] * 1e3:8.3f} {(m['argument'] + m['temp']) / GB:8.2f}"
        )
    lines += [
        f"at the floors: {r['positions_per_s']:,.0f} positions/s through the LSTMs, {r['words_per_s']:,.0f} words/s "
        f"through the token encoder; {r['tokens_per_s']:,.0f} tokens/s for a text with {r['new_words_per_token']:g} "
        "distinct words per token",
        "top kernels (runs, floor ms, GFLOP and MB per run, dtype, program, JAX op):",
    ]
    for name, p in r["programs"].items():
        for t in p["top_kernels"]:
            lines.append(
                f"  {t['runs']:4d} {t['seconds'] * 1e3:7.3f} {t['flops'] / 1e9:8.2f} {t['bytes'] / 1e6:9.1f} "
                f"{t['dtype'] or '-':5s} {name:14s} {t['source'][-60:] or t['name']}"
            )
    return lines
