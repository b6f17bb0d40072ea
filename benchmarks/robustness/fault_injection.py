"""Fault injection: runs the demo for a few hundred steps under random faults and checks that
every run ends with the uninterrupted run's exact result and loses nothing but the steps since
the last checkpoint.

Faults: kill -9 at a random moment, SIGTERM or SIGINT at a random moment, a damaged newest
checkpoint (a file deleted, truncated or bit-flipped: the run must fall back to the previous
checkpoint), and, when run as root, a full disk (the workdir on a small tmpfs: the run must stop
with one line, its checkpoints intact, and resume once the disk is grown).

    python -m benchmarks.robustness.fault_injection --faults=20 --steps=300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT
from elmo_jax.checkpoint import DamagedCheckpoint, verify_step


def train_args(workdir: Path, steps: int) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "launch.py"),
        "train",
        "--config=experiments/demo.py",
        f"--workdir={workdir}",
        f"--config.train.max_steps={steps}",
        "--config.train.checkpoint_every=50",
        "--config.train.eval_every=0",
        "--config.train.log_every=25",
    ]


def steps_on_disk(workdir: Path) -> list[int]:
    folder = workdir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def intact_steps(workdir: Path) -> list[int]:
    good = []
    for step in steps_on_disk(workdir):
        try:
            verify_step(workdir / "checkpoints" / str(step))
            good.append(step)
        except DamagedCheckpoint:
            pass
    return good


def run(workdir: Path, steps: int, signal_after: float | None = None, sig: int = signal.SIGKILL) -> tuple[int, str]:
    """A training run; with `signal_after`, `sig` is sent after that many seconds."""
    proc = subprocess.Popen(
        train_args(workdir, steps), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    if signal_after is not None:
        try:
            out, _ = proc.communicate(timeout=signal_after)
            return proc.returncode, out
        except subprocess.TimeoutExpired:
            proc.send_signal(sig)
    out, _ = proc.communicate()
    return proc.returncode, out


def final_result(out: str) -> dict | None:
    lines = [line for line in out.strip().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def damage(workdir: Path, rng: random.Random) -> str:
    step = steps_on_disk(workdir)[-1]
    files = [
        p
        for p in (workdir / "checkpoints" / str(step) / rng.choice(["state", "state", "rows", "data"])).rglob("*")
        if p.is_file() and p.name not in ("checksums.json", "commit_success.txt")
    ]
    target = rng.choice(files)
    kind = rng.choice(["delete", "truncate", "flip"])
    if kind == "delete":
        target.unlink()
    elif kind == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        data = bytearray(target.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
    return f"{kind} {target.relative_to(workdir)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=20)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    kinds = ["kill9", "kill9", "sigterm", "sigint", "damage"] + (["disk_full"] if os.geteuid() == 0 else [])
    base = Path(tempfile.mkdtemp(prefix="elmo_faults_"))

    began = time.monotonic()
    code, out = run(base / "straight", args.steps)
    want = final_result(out)
    run_seconds = time.monotonic() - began
    assert code == 0 and want, out
    print(f"uninterrupted: {run_seconds:.0f} s, {want}", flush=True)

    injected, exact, lost, episodes = {k: 0 for k in set(kinds)}, 0, 0, 0
    remaining = args.faults
    while remaining > 0:
        episodes += 1
        workdir = base / f"episode{episodes}"
        mounted = False
        faults_here = min(remaining, rng.randint(1, 3))
        remaining -= faults_here
        episode_lost = False
        for _ in range(faults_here):
            kind = rng.choice(kinds)
            injected[kind] += 1
            before = intact_steps(workdir) if workdir.exists() else []
            if kind in ("kill9", "sigterm", "sigint"):
                sig = {"kill9": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigint": signal.SIGINT}[kind]
                code, out = run(workdir, args.steps, rng.uniform(0, run_seconds), sig)
                if kind != "kill9" and code != 0:
                    print(f"  {kind}: exit {code}\n{out[-2000:]}")
                    episode_lost = True
                detail = f"exit {code}"
            elif kind == "damage":
                if not steps_on_disk(workdir):
                    run(workdir, args.steps, rng.uniform(0.5, 1.0) * run_seconds)
                if not steps_on_disk(workdir):  # killed before its first checkpoint: a whole run
                    run(workdir, args.steps)
                detail = damage(workdir, rng)
            else:  # disk_full: the workdir on a tmpfs a little larger than what it holds now
                workdir.mkdir(parents=True, exist_ok=True)
                # What it holds on a tmpfs: every file in whole pages, every folder a page.
                held = sum(-(-p.stat().st_size // 4096) * 4096 if p.is_file() else 4096 for p in workdir.rglob("*"))
                size_kb = (held + rng.randint(300_000, 1_500_000)) // 1024
                saved = base / "saved"
                if any(workdir.iterdir()):
                    subprocess.run(["cp", "-a", str(workdir), str(saved)], check=True)
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(workdir)], check=True)
                mounted = True
                if saved.exists():
                    subprocess.run(f"cp -a {saved}/. {workdir}/ && rm -rf {saved}", shell=True, check=True)
                code, out = run(workdir, args.steps)
                tail = out.strip().splitlines()[-1] if out.strip() else ""
                detail = f"exit {code}: {tail[:160]}"
                # Exit 1 with our one line last: the check before a save, or (a disk filled during
                # the save) the failed save, after TensorStore's own tracebacks.
                if code not in (0, 1) or (code == 1 and not ("no space for" in tail or "saving a checkpoint" in tail)):
                    print(f"  disk_full: unexpected\n{out[-3000:]}")
                    episode_lost = True
                subprocess.run(["mount", "-o", "remount,size=4g", str(workdir)], check=True)
            after = intact_steps(workdir) if workdir.exists() else []
            if kind != "damage" and before and (not after or max(after) < max(before)):
                episode_lost = True  # a fault other than damage destroyed a good checkpoint
            print(f"  episode {episodes}: {kind} ({detail}); intact checkpoints {before} -> {after}", flush=True)
        code, out = run(workdir, args.steps)
        result = final_result(out)
        if code == 0 and result == want:
            exact += 1
        else:
            episode_lost = True
            print(f"  episode {episodes}: final run exit {code}, result {result} != {want}\n{out[-2000:]}")
        lost += episode_lost
        if mounted:
            subprocess.run(["umount", str(workdir)], check=True)
    print(
        json.dumps(
            {
                "faults_injected": sum(injected.values()),
                "by_kind": injected,
                "runs": episodes,
                "ended_with_the_exact_result": exact,
                "lost_anything": lost,
            }
        )
    )


if __name__ == "__main__":
    main()
