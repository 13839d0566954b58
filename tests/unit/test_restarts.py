"""Restart strategies (services/sparkpoint/agent/restarts.py) on a fake clock: Flink's four kinds, with
Flink's option names and defaults."""

from __future__ import annotations

import random

import pytest

from sparkpoint.common.options import ConfigError
from sparkpoint.common.restarts import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    NoRestart,
    RestartConfig,
)

SECOND = 1000


def config(**options: str) -> RestartConfig:
    return RestartConfig.from_options({f"restart-strategy.{k}": v for k, v in options.items()})


def test_without_a_configured_strategy_it_is_exponential_delay_with_checkpointing_else_none() -> (
    None
):
    assert isinstance(RestartConfig().strategy(checkpointing=True), ExponentialDelay)
    assert isinstance(RestartConfig().strategy(checkpointing=False), NoRestart)


def test_none_never_restarts() -> None:
    strategy = config(type="none").strategy(checkpointing=True)
    strategy.notify_failure(0)
    assert not strategy.can_restart()


def test_fixed_delay_restarts_attempts_times_then_fails() -> None:
    strategy = config(
        **{"type": "fixed-delay", "fixed-delay.attempts": "2", "fixed-delay.delay": "3s"}
    ).strategy(True)
    outcomes = []
    for failure in range(3):
        strategy.notify_failure(failure * SECOND)
        outcomes.append((strategy.can_restart(), strategy.backoff_ms()))
    assert outcomes == [(True, 3000), (True, 3000), (False, 3000)]


def test_failure_rate_fails_only_when_too_many_failures_fall_in_the_interval() -> None:
    strategy = FailureRate(max_failures=2, interval_ms=60 * SECOND, delay_ms=500)
    for at in (0, 10 * SECOND):
        strategy.notify_failure(at)
        assert strategy.can_restart()
    strategy.notify_failure(60 * SECOND + 500)  # the first one left the interval
    assert strategy.can_restart()
    strategy.notify_failure(61 * SECOND)
    assert not strategy.can_restart()  # three within the last minute


def test_exponential_delay_grows_by_the_multiplier_up_to_the_maximum() -> None:
    rc = config(
        **{
            "exponential-delay.jitter-factor": "0",
            "exponential-delay.initial-backoff": "1s",
            "exponential-delay.max-backoff": "5s",
            "exponential-delay.backoff-multiplier": "2",
        }
    )
    strategy = ExponentialDelay(rc, random.Random(1))
    waits = []
    for failure in range(5):
        strategy.notify_failure(failure * SECOND)
        waits.append(strategy.backoff_ms())
    assert waits == [1000, 2000, 4000, 5000, 5000]


def test_exponential_delay_starts_over_after_the_reset_threshold() -> None:
    rc = config(
        **{
            "exponential-delay.jitter-factor": "0",
            "exponential-delay.reset-backoff-threshold": "10s",
        }
    )
    strategy = ExponentialDelay(rc, random.Random(1))
    strategy.notify_failure(0)
    strategy.notify_failure(1 * SECOND)
    assert strategy.backoff_ms() == 1500  # Flink's default multiplier 1.5
    strategy.notify_failure(1 * SECOND + 10 * SECOND + 1500)  # quiet for threshold + backoff
    assert strategy.backoff_ms() == 1000 and strategy.attempts == 1


def test_exponential_delay_gives_up_after_the_attempts_before_reset() -> None:
    rc = config(**{"exponential-delay.attempts-before-reset-backoff": "2"})
    strategy = ExponentialDelay(rc, random.Random(1))
    results = []
    for failure in range(3):
        strategy.notify_failure(failure * SECOND)
        results.append(strategy.can_restart())
    assert results == [True, True, False]


def test_jitter_moves_the_wait_by_at_most_its_share() -> None:
    rc = config(**{"exponential-delay.jitter-factor": "0.2"})
    waits = set()
    for seed in range(50):
        strategy = ExponentialDelay(rc, random.Random(seed))
        strategy.notify_failure(0)
        waits.add(strategy.backoff_ms())
    assert min(waits) >= 800 and max(waits) <= 1200 and len(waits) > 10


def test_flinks_spellings_and_the_old_key_are_understood() -> None:
    assert (
        RestartConfig.from_options({"restart-strategy": "fixeddelay"}).kind(True) == "fixed-delay"
    )
    assert config(**{"fixed-delay.attempts": "infinite"}).fixed_delay_attempts == 2**31 - 1
    assert isinstance(config(type="FAILURE-RATE").strategy(False), FailureRate)
    assert isinstance(config(type="fixed-delay").strategy(False), FixedDelay)


@pytest.mark.parametrize(
    "options",
    [
        {"restart-strategy.type": "sometimes"},
        {"restart-strategy.exponential-delay.backoff-multiplier": "0.5"},
        {"restart-strategy.exponential-delay.jitter-factor": "3"},
        {"restart-strategy.fixed-delay.attempts": "-1"},
    ],
)
def test_invalid_values_are_errors_naming_the_option(options: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as error:
        RestartConfig.from_options(options)
    assert error.value.field.startswith("restart-strategy")


def test_a_misspelled_key_suggests_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"did you mean restart-strategy\.fixed-delay\.attempts"):
        RestartConfig.from_options({"restart-strategy.fixed-delay.attempt": "3"})
