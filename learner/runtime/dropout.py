"""Dropout off in every model the learner trains or scores with (policy, critic, reference).

RL on language models compares log-probs of the same tokens across passes (pi_old, the current
policy, the generator's behaviour log-probs); dropout would make two passes with identical weights
disagree, so ratios != 1 before any update. TRL (`disable_dropout_in_model`) and verl (attention /
hidden dropout overridden to 0 at load) turn it off at load; so do we, in both places a model
keeps it: the config (Qwen2/Llama attention read `config.attention_dropout` into a float, not an
`nn.Dropout`) and every `nn.Dropout` module (GPT-2 style `resid_pdrop`, `embd_pdrop`, ...).
"""

from __future__ import annotations

from torch import nn
from transformers import PretrainedConfig

# Train-time noise not named like a dropout: MoE router jitter (Mixtral's config
# `router_jitter_noise`, copied into the sparse block's `jitter_noise`).
_OTHER_NOISE_SUFFIX = "jitter_noise"


def _is_probability_field(name: str, value: object) -> bool:
    """A nonzero number stored under a dropout-like name (booleans are switches, not levels)."""
    named = "dropout" in name or name.endswith(("pdrop", _OTHER_NOISE_SUFFIX))
    number = isinstance(value, float | int) and not isinstance(value, bool)
    return named and number and value != 0


def zero_dropout_config(config: PretrainedConfig) -> list[str]:
    """Set every dropout probability of `config` (and its sub-configs) to 0; returns their names.

    Boolean switches (e.g. `use_dropout`) are left alone; only float / int probabilities count.
    """
    changed = []
    for name, value in list(vars(config).items()):
        if isinstance(value, PretrainedConfig):
            changed += [f"{name}.{sub}" for sub in zero_dropout_config(value)]
        elif _is_probability_field(name, value):
            setattr(config, name, 0.0)
            changed.append(name)
    return changed


def disable_dropout(model: nn.Module) -> nn.Module:
    """Dropout probability 0 in `model`'s config, in each `nn.Dropout` and in each module's own
    dropout-probability attribute (Qwen2/Llama attention copy `config.attention_dropout` into
    `self.attention_dropout` at init, so zeroing the config after loading alone would miss it)."""
    config = getattr(model, "config", None)
    if isinstance(config, PretrainedConfig):
        zero_dropout_config(config)
    for module in model.modules():
        if isinstance(module, nn.Dropout | nn.Dropout1d | nn.Dropout2d | nn.Dropout3d):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if _is_probability_field(name, value):
                setattr(module, name, 0.0)
    return model
