"""Data sets held in memory as tensors (base): generated or installed ones (datasets), images read from
disk (images), text for the GPT (text), users' own (custom); partitioners (partition), the per-worker
batch stream (loader), and the metric a workload is judged by (metric)."""

from lowband.data import datasets, images, text  # noqa: F401  (fill the registry)
from lowband.data.base import TensorData, load_dataset
from lowband.data.loader import Batch, Batches
from lowband.data.partition import partition, steps_per_epoch

__all__ = ["TensorData", "load_dataset", "Batch", "Batches", "partition", "steps_per_epoch"]
