"""Settings typed from the flag to the step: typed Strategy mappings, and one validation per run."""
from __future__ import annotations

import pytest

from hotloop import cli
from hotloop.compose.plan import StrategyRequest
from hotloop.engine.strategy import Strategy, StrategyError


def test_from_mapping_checks_names_and_types_without_text():
    assert Strategy.from_mapping({"disabled_passes": ["dce"], "bucket_mb": 3, "precision": "bf16"}) == \
        Strategy(disabled_passes=("dce",), bucket_mb=3.0, precision="bf16")
    for fields, needle in (({"prefetch": "3"}, "'prefetch' must be an integer"),
                           ({"fused_optimizer": 1}, "'fused_optimizer' must be true/false"),
                           ({"sync_every": True}, "'sync_every' must be an integer"),
                           ({"precison": "bf16"}, "did you mean 'precision'")):
        with pytest.raises(StrategyError, match=needle):
            Strategy.from_mapping(fields)


def test_a_validated_strategy_is_trusted_and_a_changed_copy_is_checked(monkeypatch):
    checks = []
    original = Strategy._check
    monkeypatch.setattr(Strategy, "_check", lambda self, device: checks.append(self) or original(self, device))
    planned = Strategy(precision="bf16").validate("cpu")
    assert planned.validate("cpu") is planned and len(checks) == 1
    with pytest.raises(StrategyError, match="fp16 needs CUDA"):
        planned.replace(precision="fp16").validate("cpu")
    assert len(checks) == 2 and planned == Strategy(precision="bf16")


def test_request_takes_typed_changes_and_a_mapping():
    request = StrategyRequest.parse({"sync_every": 2}, {"precision": "bf16"}, "cpu")
    assert not request.auto and request.fixed() == Strategy(sync_every=2, precision="bf16")
    assert request.fixed() is request.fixed()
    with pytest.raises(StrategyError, match="fp16 needs CUDA"):
        StrategyRequest.parse("auto", {"precision": "fp16"}, "cpu")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("extra", [(), ("--strategy", "default", "--precision", "bf16")],
                         ids=["auto", "default-bf16"])
def test_one_train_run_validates_its_strategy_once(tmp_path, monkeypatch, capsys, extra):
    monkeypatch.setenv("HOTLOOP_CACHE_DIR", str(tmp_path / "cache"))   # no tuning-cache hit from other runs
    monkeypatch.chdir(tmp_path)
    checks = []
    original = Strategy._check
    monkeypatch.setattr(Strategy, "_check", lambda self, device: checks.append(self) or original(self, device))
    code = cli.main(["train", "--max-steps", "2", "--loggers", "none", "--output-dir", "run", *extra])
    assert code == 0, capsys.readouterr().err
    # each Strategy is checked once: the planned one, and (auto) eager's baseline where the tuner
    # times it and skips tuning because one step exceeds the budget of a 2-step run
    assert len({repr(s) for s in checks}) == len(checks) and 1 <= len(checks) <= (2 if not extra else 1), checks
