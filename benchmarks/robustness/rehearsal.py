"""The paper's run rehearsed at its real size on this machine: LM1B-sized text in LM1B's layout
(99 training shards, 768M tokens, a Zipfian vocabulary of 793,471 words with about 2% of the
word types outside it, the held-out shard), and the same text as a .tar.gz, through the real
`train` path with the original config, on this CPU.

    python -m benchmarks.robustness.rehearsal [--tokens=768000000] [--folder=DIR]
        [--config=elmo_original] [--steps=2] [--phases=all]

Each phase runs in a process of its own, so its peak resident memory is its own (os.wait4):

  generate           the text (benchmarks/speed/host_path.py's generator) and its .tar.gz, once
  data_folder_cold   train's data path (elmo_jax/train/loop.py `_open_data`: open, count,
  data_folder_warm   tokenize through the token cache, the batcher) to the first batch, with
  data_archive_cold  the token cache empty, then filled: the folder, then the .tar.gz (each
  data_archive_warm  with a cache of its own); the token arrays' bytes beside the peak
  host_rate          the host's batches against a stand-in for the H200 step (host_path.py's
                     STAND_IN_MS, at 128 and 512 rows): tokens/s, and the share of time that device
                     would have had nothing to do (train's input-bound figure)
  evaluation         the host side of evaluating the held-out shard (its batches, no model),
                     twice with one word table (a run's periodic evaluations), and the held-out
                     subset made anew each time (as every periodic evaluation did before)
  checkpoint         the full state (params and Adagrad slots) made, saved, and restored
  train              `elmo-jax train` of --steps steps, a checkpoint after each, never interrupted
  faults             the same run killed (-9) while it saves its first checkpoint, then while it
                     runs a step after it, then resumed to the end: whether its last checkpoint
                     (params, optimizer, LSTM state, rng, data position) equals the
                     uninterrupted run's, bit for bit

The cache and checkpoint sizes on disk are reported too. The last line is JSON. At full size on
2 cores it takes about an hour, most of it in the real steps of the original model on the CPU;
`--tokens=100000000` runs every phase in a quarter of that, and a tiny run (`--tokens=200000
--vocab=5000 --config=demo`) in a few minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT

PHASES = ("generate", "data_folder_cold", "data_folder_warm", "data_archive_cold", "data_archive_warm", "host_rate",
          "evaluation", "checkpoint", "train", "faults")  # fmt: skip
GB = 1e9


# -- the orchestrator ---------------------------------------------------------------------------


def _measured(command: list[str], env: dict[str, str], timeout: float | None = None) -> dict:
    """Runs `command`; its wall time, peak resident memory (GB), exit status and the JSON of its
    last stdout line (if any)."""
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines and proc.returncode == 0 else {}
    if proc.returncode != 0:
        result["error"] = out[-3000:]
    return {"wall_s": round(time.monotonic() - start, 1), "peak_rss_gb": round(usage.ru_maxrss * 1024 / GB, 2),
            "status": proc.returncode, **result}  # fmt: skip


def _phase(name: str, args: argparse.Namespace, env: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "benchmarks.robustness.rehearsal", f"--phase={name}"]
    command += [f"--{k}={v}" for k, v in vars(args).items() if k not in ("phase", "phases") and v is not None]
    return _measured(command, env)


def _train_args(args: argparse.Namespace, workdir: Path, steps: int) -> list[str]:
    text = _text(args.folder)
    return [sys.executable, "-m", "elmo_jax", "train", f"--config={args.config}", f"--workdir={workdir}",
            f"--config.data.train=lm1b:{text}", f"--config.data.vocab={text / 'vocab.txt'}",
            "--config.data.heldout=", f"--config.train.max_steps={steps}", "--config.train.checkpoint_every=1",
            "--config.train.log_every=1", "--config.train.keep_checkpoints=2"]  # fmt: skip


def _started(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 3600) -> bool:
    """kill -9 once `ready()` (polled); False when the process ended first."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            proc.kill()
            proc.wait()
            return True
        time.sleep(0.05)
    proc.wait()
    return False


def _faults(args: argparse.Namespace, env: dict[str, str], uninterrupted: Path) -> dict:
    """Killed during its first save, then during the step after its first checkpoint, then run
    to the end: its last checkpoint against the uninterrupted run's."""
    workdir = Path(args.folder) / "run_faults"
    shutil.rmtree(workdir, ignore_errors=True)
    checkpoints = workdir / "checkpoints"
    command = _train_args(args, workdir, args.steps)
    saving = _kill_when(_started(command, env), lambda: any(checkpoints.glob("*.orbax-checkpoint-tmp*")))
    landed_at: list[float] = []  # when the first checkpoint was seen whole: 3 s into the next step, a kill

    def stepping() -> bool:
        if not landed_at and _landed(checkpoints, 1):
            landed_at.append(time.monotonic())
        return bool(landed_at) and time.monotonic() - landed_at[0] > 3

    landed = _kill_when(_started(command, env), stepping)
    start = time.monotonic()
    resumed = _measured(command, env)
    same = _digests(uninterrupted, args.steps) == _digests(workdir, args.steps)
    return {"killed_while_saving": saving, "killed_while_stepping": landed, "resume_s": round(time.monotonic() - start),
            "resume_status": resumed["status"], "bit_identical_to_uninterrupted": same}  # fmt: skip


def _landed(checkpoints: Path, step: int) -> bool:
    return (checkpoints / str(step) / "state" / "checksums.json").is_file() and not any(
        checkpoints.glob("*.orbax-checkpoint-tmp*")
    )


def _digests(workdir: Path, step: int) -> dict[str, str]:
    """The SHA-256 of every array and of the data state in the checkpoint of `step`, read in a
    process of its own (the full state is GBs)."""
    code = (
        "import json, sys; from benchmarks.robustness.rehearsal import checkpoint_digests; "
        "print(json.dumps(checkpoint_digests(sys.argv[1], int(sys.argv[2]))))"
    )
    done = subprocess.run([sys.executable, "-c", code, str(workdir), str(step)], cwd=ROOT, capture_output=True,
                          text=True, check=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def checkpoint_digests(workdir: str, step: int) -> dict[str, str]:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    folder = Path(workdir) / "checkpoints" / str(step)
    out = {}
    for item in ("state", "rows"):
        tree = ocp.PyTreeCheckpointer().restore(folder / item)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            out[f"{item}{jax.tree_util.keystr(path)}"] = hashlib.sha256(np.asarray(leaf).tobytes()).hexdigest()
    out["data"] = hashlib.sha256((folder / "data" / "metadata").read_bytes()).hexdigest()
    return out


def _size_gb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / GB, 2) if path.exists() else 0.0


def _text(folder: str) -> Path:
    return Path(folder) / "text"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=768_000_000)
    parser.add_argument("--vocab", type=int, default=793_471)
    parser.add_argument("--shards", type=int, default=99)
    parser.add_argument("--heldout_tokens", type=int, default=160_000)
    parser.add_argument("--config", default="elmo_original")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--folder", default=None, help="where the text, caches and runs go (default: a temp folder)")
    parser.add_argument("--phases", default="all", help="comma-separated, of " + ", ".join(PHASES))
    parser.add_argument("--phase", default=None, help=argparse.SUPPRESS)  # one phase, in its own process
    args = parser.parse_args()
    args.folder = args.folder or str(Path(tempfile.gettempdir()) / f"elmo_jax_rehearsal_{args.tokens}_{args.vocab}")
    if args.phase:
        print(json.dumps(PHASE_CODE[args.phase](args)), flush=True)
        return
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    chosen = PHASES if args.phases == "all" else tuple(args.phases.split(","))
    results: dict[str, dict] = {}
    for name in PHASES:
        if name not in chosen:
            continue
        cache = Path(args.folder) / ("cache_archive" if "archive" in name else "cache_folder")
        if name.endswith("_cold"):
            shutil.rmtree(cache, ignore_errors=True)
        phase_env = {**env, "ELMO_JAX_TOKEN_CACHE": str(cache)}
        if name == "train":
            workdir = Path(args.folder) / "run_uninterrupted"
            shutil.rmtree(workdir, ignore_errors=True)
            results[name] = _measured(_train_args(args, workdir, args.steps), phase_env)
            results[name]["checkpoint_gb"] = _size_gb(workdir / "checkpoints" / str(args.steps))
        elif name == "faults":
            uninterrupted = Path(args.folder) / "run_uninterrupted"
            if not _landed(uninterrupted / "checkpoints", args.steps):  # the run to compare with, first
                _measured(_train_args(args, uninterrupted, args.steps), phase_env)
            results[name] = _faults(args, phase_env, uninterrupted)
        else:
            results[name] = _phase(name, args, phase_env)
        if name.startswith("data_"):
            results[name]["cache_gb"] = _size_gb(cache)
        print(f"{name}: {json.dumps(results[name])}", flush=True)
    print(json.dumps({"tokens": args.tokens, "vocab": args.vocab, "config": args.config, "cpus": os.cpu_count(),
                      "phases": results}))  # fmt: skip


# -- the phases, each in its own process -----------------------------------------------------------


def _generate(args: argparse.Namespace) -> dict:
    from benchmarks.speed.host_path import make_corpus
    from elmo_jax.text.shards import LM1B_DIR

    text = _text(args.folder)
    start = time.monotonic()
    make_corpus(text, args.shards, args.tokens, args.vocab, heldout_tokens=args.heldout_tokens)
    written = time.monotonic() - start
    archive = Path(args.folder) / "lm1b.tar.gz"
    if not archive.is_file():
        partial = archive.with_name(".lm1b.tar.gz.partial")
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(text / LM1B_DIR, arcname=LM1B_DIR)
        os.replace(partial, archive)
    return {"text_gb": _size_gb(text / LM1B_DIR), "archive_gb": round(archive.stat().st_size / GB, 2),
            "text_s": round(written), "archive_s": round(time.monotonic() - start - written)}  # fmt: skip


def _config(args: argparse.Namespace, source: str):
    """The experiment's config over the rehearsal's text (`source`: its folder or .tar.gz)."""
    from elmo_jax.experiment import experiment_file
    from elmo_jax.train.loop import resolve_config
    from elmo_jax.train.parallel import data_parallel

    spec = importlib.util.spec_from_file_location("experiment", experiment_file(args.config))
    assert spec is not None and spec.loader is not None, args.config
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    with config.unlocked():
        config.data.train = config.data.heldout = f"lm1b:{source}"
        config.data.vocab = str(_text(args.folder) / "vocab.txt")
    parallel = data_parallel(1)
    return resolve_config(config, parallel), parallel


def _data(args: argparse.Namespace, source: str) -> dict:
    """train's data path to the first batch."""
    from elmo_jax.experiment import model_config
    from elmo_jax.host_memory import keep_freed_memory
    from elmo_jax.train.loop import _open_data
    from elmo_jax.workdir import Workdir

    keep_freed_memory()  # as `train` does
    start = time.monotonic()
    config, parallel = _config(args, source)
    with tempfile.TemporaryDirectory() as workdir:
        data = _open_data(config, Workdir(workdir), parallel, model_config(config))
        next(data.batcher)
    tokenized = data.corpus.tokenized(data.vocab)
    arrays = tokenized.ids.nbytes + tokenized.starts.nbytes + tokenized.lengths.nbytes
    return {"to_first_batch_s": round(time.monotonic() - start, 1), "token_arrays_gb": round(arrays / GB, 2),
            "sentences": len(tokenized.lengths), "tokens": len(tokenized.ids)}  # fmt: skip


def _host_rate(args: argparse.Namespace) -> dict:
    from benchmarks.speed.host_path import STAND_IN_MS, input_bound, steady
    from elmo_jax.host_memory import keep_freed_memory

    keep_freed_memory()
    text, out = _text(args.folder), {}
    for rows, ms in ((rows, STAND_IN_MS[1, rows]) for rows in (128, 512)):
        out[f"{rows}_rows"] = {"tokens_per_s": round(steady(text, 1, rows, 20, 40)), "stand_in_ms": ms,
                               "input_bound": round(input_bound(text, 1, rows, 20, 60, ms), 3)}  # fmt: skip
    return out


def _evaluation(args: argparse.Namespace) -> dict:
    """The host side of evaluations: every batch of the held-out shard, no model."""
    from elmo_jax.host_memory import keep_freed_memory
    from elmo_jax.text.batcher import StreamBatcher
    from elmo_jax.text.corpus import first_sentences
    from elmo_jax.text.sources import open_corpus
    from elmo_jax.text.vocab import Vocabulary

    keep_freed_memory()
    config, _ = _config(args, str(_text(args.folder)))
    vocab = Vocabulary.load(config.data.vocab)
    heldout = open_corpus(config.data.heldout, "heldout")

    def batches(corpus) -> float:
        start = time.monotonic()
        batcher = StreamBatcher(corpus, vocab, config.train.eval_batch_size, config.train.unroll_steps,
                                shuffle=False, single_pass=True, backward_order="shared")  # fmt: skip
        for _ in batcher:
            pass
        return round(time.monotonic() - start, 2)

    whole = [batches(heldout), batches(heldout)]
    periodic = first_sentences(heldout, config.train.eval_sentences)
    kept = [batches(periodic), batches(periodic)]
    anew = [batches(first_sentences(heldout, config.train.eval_sentences)) for _ in range(2)]
    return {"heldout_s": whole, "periodic_kept_s": kept, "periodic_made_anew_s": anew,
            "periodic_sentences": config.train.eval_sentences}  # fmt: skip


def _checkpoint(args: argparse.Namespace) -> dict:
    """The full state made, saved and restored."""
    import jax

    from elmo_jax.checkpoint import Checkpoints
    from elmo_jax.experiment import model_config, train_settings
    from elmo_jax.host_memory import keep_freed_memory
    from elmo_jax.text.vocab import Vocabulary
    from elmo_jax.train.step import abstract_train_state, init_train_state

    keep_freed_memory()
    config, parallel = _config(args, str(_text(args.folder)))
    vocab_size = len(Vocabulary.load(config.data.vocab))
    model, hp, rows = model_config(config), train_settings(config, vocab_size), config.train.per_device_batch_size
    abstract = abstract_train_state(model, hp, rows, vocab_size, parallel, False)
    shardings = jax.tree.map(lambda a: a.sharding, abstract)
    start = time.monotonic()
    state = jax.jit(lambda: init_train_state(jax.random.key(0), model, hp, rows, vocab_size), out_shardings=shardings)()
    jax.block_until_ready(state)
    made = time.monotonic() - start
    folder = Path(args.folder) / "checkpoint_phase"
    shutil.rmtree(folder, ignore_errors=True)
    checkpoints = Checkpoints(folder, clean_up=True)
    data_state = {"seed": 0, "batch_size": rows, "backward_order": "independent", "rows": [[0] * 6] * rows}
    start = time.monotonic()
    checkpoints.save_and_wait(1, state, data_state, parallel.rows)
    saved = time.monotonic() - start
    del state
    start = time.monotonic()
    restored, _ = checkpoints.restore(1, abstract, parallel.rows, (rows, 6))
    jax.block_until_ready(restored)
    back = time.monotonic() - start
    checkpoints.close()
    state_gb = sum(x.nbytes for x in jax.tree.leaves(restored)) / GB
    size = _size_gb(folder / "1")
    shutil.rmtree(folder)
    return {"state_gb": round(state_gb, 2), "on_disk_gb": size, "init_s": round(made, 1), "save_s": round(saved, 1),
            "restore_s": round(back, 1)}  # fmt: skip


PHASE_CODE = {
    "generate": _generate,
    "data_folder_cold": lambda args: _data(args, str(_text(args.folder))),
    "data_folder_warm": lambda args: _data(args, str(_text(args.folder))),
    "data_archive_cold": lambda args: _data(args, str(Path(args.folder) / "lm1b.tar.gz")),
    "data_archive_warm": lambda args: _data(args, str(Path(args.folder) / "lm1b.tar.gz")),
    "host_rate": _host_rate,
    "evaluation": _evaluation,
    "checkpoint": _checkpoint,
}

if __name__ == "__main__":
    main()
