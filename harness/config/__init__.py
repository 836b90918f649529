"""The experiment configuration, as one import: `from harness.config import ExperimentConfig`.

The package keeps one concern a module, as `learner/config/` does: the experiment model and its
loading (`experiment.py`), its sections (`sections.py`: model, task, generation), eval sets and
training tasks (`evals.py`), where components run (`executor.py`), the tuning stage
(`tuning.py`), and the rules across sections (`checks.py`). The modules import each other
downward only (checks below experiment); this file re-exports the names other packages use,
each from its own module.
"""

from harness.config.checks import check_path_component, check_response_fits
from harness.config.evals import EvalConfig, EvalSetConfig, TrainTaskConfig
from harness.config.executor import ExecutorConfig
from harness.config.experiment import (
    HASH_EXCLUDED,
    OMITTED_AT_DEFAULT,
    ExperimentConfig,
    TrackingConfig,
    format_validation_error,
    load_config,
    load_config_data,
    resolved_dump,
    validate_config,
)
from harness.config.sections import (
    UNREPRODUCIBLE_SAMPLING,
    BuiltinTokenizer,
    GenerationConfig,
    GeneratorBackend,
    Gsm8kMode,
    ModelArch,
    ModelConfig,
    PromptFormat,
    TaskConfig,
    TaskName,
    VerifierName,
)
from harness.overrides import ConfigError

__all__ = [
    "HASH_EXCLUDED",
    "OMITTED_AT_DEFAULT",
    "UNREPRODUCIBLE_SAMPLING",
    "BuiltinTokenizer",
    "ConfigError",
    "EvalConfig",
    "EvalSetConfig",
    "ExecutorConfig",
    "ExperimentConfig",
    "GenerationConfig",
    "GeneratorBackend",
    "Gsm8kMode",
    "ModelArch",
    "ModelConfig",
    "PromptFormat",
    "TaskConfig",
    "TaskName",
    "TrackingConfig",
    "TrainTaskConfig",
    "VerifierName",
    "check_path_component",
    "check_response_fits",
    "format_validation_error",
    "load_config",
    "load_config_data",
    "resolved_dump",
    "validate_config",
]
