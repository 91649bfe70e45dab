"""lowband: training neural networks on workers that cannot afford to talk every step."""

__version__ = "0.1.0"
