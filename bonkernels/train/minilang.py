"""A tiny straight-line language for integer functions, and its safe interpreter.

A program is a sequence of instructions applied left to right to an accumulator that starts at
the input x. Every instruction is one operator character followed by one decimal digit:

    +d   x + d          -d   x - d          *d   x * d
    /d   floor(x / d)   %d   x mod d (Python's sign convention: the result has d's sign)

Example: ``*3+1`` maps 2 to 7. The interpreter is a hand-written parser and a loop over integer
operations: nothing is ever passed to ``eval``/``exec``, programs are length-bounded, and values
are bounded, so any text is safe to run. Invalid text raises :class:`ProgramError`.
"""

from __future__ import annotations

OPERATORS = "+-*/%"
MAX_INSTRUCTIONS = 16
MAX_ABS_VALUE = 10**12


class ProgramError(ValueError):
    """The text is not a valid program, or running it failed (division by zero, overflow)."""


def parse(text: str) -> tuple[tuple[str, int], ...]:
    """Parse program text into ((operator, digit), ...); raise ProgramError when malformed."""
    if not isinstance(text, str):
        raise ProgramError(f"a program is a str, got {type(text).__name__}")
    if not text:
        raise ProgramError("empty program")
    if len(text) % 2 or len(text) // 2 > MAX_INSTRUCTIONS:
        raise ProgramError(f"malformed program of length {len(text)}: {text[:40]!r}")
    instructions = []
    for i in range(0, len(text), 2):
        op, digit = text[i], text[i + 1]
        if op not in OPERATORS:
            raise ProgramError(f"unknown operator {op!r} at position {i} in {text!r}")
        if digit not in "0123456789":
            raise ProgramError(f"expected a digit after {op!r} at position {i + 1} in {text!r}")
        instructions.append((op, int(digit)))
    return tuple(instructions)


def run(program: tuple[tuple[str, int], ...] | str, x: int) -> int:
    """Run a parsed program (or program text) on the integer x."""
    if isinstance(program, str):
        program = parse(program)
    value = int(x)
    for op, d in program:
        if op == "+":
            value = value + d
        elif op == "-":
            value = value - d
        elif op == "*":
            value = value * d
        elif op == "/":
            if d == 0:
                raise ProgramError("division by zero")
            value = value // d
        elif op == "%":
            if d == 0:
                raise ProgramError("modulo by zero")
            value = value % d
        else:  # parse() admits only OPERATORS; a hand-built tuple may not
            raise ProgramError(f"unknown operator {op!r}")
        if abs(value) > MAX_ABS_VALUE:
            raise ProgramError("value out of range")
    return value


def fraction_passed(text: str, cases: list[tuple[int, int]]) -> float:
    """Fraction of (input, expected output) cases the program text gets right; 0.0 if invalid."""
    if not cases:
        raise ValueError("no test cases")
    try:
        program = parse(text)
    except ProgramError:
        return 0.0
    passed = 0
    for x, expected in cases:
        try:
            passed += run(program, x) == expected
        except ProgramError:
            pass
    return passed / len(cases)
