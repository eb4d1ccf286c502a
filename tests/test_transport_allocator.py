"""The staging allocator alone: out-of-order release, coalescing, reclaim plans."""

import pytest

from transfer_strategies.transport.allocator import ALIGN, StagingAllocator


def test_regions_released_out_of_order_free_their_own_space():
    space = StagingAllocator(4 * ALIGN)
    a, b, c, d = (space.take(ALIGN) for _ in range(4))
    assert (a, b, c, d) == (0, ALIGN, 2 * ALIGN, 3 * ALIGN)
    assert space.take(1) is None
    space.give(c)  # the third region, while the others stay in flight
    assert space.take(ALIGN) == c
    space.give(a)
    assert space.take(2 * ALIGN) is None  # a's hole is one region wide
    assert space.take(ALIGN) == a


def test_neighbours_merge_into_one_extent_whatever_the_release_order():
    space = StagingAllocator(4 * ALIGN)
    a, b, c, d = (space.take(ALIGN) for _ in range(4))
    space.give(b)
    space.give(d)
    space.give(c)  # joins b and d on both sides
    assert space.take(3 * ALIGN) == b
    space.give(b)
    space.give(a)
    assert space.take(4 * ALIGN) == 0
    assert space.free_bytes == 0


def test_regions_are_aligned_and_lookups_find_the_holding_region():
    space = StagingAllocator(8 * ALIGN)
    a = space.take(1)
    b = space.take(ALIGN + 1)  # rounded up to two units
    c = space.take(ALIGN)
    assert (a, b, c) == (0, ALIGN, 3 * ALIGN)
    assert space.region_at(ALIGN + 300) == b
    assert space.region_at(5 * ALIGN) is None


def test_a_payload_larger_than_the_buffer_is_refused():
    with pytest.raises(ValueError):
        StagingAllocator(4 * ALIGN).take(4 * ALIGN + 1)


def test_plan_picks_the_cheapest_window_and_avoids_unreclaimable_regions():
    space = StagingAllocator(6 * ALIGN)
    regions = [space.take(ALIGN) for _ in range(6)]
    space.give(regions[4])  # free: [4]
    pinned = {regions[3]}
    plan = space.plan(2 * ALIGN, lambda r: r not in pinned)
    assert plan == [regions[5]]  # [4] is free already: one live region beside it is enough
    pinned = {regions[3], regions[5]}
    assert space.plan(2 * ALIGN, lambda r: r not in pinned) == [regions[0], regions[1]]
    assert space.plan(4 * ALIGN, lambda r: r not in pinned) is None  # no window of four avoids 3 and 5


def test_a_full_buffer_frees_up_after_the_planned_regions_are_released():
    space = StagingAllocator(4 * ALIGN)
    for _ in range(4):
        space.take(ALIGN)
    plan = space.plan(3 * ALIGN, lambda r: True)
    assert len(plan) == 3
    for r in plan:
        space.give(r)
    assert space.take(3 * ALIGN) == min(plan)
