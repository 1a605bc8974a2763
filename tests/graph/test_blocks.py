"""Joint blocks: the factors of joined sites remember which members they read."""

import numpyro
import numpyro.distributions as dist

from blrppl.graph.blocks import as_blocks
from blrppl.graph.trace import build_graph
from models import ZOO


def test_a_factor_of_a_block_keeps_the_members_it_reads():
    # Block-hybrid site parameters integrate the transformed members a factor reads: read off
    # the trace (was a compiled gradient probe per factor, 0.2-0.4 s each on UCBadmit).
    entry = ZOO["eight_schools_noncentered"]
    args, kwargs = entry.data()
    graph = as_blocks(build_graph(entry.model, args, kwargs), [("mu", "tau", "theta_raw")])
    factors = graph.factors
    assert factors["y"].neighbours == ("mu+tau+theta_raw",)
    assert set(factors["y"].block_members) == {"mu", "tau", "theta_raw"}
    assert factors["tau"].block_members == ("tau",)
    assert factors["theta_raw"].block_members == ("theta_raw",)

    def lone(y=None):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        b = numpyro.sample("b", dist.HalfNormal(1.0))
        numpyro.sample("c", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(a, b), obs=y)

    graph = as_blocks(build_graph(lone, (), {"y": 0.3}), [("a", "b")])
    assert graph.factors["y"].block_members == ("a", "b") and graph.factors["c"].block_members == ()
