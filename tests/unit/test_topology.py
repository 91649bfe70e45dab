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


def _from_edges(world: int, edges: dict[int, list[int]], weight: float) -> torch.Tensor:
    w = torch.zeros(world, world, dtype=torch.float64)
    for i, nbrs in edges.items():
        for j in nbrs:
            w[i, j] = weight
        w[i, i] = 1 - weight * len(nbrs)
    return w


def test_torus_3x3_weights_written_out():
    # 0 1 2 / 3 4 5 / 6 7 8, wrapping both ways: every node has 4 neighbours, so 1/5 each and 1/5 self
    edges = {0: [1, 2, 3, 6], 1: [0, 2, 4, 7], 2: [0, 1, 5, 8], 3: [0, 4, 5, 6], 4: [1, 3, 5, 7],
             5: [2, 3, 4, 8], 6: [0, 3, 7, 8], 7: [1, 4, 6, 8], 8: [2, 5, 6, 7]}
    torch.testing.assert_close(mixing_matrix("torus", 9), _from_edges(9, edges, 1 / 5), rtol=0, atol=1e-15)


def test_torus_2x3_weights_written_out():
    # 0 1 2 / 3 4 5: the two rows are each other's up and down neighbour, so 3 neighbours: 1/4 each
    edges = {0: [1, 2, 3], 1: [0, 2, 4], 2: [0, 1, 5], 3: [0, 4, 5], 4: [1, 3, 5], 5: [2, 3, 4]}
    torch.testing.assert_close(mixing_matrix("torus", 6), _from_edges(6, edges, 1 / 4), rtol=0, atol=1e-15)


@pytest.mark.parametrize("world", [2, 4, 5])
def test_complete_graph_weights_are_one_over_k_everywhere(world):
    expected = torch.full((world, world), 1 / world, dtype=torch.float64)
    torch.testing.assert_close(mixing_matrix("complete", world), expected, rtol=0, atol=1e-15)


def test_ring_4_written_out():
    expected = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1]], dtype=torch.float64) / 3
    torch.testing.assert_close(mixing_matrix("ring", 4), expected, rtol=0, atol=1e-15)
