"""What the FGD paper (Weng et al., USENIX ATC '23) compares: its six placement policies
and the points of its Fig. 9(a). Kept apart from the experiment runner so that the CLI
names them without loading it."""

from __future__ import annotations

PAPER_POLICY_NAMES = {
    "random": "01-Random",
    "dot-product": "02-DotProd",
    "gpu-clustering": "03-GpuClustering",
    "gpu-packing": "04-GpuPacking",
    "best-fit": "05-BestFit",
    "fgd": "06-FGD",
}
"""gpupool's names for the six policies compared in the FGD paper -> the authors' labels."""

FIGURE_POINTS = (90, 95, 100, 110, 130)
"""Arrived-workload percentages at which the paper's Fig. 9(a) is compared."""
