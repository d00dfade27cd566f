"""The KV pool's size from the memory fraction: on a device that several scheduler processes
share (`--dp-size 2` on one GPU), each replica stays within its part of the device, whether the
replicas read the free memory at the same moment or one after the other."""

from __future__ import annotations

from radixgen.runtime.model_executor.kv_sizing import kv_budget_bytes

GIB = 1 << 30
TOTAL = 140 * GIB
WEIGHTS = GIB // 4
FRACTION = 0.88


def test_one_process_takes_the_fraction_of_what_is_free():
    free = TOTAL - WEIGHTS
    assert kv_budget_bytes(free, TOTAL, FRACTION, 1) == free * FRACTION


def test_two_replicas_reading_at_once_fit_the_device_together():
    """Both read the free memory before either pool is in (they start in parallel)."""
    free = TOTAL - 2 * WEIGHTS
    a = kv_budget_bytes(free, TOTAL, FRACTION, 2)
    b = kv_budget_bytes(free, TOTAL, FRACTION, 2)
    assert a + b + 2 * WEIGHTS <= TOTAL
    assert a == b > 0.4 * TOTAL  # each keeps most of its half


def test_two_replicas_one_after_the_other_get_equal_pools():
    free = TOTAL - 2 * WEIGHTS
    a = kv_budget_bytes(free, TOTAL, FRACTION, 2)
    b = kv_budget_bytes(free - a, TOTAL, FRACTION, 2)
    assert a + b + 2 * WEIGHTS <= TOTAL
    assert b == a


def test_a_busy_device_gives_what_is_free_not_the_share():
    free = 10 * GIB
    assert kv_budget_bytes(free, TOTAL, FRACTION, 2) == free * FRACTION
