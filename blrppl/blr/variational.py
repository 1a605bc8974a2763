"""The q of each latent variable: its family, its block structure and its layout.

Mean-field over variables and over the plate positions of each variable; a
Gaussian keeps a full covariance over the remaining axes of its value (event
axes, and batch axes that no plate declares, such as ``expand([D])``
regression weights), so ``X @ beta`` gets the exact joint posterior of beta.
A ``"DiagonalNormal"`` override makes every axis independent.

The symbolic machinery reads mean parameters in *value layout*
(:mod:`blrppl.symbolic.expectation`); families store them flat
(``MVNStats(x: (..., d), xxT: (..., d, d))``). :class:`VariableQ` converts both
ways, and turns gradients with respect to mean parameters into natural
parameters (symmetrising matrix statistics).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import jax
import jax.numpy as jnp

from blrppl.families import (
    BERNOULLI,
    CHAIN_GAUSSIAN,
    CHAIN_GAUSSIAN_PARALLEL,
    SCALAR_CHAIN_GAUSSIAN,
    SCALAR_CHAIN_GAUSSIAN_PARALLEL,
    BETA,
    CATEGORICAL,
    DIRICHLET,
    GAMMA,
    INVERSE_GAMMA,
    MULTIVARIATE_NORMAL,
    NORMAL,
    WISHART,
    ExpFamily,
    MVNStats,
    NormalStats,
)
from blrppl.errors import ModelError
from blrppl.families import CHAIN_CATEGORICAL as CHAIN_CATEGORICAL_FAMILY
from blrppl.symbolic.expectation import CHAIN, CHAIN_CATEGORICAL, GAUSSIAN, VarInfo

_KINDS = {
    "Gamma": (GAMMA, "gamma"),
    "InverseGamma": (INVERSE_GAMMA, "inverse_gamma"),
    "Beta": (BETA, "beta"),
    "Dirichlet": (DIRICHLET, "dirichlet"),
    "Categorical": (CATEGORICAL, "categorical"),
    "Bernoulli": (BERNOULLI, "bernoulli"),
    "Wishart": (WISHART, "wishart"),
}
_GAUSSIANS = ("Normal", "MultivariateNormal", "DiagonalNormal")


@dataclasses.dataclass(frozen=True)
class VariableQ:
    """The q of one latent variable (static: engines close over it).

    Attributes:
      name: the variable (site) name.
      family: the exponential family of q.
      kind: the symbolic kind (``"gaussian"``, ``"gamma"``, ...).
      shape: the shape of q's values: the site's shape, or for a Gaussian on
        an unconstrained space, the unconstrained shape.
      num_batch: leading axes of ``shape`` over which q factorises.
      transform: numpyro transform from q's space to the site's support, or
        None when q lives on the support itself.
      num_categories: K for a categorical variable, else 0.
    """

    name: str
    family: ExpFamily
    kind: str
    shape: tuple[int, ...]
    num_batch: int
    transform: Any = None
    num_categories: int = 0

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.shape[self.num_batch :]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.shape[: self.num_batch]

    @property
    def info(self) -> VarInfo:
        shape = self.shape
        if self.kind == "categorical":
            return VarInfo("categorical", shape, len(shape), self.num_categories)
        if self.kind == CHAIN_CATEGORICAL:
            return VarInfo(CHAIN_CATEGORICAL, shape, 1, self.num_categories)
        return VarInfo(self.kind, shape, self.num_batch)

    # -- layouts --------------------------------------------------------------

    def to_value_layout(self, mean: Any) -> dict:
        """Family mean parameters -> value-layout dict (see the module docstring)."""
        if self.kind == CHAIN:
            return dict(mean._asdict())
        if self.kind != GAUSSIAN:
            return dict(mean._asdict())
        if self.family is NORMAL or isinstance(mean, NormalStats):
            return {"x": jnp.reshape(mean.x, self.shape), "xx": jnp.reshape(mean.x_sq, self.shape)}
        block = self.block_shape
        return {
            "x": jnp.reshape(mean.x, self.shape),
            "xx": jnp.reshape(mean.xxT, self.shape + block),
        }

    def from_value_layout(self, grads: dict) -> Any:
        """Gradients in value layout -> natural-parameter increments (family layout)."""
        if self.kind == CHAIN:
            xx = grads["xx"] if jnp.ndim(grads["xx"]) == 1 else _symmetrize(grads["xx"])
            return self.family.stats_type(x=grads["x"], xx=xx, x_next=grads["x_next"])
        if self.kind != GAUSSIAN:
            out = self.family.stats_type(**{k: grads[k] for k in self.family.stats_type._fields})
            if self.kind == "wishart":
                out = out._replace(x=_symmetrize(out.x))
            return out
        if self.family is NORMAL:
            return NormalStats(x=grads["x"], x_sq=grads["xx"])
        d = math.prod(self.block_shape)
        batch = self.batch_shape
        xxT = jnp.reshape(grads["xx"], batch + (d, d))
        return MVNStats(x=jnp.reshape(grads["x"], batch + (d,)), xxT=_symmetrize(xxT))

    def zeros(self) -> Any:
        """Natural parameters of zero (an empty site)."""
        example = self.example_natural()
        return jax.tree.map(jnp.zeros_like, example)

    def example_natural(self) -> Any:
        """Natural parameters with the right shapes (a standard member)."""
        if self.kind == CHAIN_CATEGORICAL:
            length, k = self.shape[0], self.num_categories
            return self.family.stats_type(one_hot=jnp.zeros((length, k)), pair=jnp.zeros((length - 1, k, k)))
        if self.kind == CHAIN:
            length, state = self.shape[0], self.shape[1:]
            if not state:
                return self.family.stats_type(
                    x=jnp.zeros((length,)), xx=jnp.full((length,), -0.5), x_next=jnp.zeros((length - 1,))
                )
            d = state[0]
            return self.family.stats_type(
                x=jnp.zeros((length, d)),
                xx=-0.5 * jnp.broadcast_to(jnp.eye(d), (length, d, d)),
                x_next=jnp.zeros((length - 1, d, d)),
            )
        if self.kind == GAUSSIAN:
            if self.family is NORMAL:
                return NormalStats(x=jnp.zeros(self.shape), x_sq=jnp.full(self.shape, -0.5))
            d = math.prod(self.block_shape)
            eye = jnp.broadcast_to(jnp.eye(d), self.batch_shape + (d, d))
            return MVNStats(x=jnp.zeros(self.batch_shape + (d,)), xxT=-0.5 * eye)
        raise ValueError(f"no example natural parameters for {self.family.name}")


def _symmetrize(matrix: jax.Array) -> jax.Array:
    return 0.5 * (matrix + jnp.swapaxes(matrix, -1, -2))


def variable_q(node: Any, plates: dict, family_override: Optional[str] = None) -> VariableQ:
    """Build the :class:`VariableQ` of a graph variable node.

    Args:
      node: a :class:`~blrppl.graph.nodes.VariableNode`.
      plates: the graph's plates (name -> Plate), to tell plate axes apart.
      family_override: a family name that replaces ``node.family``.
    """
    name = family_override or node.family
    if name in ("ChainGaussian", "ChainGaussianParallel"):
        # "ChainGaussianParallel": the same q, its passes by associative scan (O(log T) depth).
        state = tuple(node.chain.state_shape) if node.chain is not None else tuple(node.shape[1:])
        if node.chain is not None and node.chain.time_axis != 0:
            raise ModelError(
                f"site {node.name!r}: {math.prod(node.shape[: node.chain.time_axis])} chains side by side "
                f"(batch shape {tuple(node.shape[: node.chain.time_axis])} before the time axis) are not "
                "supported; fit one chain per model, or stack the series into the state vector of one chain."
            )
        if node.transform is not None or len(state) > 1:
            raise ModelError(
                f"site {node.name!r}: a chain with states of shape {state} on a transformed space is not "
                "supported; write each state as a vector (time first), on the real line."
            )
        if name == "ChainGaussianParallel":
            family = SCALAR_CHAIN_GAUSSIAN_PARALLEL if not state else CHAIN_GAUSSIAN_PARALLEL
        else:
            family = SCALAR_CHAIN_GAUSSIAN if not state else CHAIN_GAUSSIAN
        return VariableQ(node.name, family, CHAIN, tuple(node.shape), 1)
    if name == "ChainCategorical":
        return _chain_categorical_q(node)
    transform = node.transform
    shape = tuple(node.shape)
    if transform is not None:
        shape = tuple(transform.inverse_shape(shape))
    if name in _GAUSSIANS:
        batch_ndim = len(node.batch_shape)
        plate_axes = [
            batch_ndim + plates[p].dim for p in node.plates if p in plates and -plates[p].dim <= batch_ndim
        ]
        num_batch = (max(plate_axes) + 1) if plate_axes else 0
        if name == "DiagonalNormal":
            num_batch = len(shape)
        num_batch = min(num_batch, len(shape))
        family = NORMAL if num_batch == len(shape) else MULTIVARIATE_NORMAL
        if len(shape) - num_batch > 1:
            raise ModelError(
                f"site {node.name!r}: a Gaussian q over {len(shape) - num_batch} joint axes "
                f"{shape[num_batch:]} is not supported; declare the leading axes with "
                "numpyro.plate or use families={site: 'DiagonalNormal'}."
            )
        return VariableQ(node.name, family, GAUSSIAN, shape, num_batch, transform)
    if name not in _KINDS:
        raise ModelError(
            f"site {node.name!r}: the q family {name!r} is not available in this engine yet; "
            "choose a conjugate family for the site."
        )
    family, kind = _KINDS[name]
    if kind == "categorical":
        num_categories = _num_categories(node)
        return VariableQ(node.name, family, kind, shape, len(shape), transform, num_categories)
    return VariableQ(node.name, family, kind, shape, len(shape) - family.event_ndim, transform)


def _chain_categorical_q(node: Any) -> VariableQ:
    """The q of a discrete chain (an HMM's states): time on axis 0, scalar states."""
    chain = node.chain
    state = tuple(chain.state_shape) if chain is not None else tuple(node.shape[1:])
    if state or (chain is not None and chain.time_axis != 0):
        raise ModelError(
            f"site {node.name!r}: a discrete chain with states of shape {state} (several chains "
            "side by side, or time on another axis) is not supported yet; write one scalar state "
            "per scan step (a separate model per sequence)."
        )
    if node.shape[0] < 2:
        raise ModelError(
            f"site {node.name!r}: a discrete chain of length {node.shape[0]} has no transitions; "
            "sample the state as an ordinary Categorical site."
        )
    num_categories = _num_categories(node)
    return VariableQ(node.name, CHAIN_CATEGORICAL_FAMILY, CHAIN_CATEGORICAL, tuple(node.shape), 1, None, num_categories)


def _num_categories(node: Any) -> int:
    support = node.support
    upper = getattr(support, "upper_bound", None)
    if upper is None:
        prior = node.prior
        while hasattr(prior, "base_dist"):
            prior = prior.base_dist
        probs = getattr(prior, "probs", None)
        if probs is None:
            probs = getattr(prior, "logits")
        return int(jnp.shape(probs)[-1])
    return int(jnp.max(jnp.asarray(upper))) + 1
