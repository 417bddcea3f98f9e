"""`uci show` parser and formatter (qinglong_edge.contracts.uci)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qinglong_edge.contracts.errors import ContractError
from qinglong_edge.contracts.uci import UciSection, format_show, parse_show, quote_value

PKG = "qinglong-edge"

# What `uci show qinglong-edge` prints for a named section, an unnamed one, a list,
# a value with a quote, spaces and a newline (openwrt/uci cli.c).
DUMP = (
    "qinglong-edge.main=agent\n"
    "qinglong-edge.main.enabled='1'\n"
    "qinglong-edge.main.state_directory='/etc/qinglong-edge/it'\\''s here'\n"
    "qinglong-edge.@worker[0]=worker\n"
    "qinglong-edge.@worker[0].trust_anchor_file='/a.pem' '/b c.pem' ''\\'''\n"
    "qinglong-edge.@worker[0].origin='two\nlines'\n"
)


def test_parses_named_and_unnamed_sections_lists_and_escapes() -> None:
    sections = parse_show(DUMP, PKG)
    assert [(s.name, s.type) for s in sections] == [("main", "agent"), ("@worker[0]", "worker")]
    assert sections[0].options == {"enabled": ("1",), "state_directory": ("/etc/qinglong-edge/it's here",)}
    assert sections[1].options["trust_anchor_file"] == ("/a.pem", "/b c.pem", "'")
    assert sections[1].options["origin"] == ("two\nlines",)


def test_format_is_the_exact_inverse() -> None:
    assert format_show(PKG, parse_show(DUMP, PKG)) == DUMP


def test_empty_dump_has_no_sections() -> None:
    assert parse_show("", PKG) == ()


def test_quote_value_matches_uci_print_value() -> None:
    assert quote_value("it's") == "'it'\\''s'"
    assert quote_value("") == "''"


@pytest.mark.parametrize(
    ("dump", "where"),
    [
        pytest.param("qinglong-edge.main.enabled='1'\n", "qinglong-edge.main.enabled", id="option_before_section"),
        pytest.param("other.main=agent\n", "line 1", id="other_package"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main=agent\n", "qinglong-edge.main", id="section_twice"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x='1'\nqinglong-edge.main.x='2'\n",
                     "qinglong-edge.main.x", id="option_twice"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x=1\n", "qinglong-edge.main.x", id="unquoted"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x='1\n", "qinglong-edge.main.x", id="unterminated"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x='1'x\n", "qinglong-edge.main.x",
                     id="junk_after_value"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x='1'  '2'\n", "qinglong-edge.main.x",
                     id="two_spaces"),
        pytest.param("qinglong-edge.main=ag ent\n", "qinglong-edge.main", id="bad_type"),
        pytest.param("qinglong-edge.ma-in=agent\n", "qinglong-edge.ma-in", id="bad_section_name"),
        pytest.param("qinglong-edge.@worker[0]=agent\n", "qinglong-edge.@worker[0]", id="unnamed_type_mismatch"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.b-d='1'\n", "qinglong-edge.main.b-d",
                     id="bad_option_name"),
        pytest.param("qinglong-edge.main\n", "line 1", id="no_equals"),
        pytest.param("qinglong-edge.a.b.c='1'\n", "line 1", id="too_deep"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x='\x00'\n", "line 2", id="nul"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x='" + "a" * 4097 + "'\n",
                     "qinglong-edge.main.x", id="value_too_long"),
        pytest.param("qinglong-edge.main=agent\nqinglong-edge.main.x=" + " ".join(["'a'"] * 65) + "\n",
                     "qinglong-edge.main.x", id="too_many_items"),
        pytest.param("".join(f"qinglong-edge.s{i}=agent\n" for i in range(65)), "qinglong-edge.s64",
                     id="too_many_sections"),
    ],
)
def test_rejects_malformed_dump(dump: str, where: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_show(dump, PKG)
    assert info.value.code == "invalid_uci"
    assert info.value.path == where


def test_rejects_oversized_dump() -> None:
    with pytest.raises(ContractError) as info:
        parse_show("x" * (256 * 1024 + 1), PKG)
    assert info.value.code == "invalid_uci"


_names = st.from_regex(r"[A-Za-z0-9_]{1,12}", fullmatch=True)
_values = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)


@st.composite
def _sections(draw: st.DrawFn) -> list[UciSection]:
    types = draw(st.lists(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), min_size=0, max_size=5))
    counts: dict[str, int] = {}
    sections = []
    used: set[str] = set()
    for kind in types:
        if draw(st.booleans()):
            name = f"@{kind}[{counts.get(kind, 0)}]"
            counts[kind] = counts.get(kind, 0) + 1
        else:
            name = draw(_names)
        if name in used:
            continue
        used.add(name)
        options = draw(st.dictionaries(_names, st.lists(_values, min_size=1, max_size=4).map(tuple), max_size=5))
        sections.append(UciSection(name, kind, options))
    return sections


@given(_sections())
def test_round_trip_of_any_dump(sections: list[UciSection]) -> None:
    text = format_show(PKG, sections)
    assert list(parse_show(text, PKG)) == sections


@given(st.text(max_size=200))
def test_arbitrary_text_parses_or_raises_contract_error(text: str) -> None:
    try:
        parse_show(text, PKG)
    except ContractError as exc:
        assert exc.code == "invalid_uci"
