"""Each graph pass: it fires (match counts) and leaves results unchanged (bitwise in fp32)."""
import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from hotloop.engine.executors import SerialExecutor
from hotloop.engine.passes import APPROXIMATE, run_passes, selected_passes
from hotloop.engine.passes.collapse_views import collapse_views
from hotloop.engine.passes.dce import eliminate_dead_code
from hotloop.engine.passes.fuse_cross_entropy import fuse_cross_entropy, softmax_xent_backward
from hotloop.engine.passes.inplace_activations import inplace_activations
from hotloop.engine.passes.rules import Op, RewriteRule, Var, apply_rules
from hotloop.engine.passes.unbind_slices import unbind_slices

aten = torch.ops.aten


def trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


def check_pass(pass_fn, fn, *args):
    """Run ``pass_fn`` on the traced ``fn``; return (result, outputs before, outputs after)."""
    ref = fn(*args)
    ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    gm = trace(fn, *args)
    result = pass_fn(gm)
    out = SerialExecutor(gm).run(list(args))
    assert len(out) == len(ref)
    for a, b in zip(out, ref):
        assert torch.equal(a, b), f"{result.name} changed a value"
    return result, gm


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_view_chains_collapse():
    def fn(x):
        a = x.view(4, 6).view(24).view(2, 12)          # view(view(view(x)))
        b = x.transpose(0, 1).transpose(0, 1) * 2      # transpose pair
        c = x.t().t() + 1                              # t pair
        d = x.permute(1, 0).permute(1, 0) - 1          # permute pair
        e = x.view(6, 4) * 3                           # view to the same shape
        return a.sum(), b, c, d, e, x.detach() * 5
    result, gm = check_pass(collapse_views, fn, torch.randn(6, 4))
    m = result.matches
    assert m["view_of_view"] >= 2 and m["transpose_pair"] == 1 and m["t_pair"] == 1
    assert m["permute_pair"] == 1 and m["view_same_shape"] >= 1 and m["detach_noop"] == 1
    assert aten.transpose.int not in targets(gm) and aten.t.default not in targets(gm)


def test_view_of_view_not_collapsed_for_non_contiguous_input():
    def fn(base):
        x = base[:, :4]                 # non-contiguous [6, 4], strides (8, 1)
        return x.view(6, 2, 2).view(6, 4) * 2
    result, _ = check_pass(collapse_views, fn, torch.randn(6, 8))
    assert result.matches["view_of_view"] == 0


def test_per_step_selects_become_one_unbind():
    def fn(x):                           # x [B, T, H]
        h = torch.zeros(x.shape[0], x.shape[2])
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] + h)
        return h
    result, gm = check_pass(unbind_slices, fn, torch.randn(3, 5, 4))
    assert result.matches["select_to_unbind"] == 5
    assert targets(gm).count(aten.unbind.int) == 1 and aten.select.int not in targets(gm)


def test_equal_width_slices_become_one_split():
    def fn(x):
        return [x[:, i * 2:(i + 1) * 2] * (i + 1) for i in range(3)]
    result, gm = check_pass(unbind_slices, fn, torch.randn(4, 6))
    assert result.matches["slice_to_split"] == 3
    assert aten.split.Tensor in targets(gm)


def test_single_select_is_left_alone():
    result, _ = check_pass(unbind_slices, lambda x: x[:, 1] * 2, torch.randn(3, 4))
    assert result.total == 0


def test_inplace_activation_only_when_safe():
    def fn(x, w):
        a = torch.relu(x @ w)            # safe: the matmul result has no other user
        b = x @ w
        c = torch.sigmoid(b) + b         # unsafe: b is read again
        d = torch.tanh(x)                # unsafe: x is a graph input
        return a, c, d
    x, w = torch.randn(4, 3), torch.randn(3, 3)
    result, gm = check_pass(inplace_activations, fn, x, w)
    assert result.matches == {"relu_inplace": 1, "tanh_inplace": 0, "sigmoid_inplace": 0}
    assert aten.relu_.default in targets(gm) and aten.sigmoid.default in targets(gm)


def test_inplace_activation_skips_a_view_whose_base_is_shared():
    def fn(x, w):
        m = x @ w
        v = m.view(-1)                   # m is also returned: a view of it may not be overwritten
        return torch.relu(v), m
    result, _ = check_pass(inplace_activations, fn, torch.randn(4, 3), torch.randn(3, 3))
    assert result.total == 0


def test_dce_removes_unused_but_keeps_random_ops():
    def fn(x):
        unused = torch.exp(x) * 3        # dead
        torch.rand(3)                    # dead but random: removing it would shift the RNG stream
        return x + 1
    gm = trace(fn, torch.randn(3))
    result = eliminate_dead_code(gm)
    assert result.matches["unused_op"] == 2
    assert aten.rand.default in targets(gm)


def _xent_joint(logits, target):
    logits = logits.detach().requires_grad_(True)
    loss = F.cross_entropy(logits, target, ignore_index=0, reduction="sum") / 7.0
    return loss.detach(), torch.autograd.grad(loss, logits)[0]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_fused_cross_entropy_backward_matches_within_tolerance(reduction):
    torch.manual_seed(0)
    logits, target = torch.randn(64, 50), torch.randint(0, 50, (64,))
    target[:5] = 0                                             # ignored rows

    def joint(x, t):
        x = x.detach().requires_grad_(True)
        loss = F.cross_entropy(x, t, ignore_index=0, reduction=reduction)
        return loss.detach(), torch.autograd.grad(loss, x)[0]
    with torch.enable_grad():
        gm = trace(joint, logits, target)
    collapse_views(gm)                   # drops the detach() autograd puts on saved values
    result = fuse_cross_entropy(gm)
    assert result.matches["nll_log_softmax_backward"] == 1
    assert aten.nll_loss_backward.default not in targets(gm)
    loss, grad = SerialExecutor(gm).run([logits, target])
    ref_loss, ref_grad = joint(logits, target)
    assert torch.equal(loss, ref_loss)
    # the native backward uses a faster vectorised exp than torch.exp: rounding-level differences
    torch.testing.assert_close(grad, ref_grad, rtol=1e-6, atol=1e-8)
    assert torch.all(grad[:5] == 0)


def test_fused_cross_entropy_is_opt_in():
    assert "fuse_cross_entropy" in APPROXIMATE
    assert "fuse_cross_entropy" not in selected_passes(True, False)
    assert "fuse_cross_entropy" in selected_passes(True, False, fast_math=True)
    assert selected_passes(False, True) == ["inplace_activations"]
    assert "dce" not in selected_passes(True, False, disabled=("dce",))


def test_softmax_xent_backward_ignores_padding_rows():
    lp = torch.log_softmax(torch.randn(3, 4), 1)
    out = softmax_xent_backward(torch.tensor(1.0), lp, torch.tensor([0, 2, 3]), 2, 0, torch.tensor(2.0))
    assert torch.all(out[0] == 0) and out[1, 2] < 0 and out[1, 0] > 0


def test_rule_framework_counts_and_respects_where():
    rule = RewriteRule("neg_neg", Op(aten.neg.default, Op(aten.neg.default, Var("x"))), Var("x"),
                       where=lambda b: b["x"].meta["val"].dim() == 1)
    gm = trace(lambda x, y: (-(-x), -(-y)), torch.randn(3), torch.randn(2, 2))
    result = apply_rules(gm, [rule], "test")
    assert result.matches["neg_neg"] == 1                      # the 2-D one fails ``where``
    assert result.nodes_after == result.nodes_before - 2
    assert "neg_neg=1" in result.line()


def test_run_passes_orders_and_reports():
    def fn(x):
        return torch.relu(x.view(2, 6).view(12) @ torch.ones(12, 3))
    gm = trace(fn, torch.randn(3, 4))
    results = run_passes(gm, ["inplace_activations", "collapse_views", "dce"])
    assert [r.name for r in results] == ["collapse_views", "dce", "inplace_activations"]
