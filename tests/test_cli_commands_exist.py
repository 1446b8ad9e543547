"""Every command the CLI advertises resolves to a real ``main`` (no listed stubs)."""
import importlib

import pytest

from hotloop import cli


@pytest.mark.parametrize("name", sorted(cli.EXTERNAL_COMMANDS))
def test_external_command_target_exists(name):
    module, _, func = cli.EXTERNAL_COMMANDS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), func))
