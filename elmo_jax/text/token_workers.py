"""Worker processes that tokenize text files into the token cache (token_cache.py), one per core.

They are started with subprocess, not multiprocessing (the caller's script is not imported
again), each in a session of its own: Ctrl-C at the terminal reaches only this process, which
stops them (SIGTERM, then SIGKILL) however its wait ends, done, failed or stopped by a signal,
and removes what they were writing. A worker prints the number of each file it has put in the
cache. One that ends before its files are done stops the whole, in one line naming the worker,
the file it was on and the last line it wrote on stderr (`RunFailed`): the files already in the
cache stay, so running again goes on from them. A worker whose parent has gone exits after the
file it is on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import IO

from elmo_jax import stop_signals
from elmo_jax.errors import RunFailed
from elmo_jax.text.token_store import non_empty, save
from elmo_jax.text.tokenized import tokenize_lines
from elmo_jax.text.vocab import Vocabulary

log = logging.getLogger(__name__)

Task = tuple[Path, bytes, Path]  # a text file, its SHA-256, the cache file to write


@dataclasses.dataclass
class _Worker:
    number: int
    tasks: list[Task]
    process: subprocess.Popen
    stderr: IO[bytes]
    done: int = 0

    def failure(self, count: int, status: int) -> str:
        how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
        self.stderr.seek(0)
        said = [line.strip() for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        return (
            f"tokenizing worker {self.number} of {count} (pid {self.process.pid}) {how} on "
            f"{self.tasks[min(self.done, len(self.tasks) - 1)][0]}" + (f": {said[-1]}" if said else "")
        )


def _shares(tasks: list[Task], workers: int) -> list[list[Task]]:
    """The biggest file first, to the least loaded worker."""
    shares: list[list[Task]] = [[] for _ in range(workers)]
    load = [0] * workers
    for task in sorted(tasks, key=lambda t: -t[0].stat().st_size):
        w = load.index(min(load))
        shares[w].append(task)
        load[w] += task[0].stat().st_size
    return [share for share in shares if share]


def run(tasks: list[Task], vocab: Vocabulary, root: Path, workers: int) -> None:
    """Puts every task's file in the cache with `workers` processes; raises RunFailed if one
    fails (module doc)."""
    vocab_file = root / f".vocab.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    vocab_file.write_text(vocab.text(), encoding="utf-8")
    package_root = str(Path(__file__).resolve().parents[2])  # importable wherever this process found it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    started: list[_Worker] = []
    try:
        for number, share in enumerate(_shares(tasks, workers), start=1):
            command = [sys.executable, "-m", __name__, str(vocab_file), vocab.sha256, str(os.getpid())]
            command += [str(part) if not isinstance(part, bytes) else part.hex() for task in share for part in task]
            stderr = tempfile.TemporaryFile()
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=env, start_new_session=True)
            started.append(_Worker(number, share, process, stderr))
        _watch(started, len(tasks))
    finally:
        _stop(started, root)
        vocab_file.unlink(missing_ok=True)


def _watch(workers: list[_Worker], total: int) -> None:
    """Waits for the workers, logging progress; a failed one raises RunFailed."""
    pending = {w.process.stdout.fileno(): w for w in workers if w.process.stdout is not None}
    start = last = time.monotonic()
    while pending:
        ready, _, _ = select.select(list(pending), [], [], 1.0)  # at most a second before the check below
        for fd in ready:
            worker = pending[fd]
            said = os.read(fd, 4096)
            worker.done += said.count(b"\n")
            if not said:  # it has ended
                del pending[fd]
                status = worker.process.wait()
                if status != 0 or worker.done < len(worker.tasks):
                    raise RunFailed(worker.failure(len(workers), status) + "; the files done are in the token cache: "
                                    "run again to go on from them")  # fmt: skip
        stop_signals.check()
        done = sum(w.done for w in workers)
        if time.monotonic() - last >= 10.0 and 0 < done < total:
            eta = (time.monotonic() - start) * (total - done) / done
            log.info("tokenizing: %d of %d file(s), ETA %.0fs", done, total, eta)
            last = time.monotonic()


def _stop(workers: list[_Worker], root: Path) -> None:
    """Workers still running are stopped (SIGTERM, then SIGKILL after 5 s); what any of them
    left half-written in the cache is removed."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.terminate()
    deadline = time.monotonic() + 5.0
    for worker in workers:
        try:
            worker.process.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        worker.stderr.close()
        if worker.process.stdout is not None:
            worker.process.stdout.close()
        for leftover in root.glob(f".*.{worker.process.pid}.*.tmp"):
            leftover.unlink(missing_ok=True)


def _work(vocab_file: str, vocab_sha256: str, parent: str, *tasks: str) -> None:
    """A worker: each (file, SHA-256, cache file) of `tasks` into the cache."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # unwinds: the file being written is removed
    vocab = Vocabulary.load(vocab_file)
    if vocab.sha256 != vocab_sha256:
        raise SystemExit(f"{vocab_file}: not the vocabulary of SHA-256 {vocab_sha256}")
    for number in range(len(tasks) // 3):
        path, sha256, cache_file = tasks[3 * number : 3 * number + 3]
        data = Path(path).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha256:
            raise SystemExit(f"{path} changed while it was being tokenized")
        save(Path(cache_file), tokenize_lines(non_empty(data), vocab.word_ids))
        print(number, flush=True)
        if os.getppid() != int(parent):  # the parent has gone: nobody waits for the rest
            return


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):  # the parent stopped reading: it is stopping us
        _work(*sys.argv[1:])
