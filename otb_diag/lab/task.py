"""The lab's verifiable task: copy, reverse or sort a string of 3 to 40 digits.

A problem is an op letter and a digit string; its prompt is ``"R:83920="`` and its correct
response is the answer followed by the end marker, ``"02938<end>"``. Answer length equals the
digit count, so one task yields responses from 4 to 41 tokens: the long-horizon heterogeneity the
diagnostics are about.

Op ``T`` is sort with a tool: the model emits ``<call>``, the tool's output ``[02389]`` (the
sorted digits in brackets) is spliced into the response, and the model then writes the answer,
``"<call>[02389]02389<end>"``. The verifier strips tool segments, so an answer written without
calling the tool counts too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

END = "<end>"
CALL = "<call>"
PLAIN_OPS = ("C", "R", "S")  # copy, reverse, sort
TOOL_OP = "T"  # sort, with the sorting tool available
MIN_DIGITS = 3
MAX_DIGITS = 40

# A tool call and the tool's reply, as they appear inside a response.
_TOOL_SEGMENT = re.compile(re.escape(CALL) + r"\[[0-9]*\]")
_PROMPT = re.compile(r"([CRST]):([0-9]+)=")


@dataclass(frozen=True)
class Problem:
    """One task instance: `op` in C/R/S/T and its input `digits`."""

    op: str
    digits: str

    @property
    def prompt(self) -> str:
        return f"{self.op}:{self.digits}="


def answer(op: str, digits: str) -> str:
    """The correct answer, without end marker."""
    if op == "C":
        return digits
    if op == "R":
        return digits[::-1]
    if op in ("S", TOOL_OP):
        return "".join(sorted(digits))
    raise ValueError(f"unknown op {op!r}")


def tool_output(digits: str) -> str:
    """What the sorting tool returns for a call: the sorted digits in brackets."""
    return "[" + "".join(sorted(digits)) + "]"


def target(problem: Problem) -> str:
    """The response the SFT data teaches: the answer and end marker, via the tool for op T."""
    body = answer(problem.op, problem.digits) + END
    if problem.op == TOOL_OP:
        return CALL + tool_output(problem.digits) + body
    return body


def parse_prompt(prompt: str) -> Problem:
    """Inverse of `Problem.prompt`; raises ValueError on anything else."""
    match = _PROMPT.fullmatch(prompt)
    if match is None:
        raise ValueError(f"not a lab prompt: {prompt!r}")
    return Problem(op=match.group(1), digits=match.group(2))


def verify(prompt: str, response: str) -> float:
    """1.0 if the text before the first end marker (tool segments removed) is the answer, else 0.0.

    A response without an end marker is wrong: it ran out of tokens before committing.
    """
    problem = parse_prompt(prompt)
    head, found, _ = response.partition(END)
    if not found:
        return 0.0
    given = _TOOL_SEGMENT.sub("", head)
    return 1.0 if given == answer(problem.op, problem.digits) else 0.0


def make_problem(rng: np.random.Generator, op: str, n_digits: int) -> Problem:
    """A problem with `n_digits` uniformly random digits."""
    digits = "".join(str(d) for d in rng.integers(0, 10, size=n_digits))
    return Problem(op=op, digits=digits)


def make_problems(
    rng: np.random.Generator, n: int, n_digits: int, ops: tuple[str, ...] = (*PLAIN_OPS, TOOL_OP)
) -> list[Problem]:
    """`n` problems of `n_digits` digits each, ops drawn uniformly from `ops`."""
    op_idx = rng.integers(0, len(ops), size=n)
    return [make_problem(rng, ops[i], n_digits) for i in op_idx]
