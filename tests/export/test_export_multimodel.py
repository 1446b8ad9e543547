"""A multi-problem model exports one task's graph (``--task``); safetensors keeps the whole model."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from hotloop.export import ExportError, export_model, load_model, load_runtime, read_manifest
from hotloop.export.graphs import example_inputs
from hotloop.problems.mixing import tag_batch
from hotloop.compose.build import build_run

PROBLEMS = "algorithmic_copy,image_synthetic"


@pytest.fixture(scope="module")
def multimodel() -> torch.nn.Module:
    torch.manual_seed(0)
    run = build_run(PROBLEMS, "multimodel", "multimodel_tiny", None, device=torch.device("cpu"))
    return run.model.eval()


def _eager_logits(model: torch.nn.Module, task: str, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The multimodel's own forward on a tagged batch, as training calls it."""
    spec = model.task_specs[task]
    if spec.spec.task == "classify":
        batch = {"inputs": inputs[0], "targets": torch.zeros((inputs[0].shape[0], 1), dtype=torch.long)}
    else:
        batch = {"inputs": inputs[0], "targets": inputs[1]}
    with torch.no_grad():
        logits, _ = model(tag_batch(batch, task, spec.index))
    return logits[:, 0] if spec.spec.task == "classify" else logits


@pytest.mark.parametrize("task", ["algorithmic_copy", "image_synthetic"])
def test_each_task_exports_as_an_onnx_graph_equal_to_the_multimodel(multimodel, task: str,
                                                                    tmp_path: Path) -> None:
    out = tmp_path / task
    export_model(multimodel, "onnx", out, model_name="multimodel", problem_name=PROBLEMS, task=task,
                 graphs=("forward",), log=lambda _msg: None)
    manifest = read_manifest(out)
    assert manifest["task"]["name"] == task
    assert manifest["task"]["spec"]["task"] == multimodel.task_specs[task].spec.task
    view = multimodel.task_view(task)
    inputs = example_inputs(view, batch=3, seq=4, seed=5)       # other sizes than the export example
    got = load_runtime(out)([t.numpy() for t in inputs])[0]
    want = _eager_logits(multimodel, task, inputs).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_a_task_is_required_named_and_refused_where_it_does_not_apply(multimodel, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="pass --task .*algorithmic_copy, image_synthetic"):
        export_model(multimodel, "onnx", tmp_path / "a", model_name="multimodel", log=lambda _msg: None)
    with pytest.raises(Exception, match="no task 'ptb_lm'.*algorithmic_copy, image_synthetic"):
        export_model(multimodel, "onnx", tmp_path / "b", model_name="multimodel", task="ptb_lm",
                     log=lambda _msg: None)
    with pytest.raises(ExportError, match="safetensors export holds the whole"):
        export_model(multimodel, "safetensors", tmp_path / "c", model_name="multimodel", task="image_synthetic")
    single = build_run("image_synthetic", "conv_net", "conv_net_base", "conv_channels=4:8,image_size=8").model
    with pytest.raises(ExportError, match="trains one problem"):
        export_model(single, "onnx", tmp_path / "d", model_name="conv_net", task="image_synthetic")
    assert not any(p.name in "abcd" for p in tmp_path.iterdir())  # nothing half-written


def test_the_whole_multimodel_round_trips_through_safetensors(multimodel, tmp_path: Path) -> None:
    export_model(multimodel, "safetensors", tmp_path / "st", model_name="multimodel", problem_name=PROBLEMS)
    loaded = load_model(tmp_path / "st")
    assert sorted(loaded.task_specs) == sorted(multimodel.task_specs)
    for task in multimodel.task_specs:
        inputs = example_inputs(multimodel.task_view(task), batch=2, seq=5, seed=1)
        assert torch.equal(_eager_logits(loaded, task, inputs), _eager_logits(multimodel, task, inputs))


def test_a_one_task_lm_multimodel_exports_without_naming_its_task(tmp_path: Path) -> None:
    """A multimodel LM reads its inputs with the task token as the encoder's one position and
    carries no state: its graph is tokens -> logits."""
    from hotloop.hparams import get_hparams
    from hotloop.models.multimodel import MultiModel
    from hotloop.problems.base import ProblemSpec
    from hotloop.problems.multi_problem import MultiProblemSpec, TaskSpec
    lm = ProblemSpec("lm", 30, 30, 12, 12, pad_id=-1)
    torch.manual_seed(0)
    model = MultiModel(get_hparams("multimodel_tiny"),
                       MultiProblemSpec("multi", 30, 30, 12, 12, pad_id=-1, tasks=(TaskSpec("tiny_lm", 0, lm, "v"),)))
    export_model(model.eval(), "onnx", tmp_path / "lm", model_name="multimodel", graphs=("forward",),
                 log=lambda _msg: None)
    assert read_manifest(tmp_path / "lm")["task"]["name"] == "tiny_lm"
    tokens = torch.randint(4, 30, (3, 9))
    got = load_runtime(tmp_path / "lm")([tokens.numpy()])[0]
    with torch.no_grad():
        want, _ = model(tag_batch({"inputs": tokens, "targets": tokens}, "tiny_lm", 0))   # [3, 9, 30]
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=0)
