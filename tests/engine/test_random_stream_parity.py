"""The parity guard's random-stream rule confirms bits16 dropout masks and rejects a broken mask;
the tuner proposes them only for a model with dropout; a bits16 run repeats and resumes bitwise."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers import StopAt, make_trainer, params_of, tiny_hp
from hotloop.engine.dropout_masks import MaskedDropout
from hotloop.engine.parity import ParityCase, check_parity
from hotloop.engine.strategy import Strategy
from hotloop.models.base import LossOutput
from hotloop.ops import dropout as dropout_ops
from hotloop.testing import model_case
from hotloop.tools.formulation_candidates import formulation_options
from hotloop.tools.hardware import HardwareInfo
from hotloop.tools.proposals import formulation_proposals
from test_dropout_masks import bert_batch, bert_tiny

pytestmark = pytest.mark.usefixtures("one_thread")

BITS16 = Strategy(dropout_masks="bits16")
CPU = HardwareInfo("cpu", 2, "test cpu", (), cpu_isa=("avx2",))


def _bert_case(steps: int = 3):
    gen = torch.Generator().manual_seed(0)
    batches = [bert_batch(gen) for _ in range(steps)]

    def build() -> ParityCase:
        torch.manual_seed(0)
        model, hp = bert_tiny()
        return ParityCase(model, hp, batches)
    return build


def _drop_everything(shape, p, dtype, device, generator=None):
    return torch.zeros(shape, dtype=dtype, device=device)


CASES = {"bert": _bert_case, "transformer": lambda: model_case("transformer", overrides="dropout=0.1")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_random_stream_rule_accepts_bits16_and_rejects_masks_that_drop_everything(name, monkeypatch) -> None:
    build = CASES[name]()
    result = check_parity(build, BITS16)
    assert result.ok, result.stream_line()
    assert result.losses_alt != result.losses_ref and result.losses != result.losses_ref   # three streams
    assert "dropout masks: bits16 in" in " ".join(result.report)
    monkeypatch.setattr(dropout_ops, "dropout_mask", _drop_everything)
    broken = check_parity(build, BITS16)
    assert not broken.ok and broken.reason().startswith("parameter update wrong")
    assert broken.update.cosine < broken.update_tol.min_cosine


def test_same_stream_candidates_of_a_dropout_model_stay_bitwise_when_build_does_not_reseed() -> None:
    """The tuner's build() deep-copies its model: check_parity seeds both runs itself."""
    torch.manual_seed(0)
    pristine = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 1))
    batches = [{"x": torch.randn(4, 8)} for _ in range(3)]

    def build() -> ParityCase:
        return ParityCase(copy.deepcopy(pristine), lambda params, fused: torch.optim.SGD(params, lr=0.1),
                          batches, loss_fn=lambda m, b, s: LossOutput(m(b["x"]).pow(2).mean(), {}))
    before = torch.get_rng_state()
    result = check_parity(build, Strategy(fused_optimizer=True))
    assert result.ok and result.tol == 0 and result.stream_noise is None
    assert torch.equal(torch.get_rng_state(), before)            # the caller's stream is left as it was


def _mask_options(model: nn.Module) -> list:
    """The model's formulation options that change how dropout masks are drawn."""
    return [o for o in formulation_options(model) if "dropout_masks" in o.changes]


def test_the_tuner_proposes_bits16_masks_only_where_something_drops() -> None:
    model, _ = bert_tiny()
    [option] = _mask_options(model)
    assert option.changes == {"dropout_masks": "bits16"} and option.rounding == "random_stream"
    [proposal] = [p for p in formulation_proposals(formulation_options(model), CPU) if "bits16" in p.label]
    assert proposal.label == "dropout_masks=bits16" and proposal.tags == ("random_stream",)
    user = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2))
    assert "in 1 nn.Dropout module" in formulation_options(user)[0].why
    assert _mask_options(bert_tiny(dropout=0.0)[0]) == []
    assert [o.label for o in formulation_options(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.0)))] == ["linear_gemm=onednn"]


def test_a_seeded_bits16_run_repeats_and_resumes_bitwise(tmp_path) -> None:
    hp = tiny_hp("dropout=0.1")
    strategy = Strategy(prefetch=0, dropout_masks="bits16")
    straight = make_trainer(tmp_path / "straight", max_steps=8, hp=hp, strategy=strategy)
    straight.fit()
    assert any(isinstance(m, MaskedDropout) for m in straight.model.modules())
    again = make_trainer(tmp_path / "again", max_steps=8, hp=hp, strategy=strategy)
    again.fit()
    first = make_trainer(tmp_path / "resumed", max_steps=8, hp=hp, strategy=strategy, callbacks=[StopAt(3)])
    assert first.fit().steps == 3
    resumed = make_trainer(tmp_path / "resumed", max_steps=8, hp=hp, strategy=strategy)
    assert resumed.fit(resume=True).steps == 8
    plain = make_trainer(tmp_path / "plain", max_steps=8, hp=hp)
    plain.fit()
    reference = params_of(straight)
    for other in (again, resumed):
        assert all(torch.equal(v, reference[k]) for k, v in params_of(other).items())
    assert params_of(plain).keys() == reference.keys()
    assert any(not torch.equal(v, reference[k]) for k, v in params_of(plain).items())   # other masks
