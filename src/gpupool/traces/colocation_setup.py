"""The drivers' one way from `sharing.admission` to the core's admission: read the job
profiles CSV and the measured pairs, then train and build (learning/colocation_config.py).
The live service and the simulator both call `load_pair_admission`, so one configuration
decides alike in both; the core never opens these files itself.
"""

from __future__ import annotations

from gpupool.errors import NotFoundError, SpecError
from gpupool.learning.colocation_admission import PairAdmissionPolicy
from gpupool.learning.colocation_config import PairAdmissionConfig, build_pair_admission
from gpupool.traces.job_profiles import read_job_profiles
from gpupool.traces.lucid import LucidData, read_lucid

WHERE = "sharing.admission"


def load_pair_admission(config: PairAdmissionConfig, source: str) -> PairAdmissionPolicy | None:
    """The configured admission (None while `off`); `source` names the configuration file
    in the messages. A missing or malformed file is a SpecError saying which key to fix."""
    if not config.on:
        return None
    assert config.profiles is not None  # PairAdmissionConfig requires it unless off
    try:
        jobs = read_job_profiles(config.profiles)
    except NotFoundError:
        raise SpecError(
            f"{source}: {WHERE}.profiles: {config.profiles} does not exist; give the job "
            "profiles CSV (paths are relative to the configuration file)"
        ) from None
    data = LucidData({}, ())
    if config.pairs is not None:
        try:
            data = read_lucid(config.pairs)
        except NotFoundError as err:
            raise SpecError(
                f"{source}: {WHERE}.pairs: {err}; give the folder of measured pairs "
                "(single_data.csv and colocate_info.csv)"
            ) from None
    return build_pair_admission(config, jobs, data.profiles, data.pairs)
