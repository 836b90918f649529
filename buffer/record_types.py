"""The rollout record's vocabulary: its error, its array types and its version metadata key.

The bottom of the record's modules, importing none of them, so the ones above it (the field
checks `buffer.record_checks`, the versions `buffer.record_versions`, the group
`buffer.rollout_group`, the codec `buffer.schema`) depend on each other in one direction only.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

FinishReason = Literal["stop", "length"]
FINISH_REASONS: frozenset[str] = frozenset({"stop", "length"})
SCHEMA_VERSION_KEY = b"gspo.schema_version"  # Arrow schema metadata naming the record version

IntArray = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float32]
ExpertArray = npt.NDArray[np.int16]


class RecordError(ValueError):
    """A rollout record is malformed; the message names the field and what was wrong with it."""
