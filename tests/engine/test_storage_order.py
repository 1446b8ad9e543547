"""The one-kernel update over channels_last parameters in storage order: the same numbers, the same state."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hotloop.engine import Strategy, build_step
from hotloop.engine.storage_order import in_storage_order, storage_view
from hotloop.hparams import HParams
from hotloop.models.base import LossOutput


def _params(layout: torch.memory_format) -> list[nn.Parameter]:
    torch.manual_seed(0)
    return [nn.Parameter(torch.randn(6, 4, 3, 3).contiguous(memory_format=layout)),
            nn.Parameter(torch.randn(5, 3, 2, 2).contiguous(memory_format=layout)),
            nn.Parameter(torch.randn(7))]


def _train(params: list[nn.Parameter], opt: torch.optim.Optimizer, storage_order: bool, steps: int = 4,
           grad_layout: torch.memory_format | None = None) -> None:
    for step in range(steps):
        for p in params:   # by default in the parameter's own layout, as autograd writes it
            p.grad = torch.cos(p.detach() * (step + 1)) * 0.3
            if grad_layout is not None:
                p.grad = p.grad.contiguous(memory_format=grad_layout)
        if storage_order:
            with in_storage_order(opt):
                opt.step()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)


def _kinds():
    return [("adam", lambda ps: torch.optim.Adam(ps, lr=0.05, weight_decay=0.01, fused=True)),
            ("adamw", lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.01, fused=True)),
            ("momentum", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, fused=True)),
            ("adagrad", lambda ps: torch.optim.Adagrad(ps, lr=0.05, fused=True))]


@pytest.mark.parametrize("name,make", _kinds())
def test_update_in_storage_order_is_bitwise_and_keeps_the_state_in_the_parameters_shape(name, make) -> None:
    plain_params, ordered_params = _params(torch.channels_last), _params(torch.channels_last)
    plain, ordered = make(plain_params), make(ordered_params)
    _train(plain_params, plain, storage_order=False)
    _train(ordered_params, ordered, storage_order=True)
    for a, b in zip(plain_params, ordered_params):
        assert torch.equal(a, b) and a.stride() == b.stride()
        assert b.grad is None                            # zero_grad reached the model's parameters
    assert all(group["params"][i] is p for group in ordered.param_groups
               for i, p in enumerate(ordered_params))     # the optimizer holds the model's tensors again
    want, got = plain.state_dict(), ordered.state_dict()
    assert want["param_groups"] == got["param_groups"]
    for index, state in want["state"].items():
        for key, value in state.items():
            other = got["state"][index][key]
            assert other.shape == value.shape and torch.equal(other, value), (index, key)


def test_gradients_in_another_layout_than_their_parameters_give_the_true_update() -> None:
    """channels_last weights with contiguous gradients: the update of the same values laid out plainly
    (torch's own kernel, given these, pairs elements of the two layouts wrongly on this torch)."""
    plain_params, ordered_params = _params(torch.contiguous_format), _params(torch.channels_last)
    plain = torch.optim.Adam(plain_params, lr=0.05, fused=True)
    ordered = torch.optim.Adam(ordered_params, lr=0.05, fused=True)
    _train(plain_params, plain, storage_order=False, grad_layout=torch.contiguous_format)
    _train(ordered_params, ordered, storage_order=True, grad_layout=torch.contiguous_format)
    assert all(torch.equal(a, b) for a, b in zip(plain_params, ordered_params))
    assert ordered_params[0].is_contiguous(memory_format=torch.channels_last)


def test_state_loaded_in_another_layout_is_laid_out_once_and_stays_exact() -> None:
    """A checkpoint written by a run in NCHW resumes a channels_last run: the same numbers."""
    nchw, cl = _params(torch.contiguous_format), _params(torch.channels_last)
    first = torch.optim.Adam(nchw, lr=0.05, fused=True)
    _train(nchw, first, storage_order=False, steps=2)
    resumed_params = [nn.Parameter(p.detach().clone().contiguous(memory_format=torch.channels_last))
                      if p.dim() == 4 else nn.Parameter(p.detach().clone()) for p in nchw]
    resumed = torch.optim.Adam(resumed_params, lr=0.05, fused=True)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    _train(resumed_params, resumed, storage_order=True, steps=3)
    reference = torch.optim.Adam(cl, lr=0.05, fused=True)
    _train(cl, reference, storage_order=False, steps=2)
    _train(cl, reference, storage_order=False, steps=3)
    # the same step count on the same values; only the layout of the loaded state differed
    for a, b in zip(resumed_params, cl):
        assert torch.equal(a, b)


def test_only_dense_non_contiguous_tensors_get_a_view_and_unfused_groups_are_left_alone() -> None:
    cl = torch.randn(4, 3, 2, 2).contiguous(memory_format=torch.channels_last)
    view = storage_view(cl)
    assert view is not None and view.shape == (cl.numel(),) and view.data_ptr() == cl.data_ptr()
    assert storage_view(torch.randn(4, 3)) is None                        # contiguous already
    assert storage_view(torch.randn(4, 6)[:, ::2]) is None                 # strided: not dense
    assert storage_view(torch.randn(4, 3).t()) is not None                 # transposed: dense
    params = _params(torch.channels_last)
    opt = torch.optim.Adam(params, lr=0.1, foreach=True)
    for p in params:
        p.grad = torch.ones_like(p)
    with in_storage_order(opt):
        assert all(a is b for a, b in zip(opt.param_groups[0]["params"], params))


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.Conv2d(8, 4, 3, padding=1))

    def loss(self, batch, state=None) -> LossOutput:
        out = self.body(batch["inputs"])                       # [B, 4, H, W]
        loss = (out - batch["targets"]).pow(2).mean()
        return LossOutput(loss, {}, state)


def test_the_step_with_a_fused_update_of_channels_last_weights_matches_the_copying_update_bitwise(
        monkeypatch) -> None:
    """``TrainStep`` updates channels_last weights in storage order: bitwise the copying update."""
    import contextlib

    import hotloop.engine.step as step_module
    from hotloop.engine import storage_order
    swapped: list[int] = []

    def flat(opt) -> int:
        return sum(p.dim() == 1 for group in opt.param_groups for p in group["params"])

    @contextlib.contextmanager
    def counting(opt):                 # the real context, counting the weights it hands over flat
        before = flat(opt)
        with storage_order.in_storage_order(opt):
            swapped.append(flat(opt) - before)
            yield

    monkeypatch.setattr(step_module, "in_storage_order", counting)
    torch.manual_seed(0)
    model = _ConvNet()
    batches = [{"inputs": torch.randn(2, 3, 6, 6), "targets": torch.randn(2, 4, 6, 6)} for _ in range(3)]
    hp = HParams(optimizer="adam", learning_rate=0.01)
    strategy = Strategy(fused_optimizer=True, fused_kernel=True, channels_last=True)
    results = []
    for ordered in (True, False):
        if not ordered:   # the update as torch runs it on its own (copies into contiguous tensors)
            monkeypatch.setattr(step_module, "in_storage_order", lambda opt: contextlib.nullcontext())
        built = build_step(copy.deepcopy(model).train(), hp, strategy)
        losses = [float(built.step([b]).loss) for b in batches + batches]
        results.append((losses, [p.detach().clone() for p in built.model.parameters()]))
    assert swapped and all(n == 2 for n in swapped)      # both conv weights went through storage order
    (losses, params), (ref_losses, ref_params) = results
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))
