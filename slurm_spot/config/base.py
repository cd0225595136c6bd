"""The base of every ``spot.yaml`` model (:mod:`slurm_spot.config.models`,
:mod:`slurm_spot.config.provider_models`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    """A part of ``spot.yaml``: unknown keys are refused, the values are frozen once
    validated, and ``.inf``/``.nan`` are refused (floats YAML accepts; no duration, price or
    size is either). Raises ``pydantic.ValidationError`` on bad values, as every model does."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
