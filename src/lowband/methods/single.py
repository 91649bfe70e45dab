"""S-DNN: one process, plain SGD on the whole training set.

The reference for what one worker alone reaches, and the compute-only speed limit that
communication-saving methods are measured against. It always runs one process.
"""

from lowband.methods.base import Method
from lowband.registry import METHODS


@METHODS.register("single")
class Single(Method):
    fixed_workers = 1
