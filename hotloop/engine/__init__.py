"""The speed engine: Strategy, whole-step capture, graph passes, executors.

Heavy pieces (capture, passes, executors, torch.compile) are imported only when
a strategy needs them. :func:`build_step` is the one way to build a training step.
"""
from .flags import FlagReport, apply_device_flags
from .parity import ParityCase, ParityResult, check_parity
from .build import BuiltStep, build_step
from .step import TrainStep
from .step_parts import StepResult
from .strategy import Strategy, StrategyError, validate_for_model

__all__ = ["BuiltStep", "FlagReport", "ParityCase", "ParityResult", "StepResult", "Strategy",
           "StrategyError", "TrainStep", "apply_device_flags", "build_step", "check_parity",
           "validate_for_model"]
