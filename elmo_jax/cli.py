"""The command line of `elmo-jax` (also `python -m elmo_jax` and `python launch.py`):
`elmo-jax COMMAND --flag=value ...`; `elmo-jax COMMAND --help` lists a command's flags. This
module parses and dispatches; each command is a module of elmo_jax/commands/.

Flags are absl's, spelled with underscores; a hyphenated spelling, a flag of another command, an
unknown command or a missing required flag is one line on stderr with the usage, exit status 2.
Outputs never clobber (elmo_jax/outputs.py): an existing one is refused unless --overwrite.
Errors the user can fix (files, flags, settings, formats) are one line on stderr with exit
status 2; a run that cannot go on (divergence, a failed save, a full disk) one line with exit
status 1; --verbose (or ELMO_JAX_TRACEBACK=1) shows their tracebacks. Only bugs show them
unasked.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
import textwrap
from pathlib import Path
from typing import NoReturn

import ml_collections
from absl import app, flags

from elmo_jax import settings
from elmo_jax.commands import COMMANDS
from elmo_jax.commands.command import prog, usage_line
from elmo_jax.commands.flags import COMMON_FLAGS, FLAGS
from elmo_jax.commands.process import run_command
from elmo_jax.errors import UserError, as_flags
from elmo_jax.experiment import experiment_file, packaged_experiments

RENAMED = {"out": "output"}  # flags of earlier releases
QUOTE = "'"  # around absl's string defaults


def _usage(command: str) -> str:
    return usage_line(command, COMMANDS[command])


def _fail(message: str, status: int = 2) -> NoReturn:
    print(message, file=sys.stderr)
    sys.exit(status)


def _flag_name(arg: str) -> str | None:
    """--name=value / --name / -name -> name; None for a value."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit():
        return None
    return arg.lstrip("-").split("=", 1)[0]


def _check_flag_names(command: str, args: list[str]) -> None:
    """A hyphenated spelling, an old name, or a flag of another command: one line, exit 2."""
    ours = {name for c in COMMANDS.values() for name in c.flags} | set(COMMON_FLAGS)
    allowed = set(COMMANDS[command].flags) | set(COMMON_FLAGS)
    hint = f"{prog()} {command} --help lists its flags"
    for name in filter(None, map(_flag_name, args)):
        bare = name[2:] if name.startswith("no") and name[2:] in ours else name
        if bare.startswith("config.") and "config" in allowed:
            continue
        if "-" in bare and bare.replace("-", "_") in ours:
            _fail(f"{prog()} {command}: --{name}: flags are spelled with underscores: --{name.replace('-', '_')}")
        if bare in RENAMED and RENAMED[bare] in allowed:
            _fail(f"{prog()} {command}: --{bare} is now --{RENAMED[bare]}")
        if (bare in ours or bare.startswith("config.")) and bare not in allowed:
            _fail(f"{prog()} {command}: --{bare} is not a flag of {command}; {hint}")


def _resolve_config(args: list[str]) -> list[str]:
    """--config=NAME of a packaged experiment -> its file (a path stays as it is)."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--config="):
            out[i] = "--config=" + experiment_file(arg.split("=", 1)[1])
        elif arg == "--config" and i + 1 < len(out):
            out[i + 1] = experiment_file(out[i + 1])
    return out


def _help(command: str | None) -> str:
    width = 100
    if command is None:
        lines = [f"usage: {prog()} COMMAND [--flags]", "", "commands:"]
        lines += [f"  {name:8s} {c.summary}" for name, c in COMMANDS.items()]
        lines += ["", f"{prog()} COMMAND --help lists the flags of COMMAND."]
        return "\n".join(lines)

    def describe(name: str) -> list[str]:
        flag = FLAGS[name]
        spelled = f"--[no]{name}" if isinstance(flag, flags.BooleanFlag) else f"--{name}"
        default = (
            ""
            if flag.default is None or name == "config"
            else f" (default: {(flag.default_as_str or '').strip(QUOTE)})"
        )
        text = textwrap.wrap((flag.help or "") + default, width - 28)
        return [f"  {spelled:24s}  {text[0]}"] + [" " * 28 + t for t in text[1:]]

    c = COMMANDS[command]
    lines = [_usage(command), "", textwrap.fill(c.summary, width), "", "flags:"]
    for name in c.flags:
        lines += describe(name)
    lines += ["", "flags of every command:"]
    for name in COMMON_FLAGS:
        lines += describe(name)
    if "config" in c.flags:
        lines += ["", "packaged experiments: " + ", ".join(sorted(packaged_experiments()))]
        lines += ["", "settings (--config.train.KEY=VALUE, --config.data.KEY=VALUE) and the base recipe's values:"]
        lines += settings.help_lines(width)
    return "\n".join(lines)


def _config_keys(config: ml_collections.ConfigDict, prefix: str = "config.") -> list[str]:
    keys = []
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            keys += _config_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _load_experiment(path: str) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location("experiment", path)
    if spec is None or spec.loader is None:
        raise UserError(f"--config={path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def parse_flags(argv: list[str]) -> list[str]:
    """The command and its flags, checked before anything is imported or run."""
    args = argv[1:]
    command = args[0] if args and not args[0].startswith("-") else None
    if any(a in ("-h", "--help", "-help", "--helpshort", "--helpfull") for a in args):
        print(_help(command if command in COMMANDS else None))
        sys.exit(0)
    if command is None:
        _fail(f"{prog()}: no command; {_help(None).splitlines()[0]} (COMMAND: {', '.join(COMMANDS)})")
    if command not in COMMANDS:
        _fail(f"{prog()}: unknown command {command!r}; usage: {prog()} COMMAND [--flags] ({', '.join(COMMANDS)})")
    _check_flag_names(command, args[1:])
    try:
        args = _resolve_config(args)
    except UserError as e:
        _fail(f"{prog()} {command}: {as_flags(e)}")
    try:
        rest = FLAGS([argv[0], *args])
    except Exception as e:  # flag values, or the experiment file's own code (a SyntaxError names its line)
        _fail(f"{prog()} {command}: {_flag_error(e, args)}")
    if len(rest) != 2:
        _fail(f"{prog()} {command}: unexpected arguments {' '.join(rest[2:])}; {_usage(command)}")
    missing = [f"--{n}" for n in COMMANDS[command].required if not FLAGS[n].present]
    if missing:
        _fail(f"{prog()} {command}: {' and '.join(missing)} required; {_usage(command)}")
    return rest


def _flag_error(error: Exception, args: list[str]) -> str:
    """absl's message, or for an unknown --config.x override the nearest valid key."""
    message = str(error) if isinstance(error, flags.Error) else f"{type(error).__name__}: {error}"
    bad = [a.split("=")[0].lstrip("-") for a in args if a.startswith("--config.")]
    config_path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    if bad and config_path and Path(config_path).is_file():
        valid = _config_keys(_load_experiment(config_path))
        unknown = [b for b in bad if b not in valid]
        if unknown:
            guesses = [(key, _nearest_key(key, valid)) for key in unknown]
            return (
                "; ".join(
                    f"--{key}: unknown config key" + (f", did you mean --{near}?" if near else "")
                    for key, near in guesses
                )
                + f" (every key: {prog()} train --help)"
            )
    return message


def _nearest_key(key: str, valid: list[str]) -> str | None:
    """The valid key `key` was most likely meant to be: a near spelling of its last part in the
    same section, else a near spelling of the whole."""
    section, _, name = key.rpartition(".")
    siblings = {v.rpartition(".")[2]: v for v in valid if v.rpartition(".")[0] == section}
    near = difflib.get_close_matches(name, siblings, n=1)
    if near:
        return siblings[near[0]]
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.85)
    return near[0] if near else None


def main(argv: list[str]) -> None:
    command = argv[1]
    run_command(command, COMMANDS[command].run, FLAGS)


def run() -> None:
    """The entry point: absl parses (parse_flags), then the command runs."""
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
