"""Running launch.py in a subprocess, for tests of the command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch_args(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "launch.py"), *args]


def run_cli(args, env_update: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_update or {})}
    return subprocess.run(launch_args(*args), capture_output=True, text=True, env=env, cwd=ROOT, **kwargs)


def start_cli(args) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        launch_args(*args), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def strict_json(text: str):
    """`text` parsed as strict JSON (RFC 8259): Infinity and NaN are refused, as jq does."""
    return json.loads(text, parse_constant=_not_json)


def assert_one_line_error(result: subprocess.CompletedProcess, status: int, *fragments: str) -> None:
    """Exit `status`, no traceback, and one stderr line holding every fragment."""
    assert result.returncode == status, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
