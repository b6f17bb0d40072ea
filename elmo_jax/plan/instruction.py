"""One instruction of a compiled program's HLO text, parsed: its name, result type, opcode,
operands and attributes."""

from __future__ import annotations

import re

DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_OPERAND = re.compile(r"%([\w.\-]+)")
_ATTR = {
    name: re.compile(rf"\b{name}=\{{?%?([\w.\-, %]+?)\}}?(?:,|$| )")
    for name in ("calls", "body", "condition", "to_apply", "branch_computations")
}


def required(pattern: re.Pattern[str] | str, text: str, flags: int = 0) -> re.Match[str]:
    """`re.search`'s match of `pattern` in HLO `text`; a ValueError naming the pattern where the
    text lacks it (a compiler's output this parser does not know)."""
    match = re.search(pattern, text, flags)
    if match is None:
        shown = pattern.pattern if isinstance(pattern, re.Pattern) else pattern
        raise ValueError(f"HLO without {shown!r}: {text[:200]!r}")
    return match


def _closing(text: str, depth: int) -> int:
    """The index in `text` of the parenthesis that closes `depth` open ones (the first one's,
    when `text` starts with it)."""
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return i
    return len(text)


class Instruction:
    """One line of HLO: name, result type, opcode, operand names and the rest."""

    def __init__(self, line: str):
        self.line = line
        definition = required(DEFINITION, line)
        self.name = definition.group(1)
        rest = line[definition.end() :]
        if rest.startswith("("):  # a tuple type
            end = _closing(rest, 0)
            self.type, rest = rest[: end + 1], rest[end + 1 :].lstrip()
        else:
            self.type, _, rest = rest.partition(" ")
        self.opcode, _, args = rest.partition("(")
        end = _closing(args, 1)
        self.operands = _OPERAND.findall(args[:end])
        self.attrs = args[end + 1 :]

    def called(self, attr: str) -> list[str]:
        match = _ATTR[attr].search(self.attrs)
        return [c.strip().lstrip("%") for c in match.group(1).split(",")] if match else []
