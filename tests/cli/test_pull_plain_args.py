"""``commands.pull.plain_args``: the cron-run ``pull`` parsed without argparse must give
exactly what argparse gives (``cli.build_parser`` + ``cli.main``'s defaults), and hand
everything else to argparse (None)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qinglong_edge.cli import _ArgumentError, build_parser, main
from qinglong_edge.commands import pull
from qinglong_edge.commands.pull import plain_args


def _argparse(argv: list[str]) -> dict[str, Any] | None:
    """What cli.main hands the handler after argparse, or None for a usage error."""
    try:
        args = build_parser(argv).parse_args(argv)
    except _ArgumentError:
        return None
    for name, default in (("config", None), ("json", False)):
        if not hasattr(args, name):
            setattr(args, name, default)
    return vars(args)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y or type(x) is not type(y):
            return False
    return True


PLAIN = [
    pytest.param(["--config", "/var/etc/qinglong-edge/config.json", "pull"], id="openwrt_cron"),
    pytest.param(["--config", "/etc/qinglong-edge/config.json", "pull"], id="systemd_timer"),
    pytest.param(["pull", "--config", "/tmp/c.json", "--no-splay"], id="bench"),
    pytest.param(["pull"], id="bare"),
    pytest.param(["pull", "--json"], id="json_after"),
    pytest.param(["--json", "pull"], id="json_before"),
    pytest.param(["--json", "--config", "c", "pull", "--duration", "30", "--no-splay"], id="everything"),
    pytest.param(["pull", "--duration", "0.5"], id="fraction"),
    pytest.param(["pull", "--duration", "1e3"], id="exponent"),
    pytest.param(["pull", "--duration", "nan"], id="nan_reaches_the_range_check"),
    pytest.param(["pull", "--duration", " 7 "], id="float_strips_spaces"),
    pytest.param(["--config", "pull", "pull"], id="config_named_pull"),
    pytest.param(["--config", "", "pull"], id="empty_config"),
    pytest.param(["pull", "--config", "a b"], id="config_with_space"),
]


@pytest.mark.parametrize("argv", PLAIN)
def test_plain_command_lines_match_argparse(argv: list[str]) -> None:
    fast = plain_args(argv)
    assert fast is not None, "the plain form must skip argparse"
    expected = _argparse(argv)
    assert expected is not None
    assert _same(vars(fast), expected), (vars(fast), expected)
    assert fast.handler is pull._run


OTHER = [
    pytest.param([], id="empty"),
    pytest.param(["--config", "c"], id="no_command"),
    pytest.param(["version"], id="other_command"),
    pytest.param(["pull", "--help"], id="help"),
    pytest.param(["pull", "-h"], id="short_help"),
    pytest.param(["pull", "--no-spl"], id="abbreviation"),
    pytest.param(["--conf", "c", "pull"], id="global_abbreviation"),
    pytest.param(["pull", "--config=c"], id="equals_form"),
    pytest.param(["pull", "--duration=5"], id="equals_duration"),
    pytest.param(["--config", "a", "pull", "--config", "b"], id="config_on_both_sides"),
    pytest.param(["pull", "--json", "--json"], id="repeat"),
    pytest.param(["pull", "--duration", "-5"], id="negative_value"),
    pytest.param(["pull", "--config", "-c"], id="value_like_an_option"),
    pytest.param(["pull", "--duration", "five"], id="bad_float"),
    pytest.param(["pull", "--duration"], id="missing_value"),
    pytest.param(["--config"], id="missing_config_value"),
    pytest.param(["--duration", "5", "pull"], id="pull_option_before_command"),
    pytest.param(["--no-splay", "pull"], id="pull_flag_before_command"),
    pytest.param(["pull", "extra"], id="extra_positional"),
    pytest.param(["pull", "pull"], id="command_twice"),
    pytest.param(["pull", "--"], id="double_dash"),
    pytest.param(["pull", ""], id="empty_word"),
    pytest.param(["pull", "--unknown"], id="unknown_option"),
]


@pytest.mark.parametrize("argv", OTHER)
def test_rejects_anything_but_the_plain_grammar(argv: list[str]) -> None:
    assert plain_args(argv) is None


WORDS = ["pull", "version", "--config", "--json", "--no-splay", "--duration", "--conf", "--no-spl",
         "--config=x", "-h", "--", "", "-5", "5", "0", "86400", "nan", "inf", "1e3", " 2 ", "x", "/etc/c.json",
         "a b", "-"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=7))
def test_plain_args_never_differs_from_argparse(argv: list[str]) -> None:
    fast = plain_args(argv)
    if fast is None:
        return
    expected = _argparse(argv)
    assert expected is not None, f"plain_args accepted {argv!r}, argparse rejects it"
    assert _same(vars(fast), expected), (argv, vars(fast), expected)


def test_pull_options_are_the_ones_plain_args_knows() -> None:
    """A new ``pull`` option (or global one) must be taught to plain_args too."""
    parser = build_parser(["pull"])
    sub = next(a for a in parser._actions if a.dest == "command").choices["pull"]  # type: ignore[union-attr]
    options = {s for action in sub._actions for s in action.option_strings} - {"-h", "--help"}
    assert options == set(pull._GLOBAL_OPTIONS) | set(pull._PULL_OPTIONS)
    top = {s for action in parser._actions for s in action.option_strings} - {"-h", "--help"}
    assert top == set(pull._GLOBAL_OPTIONS)
    values = {s for action in sub._actions for s in action.option_strings if action.nargs is None
              and action.const is None and s not in ("-h", "--help")}
    assert values == set(pull._VALUE_OPTIONS)


def test_usage_errors_still_come_from_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "--duration", "five"]) == 64
    assert "invalid float value: 'five'" in capsys.readouterr().err
    assert main(["pull", "--duration", "0"]) == 64  # the range check of the handler, on the plain path
    assert "--duration must be more than 0" in capsys.readouterr().err
