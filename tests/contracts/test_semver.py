"""contracts/semver.py against the real node-semver 7.7.4 (the reference's pinned package).

The vectors (tests/contracts/vectors/semver.jsonl) were produced by the package itself
from generated inputs; tests/contracts/vectors/generate.mjs says how to make them again.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from qinglong_edge.contracts import semver

VECTORS = pathlib.Path(__file__).parent / "vectors" / "semver.jsonl"
CASES = [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").splitlines()]


def test_the_vectors_cover_the_grammar() -> None:
    """The generated set is not trivial: valid and invalid ranges, both answers, and
    cases where includePrerelease changes the answer."""
    assert len(CASES) >= 1500
    assert sum(c["validRange"] is None for c in CASES) > 300 and sum(c["validRange"] is not None for c in CASES) > 600
    assert sum(c["satisfiesPre"] for c in CASES) > 150
    assert sum(c["satisfies"] != c["satisfiesPre"] for c in CASES) > 30
    assert sum(c["valid"] is None for c in CASES) > 50


@pytest.mark.parametrize("field", ["valid", "validRange", "validRangePre", "satisfies", "satisfiesPre"])
def test_agrees_with_node_semver_on_every_vector(field: str) -> None:
    def ours(case: dict[str, object]) -> object:
        version, text = str(case["version"]), str(case["range"])
        return {
            "valid": lambda: semver.valid(version),
            "validRange": lambda: semver.valid_range(text),
            "validRangePre": lambda: semver.valid_range(text, include_prerelease=True),
            "satisfies": lambda: semver.satisfies(version, text),
            "satisfiesPre": lambda: semver.satisfies(version, text, include_prerelease=True),
        }[field]()

    wrong = [(c["version"], c["range"], c[field], ours(c)) for c in CASES if ours(c) != c[field]]
    assert wrong == []


@pytest.mark.parametrize(("version", "text", "plain", "pre"), [
    ("1.2.3-rc.1", "^1.2.0", False, True),   # a prerelease passes only with includePrerelease
    ("1.2.3-rc.1", ">=1.2.3-rc.0 <2", True, True),  # ...or a comparator of its own M.m.p
    ("3.13.0-rc.1", ">=3.11", False, True),
    ("2.0.0", "1.x || >=2.0.0", True, True),
    ("1.2.3", "1.2.3 - 2", True, True),
    ("9007199254740991.0.0", ">=1", True, True),
])
def test_hand_picked_answers(version: str, text: str, plain: bool, pre: bool) -> None:
    assert semver.satisfies(version, text) is plain
    assert semver.satisfies(version, text, include_prerelease=True) is pre


@pytest.mark.parametrize(("text", "expected"), [
    ("1.2.3\x85", None),         # NEL: white space to Python, not to JavaScript
    ("１.2.3", None),             # a Unicode digit: \\d in Python, not in JavaScript
    ("1.2.3\n4", None),          # Python's $ would match before the newline
    ("\ufeff1.2.3\u00a0", "1.2.3"),  # JavaScript's trim() removes these (checked with node)
    ("9007199254740992.0.0", None), ("01.2.3", None), ("1.2", None),
])
def test_javascript_not_python_decides_white_space_and_digits(text: str, expected: str | None) -> None:
    assert semver.valid(text) == expected
