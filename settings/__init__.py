"""One typed, frozen settings object per environment, validated once at app start (pydantic v2).

Defaults, constraints and descriptions live on the section models (settings/network.py, training.py,
serving.py, operations.py, model.py); `cdk.json` declares each environment as overrides of those defaults;
`-c section.key=value` overrides any of them from the command line (settings/sources.py). Every error names the
setting, the value given and what is allowed. `python -m settings` shows each value and where it came from.
Nothing here imports the CDK: stacks, training and inference tools all build on it.
"""

from settings.errors import SettingsError
from settings.fields import LOG_RETENTION_DAYS, Allowed, section, setting, text
from settings.model import Settings
from settings.network import ArtifactSettings, EndpointSettings, NetworkSettings
from settings.operations import OperationsSettings, PipelineSettings
from settings.serving import LMI_VERSIONS, FalconSettings, SentimentSettings
from settings.sources import (
    CDK_JSON,
    DEFAULT_ENVIRONMENT,
    REPO_ROOT,
    known_settings,
    load_settings,
    load_with_sources,
    overrides_from_context,
    read_environments,
    read_shared,
    settings_from_context,
)
from settings.training import TrainingSettings

__all__ = [
    "CDK_JSON", "DEFAULT_ENVIRONMENT", "LMI_VERSIONS", "LOG_RETENTION_DAYS", "REPO_ROOT", "Allowed",
    "ArtifactSettings", "EndpointSettings", "FalconSettings", "NetworkSettings", "OperationsSettings",
    "PipelineSettings", "SentimentSettings", "Settings", "SettingsError", "TrainingSettings", "known_settings",
    "load_settings", "load_with_sources", "overrides_from_context", "read_environments", "read_shared", "section",
    "setting", "settings_from_context", "text",
]
