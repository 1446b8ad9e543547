"""Every command the CLI lists is a real module with a parser and a ``run`` (no listed stubs)."""
import argparse

import pytest

from hotloop import cli


@pytest.mark.parametrize("name", cli.command_names())
def test_listed_command_builds_its_parser_and_runs(name):
    module = cli.load_command(name)
    assert module.NAME == name and callable(module.run) and module.HELP
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)


def test_run_flags_have_the_same_defaults_for_every_command():
    parser = cli.build_parser()
    defaults = {}
    for name in cli.command_names():
        module = cli.load_command(name)
        if getattr(module, "RUN_FLAGS", False):
            args = parser.parse_args([name])
            defaults[name] = (args.problem, args.model, args.hparams, args.device, args.raw_root)
    assert len(defaults) >= 5 and len(set(defaults.values())) == 1, defaults
