"""Configuration: params.yaml and a profile -> frozen, checked dataclasses; dotted overrides (torch-free)."""

from pipeline.config.loader import ConfigError, describe_profiles, load, override, parse_set, replace_train
from pipeline.config.schema import Config, DataConfig, SpaceConfig, SweepConfig, TrainConfig

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "SpaceConfig",
    "SweepConfig",
    "TrainConfig",
    "describe_profiles",
    "load",
    "override",
    "parse_set",
    "replace_train",
]
