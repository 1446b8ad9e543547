"""Whole-step capture: signature cache, re-capture rules, fallbacks with reasons, accumulation."""
import pytest
import torch
from torch import nn

from hotloop.engine import Strategy
from hotloop.engine.build import compile_step
from hotloop.engine.parity import ParityCase, check_parity
from hotloop.models.base import LossOutput


class Branchy(nn.Module):
    """Two branches from one input: x -> (fc, gate) -> relu(fc) * sigmoid(gate) -> head."""

    def __init__(self):
        super().__init__()
        self.fc, self.gate, self.head = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.relu(self.fc(x)) * torch.sigmoid(self.gate(x)))


class DataDependent(Branchy):
    def forward(self, x):
        if x.sum() > 0:                    # reads a value: cannot be one static graph
            x = x * 2
        return super().forward(x)


class SparseEmb(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.head = nn.Embedding(10, 8, sparse=True), nn.Linear(8, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def loss_fn(model, batch, state):
    logits = model(batch["x"] if "x" in batch else batch["ids"])
    loss = nn.functional.cross_entropy(logits, batch["y"])
    return LossOutput(loss, {"nll_sum": loss.detach(), "examples": torch.tensor(batch["y"].shape[0])}, state)


def batch_for(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(n, 8, generator=g), "y": torch.randint(0, 3, (n,), generator=g)}

GRAPH = Strategy(backend="graph", graph_passes=True)


def make(model_cls, strategy=GRAPH, **kw):
    torch.manual_seed(0)
    model = model_cls(**kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=strategy.fused_optimizer)
    return model, compile_step(model, loss_fn, opt, strategy)


@pytest.mark.timeout(120)
def test_same_signature_reuses_graph_new_shape_recaptures_once():
    model, step = make(Branchy)
    step([batch_for(4)], None)
    step([batch_for(4, seed=1)], None)
    assert step.captures == 1                      # new values, same signature
    step([batch_for(6)], None)
    assert step.captures == 2                      # new batch size: exactly one re-capture
    step([batch_for(6, seed=2)], None)
    step([batch_for(4, seed=3)], None)
    assert step.captures == 2                      # both signatures cached
    model.eval()
    step([batch_for(4)], None)
    assert step.captures == 3                      # training flag is part of the signature
    model.train()
    model.fc.weight.requires_grad_(False)
    step([batch_for(4)], None)
    assert step.captures == 4                      # requires_grad is part of the signature
    assert step.fallback_reason is None


@pytest.mark.timeout(120)
def test_dtype_change_recaptures():
    model, step = make(Branchy)
    step([batch_for(4)], None)
    model.double()
    step([{"x": batch_for(4)["x"].double(), "y": batch_for(4)["y"]}], None)
    assert step.captures == 2


@pytest.mark.timeout(120)
def test_data_dependent_control_flow_falls_back_with_reason():
    model, step = make(DataDependent)
    result = step([batch_for(4)], None)
    assert "data-dependent" in step.fallback_reason
    assert step.fallback_reason in step.report
    assert torch.isfinite(result.loss)
    torch.manual_seed(0)
    ref_model = DataDependent()
    ref_step = compile_step(ref_model, loss_fn, torch.optim.SGD(ref_model.parameters(), lr=0.1), Strategy())
    ref = ref_step([batch_for(4)], None)
    assert torch.equal(result.loss, ref.loss)       # the fallback is the eager step


def test_sparse_gradients_fall_back_when_optimizer_is_not_fused():
    _, step = make(SparseEmb, Strategy(backend="graph", fused_optimizer=False))
    step([{"ids": torch.tensor([[1, 2], [3, 4]]), "y": torch.tensor([0, 1])}], None)
    assert "sparse gradients" in step.fallback_reason


class TiedEmbeddings(nn.Module):
    """Tied input embedding and output projection (one parameter under two names), as in a Transformer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.mix = nn.Linear(8, 8)
        self.out = nn.Linear(8, 10, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, ids):                                          # [B, T] -> [B, 10]
        return self.out(torch.tanh(self.mix(self.emb(ids))).mean(1))


def _tied_case():
    torch.manual_seed(0)
    model = TiedEmbeddings()
    g = torch.Generator().manual_seed(1)
    batches = [[{"ids": torch.randint(0, 10, (4, 5), generator=g), "y": torch.randint(0, 3, (4,), generator=g)}]
               for _ in range(3)]
    return ParityCase(model, lambda p, fused: torch.optim.Adam(p, lr=1e-2, foreach=fused), batches, loss_fn=loss_fn)


@pytest.mark.timeout(120)
def test_a_parameter_tied_under_two_names_is_captured_and_trains_bitwise():
    result = check_parity(_tied_case, GRAPH, steps=3)
    assert result.fallback_reason is None, result.fallback_reason
    assert result.ok and result.max_abs_diff == 0.0, (result.losses, result.losses_ref)


class EncoderLayer(nn.Module):
    """torch's encoder layer with dropout: its attention output is a strided view when dropped."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True, norm_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x):                                            # [B, T, 16] -> [B, 3]
        return self.head(self.layer(x).mean(1))


def _encoder_case():
    torch.manual_seed(0)
    model = EncoderLayer()
    g = torch.Generator().manual_seed(1)
    batches = [[{"x": torch.randn(4, 5, 16, generator=g), "y": torch.randint(0, 3, (4,), generator=g)}]
               for _ in range(3)]
    return ParityCase(model, lambda p, fused: torch.optim.Adam(p, lr=1e-2, foreach=fused), batches, loss_fn=loss_fn)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", [GRAPH, GRAPH.replace(executor="parallel", inplace=True)])
def test_captured_dropout_draws_eager_masks_on_strided_maps(strategy):
    """Functionalized in-place draws would fill a contiguous mask (other units dropped); the graph
    draws into the strided layout eager draws into (an op the executors order as a random one), so
    the step is bitwise eager's."""
    assert torch.Tag.nondeterministic_seeded in torch.ops.hotloop.bernoulli_like.default.tags
    result = check_parity(_encoder_case, strategy, steps=3)
    assert result.fallback_reason is None, result.fallback_reason
    assert result.ok and result.max_abs_diff == 0.0, (result.losses, result.losses_ref)


def _branchy_case():
    torch.manual_seed(0)
    model = Branchy()
    batches = [[batch_for(4, seed=2 * i), batch_for(4, seed=2 * i + 1)] for i in range(3)]
    return ParityCase(model, lambda p, fused: torch.optim.Adam(p, lr=1e-2, foreach=fused), batches,
                      loss_fn=loss_fn, max_grad_norm=0.5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", [GRAPH, GRAPH.replace(executor="parallel", inplace=True)])
def test_accumulation_and_clipping_match_eager_bitwise(strategy):
    result = check_parity(_branchy_case, strategy, steps=3)
    assert result.ok, (result.losses, result.losses_ref, result.max_abs_diff)
    assert result.fallback_reason is None
    assert result.max_abs_diff == 0.0


def test_graph_failing_on_first_run_falls_back_to_eager(monkeypatch):
    import hotloop.engine.graph_backend as graph_step
    from hotloop.engine.executors import ExecutorError

    class Broken:
        def run(self, inputs):
            raise ExecutorError("graph node mm (aten.mm) failed: boom")
    monkeypatch.setattr(graph_step, "make_executor", lambda *a, **k: Broken())
    model, step = make(Branchy)
    result = step([batch_for(4)], None)
    assert "failed on its first run" in step.fallback_reason
    torch.manual_seed(0)
    ref_model = Branchy()
    ref = compile_step(ref_model, loss_fn, torch.optim.SGD(ref_model.parameters(), lr=0.1), Strategy())
    assert torch.equal(result.loss, ref([batch_for(4)], None).loss)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref_model.parameters()))
