"""gpupool: pool the GPUs, decide which job runs where and when."""

__version__ = "0.1.0"
