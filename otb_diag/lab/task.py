"""The lab's verifiable tasks: copy, reverse or sort a string of 3 to 40 digits (the default
scenario), and add up to 52 digits with a written scratchpad (the long scenario).

A problem is an op letter and a digit string; its prompt is ``"R:83920="`` and its correct
response is the answer followed by the end marker, ``"02938<end>"``. Answer length equals the
digit count, so one task yields responses from 4 to 41 tokens: the long-horizon heterogeneity the
diagnostics are about.

Op ``T`` is sort with a tool: the model emits ``<call>``, the tool's output ``[02389]`` (the
sorted digits in brackets) is spliced into the response, and the model then writes the answer,
``"<call>[02389]02389<end>"``. The verifier strips tool segments, so an answer written without
calling the tool counts too.

Op ``A`` (add, the long scenario) labels each digit with a letter, ``"A:a3b9c2="``, and the
correct response works through the digits one line at a time: label, digit, ``+`` the running
total so far, ``=`` the new total, all modulo 10, then the final total after ``#``:
``"a3+0=3;b9+3=2;c2+2=4;#4<end>"``. The labels make finding the next digit a lookup by
content, which a small model learns, instead of a count of positions, which it does not; every
line is 7 tokens, so responses run from 24 tokens (3 digits) to 367 (52 digits), and a response
mixes near-certain tokens (labels, copies of the last total) with uncertain ones (the sums).
Only the total after the last ``#`` is verified, as RL with verifiable rewards checks the final
answer, not the work; a guess is right one time in ten.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

END = "<end>"
CALL = "<call>"
PLAIN_OPS = ("C", "R", "S")  # copy, reverse, sort
TOOL_OP = "T"  # sort, with the sorting tool available
SUM_OP = "A"  # add, with a scratchpad
MIN_DIGITS = 3
MAX_DIGITS = 40
LABELS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  # one per digit of an op-A problem
ANSWER = "#"  # op A: what follows is the final answer

# A tool call and the tool's reply, as they appear inside a response.
_TOOL_SEGMENT = re.compile(re.escape(CALL) + r"\[[0-9]*\]")
_PROMPT = re.compile(r"([CRST]):([0-9]+)=")
_SUM_PROMPT = re.compile(r"A:((?:[a-zA-Z][0-9])+)=")


@dataclass(frozen=True)
class Problem:
    """One task instance: `op` in C/R/S/T and its input `digits`."""

    op: str
    digits: str

    @property
    def prompt(self) -> str:
        if self.op == SUM_OP:
            pairs = "".join(a + d for a, d in zip(LABELS, self.digits, strict=False))
            return f"{SUM_OP}:{pairs}="
        return f"{self.op}:{self.digits}="


def answer(op: str, digits: str) -> str:
    """The correct answer, without end marker."""
    if op == "C":
        return digits
    if op == "R":
        return digits[::-1]
    if op in ("S", TOOL_OP):
        return "".join(sorted(digits))
    if op == SUM_OP:
        return str(sum(int(d) for d in digits) % 10)
    raise ValueError(f"unknown op {op!r}")


def tool_output(digits: str) -> str:
    """What the sorting tool returns for a call: the sorted digits in brackets."""
    return "[" + "".join(sorted(digits)) + "]"


def scratchpad(digits: str) -> str:
    """Op A's worked lines, one per digit: label, digit, running total before and after, mod 10
    (``"a3+0=3;b9+3=2;"``)."""
    lines, total = [], 0
    for label, d in zip(LABELS, digits, strict=False):
        new = (total + int(d)) % 10
        lines.append(f"{label}{d}+{total}={new};")
        total = new
    return "".join(lines)


def target(problem: Problem) -> str:
    """The response the SFT data teaches: the answer and end marker, via the tool for op T,
    after the scratchpad for op A."""
    if problem.op == SUM_OP:
        return scratchpad(problem.digits) + ANSWER + answer(SUM_OP, problem.digits) + END
    body = answer(problem.op, problem.digits) + END
    if problem.op == TOOL_OP:
        return CALL + tool_output(problem.digits) + body
    return body


def parse_prompt(prompt: str) -> Problem:
    """Inverse of `Problem.prompt`; raises ValueError on anything else."""
    labelled = _SUM_PROMPT.fullmatch(prompt)
    if labelled is not None:
        pairs = labelled.group(1)
        if pairs[::2] != LABELS[: len(pairs) // 2]:
            raise ValueError(f"labels out of order in {prompt!r}")
        return Problem(op=SUM_OP, digits=pairs[1::2])
    match = _PROMPT.fullmatch(prompt)
    if match is None:
        raise ValueError(f"not a lab prompt: {prompt!r}")
    return Problem(op=match.group(1), digits=match.group(2))


def verify(prompt: str, response: str) -> float:
    """1.0 if the text before the first end marker (tool segments removed; for op A, the part
    after the last ``#``) is the answer, else 0.0.

    A response without an end marker is wrong: it ran out of tokens before committing.
    """
    problem = parse_prompt(prompt)
    head, found, _ = response.partition(END)
    if not found:
        return 0.0
    if problem.op == SUM_OP:
        _, marked, given = head.rpartition(ANSWER)
        return 1.0 if marked and given == answer(SUM_OP, problem.digits) else 0.0
    given = _TOOL_SEGMENT.sub("", head)
    return 1.0 if given == answer(problem.op, problem.digits) else 0.0


def make_problem(rng: np.random.Generator, op: str, n_digits: int) -> Problem:
    """A problem with `n_digits` uniformly random digits."""
    if op == SUM_OP and n_digits > len(LABELS):
        raise ValueError(f"op A takes at most {len(LABELS)} digits (one label each)")
    digits = "".join(str(d) for d in rng.integers(0, 10, size=n_digits))
    return Problem(op=op, digits=digits)


def problem_tokens(op: str, n_digits: int) -> int:
    """Characters of prompt + correct response for `n_digits` zeros: a size estimate of one
    training example (exact for copy/reverse/sort; op A's totals only grow longer)."""
    problem = Problem(op=op, digits="0" * n_digits)
    return len(problem.prompt) + len(target(problem).replace(END, "e").replace(CALL, "c"))


def make_problems(
    rng: np.random.Generator, n: int, n_digits: int, ops: tuple[str, ...] = (*PLAIN_OPS, TOOL_OP)
) -> list[Problem]:
    """`n` problems of `n_digits` digits each, ops drawn uniformly from `ops`."""
    op_idx = rng.integers(0, len(ops), size=n)
    return [make_problem(rng, ops[i], n_digits) for i in op_idx]
