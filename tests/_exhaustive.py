"""Splitting a parametrized grid into a default subset and the rest, marked `exhaustive` (tests/conftest.py).

`grid(cases, keep)` returns every case as a pytest param; those for which `keep(index, case)` is false
carry the `exhaustive` mark and are skipped unless pytest runs with `--exhaustive`.
"""

from typing import Callable, Iterable, Sequence

import pytest


def grid(cases: Iterable[Sequence], keep: Callable[[int, Sequence], bool]) -> list:
    out = []
    for i, case in enumerate(cases):
        case = tuple(case) if isinstance(case, (tuple, list)) else (case,)
        marks = () if keep(i, case) else (pytest.mark.exhaustive,)
        out.append(pytest.param(*case, marks=marks))
    return out

