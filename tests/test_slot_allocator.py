"""The one slot allocator every row kind keeps its rows' device state in."""
import pytest

from engine.runner.slots import SlotAllocator


def test_a_joining_row_takes_the_lowest_free_slot():
    slots = SlotAllocator(4)
    assert [slots.take(name) for name in "abc"] == [0, 1, 2]
    slots.give_back(1)
    assert slots.take("d") == 1 and slots.holder(1) == "d"
    assert slots.num_free == 1


def test_packing_moves_a_holder_into_a_free_slot_and_swaps_two_holders():
    slots = SlotAllocator(3)
    slots.take("a"), slots.take("b"), slots.take("c")
    slots.give_back(0)
    slots.move(2, 0)
    assert (slots.holder(0), slots.holder(2), slots.take("d")) == ("c", None, 2)
    slots.swap(0, 1)
    assert (slots.holder(0), slots.holder(1)) == ("b", "c")


def test_taking_a_slot_when_none_is_free_names_the_cause():
    slots = SlotAllocator(1)
    slots.take("a")
    with pytest.raises(RuntimeError, match="all 1 are held"):
        slots.take("b")
