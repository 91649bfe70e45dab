"""Mixing matrices: symmetric, doubly stochastic, supported on the graph."""

import pytest
import torch

from lowband.comm.topology import mixing_matrix, neighbours, torus_shape
from lowband.errors import ConfigError


@pytest.mark.parametrize("name, world", [("ring", 2), ("ring", 3), ("ring", 8), ("torus", 4), ("torus", 9),
                                         ("torus", 12), ("complete", 2), ("complete", 5)])
def test_symmetric_doubly_stochastic_on_edges(name, world):
    w = mixing_matrix(name, world)
    assert w.dtype == torch.float64 and w.shape == (world, world)
    torch.testing.assert_close(w, w.T)
    torch.testing.assert_close(w.sum(0), torch.ones(world, dtype=torch.float64))
    torch.testing.assert_close(w.sum(1), torch.ones(world, dtype=torch.float64))
    assert (w >= 0).all()
    for i in range(world):
        support = {j for j in range(world) if w[i, j] != 0} - {i}
        assert support == set(neighbours(name, i, world))


def test_ring_weights_are_one_third():
    w = mixing_matrix("ring", 6)
    assert [float(w[2, j]) for j in (1, 2, 3)] == pytest.approx([1 / 3] * 3) and w[2, 4] == 0


def test_torus_neighbours():
    assert torus_shape(12) == (3, 4)
    assert neighbours("torus", 5, 12) == [1, 4, 6, 9]  # row 1, col 1 of a 3 x 4 grid


@pytest.mark.parametrize("name, world, fragment", [("torus", 7, "cannot form a torus"), ("star", 4, "ring, torus")])
def test_impossible_topologies_name_the_field(name, world, fragment):
    with pytest.raises(ConfigError) as e:
        mixing_matrix(name, world)
    assert e.value.field == "method.topology" and fragment in str(e.value)
