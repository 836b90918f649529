"""What the learner trains: every group is checked completely before it can fill a batch slot.

The rules are data (`IntakeRules`, built by the learner from its task and model): the learner
hands them to the buffer's take (`RolloutConsumer.take_batch` / `take`), which runs `refusal` on
each group as it is read, so no check travels as a callback.

The record's own invariants are checked when a message is decoded (`buffer.record_checks`,
`buffer.rollout_group.check_group`: one behaviour logprob per response token, routed experts for
every position, token ids >= 0, finite logprobs and rewards, known finish reasons); a message
that breaks one never becomes a group.
`refusal` checks what needs this trial's settings and model, in this order, and answers one line
naming the group, its batch and the setting it breaks:
- shape: exactly `generation.group_size` samples (advantages are taken per group of that size);
- identity, the staleness rule (design section 5): its prompt index is one of the batch its entry
  claims and its id is `make_group_id(seed, batch, prompt)`; fixed mode: its policy version is
  exactly max(0, batch - lag); bounded mode: not newer than the learner's own version (no
  generator can hold weights the learner has not published);
- the model: token ids inside the vocabulary, prompt + response within the context;
- values: every reward inside `learner.reward_range` (finite: checked at decode), every response
  at most `generation.max_new_tokens` tokens;
- the prompt: when the trial can render its prompts (`LearnerTask.prompt_ids`), the prompt tokens
  are exactly those of its prompt index; otherwise only the index is checked.

The buffer runs the check on each group as it is read, before the group is held, stashed for a
batch or recorded as seen for de-duplication. A refused group goes to the dead-letter stream with
its reason and takes nothing with it: the real group of that id, read before or after it, is
still accepted and trained.

What protects against a forged group, and what does not:
- A copy that fails any check (malformed, out of range, another version, prompt or id than its
  batch's) never displaces the real group, whatever the arrival order.
- The buffer admits one push per group id (`buffer.outbox`: the first push's content digest owns
  the id; a later push with other contents is dead-lettered as a conflicting duplicate). A copy
  pushed through the buffer before the generator's keeps the real group out of the stream; if
  that copy is refused, its slot can never be filled. The same holds when the generator itself
  made a group that is refused: fixed mode makes the same group on every retry. Fixed mode then
  fails the trial at once, in one line naming the group (`buffer.consumer.SlotRefusedError`),
  instead of waiting out the take timeout, and the refusal is kept in the checkpoint
  (`TrainingState.refused_slots`), so a resumed learner fails the same way at once. Bounded mode
  has no slots: a refused group is not trained and the take goes on with the next group (no
  ticket replaces it, so refusals, like stale drops, use up the headroom that `max_lag` leaves).
- Nothing here tells a well-formed forgery from the real group: the right id, version and prompt,
  rewards inside the range, tokens inside the vocabulary. The first such copy read fills the slot
  and is trained (the real group is then a duplicate, or a conflicting push). The checks bound
  what a forgery can do (rewards inside reward_range, responses no longer than the generator's
  limit, the batch's own prompt indices and version, its prompt tokens where `prompt_ids` is
  given); that groups are real rests on who can write to the run's Redis (a random password, TLS
  for a remote Redis: design section 9). Groups carry no signature.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from buffer.inbox import Delivery
from buffer.rollout_group import RolloutGroup
from buffer.schema import make_group_id
from buffer.staleness import StalenessPolicy, staleness_policy
from buffer.tickets import draw_batch, draw_round, round_tickets, ticket_batch, ticket_round
from contract.trial import StalenessMode

Check = Callable[[Delivery], str | None]
"""Why a delivered group must not be trained (it is dead-lettered with that reason), or None."""


@dataclass(frozen=True)
class ModelLimits:
    """What a group must fit: token ids < vocab_size, prompt + response <= max_positions."""

    vocab_size: int
    max_positions: int | None = None


def model_limits(config: object) -> ModelLimits:
    """Limits of a transformers model config (`max_position_embeddings` when it has one)."""
    return ModelLimits(
        vocab_size=int(config.vocab_size),  # type: ignore[attr-defined]
        max_positions=getattr(config, "max_position_embeddings", None),
    )


@dataclass(frozen=True)
class IntakeRules:
    """What a group must be to be trained in one trial (the loop builds it from its task)."""

    mode: StalenessMode
    lag: int
    seed: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    reward_range: tuple[float, float]
    limits: ModelLimits
    prompt_ids: Callable[[int], Sequence[int]] | None = None  # prompt index -> its tokens
    extra_rounds: int = 0  # dynamic sampling: the arm's dynamic_sampling_rounds
    sync_every: int = 1  # staleness.sync_every: fixed mode's versions are its multiples

    @cached_property
    def policy(self) -> StalenessPolicy:
        """The trial's staleness rule, which says what versions a group may carry (built once:
        every group read is checked against it)."""
        return staleness_policy(self.mode, self.lag, self.sync_every)


def refusal(delivery: Delivery, rules: IntakeRules, learner_version: int) -> str | None:
    """Why `delivery` must not be trained, in one line naming the group and its batch, or None.

    `learner_version`: the learner's policy version as it takes the group (bounded mode refuses
    newer groups; fixed mode reads the version off the batch index)."""
    group = delivery.group
    problem = (
        shape_problem(group, rules.group_size)
        or identity_problem(delivery, rules, learner_version)
        or model_problem(group, rules.limits)
        or value_problem(group, rules.reward_range, rules.max_new_tokens)
        or prompt_problem(group, rules.prompt_ids)
    )
    if problem is None:
        return None
    return f"group {group.group_id!r} (batch {delivery.batch_index}): {problem}"


def intake_check(rules: IntakeRules, learner_version: int) -> Check:
    """`refusal` bound to one take: the check the buffer's take runs on each group it reads."""

    def check(delivery: Delivery) -> str | None:
        return refusal(delivery, rules, learner_version)

    return check


def shape_problem(group: RolloutGroup, group_size: int) -> str | None:
    n = len(group.response_ids)
    if n != group_size:
        return f"{n} samples, but generation.group_size is {group_size}"
    return None


def identity_problem(delivery: Delivery, rules: IntakeRules, learner_version: int) -> str | None:
    """Version, prompt index and id against the batch (and round) the entry claims (module
    docstring). An extra round's entry claims `buffer.tickets.draw_key(batch, round)`: its
    prompt indices are that round's tickets, its version the batch's."""
    group, key, per_step = delivery.group, delivery.batch_index, rules.prompts_per_step
    batch, round_index = draw_batch(key), draw_round(key)
    where = f"batch {batch}" if round_index == 0 else f"batch {batch} round {round_index}"
    if round_index > rules.extra_rounds:
        return (
            f"claims extra round {round_index} of batch {batch}, but the arm's "
            f"dynamic_sampling_rounds is {rules.extra_rounds}"
        )
    problem = rules.policy.version_problem(group, batch, learner_version)
    if problem is not None:
        return problem
    prompt = group.prompt_index
    if ticket_batch(prompt, per_step) != batch or ticket_round(prompt) != round_index:
        first = round_tickets(batch, round_index, per_step)[0]
        return f"prompt_index {prompt} is outside {where}'s [{first}, {first + per_step})"
    want_id = make_group_id(rules.seed, batch, prompt)
    if group.group_id != want_id:
        return f"id should be {want_id!r} for seed {rules.seed}, batch {batch}"
    return None


def model_problem(group: RolloutGroup, limits: ModelLimits) -> str | None:
    """Token ids outside the vocabulary, or a sequence longer than the context: the forward
    would fail on it (an IndexError) on every retry."""
    highest = max(
        int(group.prompt_ids.max()), *(int(r.max()) for r in group.response_ids if r.size)
    )
    if highest >= limits.vocab_size:
        return (
            f"token id {highest} is outside the model's vocabulary of {limits.vocab_size}; "
            "generator and learner disagree on the model or tokenizer"
        )
    if limits.max_positions is not None:
        longest = len(group.prompt_ids) + max(len(r) for r in group.response_ids)
        if longest > limits.max_positions:
            return (
                f"{longest} tokens exceed the model's context of {limits.max_positions}; lower "
                "generation.max_new_tokens or shorten prompts"
            )
    return None


def value_problem(
    group: RolloutGroup, reward_range: tuple[float, float], max_new_tokens: int
) -> str | None:
    """A reward outside `reward_range` (NaN included) or a response over `max_new_tokens`."""
    low, high = reward_range
    bad = next((r for r in group.rewards if not low <= r <= high), None)
    if bad is not None:
        return (
            f"reward {bad:g} is outside learner.reward_range [{low}, {high}]; widen it if the "
            "verifier's rewards are meant to reach this"
        )
    longest = max(len(r) for r in group.response_ids)
    if longest > max_new_tokens:
        return (
            f"a response of {longest} tokens, over generation.max_new_tokens={max_new_tokens}; "
            "the generator ran with another limit"
        )
    return None


def prompt_problem(
    group: RolloutGroup, prompt_ids: Callable[[int], Sequence[int]] | None
) -> str | None:
    """Prompt tokens other than those of its prompt index (when the trial can render them)."""
    if prompt_ids is None:
        return None
    want = np.asarray(prompt_ids(group.prompt_index))
    if not np.array_equal(group.prompt_ids, want):
        return (
            f"its prompt ({len(group.prompt_ids)} tokens) is not prompt {group.prompt_index} of "
            f"the trial's prompt stream ({len(want)} tokens)"
        )
    return None


_GROUP_ID = re.compile(r"s-?\d+-b(\d+)-p(\d+)")


@dataclass(frozen=True)
class TrialSlots:
    """The group ids a fixed-mode trial trains or may read: `make_group_id(seed, k, p)` for
    each batch k < steps and each prompt p of its round 0 and of its extra rounds up to
    `extra_rounds` (dynamic sampling). A container (`group_id in slots`), not a set of ids."""

    seed: int
    prompts_per_step: int
    steps: int
    extra_rounds: int = 0

    def __contains__(self, group_id: object) -> bool:
        match = _GROUP_ID.fullmatch(group_id) if isinstance(group_id, str) else None
        if match is None:
            return False
        batch, prompt = int(match.group(1)), int(match.group(2))
        return (
            batch < self.steps
            and ticket_batch(prompt, self.prompts_per_step) == batch
            and ticket_round(prompt) <= self.extra_rounds
            and make_group_id(self.seed, batch, prompt) == group_id
        )


__all__ = [
    "IntakeRules",
    "ModelLimits",
    "TrialSlots",
    "identity_problem",
    "intake_check",
    "model_limits",
    "model_problem",
    "prompt_problem",
    "refusal",
    "shape_problem",
    "value_problem",
]
