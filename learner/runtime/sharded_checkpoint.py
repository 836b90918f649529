"""The sharded part of an FSDP learner's checkpoint: torch.distributed.checkpoint (DCP).

Why DCP: each rank writes only its own shards of the models and AdamW state (no rank gathers a
whole model to save it), and loading reshards them to however many ranks the resumed learner
has, so a trial checkpointed by 2 ranks resumes with 1 and back. The shards go to
`step-NNNNNN/shards/` (DCP's `.metadata` plus one `.distcp` file per rank); the step's
`state.pt` keeps what is not sharded (schedulers, RNG states, the training state), and the
checkpoint's manifest seals both (`learner.runtime.checkpoint`).

The modules come as `learner.runtime.models.checkpoint_modules` names them: `<name>` a model,
`<name>_optimizer` its optimiser, `<name>_scheduler` its LR scheduler. Models and optimisers
are saved through `get_state_dict` (fully qualified parameter names, optimiser state keyed by
them, so the layout does not depend on the world size).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from learner.runtime.sharding import is_sharded

SHARDS_DIR = "shards"


def is_sharded_payload(modules: dict[str, Any]) -> bool:
    """Whether the checkpoint's models are FSDP-sharded (then every rank saves and loads)."""
    return any(isinstance(m, nn.Module) and is_sharded(m) for m in modules.values())


def _models(modules: dict[str, Any]) -> dict[str, tuple[nn.Module, Any]]:
    """name -> (model, its optimiser)."""
    return {
        name: (module, modules[f"{name}_optimizer"])
        for name, module in modules.items()
        if isinstance(module, nn.Module)
    }


def _sharded_state(modules: dict[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, (model, optimizer) in _models(modules).items():
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state[name] = model_state
        state[f"{name}_optimizer"] = optimizer_state
    return state


def save_shards(modules: dict[str, Any], directory: Path) -> None:
    """Every rank writes its shards of each model and optimiser into `directory`."""
    dcp.save(_sharded_state(modules), checkpoint_id=str(directory))


def load_shards(modules: dict[str, Any], directory: Path) -> None:
    """Every rank reads its shards (resharded to this world size) into the models and
    optimisers in place."""
    state = _sharded_state(modules)  # the layout to fill: this world size's shards
    dcp.load(state, checkpoint_id=str(directory))
    for name, (model, optimizer) in _models(modules).items():
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state[name],
            optim_state_dict=state[f"{name}_optimizer"],
        )


def unsharded_state(modules: dict[str, Any]) -> dict[str, Any]:
    """What `state.pt` keeps of a sharded learner: each scheduler's state dict."""
    return {name: obj.state_dict() for name, obj in modules.items() if name.endswith("_scheduler")}


def load_unsharded_state(modules: dict[str, Any], payload: dict[str, Any]) -> None:
    for name, obj in modules.items():
        if name.endswith("_scheduler"):
            obj.load_state_dict(payload[name])
