"""Node reasons (slurm_spot/slurm/reasons.py): what each builder writes, the parsers read back
as slurm-spot's own, so the reconciler may replace it and never mistakes it for an admin's."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from slurm_spot.slurm.reasons import (
    MAX_REASON_CHARS,
    breaker_reason,
    cooldown_reason,
    interruption_reason,
    is_clearable,
    is_ours,
    kill_task_failed_reason,
    launch_failure_reason,
    lost_while_booting_reason,
    low_memory_of,
    low_memory_reason,
    parse_cooldown,
    parse_interruption,
    reason_code,
)

WHEN = datetime(2026, 3, 1, 8, 0, 0, tzinfo=timezone.utc)
# The same instant seen from UTC+2: reasons are written in UTC whatever the input's zone.
WHEN_ELSEWHERE = WHEN.astimezone(timezone(timedelta(hours=2)))


@pytest.mark.parametrize("reason", [
    interruption_reason("terminate", WHEN),
    interruption_reason("rebalance", WHEN_ELSEWHERE),
    interruption_reason("reclaimed", WHEN),
    lost_while_booting_reason(WHEN),
    kill_task_failed_reason(WHEN),
    breaker_reason(3, 600, "(Code:InsufficientInstanceCapacity)no capacity"),
    breaker_reason(3, 600.5, ""),
    launch_failure_reason("VcpuLimitExceeded", "quota: job 7 needs 192 vCPU\nmore than 96"),
    cooldown_reason("ZONE_RESOURCE_POOL_EXHAUSTED", WHEN),
])
def test_every_reason_slurm_spot_writes_reads_back_as_its_own(reason: str) -> None:
    assert is_ours(reason), reason
    assert is_clearable(reason)
    assert "\n" not in reason and len(reason) <= MAX_REASON_CHARS


def test_interruption_reason_parses_back_to_its_action_and_utc_time() -> None:
    assert interruption_reason("rebalance", WHEN_ELSEWHERE) == \
        "spot-interruption:rebalance@2026-03-01T08:00:00Z"
    assert parse_interruption(interruption_reason("preempted", WHEN)) == ("preempted", WHEN)
    # An admin's reason that merely starts like one is not an interruption of slurm-spot's.
    assert parse_interruption("spot-interruption: check GPU 3") is None
    assert not is_ours("spot-interruption: check GPU 3")
    with pytest.raises(ValueError, match="lowercase word"):
        interruption_reason("Terminate now", WHEN)


def test_launch_failure_and_cooldown_reasons_parse_back_to_their_code() -> None:
    reason = launch_failure_reason("InsufficientInstanceCapacity", "no  capacity\nin us-east-1a")
    assert reason == "(Code:InsufficientInstanceCapacity)no capacity in us-east-1a"
    assert reason_code(reason) == "InsufficientInstanceCapacity"
    assert len(launch_failure_reason("Quota", "x" * 500)) == MAX_REASON_CHARS
    cooldown = cooldown_reason("ZONE_RESOURCE_POOL_EXHAUSTED", WHEN_ELSEWHERE)
    assert parse_cooldown(cooldown) == ("ZONE_RESOURCE_POOL_EXHAUSTED", WHEN)
    assert reason_code(cooldown) == "ZONE_RESOURCE_POOL_EXHAUSTED"


def test_breaker_reason_keeps_the_last_failure_within_the_length_limit() -> None:
    reason = breaker_reason(5, 900, "(Code:X)" + "y" * 300)
    assert reason.startswith("slurm-spot:circuit-breaker: 5 resume failures within 900 s, "
                             "last: (Code:X)yyy")
    assert len(reason) == MAX_REASON_CHARS
    assert breaker_reason(1, 60, "").endswith("last: no reason")


def test_low_memory_reason_is_deliberately_an_admins_until_the_config_is_fixed() -> None:
    """The node stays drained (not ours, not clearable): powering it up again would only
    repeat slurmctld's drain. slurmctld's own Low RealMemory reason parses to its numbers."""
    reason = low_memory_reason(15000, 16000)
    assert not is_ours(reason) and not is_clearable(reason)
    assert low_memory_of("Low RealMemory (reported:15000 < 100.00% of configured:16000)") == \
        (15000, 16000)


@pytest.mark.parametrize("action,written", [("terminate", "terminate"), ("Stop", "stop"),
                                            ("hibernate", "hibernate"),
                                            ("x JobState=COMPLETED", "unknown"), ("", "unknown")])
def test_a_providers_notice_writes_a_reason_that_reads_back_as_ours(action: str,
                                                                     written: str) -> None:
    from slurm_spot.providers.notices import Notice

    reason = Notice(action, WHEN_ELSEWHERE, "imds").reason
    assert reason == f"spot-interruption:{written}@2026-03-01T08:00:00Z"
    assert parse_interruption(reason) == (written, WHEN)
    assert is_ours(reason)


def test_a_launch_failures_reason_is_the_builders_one_line() -> None:
    from slurm_spot.providers.base import ErrorClass, LaunchFailure

    failure = LaunchFailure(nodes=("spot-1",), code="InsufficientInstanceCapacity",
                            message="no capacity\nin us-east-1a " + "x" * 300,
                            error_class=ErrorClass.CAPACITY)
    assert failure.reason == launch_failure_reason(failure.code, failure.message)
    assert failure.reason.startswith("(Code:InsufficientInstanceCapacity)no capacity in")
    assert len(failure.reason) == MAX_REASON_CHARS and "\n" not in failure.reason
    assert reason_code(failure.reason) == "InsufficientInstanceCapacity"
