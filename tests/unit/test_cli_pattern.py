"""One sub-command pattern: the CLI parses each sub-command into one frozen options dataclass and calls
one function taking it; no code outside the CLI layer takes an argparse.Namespace."""
import argparse
import dataclasses
import inspect
import re
import typing
from pathlib import Path

import pytest

from experiments import cli

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = cli.sub_commands()
SUBPARSERS = cli.build_parser().parse_args(["run", "--out", "x"]).subcommands


# an argparse.Namespace by name, or a parameter called args (what took one here before; *args and args: tuple aside)
TAKES_A_NAMESPACE = (r"argparse\.Namespace|\bNamespace\b\)|:\s*Namespace\b"
                     r"|def \w+\([^)]*(?<!\*)\bargs\b\s*[,:)](?!\s*tuple)")


def _dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.dest != "help"}


def test_every_sub_command_is_registered_with_its_options_and_function():
    assert list(COMMANDS) == list(SUBPARSERS)
    for name, command in COMMANDS.items():
        assert dataclasses.is_dataclass(command.options) and command.options.__dataclass_params__.frozen, name
        parameters = list(inspect.signature(command.function).parameters.values())
        assert len(parameters) == 1, name
        hint = typing.get_type_hints(command.function)[parameters[0].name]
        assert issubclass(command.options, hint), (name, hint)  # tune-bucket's options are predict's, narrowed
        assert command.function.__doc__, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_options_hold_exactly_the_flags_with_the_parsers_defaults(name):
    command, parser = COMMANDS[name], SUBPARSERS[name]
    fields = {f.name: f for f in dataclasses.fields(command.options)}
    dests = _dests(parser)
    if name == "run":  # the lists are the grid's keys
        assert dests - {"grid"} == set(fields) - {"grid"} | set(cli.LIST_PARAMS)
        return
    assert dests - {"command"} == set(fields) - {"command"}, name
    for dest in dests & set(fields):
        default = fields[dest].default
        if default is not dataclasses.MISSING and parser.get_default(dest) is not None:
            assert default == parser.get_default(dest), (name, dest)


def test_a_parsed_command_line_becomes_its_options():
    args = cli.build_parser().parse_args(["run", "--bucket-mb", "1,25", "--out", "r.jsonl", "--resume"])
    assert COMMANDS["run"].options_of(args) == cli.RunOptions(out=Path("r.jsonl"), grid={"bucket_mb": "1,25"},
                                                              resume=True)
    args = cli.build_parser().parse_args(["tune-bucket", "--profile", "p", "--cluster", "c"])
    assert COMMANDS["tune-bucket"].options_of(args).command == "tune-bucket"


def test_no_module_outside_the_cli_takes_a_namespace():
    offenders = []
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        if path.name == "cli.py" and path.parent.name == "experiments":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(TAKES_A_NAMESPACE, line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
    for name, command in COMMANDS.items():
        hints = typing.get_type_hints(command.function)
        assert argparse.Namespace not in hints.values(), name


def test_the_main_job_calls_the_functions_without_command_line_text():
    source = inspect.getsource(cli)
    assert "to_argv" not in source and "main([" not in source
