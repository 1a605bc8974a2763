"""``index_runs``: an index array split greedily into evenly spaced runs, one iteration per run."""

import numpy as np

from blrppl.symbolic.compiled import MAX_RUNS, index_runs


def greedy_runs(positions, limit=None):
    """The definition, position by position: a run extends while the step from its start holds."""
    runs, i = [], 0
    while i < positions.size and (limit is None or len(runs) <= limit):
        start = int(positions[i])
        step = int(positions[i + 1] - start) if i + 1 < positions.size else 1
        j = i + 1
        if step < 1:
            step = 1
        else:
            while j < positions.size and positions[j] - positions[j - 1] == step:
                j += 1
        runs.append((start, int(positions[j - 1]) + 1, step))
        i = j
    return runs


def test_runs_equal_the_greedy_definition():
    rng = np.random.default_rng(0)
    cases = [np.arange(10), np.array([3]), np.array([], int), np.array([0, 0, 1, 1]), np.array([5, 4, 3]),
             np.tile(np.arange(6), 3), np.concatenate([np.arange(0, 20, 2), np.arange(1, 20, 2)])]
    cases += [rng.integers(0, 5, rng.integers(1, 40)) for _ in range(300)]
    cases += [np.cumsum(rng.integers(0, 3, rng.integers(1, 60))) for _ in range(300)]
    for positions in cases:
        for limit in (None, 0, 1, MAX_RUNS):
            assert index_runs(positions, limit) == greedy_runs(positions, limit), (positions, limit)


def test_a_long_run_is_one_iteration():
    assert index_runs(np.arange(2_000_000), MAX_RUNS) == [(0, 2_000_000, 1)]
    assert len(index_runs(np.random.default_rng(1).integers(0, 9, 100_000), MAX_RUNS)) == MAX_RUNS + 1
