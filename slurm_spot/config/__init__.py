"""The site configuration, ``spot.yaml``.

Modules: :mod:`.models` (the frozen pydantic models: every field, default and bound, and the
whole file), :mod:`.provider_models` (its providers and node sets: what a provider type
adds), :mod:`.base` (the models' common base), :mod:`.loader` (where the file is, reading it,
problems named by file, field and line), :mod:`.yamlfile` (the YAML text itself: lines,
duplicate keys, placeholders), :mod:`.source` (where the file is, its bytes read safely,
trusted files), :mod:`.plain` (patterns and node-set arithmetic without pydantic),
:mod:`.cache` (the validated-config cache the hooks use). Every public name of :mod:`.models`,
:mod:`.provider_models` and :mod:`.loader`, and the patterns of :mod:`.plain`, is importable
from here, as ``from slurm_spot.config import SpotConfig, load_config``. They are imported on
first use (PEP 562 ``__getattr__``): importing this package, or its pydantic-free modules
(:mod:`.plain`, :mod:`.source`, :mod:`.cache`), loads neither pydantic nor YAML, which a
hook that finds its config in the cache never needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurm_spot.config.loader import (
        SLURM_COMMANDS,
        credentials_file_problems,
        load_config,
        parse_config,
        slurm_bin_problems,
    )
    from slurm_spot.config.models import (
        LOCAL_COST,
        MAX_TIME_LIMIT_MINUTES,
        CheckpointConfig,
        CostConfig,
        PartitionConfig,
        PowerConfig,
        PreemptionConfig,
        ReconcileConfig,
        S3Settings,
        SpotConfig,
        check_listen_address,
        default_local_config,
        max_time_minutes,
    )
    from slurm_spot.config.plain import (
        DEFAULT_CONFIG_PATH,
        MAX_TIME_PATTERN,
        NAME_PATTERN,
        NODE_SET_PATTERN,
        S3_ROOT_PATTERN,
        SIGNAL_NAMES,
    )
    from slurm_spot.config.provider_models import (
        PROVIDER_TYPE_NAMES,
        AwsNodeSetOptions,
        AwsProviderConfig,
        GcpNodeSetOptions,
        GcpProviderConfig,
        GpuSpec,
        LocalProviderConfig,
        NodeSetConfig,
        ProviderConfig,
        ProviderSettings,
    )
    from slurm_spot.config.source import (
        MAX_CONFIG_BYTES,
        config_path,
    )

_LOADER_NAMES = (
    "SLURM_COMMANDS", "credentials_file_problems", "load_config", "parse_config",
    "slurm_bin_problems",
)
_MODEL_NAMES = (
    "LOCAL_COST", "MAX_TIME_LIMIT_MINUTES", "CheckpointConfig", "CostConfig", "PartitionConfig",
    "PowerConfig", "PreemptionConfig", "ReconcileConfig", "S3Settings", "SpotConfig",
    "check_listen_address", "default_local_config", "max_time_minutes",
)
_PLAIN_NAMES = (
    "DEFAULT_CONFIG_PATH", "MAX_TIME_PATTERN", "NAME_PATTERN", "NODE_SET_PATTERN",
    "S3_ROOT_PATTERN", "SIGNAL_NAMES",
)
_PROVIDER_MODEL_NAMES = (
    "PROVIDER_TYPE_NAMES", "AwsNodeSetOptions", "AwsProviderConfig", "GcpNodeSetOptions",
    "GcpProviderConfig", "GpuSpec", "LocalProviderConfig", "NodeSetConfig", "ProviderConfig",
    "ProviderSettings",
)
_SOURCE_NAMES = (
    "MAX_CONFIG_BYTES", "config_path",
)
_HOME = {**dict.fromkeys(_LOADER_NAMES, "loader"), **dict.fromkeys(_MODEL_NAMES, "models"),
         **dict.fromkeys(_PROVIDER_MODEL_NAMES, "provider_models"),
         **dict.fromkeys(_PLAIN_NAMES, "plain"),
         **dict.fromkeys(_SOURCE_NAMES, "source")}

__all__ = [
    "DEFAULT_CONFIG_PATH",
    "LOCAL_COST",
    "MAX_CONFIG_BYTES",
    "MAX_TIME_LIMIT_MINUTES",
    "MAX_TIME_PATTERN",
    "NAME_PATTERN",
    "NODE_SET_PATTERN",
    "PROVIDER_TYPE_NAMES",
    "S3_ROOT_PATTERN",
    "SIGNAL_NAMES",
    "SLURM_COMMANDS",
    "AwsNodeSetOptions",
    "AwsProviderConfig",
    "CheckpointConfig",
    "CostConfig",
    "GcpNodeSetOptions",
    "GcpProviderConfig",
    "GpuSpec",
    "LocalProviderConfig",
    "NodeSetConfig",
    "PartitionConfig",
    "PowerConfig",
    "PreemptionConfig",
    "ProviderConfig",
    "ProviderSettings",
    "ReconcileConfig",
    "S3Settings",
    "SpotConfig",
    "check_listen_address",
    "config_path",
    "credentials_file_problems",
    "default_local_config",
    "load_config",
    "max_time_minutes",
    "parse_config",
    "slurm_bin_problems",
]


def __getattr__(name: str) -> Any:
    """``slurm_spot.config.<name>`` from the module that defines it, imported on first use.

    Raises:
        AttributeError: no such public name.
    """
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'slurm_spot.config' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"slurm_spot.config.{home}"), name)
    globals()[name] = value
    return value
