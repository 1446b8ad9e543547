"""Serial and parallel executors: same results, bitwise; random ops in order; errors named."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from hotloop.engine.executors import ExecutorError, ParallelExecutor, SerialExecutor, make_executor


def branches(x, ws):
    outs = [torch.tanh(x @ w) for w in ws]            # independent branches
    return torch.stack(outs).sum(0), outs[0].t().contiguous()


def trace(fn, *args):
    return make_fx(fn, tracing_mode="fake")(*args)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_parallel_equals_serial_bitwise(threads):
    torch.manual_seed(0)
    x, ws = torch.randn(32, 64), [torch.randn(64, 64) for _ in range(6)]
    gm = trace(branches, x, ws)
    ref = branches(x, ws)
    serial = SerialExecutor(gm).run([x, *ws])
    parallel = ParallelExecutor(gm, threads)
    for _ in range(3):                                  # reuse of the executor and its pool
        out = parallel.run([x, *ws])
        assert all(torch.equal(a, b) for a, b in zip(out, serial))
    assert all(torch.equal(a, b) for a, b in zip(serial, ref))


@pytest.mark.timeout(60)
def test_random_ops_run_in_graph_order():
    def fn(x):
        a = torch.nn.functional.dropout(x, 0.5, True)
        b = torch.nn.functional.dropout(x * 2, 0.5, True)   # independent of a: could race
        return a, b, torch.rand(4)
    x = torch.randn(256)
    gm = trace(fn, x)
    torch.manual_seed(3)
    ref = SerialExecutor(gm).run([x])
    for _ in range(3):
        torch.manual_seed(3)
        out = ParallelExecutor(gm, 4).run([x])
        assert all(torch.equal(a, b) for a, b in zip(out, ref))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_failing_node_is_named_and_does_not_hang(kind):
    gm = trace(lambda x, y: (x + 1) @ y, torch.randn(2, 3), torch.randn(3, 4))
    ex = make_executor(gm, kind, 2)
    with pytest.raises(ExecutorError, match="mm"):
        ex.run([torch.randn(2, 3), torch.randn(5, 4)])   # wrong inner size at run time
    out = ex.run([torch.randn(2, 3), torch.randn(3, 4)])  # still usable afterwards
    assert out[0].shape == (2, 4)


def test_wrong_input_count_and_kind():
    gm = trace(lambda x: x + 1, torch.randn(2))
    with pytest.raises(ExecutorError, match="takes 1 inputs"):
        SerialExecutor(gm).run([])
    with pytest.raises(ExecutorError, match="unknown executor"):
        make_executor(gm, "async")


def test_outputs_never_alias_inputs_or_constants():
    gm = trace(lambda x: (x, torch.tensor(5)), torch.randn(2))
    x = torch.randn(2)
    out_x, const = SerialExecutor(gm).run([x])
    assert torch.equal(out_x, x) and out_x.data_ptr() != x.data_ptr()
    const += 1                                          # must not change the graph's constant
    assert SerialExecutor(gm).run([x])[1].item() == 5
