"""The speed engine: Strategy, whole-step capture, graph passes, executors.

Heavy pieces (capture, passes, executors, torch.compile) are imported only when
a strategy needs them.
"""
from .flags import FlagReport, apply_device_flags
from .parity import ParityCase, ParityResult, check_parity
from .step import StepResult, TrainStep, compile_step
from .strategy import Strategy, StrategyError, parse_strategy, validate_for_model

__all__ = ["FlagReport", "ParityCase", "ParityResult", "StepResult", "Strategy", "StrategyError",
           "TrainStep", "apply_device_flags", "check_parity", "compile_step", "parse_strategy",
           "validate_for_model"]
