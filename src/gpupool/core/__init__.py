"""The pure scheduling core: domain values, lifecycle, cluster state and the engine."""
