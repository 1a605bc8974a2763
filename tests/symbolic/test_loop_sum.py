"""A loop chain's joined factor is analysed in time that grows with its length, not its square.

The sites of a Python-loop chain (one ``numpyro.sample`` per step) are joined into one
factor whose per-site densities the analysis sums. A running sum normalised every term
gathered so far at each site: O(T^2) term normalisations (half of planning a 400-step
loop). Summed pairwise, doubling T about doubles them.
"""

import blrppl
from blrppl.symbolic import algebra
from models import hmm_markov


def test_doubling_a_loop_about_doubles_the_terms_normalised(monkeypatch):
    count = [0]
    original = algebra.normalize_term

    def counted(term):
        count[0] += 1
        return original(term)

    monkeypatch.setattr(algebra, "normalize_term", counted)

    def normalised(num_steps: int) -> int:
        args, kwargs = hmm_markov.data(num_sequences=3, num_steps=num_steps)
        count[0] = 0
        blrppl.VMP(hmm_markov.model).plan(*args, **kwargs)
        return count[0]

    short, long = normalised(32), normalised(64)
    assert long < 2.5 * short, (short, long)  # a running sum: 3.3x (5,669 -> 18,453)
