"""The q of one latent variable: a family laid out over the variable's value.

Mean-field over variables and over the plate positions of each variable; a
Gaussian keeps a full covariance over the remaining axes of its value (event
axes, and batch axes that no plate declares, such as ``expand([D])``
regression weights), so ``X @ beta`` gets the exact joint posterior of beta.

The symbolic machinery reads mean parameters in *value layout* (one array per
statistic, shaped like the value: ``x`` of shape ``batch + block``, ``xx`` of
shape ``batch + block + block``, ...; see :mod:`blrppl.symbolic`), while
families store them in their own layout (``MVNStats(x: (..., d), xxT:
(..., d, d))``). A family's :class:`Layout` converts both ways and turns
gradients with respect to value-layout mean parameters into natural
parameters (symmetrising matrix statistics). :class:`VariableQ` binds a
family to one variable's shapes; nothing here switches on family names.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from blrppl.families.base import ExpFamily


class Layout(NamedTuple):
    """How a family's statistics meet a variable's value layout.

    Every function takes the :class:`VariableQ` first (for its shapes).

    Attributes:
      to_value: ``(q, μ) -> dict`` of value-layout mean parameters.
      from_value: ``(q, grads) -> λ increment``: gradients of an expected log
        factor with respect to the value-layout mean parameters, as natural
        parameters in the family's layout.
      example: ``q -> λ``, a valid member with the right shapes, or None for
        families that start from their prior (``from_numpyro``).
      marginals: ``(q, μ) -> μ'``: the per-position Gaussian marginals that
        non-conjugate estimators work on (a chain's per-time blocks); the
        identity for ordinary families.
      from_marginals: ``(q, μ, ĝ') -> ĝ``: site parameters on those marginals
        back in the family's layout.
    """

    to_value: Callable
    from_value: Callable
    example: Any = None
    marginals: Callable = lambda q, mean: mean
    from_marginals: Callable = lambda q, mean, grad: grad


def symmetrize(matrix: jax.Array) -> jax.Array:
    """½ (M + Mᵀ) over the last two axes."""
    return 0.5 * (matrix + jnp.swapaxes(matrix, -1, -2))


def elementwise_layout(symmetric: tuple[str, ...] = ()) -> Layout:
    """The layout of families whose statistics already have the value's shape.

    Args:
      symmetric: statistic fields that are symmetric matrices (their
        gradients are symmetrised).
    """

    def to_value(q: "VariableQ", mean: Any) -> dict:
        return dict(mean._asdict())

    def from_value(q: "VariableQ", grads: dict) -> Any:
        fields = q.family.stats_type._fields
        out = {k: grads[k] for k in fields}
        for k in symmetric:
            out[k] = symmetrize(out[k])
        return q.family.stats_type(**out)

    return Layout(to_value, from_value)


@dataclasses.dataclass(frozen=True)
class VariableQ:
    """The q of one latent variable (static: the core closes over it).

    Attributes:
      name: the variable (site, chain or joint block) name.
      family: the exponential family of q (:class:`~blrppl.families.base.ExpFamily`).
      shape: the shape of q's values: the site's shape, or for a Gaussian on
        an unconstrained space the unconstrained shape (a joint block: the
        length of its flat vector).
      num_batch: leading axes of ``shape`` over which q factorises; the
        remaining axes form one block (for a chain family: the independent
        sequences; the block is then time and state).
      transform: numpyro transform from q's space to the site's support, or
        None when q lives on the support itself. A joint block's transform
        maps its flat vector to a dict of member site values.
      num_categories: K for an index-valued (categorical) variable, else 0.
      joint: True for a joint block over several sites (``blocks=[...]``).
    """

    name: str
    family: ExpFamily
    shape: tuple[int, ...]
    num_batch: int
    transform: Any = None
    num_categories: int = 0
    joint: bool = False

    @property
    def kind(self) -> str:
        """The family's symbolic kind (``"gaussian"``, ``"gamma"``, ...)."""
        return self.family.kind

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.shape[self.num_batch :]

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self.shape[: self.num_batch]

    def to_value_layout(self, mean: Any) -> dict:
        """Family mean parameters -> value-layout dict (module docstring)."""
        return self.family.layout.to_value(self, mean)

    def from_value_layout(self, grads: dict) -> Any:
        """Gradients in value layout -> natural-parameter increments (family layout)."""
        return self.family.layout.from_value(self, grads)

    def marginals(self, mean: Any) -> Any:
        """Per-position Gaussian marginals (a chain's per-time blocks), else ``mean``."""
        return self.family.layout.marginals(self, mean)

    def from_marginals(self, mean: Any, grad: Any) -> Any:
        """Site parameters on :meth:`marginals` back in the family's layout."""
        return self.family.layout.from_marginals(self, mean, grad)

    def example_natural(self) -> Any:
        """Natural parameters with the right shapes (a standard member)."""
        if self.family.layout.example is None:
            raise ValueError(f"{self.family.name} has no example member; start it from its prior.")
        return self.family.layout.example(self)

    def zeros(self) -> Any:
        """Natural parameters of zero (an empty site)."""
        return jax.tree.map(jnp.zeros_like, self.example_natural())

    def value_to_family(self, value: jax.Array) -> jax.Array:
        """A value of q's shape in the family's sample layout (blocks flattened)."""
        if self.family.event_ndim == 1 and len(self.block_shape) != 1 and not self.family.chain:
            return jnp.reshape(value, jnp.shape(value)[: jnp.ndim(value) - len(self.shape)] + self.batch_shape + (math.prod(self.block_shape),))
        return value

    def value_from_family(self, draws: jax.Array) -> jax.Array:
        """Family samples (leading sample axes) reshaped to q's value shape."""
        if self.family.event_ndim == 1 and len(self.block_shape) != 1 and not self.family.chain:
            lead = jnp.shape(draws)[: jnp.ndim(draws) - self.num_batch - 1]
            return jnp.reshape(draws, lead + self.shape)
        return draws
