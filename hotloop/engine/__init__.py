"""The speed engine: Strategy, whole-step capture, graph passes, executors."""
from .step import StepResult, TrainStep, compile_step
from .strategy import Strategy, StrategyError, parse_strategy

__all__ = ["StepResult", "Strategy", "StrategyError", "TrainStep", "compile_step", "parse_strategy"]
