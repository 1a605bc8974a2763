"""Label substitutions of constant operands: a gather along labels the array already has
reads their diagonal directly, never the crossed array.

A masked step of an HMM over (time, sequence) gathered a (T, N, T, N, D) operand into a
(T, N, D, T, N, T, N) array before taking its diagonal: 2 GB and 4 s of planning at
T = 24, N = 16 (numpyro's ``hmm_enum`` example, written as there).
"""

import numpy as np

from blrppl.symbolic.terms import Labels, Substitution, substitute_array
from blrppl.symbolic import terms


def test_a_gather_along_a_label_the_array_has_reads_the_diagonal():
    rng = np.random.default_rng(0)
    space = Labels()
    t, n = space.new(5), space.new(4)
    array = rng.normal(size=(5, 4, 3, 2))  # labels (t, n, x, d)
    positions = rng.integers(0, 3, size=(5, 4))  # x read at a position per (t, n)
    taken, labels = terms._gather_axis(array, [t, n, "x", "d"], "x", Substitution((t, n), positions))
    assert taken.shape == (5, 4, 2) and labels == [t, n, "d"]  # not (5, 4, 5, 4, 2)
    reference = np.take_along_axis(array, positions[:, :, None, None], axis=2)[:, :, 0]
    np.testing.assert_array_equal(taken, reference)


def test_a_broadcast_axis_is_read_at_its_one_position():
    rng = np.random.default_rng(1)
    space = Labels()
    t, n = space.new(5), space.new(4)
    array = rng.normal(size=(1, 4, 3))  # labels (t, n, x): constant along t
    positions = rng.integers(0, 3, size=(5, 4))
    taken, labels = terms._gather_axis(array, [t, n, "x"], "x", Substitution((t, n), positions))
    assert taken.shape == (5, 4) and labels == [t, n]
    np.testing.assert_array_equal(taken, array[0][np.arange(4)[None, :], positions])


def test_simultaneous_substitutions_agree_with_numpy_indexing():
    rng = np.random.default_rng(2)
    space = Labels()
    a, b, c = (space.new(k) for k in (6, 4, 3))
    first, second = rng.integers(0, 4, size=(6,)), rng.integers(0, 5, size=(6, 3))
    array = rng.normal(size=(4, 5, 3))  # labels (a, b, c)
    subs = {a: Substitution((a,), first), b: Substitution((a, c), second)}
    out, labels = substitute_array(array, (a, b, c), subs)
    reference = array[first[:, None], second, np.arange(3)[None, :]]  # (a, c)
    order = [labels.index(lab) for lab in (a, c)]
    np.testing.assert_array_equal(np.transpose(out, order), reference)
