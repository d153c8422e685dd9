"""Runnable example jobs that follow gpupool's checkpoint protocol (docs/checkpoint-protocol.md)."""
