"""Configuration: params.yaml and a profile -> frozen, checked dataclasses; dotted overrides (torch-free)."""
from pipeline.config.loader import load, override, replace_train, parse_set, describe_profiles, ConfigError
from pipeline.config.schema import Config, TrainConfig, DataConfig, SweepConfig, SpaceConfig

__all__ = ['Config', 'ConfigError', 'DataConfig', 'SpaceConfig', 'SweepConfig', 'TrainConfig',
           'describe_profiles', 'load', 'override', 'parse_set', 'replace_train']
