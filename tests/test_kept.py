"""The bounded memo the simulator keeps what it makes again and again in."""

from gpipe_sim.kept import Kept


def test_a_value_is_made_once_and_the_oldest_forgotten_first():
    made = []
    kept: Kept[str] = Kept(2)

    def make(key):
        return lambda: made.append(key) or f"value {key}"

    assert kept.get("a", make("a")) == "value a" and kept.get("a", make("a")) == "value a"
    kept.get("b", make("b"))
    kept.get("c", make("c"))  # over the size: "a", the first kept, is forgotten
    assert len(kept) == 2
    kept.get("b", make("b"))
    kept.get("a", make("a"))
    assert made == ["a", "b", "c", "a"]


def test_an_unhashable_key_is_made_each_time_and_never_kept():
    made = []
    kept: Kept[int] = Kept(4)
    for _ in range(3):
        assert kept.get(("ops", [1, 2]), lambda: made.append(1) or 7) == 7
    assert made == [1, 1, 1] and len(kept) == 0
