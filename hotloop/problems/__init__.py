"""Problems: datasets with generators, encoders and metrics."""
from .base import EOS_ID, NUM_RESERVED, PAD_ID, Batch, BatchReader, Problem, ProblemSpec
from .prepared import PreparedProblem

__all__ = ["EOS_ID", "NUM_RESERVED", "PAD_ID", "Batch", "BatchReader", "Problem", "ProblemSpec",
           "PreparedProblem"]
