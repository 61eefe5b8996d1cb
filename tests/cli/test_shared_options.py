"""--case, --jobs, -q and --stage are declared once (cli/options.py): every command spells them alike."""

import pytest

from csa_conform.cli import main
from csa_conform.cli.options import OneStage, StageList

COMMANDS = list(main.commands.values())


def _params(option: str):
    return [(command.name, param) for command in COMMANDS for param in command.params
            if option in getattr(param, "opts", ())]


@pytest.mark.parametrize("option, commands", [
    ("--case", ["bench", "bisect", "bridge", "diff", "explain", "export", "gap", "generate", "mutate", "reduce",
                "verify"]),
    ("--jobs", ["bridge", "generate", "mutate", "verify"]),
    ("-q", ["bench", "bisect", "bridge", "diff", "explain", "export", "fuzz", "generate", "mutate", "reduce", "report",
            "verify"]),
    ("--stage", ["diff", "explain", "inspect"]),
])
def test_every_command_declares_the_option_alike(option, commands):
    params = _params(option)
    assert sorted(name for name, _ in params) == commands
    shapes = {(tuple(param.opts), param.is_flag, type(param.type), repr(param.type)) for _, param in params
              if not (option == "--case" and param.name == "case")}
    if option == "--stage":
        assert all(isinstance(param.type, StageList) for _, param in params)
        shapes = {(tuple(param.opts), isinstance(param.type, OneStage)) for _, param in params}
        assert len(shapes) <= 2
    else:
        assert len(shapes) == 1, shapes


def test_inspect_takes_one_stage_spelled_as_elsewhere():
    (param,) = [param for param in main.commands["inspect"].params if "--stage" in param.opts]
    assert param.type.convert("5", param, None) == param.type.convert("5:select", param, None) == "selection"
    assert param.type.convert("outputs", param, None) == "outputs"
