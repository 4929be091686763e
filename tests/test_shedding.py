"""The connection table's shedding order (t3d/api/shedding.py), a pure core."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from t3d.api.shedding import ConnectionTable, Standing


def test_exposed_go_first_then_idle_and_protected_never() -> None:
    """Shedding takes the exposed slots oldest first, then the idle ones; protected slots stay."""
    table: ConnectionTable[str] = ConnectionTable()
    slots = {name: table.add(name) for name in ("a", "b", "c", "d", "e")}
    slots["a"].stand(Standing.PROTECTED)
    slots["b"].stand(Standing.IDLE)
    slots["c"].stand(Standing.IDLE)
    # d and e stay exposed; d moves to the back of its queue by standing again.
    slots["d"].stand(Standing.EXPOSED)
    assert [table.shed_one() for _ in range(5)] == ["e", "d", "b", "c", None]
    assert len(table) == 1
    assert table.shed_total == 4
    assert slots["a"].open and not slots["e"].open


def test_a_slot_leaves_once() -> None:
    """leave() reports whether the slot was still in the table; a shed slot has left, and
    standing it again changes nothing."""
    table: ConnectionTable[int] = ConnectionTable()
    slot = table.add(1)
    assert table.shed_one() == 1
    assert not slot.leave()
    slot.stand(Standing.IDLE)
    assert slot.standing is None
    assert len(table) == 0
    other = table.add(2)
    assert other.leave()
    assert not other.leave()
    assert table.shed_one() is None


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 0)),
        st.tuples(st.sampled_from(list(Standing)), st.integers(0, 30)),
        st.tuples(st.just("leave"), st.integers(0, 30)),
        st.tuples(st.just("shed"), st.integers(0, 0)),
    ),
    max_size=80,
)


@given(_ops)
def test_shedding_matches_a_model(ops: list[tuple[object, int]]) -> None:
    """Against a plain model (each slot's standing and when it last changed): shed_one
    returns the exposed slot that changed longest ago, else such an idle one, else None."""
    table: ConnectionTable[int] = ConnectionTable()
    slots = []
    model: dict[int, tuple[Standing, int]] = {}  # slot id -> (standing, time of last change)
    for clock, (op, index) in enumerate(ops):
        if op == "add":
            slots.append(table.add(len(slots)))
            model[len(slots) - 1] = (Standing.EXPOSED, clock)
        elif op == "shed":
            candidates = [
                (rank, since, key)
                for key, (standing, since) in model.items()
                for rank, wanted in enumerate((Standing.EXPOSED, Standing.IDLE))
                if standing is wanted
            ]
            expected = min(candidates)[2] if candidates else None
            assert table.shed_one() == expected
            if expected is not None:
                del model[expected]
        elif slots:
            key = index % len(slots)
            if op == "leave":
                assert slots[key].leave() == (key in model)
                model.pop(key, None)
            else:
                assert isinstance(op, Standing)
                slots[key].stand(op)
                if key in model:
                    model[key] = (op, clock)
        assert len(table) == len(model)
        for standing in Standing:
            assert table.count(standing) == sum(1 for s, _ in model.values() if s is standing)
