"""The arithmetic of speculative decoding: chain drafting with i.i.d. per-token acceptance
(Leviathan et al.). tau (tokens per verify step, the bonus token included), k (drafts per
step), alpha (per-token acceptance), the strict rate (tau-1)/k, and the acceptance
definitions engines have reported their figures in."""

from __future__ import annotations

from typing import Literal

Definition = Literal["strict", "sglang_legacy"]


DEFINITIONS: dict[str, str] = {
    "strict": "accepted / proposed drafts = (tau-1)/k",
    "sglang_legacy": "accept length / num_draft_tokens = tau/(k+1), SGLang before PR #23530",
}


DRAFT_COSTS = (0.05, 0.1, 0.2)  # draft/target cost ratios the modelled speed-up is given for


def tau_from_alpha(alpha: float, k: int) -> float:
    """Expected tokens per verify step, bonus included: (1 - a^(k+1)) / (1 - a)."""
    # Summed as 1 + a + ... + a^k: the closed form cancels badly as a -> 1.
    return sum(alpha**i for i in range(k + 1))


def alpha_from_tau(tau: float, k: int) -> float:
    """Per-token acceptance alpha (i.i.d.) with tau_from_alpha(alpha, k) = tau, by bisection."""
    if not 1.0 <= tau <= k + 1.0:
        raise ValueError(f"accept length {tau:g} is outside [1, k+1] = [1, {k + 1}]")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # tau_from_alpha rises monotonically on [0, 1]
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau_from_alpha(mid, k) < tau else (lo, mid)
    return (lo + hi) / 2


def strict_rate(tau: float, k: int) -> float:
    """The one definition: accepted / proposed drafts = (tau - 1) / k."""
    return (tau - 1.0) / k


def rate_floor(k: int, definition: Definition) -> float:
    """The figure a definition gives when no draft is accepted: 0 strict, 1/(k+1) legacy."""
    return 0.0 if definition == "strict" else 1.0 / (k + 1)


def _tau_of_rate(rate: float, k: int, definition: Definition) -> float:
    """strict: rate = (tau-1)/k. sglang_legacy: rate = (accepted + bs) / (bs * num_draft_tokens)
    = tau / num_draft_tokens, with num_draft_tokens = k+1 in chain drafting (topk 1)."""
    return 1.0 + rate * k if definition == "strict" else rate * (k + 1)


def tau_from_rate(rate: float, k: int, definition: Definition) -> float:
    """tau from an engine's acceptance figure; below the floor is an error."""
    tau = _tau_of_rate(rate, k, definition)
    if tau < 1.0 - 1e-9:  # legacy figures start at 1/(k+1): zero drafts accepted
        raise ValueError(
            f"{rate:g} is below the floor of {definition} for k={k}, "
            f"1/(k+1) = {1 / (k + 1):.3g}: check k and the definition"
        )
    return max(tau, 1.0)


def modelled_speedup(tau: float, k: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    """S = tau / (k*r + v), Leviathan Thm 3.8, r the draft/target cost ratio and
    v = T_verify/T_dec."""
    return tau / (k * draft_cost + verify_cost)
