"""Restart strategies: whether a failed job restarts, and after how long (Flink's
RestartBackoffTimeStrategy and its four kinds, with Flink's option names and defaults).

- ``none``: the first failure fails the job.
- ``fixed-delay``: ``attempts`` restarts, each after ``delay``.
- ``failure-rate``: restarts after ``delay`` while at most ``max-failures-per-interval`` failures
  fall within ``failure-rate-interval``.
- ``exponential-delay`` (the default when checkpointing is on and nothing is configured): the
  wait starts at ``initial-backoff`` and grows by ``backoff-multiplier`` per failure up to
  ``max-backoff``, each wait moved by up to ``jitter-factor`` of itself either way; a failure after
  ``reset-backoff-threshold`` without one starts over from ``initial-backoff``; the job fails
  after ``attempts-before-reset-backoff`` restarts without such a reset.

Pure logic: the time comes in with each failure, randomness is injected.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from sparkpoint.common.options import ConfigError, Section, parse_section

NONE = ("none", "off", "disable")
FIXED_DELAY = ("fixed-delay", "fixeddelay")
FAILURE_RATE = ("failure-rate", "failurerate")
EXPONENTIAL_DELAY = ("exponential-delay", "exponentialdelay")


class RestartStrategy(Protocol):
    name: str

    def notify_failure(self, now_ms: int) -> None:
        """A failure happened at ``now_ms``."""
        ...

    def can_restart(self) -> bool:
        """Whether the job restarts after the failures notified so far."""
        ...

    def backoff_ms(self) -> int:
        """How long to wait before the restart."""
        ...


class NoRestart:
    name = "none"

    def notify_failure(self, now_ms: int) -> None:
        pass

    def can_restart(self) -> bool:
        return False

    def backoff_ms(self) -> int:
        return 0


class FixedDelay:
    name = "fixed-delay"

    def __init__(self, attempts: int, delay_ms: int) -> None:
        self.attempts = attempts
        self.delay_ms = delay_ms
        self.failures = 0

    def notify_failure(self, now_ms: int) -> None:
        self.failures += 1

    def can_restart(self) -> bool:
        return self.failures <= self.attempts

    def backoff_ms(self) -> int:
        return self.delay_ms


class FailureRate:
    name = "failure-rate"

    def __init__(self, max_failures: int, interval_ms: int, delay_ms: int) -> None:
        self.max_failures = max_failures
        self.interval_ms = interval_ms
        self.delay_ms = delay_ms
        self.failures: deque[int] = deque()
        self.last_ms = 0

    def notify_failure(self, now_ms: int) -> None:
        self.failures.append(now_ms)
        self.last_ms = now_ms
        while self.failures and now_ms - self.failures[0] > self.interval_ms:
            self.failures.popleft()

    def can_restart(self) -> bool:
        return len(self.failures) <= self.max_failures

    def backoff_ms(self) -> int:
        return self.delay_ms


class ExponentialDelay:
    name = "exponential-delay"

    def __init__(self, config: RestartConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.current_ms = 0
        self.attempts = 0
        self.last_failure_ms: int | None = None

    def notify_failure(self, now_ms: int) -> None:
        c = self.config
        quiet = self.last_failure_ms is None or (
            now_ms - self.last_failure_ms >= c.reset_backoff_threshold_ms + self.current_ms
        )
        if quiet:
            self.current_ms = c.initial_backoff_ms
            self.attempts = 0
        else:
            self.current_ms = min(int(self.current_ms * c.backoff_multiplier), c.max_backoff_ms)
        self.attempts += 1
        self.last_failure_ms = now_ms

    def can_restart(self) -> bool:
        return self.attempts <= self.config.attempts_before_reset

    def backoff_ms(self) -> int:
        jitter = self.current_ms * self.config.jitter_factor
        return max(0, int(self.current_ms + self.rng.uniform(-jitter, jitter)))


@dataclass(frozen=True)
class RestartConfig:
    """``restart-strategy.*`` with Flink's defaults; ``type`` None: not configured."""

    type: str | None = None
    fixed_delay_attempts: int = 1
    fixed_delay_ms: int = 1_000
    failure_rate_max_failures: int = 1
    failure_rate_interval_ms: int = 60_000
    failure_rate_delay_ms: int = 1_000
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    backoff_multiplier: float = 1.5
    reset_backoff_threshold_ms: int = 3_600_000
    jitter_factor: float = 0.1
    attempts_before_reset: int = 2**31 - 1

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], base: RestartConfig | None = None
    ) -> RestartConfig:
        return replace(base or cls(), **parse_section(options, Section.RESTART)).validate()

    def validate(self) -> RestartConfig:
        if self.type is not None and self.type.lower() not in (
            *NONE,
            *FIXED_DELAY,
            *FAILURE_RATE,
            *EXPONENTIAL_DELAY,
        ):
            raise ConfigError("restart-strategy.type", f"unknown restart strategy {self.type!r}")
        checks = [
            ("fixed-delay.attempts", self.fixed_delay_attempts >= 0),
            ("fixed-delay.delay", self.fixed_delay_ms >= 0),
            ("failure-rate.max-failures-per-interval", self.failure_rate_max_failures >= 1),
            ("failure-rate.failure-rate-interval", self.failure_rate_interval_ms > 0),
            ("failure-rate.delay", self.failure_rate_delay_ms >= 0),
            ("exponential-delay.initial-backoff", self.initial_backoff_ms > 0),
            ("exponential-delay.max-backoff", self.max_backoff_ms >= self.initial_backoff_ms),
            ("exponential-delay.backoff-multiplier", self.backoff_multiplier >= 1.0),
            ("exponential-delay.reset-backoff-threshold", self.reset_backoff_threshold_ms > 0),
            ("exponential-delay.jitter-factor", 0.0 <= self.jitter_factor <= 1.0),
            ("exponential-delay.attempts-before-reset-backoff", self.attempts_before_reset >= 1),
        ]
        for name, ok in checks:
            if not ok:
                raise ConfigError(f"restart-strategy.{name}", "out of range")
        return self

    def kind(self, checkpointing: bool) -> str:
        """The strategy in force: the configured one, else Flink's default (exponential-delay
        when checkpointing is on, none otherwise)."""
        if self.type is None:
            return "exponential-delay" if checkpointing else "none"
        chosen = self.type.lower()
        for name, spellings in (
            ("none", NONE),
            ("fixed-delay", FIXED_DELAY),
            ("failure-rate", FAILURE_RATE),
            ("exponential-delay", EXPONENTIAL_DELAY),
        ):
            if chosen in spellings:
                return name
        raise ValueError(chosen)

    def strategy(self, checkpointing: bool, rng: random.Random | None = None) -> RestartStrategy:
        kind = self.kind(checkpointing)
        if kind == "fixed-delay":
            return FixedDelay(self.fixed_delay_attempts, self.fixed_delay_ms)
        if kind == "failure-rate":
            return FailureRate(
                self.failure_rate_max_failures,
                self.failure_rate_interval_ms,
                self.failure_rate_delay_ms,
            )
        if kind == "exponential-delay":
            return ExponentialDelay(self, rng or random.Random())
        return NoRestart()
