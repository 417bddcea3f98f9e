"""node-semver's strict ``valid``, ``validRange`` and ``satisfies``, as the cluster runs them.

The reference's placement (``remoteWorkerPlacement.ts``, ``remoteWorkerCompatibility.ts``)
checks runtime versions and the protocol version with the npm package ``semver``
(pinned at 7.7.4 by ``ql3-runtime-core``): ``valid(version)`` and ``validRange(range)``
when it normalizes, ``satisfies(version, range, {includePrerelease: true})`` when it
places. A Python reading of the same rules, written from the package's documented
grammar and behaviour (not a copy of its code), and checked against the real package by
``tests/contracts/vectors/`` (see tests/contracts/test_semver.py):

* a version is ``v?MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`` after a JS ``trim()``, at
  most 256 UTF-16 units, each number at most 2^53-1, no leading zeros;
* a range is ``||``-separated sets of space-separated comparators, after every run of
  JS white space became one space; each comparator may be a hyphen range
  (``1.2 - 2``), a caret (``^1.2.3``), a tilde (``~1.2``, ``~>1.2``), an X-range
  (``1.x``, ``*``, ``>=1.2``), or ``[<|>]=?VERSION``; build metadata is ignored;
* ``includePrerelease`` lets a prerelease version satisfy any comparator it passes (and
  lowers ``^1.2.3``'s floor to ``1.2.3-0``); without it a prerelease matches only a set
  with a prerelease comparator of the same ``MAJOR.MINOR.PATCH``.

Regular expressions mirror the package's "safe" forms (bounded repeats: ``\\s*`` is at
most one space after the white-space collapse). Python's ``$`` matches before a final
newline and ``\\d``/``\\s`` are wider than JavaScript's, so every pattern here spells
``\\Z``, ``[0-9]`` and a literal space instead.

Pure: no I/O. Errors: none raised (invalid input gives None / False).
"""

from __future__ import annotations

import re

from qinglong_edge.contracts.fields import js_length

__all__ = ["MAX_SAFE_INTEGER", "Version", "compare", "parse_version", "satisfies", "valid", "valid_range"]

MAX_SAFE_INTEGER = 2**53 - 1
MAX_LENGTH = 256

#: ECMAScript WhiteSpace and LineTerminator (what ``trim()`` and ``\\s`` mean there).
_JS_SPACE = "\t\n\x0b\x0c\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a" \
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_SPACE_RUN = re.compile(f"[{_JS_SPACE}]+")

# The package's tokens, in their bounded ("safe") spelling; the space is the only white
# space left once a range has been collapsed.
_NUM = "0|[1-9][0-9]{0,256}"
_NUM_LOOSE = "[0-9]{1,256}"
_NON_NUM = "[0-9]{0,256}[a-zA-Z-][a-zA-Z0-9-]{0,250}"
_PRE_ID = f"(?:{_NON_NUM}|{_NUM})"
_PRE_ID_LOOSE = f"(?:{_NON_NUM}|{_NUM_LOOSE})"
_PRERELEASE = f"(?:-({_PRE_ID}(?:\\.{_PRE_ID})*))"
_PRERELEASE_LOOSE = f"(?:-?({_PRE_ID_LOOSE}(?:\\.{_PRE_ID_LOOSE})*))"
_BUILD_ID = "[a-zA-Z0-9-]{1,250}"
_BUILD = f"(?:\\+({_BUILD_ID}(?:\\.{_BUILD_ID})*))"
_FULL_PLAIN = f"v?({_NUM})\\.({_NUM})\\.({_NUM}){_PRERELEASE}?{_BUILD}?"
_LOOSE_PLAIN = f"[v= ]*({_NUM_LOOSE})\\.({_NUM_LOOSE})\\.({_NUM_LOOSE}){_PRERELEASE_LOOSE}?{_BUILD}?"
_GTLT = "((?:<|>)?=?)"
_XID = f"{_NUM}|x|X|\\*"
_XRANGE_PLAIN = (f"[v= ]*({_XID})(?:\\.({_XID})(?:\\.({_XID})(?:{_PRERELEASE})?{_BUILD}?)?)?")

_FULL = re.compile(f"\\A{_FULL_PLAIN}\\Z")
_COMPARATOR = re.compile(f"\\A{_GTLT} {{0,1}}({_FULL_PLAIN})\\Z|\\A\\Z")
_COMPARATOR_TRIM = re.compile(f"( {{0,1}}){_GTLT} {{0,1}}({_LOOSE_PLAIN}|{_XRANGE_PLAIN})")
_TILDE_TRIM = re.compile("( {0,1})(?:~>?) {1,1}")
_CARET_TRIM = re.compile("( {0,1})(?:\\^) {1,1}")
_TILDE = re.compile(f"\\A(?:~>?){_XRANGE_PLAIN}\\Z")
_CARET = re.compile(f"\\A(?:\\^){_XRANGE_PLAIN}\\Z")
_XRANGE = re.compile(f"\\A{_GTLT} {{0,1}}{_XRANGE_PLAIN}\\Z")
_HYPHEN = re.compile(f"\\A {{0,1}}({_XRANGE_PLAIN}) {{1,1}}- {{1,1}}({_XRANGE_PLAIN}) {{0,1}}\\Z")
_STAR = re.compile("(<|>)?=? {0,1}\\*")
_GTE0 = re.compile("\\A {0,1}>= {0,1}0\\.0\\.0 {0,1}\\Z")
_GTE0_PRE = re.compile("\\A {0,1}>= {0,1}0\\.0\\.0-0 {0,1}\\Z")
_BUILD_ANYWHERE = re.compile(_BUILD)
_NUMERIC = re.compile("[0-9]+")
_SPACES = re.compile(" +")


def _trim(text: str) -> str:
    return text.strip(_JS_SPACE)


class Version:
    """A parsed version: ``major``/``minor``/``patch`` ints, ``prerelease`` identifiers
    (ints below 2^53-1, else strings) and ``version``, the normalized text."""

    __slots__ = ("major", "minor", "patch", "prerelease", "version")

    def __init__(self, major: int, minor: int, patch: int, prerelease: tuple[int | str, ...]) -> None:
        self.major, self.minor, self.patch, self.prerelease = major, minor, patch, prerelease
        self.version = f"{major}.{minor}.{patch}" + ("-" + ".".join(str(p) for p in prerelease) if prerelease else "")

    def __repr__(self) -> str:
        return f"Version({self.version!r})"


def parse_version(text: str) -> Version | None:
    """``new SemVer(text)`` (strict), or None when it would throw."""
    if not isinstance(text, str) or js_length(text) > MAX_LENGTH:
        return None
    match = _FULL.match(_trim(text))
    if match is None:
        return None
    numbers = [int(group) for group in match.group(1, 2, 3)]
    if any(n > MAX_SAFE_INTEGER for n in numbers):
        return None
    prerelease: tuple[int | str, ...] = ()
    if match.group(4):
        prerelease = tuple(_identifier(part) for part in match.group(4).split("."))
    return Version(numbers[0], numbers[1], numbers[2], prerelease)


def _identifier(part: str) -> int | str:
    if _NUMERIC.fullmatch(part) and int(part) < MAX_SAFE_INTEGER:
        return int(part)
    return part


def valid(text: str) -> str | None:
    """``semver.valid(text)``: the normalized version, or None."""
    version = parse_version(text)
    return None if version is None else version.version


def _compare_identifiers(a: int | str, b: int | str) -> int:
    if isinstance(a, int) and isinstance(b, int):
        return 0 if a == b else -1 if a < b else 1
    a_num = isinstance(a, int) or _NUMERIC.fullmatch(a) is not None
    b_num = isinstance(b, int) or _NUMERIC.fullmatch(b) is not None
    if a_num and b_num:
        fa, fb = float(a), float(b)  # JS Number(): a huge numeric identifier rounds
        return 0 if fa == fb else -1 if fa < fb else 1
    if a_num:
        return -1
    if b_num:
        return 1
    sa, sb = str(a), str(b)
    return 0 if sa == sb else -1 if sa < sb else 1


def compare(a: Version, b: Version) -> int:
    """-1, 0 or 1 (``SemVer.compare``: main numbers, then prerelease precedence)."""
    if a.version == b.version:
        return 0
    for x, y in ((a.major, b.major), (a.minor, b.minor), (a.patch, b.patch)):
        if x != y:
            return -1 if x < y else 1
    if a.prerelease and not b.prerelease:
        return -1
    if b.prerelease and not a.prerelease:
        return 1
    for index in range(max(len(a.prerelease), len(b.prerelease))):
        if index >= len(b.prerelease):
            return 1
        if index >= len(a.prerelease):
            return -1
        left, right = a.prerelease[index], b.prerelease[index]
        if type(left) is type(right) and left == right:
            continue
        return _compare_identifiers(left, right)
    return 0


class _Comparator:
    __slots__ = ("operator", "semver", "value")

    def __init__(self, text: str) -> None:
        comp = " ".join(_SPACES.split(_trim(text)))
        match = _COMPARATOR.match(comp)
        if match is None:
            raise ValueError(f"invalid comparator {comp!r}")
        operator = match.group(1) or ""
        self.operator = "" if operator == "=" else operator
        self.semver: Version | None = None
        if match.group(2):
            self.semver = parse_version(match.group(2))
            if self.semver is None:
                raise ValueError(f"invalid version {match.group(2)!r}")
        self.value = "" if self.semver is None else self.operator + self.semver.version

    def test(self, version: Version) -> bool:
        if self.semver is None:
            return True
        order = compare(version, self.semver)
        return {"": order == 0, ">": order > 0, ">=": order >= 0, "<": order < 0, "<=": order <= 0}[self.operator]


def _is_x(part: str | None) -> bool:
    return not part or part.lower() == "x" or part == "*"


def _hyphen(match: re.Match[str], include_prerelease: bool) -> str:
    frm, f_major, f_minor, f_patch, f_pre = match.group(1, 2, 3, 4, 5)
    to, t_major, t_minor, t_patch, t_pre = match.group(7, 8, 9, 10, 11)
    z = "-0" if include_prerelease else ""
    if _is_x(f_major):
        frm = ""
    elif _is_x(f_minor):
        frm = f">={f_major}.0.0{z}"
    elif _is_x(f_patch):
        frm = f">={f_major}.{f_minor}.0{z}"
    elif f_pre:
        frm = f">={frm}"
    else:
        frm = f">={frm}{z}"
    if _is_x(t_major):
        to = ""
    elif _is_x(t_minor):
        to = f"<{int(t_major) + 1}.0.0-0"
    elif _is_x(t_patch):
        to = f"<{t_major}.{int(t_minor) + 1}.0-0"
    elif t_pre:
        to = f"<={t_major}.{t_minor}.{t_patch}-{t_pre}"
    elif include_prerelease:
        to = f"<{t_major}.{t_minor}.{int(t_patch) + 1}-0"
    else:
        to = f"<={to}"
    return f"{frm} {to}".strip(" ")


def _tilde(comp: str) -> str:
    match = _TILDE.match(comp)
    if match is None:
        return comp
    major, minor, patch, pre = match.group(1, 2, 3, 4)
    if _is_x(major):
        return ""
    if _is_x(minor):
        return f">={major}.0.0 <{int(major) + 1}.0.0-0"
    if _is_x(patch):
        return f">={major}.{minor}.0 <{major}.{int(minor) + 1}.0-0"
    if pre:
        return f">={major}.{minor}.{patch}-{pre} <{major}.{int(minor) + 1}.0-0"
    return f">={major}.{minor}.{patch} <{major}.{int(minor) + 1}.0-0"


def _caret(comp: str, include_prerelease: bool) -> str:
    match = _CARET.match(comp)
    if match is None:
        return comp
    major, minor, patch, pre = match.group(1, 2, 3, 4)
    z = "-0" if include_prerelease else ""
    if _is_x(major):
        return ""
    if _is_x(minor):
        return f">={major}.0.0{z} <{int(major) + 1}.0.0-0"
    if _is_x(patch):
        upper = f"{major}.{int(minor) + 1}.0-0" if major == "0" else f"{int(major) + 1}.0.0-0"
        return f">={major}.{minor}.0{z} <{upper}"
    floor = f"{major}.{minor}.{patch}-{pre}" if pre else f"{major}.{minor}.{patch}"
    if major == "0":
        upper = f"{major}.{minor}.{int(patch) + 1}-0" if minor == "0" else f"{major}.{int(minor) + 1}.0-0"
        return f">={floor}{'' if pre else z} <{upper}"
    return f">={floor} <{int(major) + 1}.0.0-0"


def _xrange(comp: str, include_prerelease: bool) -> str:
    comp = _trim(comp)
    match = _XRANGE.match(comp)
    if match is None:
        return comp
    gtlt, major, minor, patch = match.group(1, 2, 3, 4)
    x_major = _is_x(major)
    x_minor = x_major or _is_x(minor)
    x_patch = x_minor or _is_x(patch)
    if gtlt == "=" and x_patch:
        gtlt = ""
    pre = "-0" if include_prerelease else ""
    if x_major:
        return "<0.0.0-0" if gtlt in (">", "<") else "*"
    if gtlt and x_patch:
        m_num = 0 if x_minor else int(minor)
        p_num = 0
        M_num = int(major)
        if gtlt == ">":
            gtlt = ">="
            if x_minor:
                M_num, m_num = M_num + 1, 0
            else:
                m_num += 1
        elif gtlt == "<=":
            gtlt = "<"
            if x_minor:
                M_num += 1
            else:
                m_num += 1
        if gtlt == "<":
            pre = "-0"
        return f"{gtlt}{M_num}.{m_num}.{p_num}{pre}"
    if x_minor:
        return f">={major}.0.0{pre} <{int(major) + 1}.0.0-0"
    if x_patch:
        return f">={major}.{minor}.0{pre} <{major}.{int(minor) + 1}.0-0"
    return match.group(0)


def _parse_comparator(comp: str, include_prerelease: bool) -> str:
    comp = _BUILD_ANYWHERE.sub("", comp, count=1)
    comp = " ".join(_caret(c, include_prerelease) for c in _SPACES.split(_trim(comp)))
    comp = " ".join(_tilde(c) for c in _SPACES.split(_trim(comp)))
    comp = " ".join(_xrange(c, include_prerelease) for c in _SPACES.split(comp))
    return _STAR.sub("", _trim(comp), count=1)


def _parse_set(text: str, include_prerelease: bool) -> list[_Comparator]:
    text = _HYPHEN.sub(lambda m: _hyphen(m, include_prerelease), text, count=1)
    text = _COMPARATOR_TRIM.sub(lambda m: m.group(1) + m.group(2) + m.group(3), text)
    text = _TILDE_TRIM.sub(lambda m: m.group(1) + "~", text)
    text = _CARET_TRIM.sub(lambda m: m.group(1) + "^", text)
    parts = " ".join(_parse_comparator(c, include_prerelease) for c in text.split(" "))
    gte0 = _GTE0_PRE if include_prerelease else _GTE0
    comparators = [_Comparator(gte0.sub("", _trim(c), count=1)) for c in _SPACES.split(parts)]
    unique: dict[str, _Comparator] = {}
    for comparator in comparators:
        if comparator.value == "<0.0.0-0":
            return [comparator]
        unique[comparator.value] = comparator  # Map.set: the first one's place, the same value
    if len(unique) > 1 and "" in unique:
        del unique[""]
    return list(unique.values())


def _parse_range(text: str, include_prerelease: bool) -> list[list[_Comparator]] | None:
    if not isinstance(text, str):
        return None
    raw = _JS_SPACE_RUN.sub(" ", _trim(text))
    try:
        sets = [s for s in (_parse_set(_trim(part), include_prerelease) for part in raw.split("||")) if s]
    except ValueError:
        return None
    if not sets:
        return None
    if len(sets) > 1:
        first = sets[0]
        sets = [s for s in sets if s[0].value != "<0.0.0-0"]
        if not sets:
            sets = [first]
        elif len(sets) > 1:
            for comparators in sets:
                if len(comparators) == 1 and comparators[0].value == "":
                    sets = [comparators]
                    break
    return sets


def valid_range(text: str, *, include_prerelease: bool = False) -> str | None:
    """``semver.validRange(text)``: the normalized range (``*`` for any), or None."""
    sets = _parse_range(text, include_prerelease)
    if sets is None:
        return None
    return "||".join(" ".join(c.value for c in s) for s in sets) or "*"


def satisfies(version: str, range_text: str, *, include_prerelease: bool = False) -> bool:
    """``semver.satisfies(version, range, {includePrerelease})``: False for an invalid
    version or range."""
    sets = _parse_range(range_text, include_prerelease)
    parsed = parse_version(version) if isinstance(version, str) and version else None
    if sets is None or parsed is None:
        return False
    for comparators in sets:
        if all(c.test(parsed) for c in comparators):
            if not parsed.prerelease or include_prerelease:
                return True
            for c in comparators:
                if c.semver is not None and c.semver.prerelease and (
                        c.semver.major, c.semver.minor, c.semver.patch) == (parsed.major, parsed.minor,
                                                                             parsed.patch):
                    return True
    return False
