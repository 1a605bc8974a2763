"""How blrppl's programs are compiled: quickly where the data are small, optimised elsewhere.

On XLA:CPU most of a small model's first call is compilation: the VMP loop
of a linear regression on 100 rows compiles for 2.3-2.9 s and then runs a
step in 0.1 ms. Without XLA:CPU's fusion emitters and at LLVM optimisation
level 0 (``FAST_CPU_OPTIONS``) the same program compiles in 0.8 s and runs
1.5-3x slower: a good trade where a step costs microseconds, not where it
costs milliseconds (a Kalman smoother over 100,000 steps, an HMM over
10,000). So the driver's programs (start, step loop, restarts, compiled
planner), ``Integrated``'s grid and q's samplers take the cheap settings
when their data are small: at most ``SMALL_DATA_BYTES`` of arrays, on a CPU.
Programs that run
once per fit (starts, the posterior's distributions) take the cheap settings
up to ``ONE_SHOT_BYTES``. Larger data on a CPU compile with ``BALANCED_CPU_OPTIONS``
(XLA's defaults less the fusion emitters, at LLVM level 2: compiled sooner, run about
as fast), accelerators with XLA's defaults. A step loop over larger data still takes the cheap settings where its
run is short: its count of operations per step (:func:`blrppl.flops.jaxpr_flops`,
on the traced program, by XLA's conventions) times the steps asked for is within
``LOOP_FLOP_BUDGET`` (a hierarchical GLM on a thousand rows, 200 steps; not a
chain's loop, whose passes over its length the count sees once). The choice depends only on the data's shapes,
the device and that step count (rounded up to a power of two), so a fit is
reproducible bit for bit. Planning's evaluations of the
model's code run as one program each (:func:`probe`) or not at all
(:func:`structure_of`), not as one compiled program per ``jnp`` operation.
The two compilations round differently (level 0 fuses no multiply-adds):
converged fits agree to 1e-10, and checks must not rely on the rounding of
a diverging fit (:func:`blrppl.blr.checks.erratic`).

``set_compile_mode("optimized")`` (or ``BLRPPL_COMPILE_MODE=optimized`` in the
environment) always takes XLA's defaults, ``"fast"`` always the cheap
settings on a CPU, ``"auto"`` (the default) chooses by size as above (cheap or balanced
on a CPU).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import jax
import numpy as np

from blrppl.flops import jaxpr_flops

FAST_CPU_OPTIONS = {
    "xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0, "xla_cpu_parallel_codegen_split_count": 1,
}
"""XLA:CPU compiler options that trade run time for compile time (2-4x less compile time
on blrppl's programs; the fusion emitters alone give 1.3-1.8x, the optimisation level most of the rest).
Both sets compile a program as one LLVM module (``xla_cpu_parallel_codegen_split_count``: XLA:CPU
splits it into parts compiled by a thread pool, whose repeated work costs more CPU than the threads
save where two programs already compile side by side on 2 cores: the starts and loops of eight
schools, radon, the HMM, a linear regression and the Nile compile with 10-30% less CPU, first
calls' CPU 5-15% less, run times unchanged). Only those that the installed XLA:CPU knows are
passed (:func:`fast_cpu_options`)."""

BALANCED_CPU_OPTIONS = {
    "xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 2, "xla_cpu_parallel_codegen_split_count": 1,
}
"""XLA:CPU compiler options for larger data in mode "auto": XLA's defaults without its fusion
emitters and at LLVM level 2, which compile a program 1.3-1.9x sooner and run it at about
the same speed (measured on 2 cores: the logistic regression on 100,000 rows, first call
2.25 -> 1.73 s and its fit 307 -> 351 ms; the mixture on 100,000 points 3.83 -> 3.37 s,
fit 0.94 -> 0.98 s; a Kalman smoother's ConjugateBayes run over 100,000 steps and HMM EM
over 10,000 as fast or faster; the Bayesian neural network's IVON run 3.4 -> 2.7 s first,
1.1 -> 0.8 s second). Mode "optimized" keeps XLA's defaults; accelerators always do."""

SMALL_DATA_BYTES = 1 << 16
"""Data of at most this many bytes (8,192 float64 numbers) compile with ``FAST_CPU_OPTIONS`` in mode "auto"."""

LOOP_FLOP_BUDGET = 2e9
"""A step loop over more data than ``SMALL_DATA_BYTES`` still compiles with ``FAST_CPU_OPTIONS``
when its estimated work, the floating-point operations of a step (:func:`blrppl.flops.jaxpr_flops`:
within 0.7-1.9x of XLA's own cost analysis on the zoo's loops, which it replaced: that
lowered the program once more, 0.1-0.15 s of a first call) times the steps asked for
(rounded up to a power of two), is at most this. Measured on 2 cores: the cheap loop of a GLM or a quadrature likelihood runs
0.08-0.22 ms slower per million operations of a step and compiles 1-1.6 s sooner, so at
this budget it costs at most about 0.5 s of run time for a second or more of compilation
saved (a hierarchical logistic regression on 600 rows: first call 2.5 -> 1.7 s)."""

ONE_SHOT_BYTES = 1 << 26
"""The same bound (64 MiB) for programs that run once per fit (a start, the restarts' starts,
the posterior's distributions): their run time is one pass over the data, where a step
loop's is hundreds; the start of a mixture on 100,000 points compiles in 3 s instead of 10 s."""

FIRST_STEPS = 8
"""After a Newton start (:attr:`~blrppl.blr.state.InferenceAlgorithm.newton_started`) a step loop
runs its first ``FIRST_STEPS`` steps with ``FAST_CPU_OPTIONS`` (:func:`first_steps`), whatever its
data's size and planned steps, and only a run that goes on compiles the loop its planned steps
call for. Such a fit starts at the Laplace approximation and usually converges within a few
steps, where the balanced loop's compilation costs more than it saves: the logistic regression
on 100,000 rows converges in 3 steps of 106 ms (67 ms balanced), and its loop compiles in
0.3-0.5 s instead of 0.7-1.1 s. A longer run pays one more compilation and those steps' difference.
The choice depends only on the step's index, so a fit is still reproducible bit for bit."""

MODES = ("auto", "fast", "optimized")
ENVIRONMENT_VARIABLE = "BLRPPL_COMPILE_MODE"


def _checked(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"compile mode must be one of {MODES}, got {mode!r}.")
    return mode


_mode = _checked(os.environ.get(ENVIRONMENT_VARIABLE, "auto").strip().lower() or "auto")


def set_compile_mode(mode: str) -> str:
    """Choose how blrppl compiles its programs; returns the previous mode.

    Args:
      mode: ``"auto"`` (cheap settings for small data on a CPU, see the module
        docstring), ``"fast"`` (cheap settings on a CPU whatever the size) or
        ``"optimized"`` (XLA's defaults always).
    """
    global _mode
    previous, _mode = _mode, _checked(mode)
    return previous


def compile_mode() -> str:
    """The current mode (see :func:`set_compile_mode`)."""
    return _mode


ACCEPTED_BY_JAXLIB = {(0, 10): tuple(FAST_CPU_OPTIONS)}
"""jaxlib (major, minor) -> the entries of ``FAST_CPU_OPTIONS`` its XLA:CPU is known to accept
(``tests/test_compile_mode.py`` checks the entry of the installed jaxlib against a probe).
``BALANCED_CPU_OPTIONS`` names the same options: the accepted ones are passed for it too."""


def balanced_cpu_options() -> dict:
    """The entries of ``BALANCED_CPU_OPTIONS`` that this jaxlib's XLA:CPU accepts (see
    :func:`fast_cpu_options`, whose options are the same)."""
    return {name: BALANCED_CPU_OPTIONS[name] for name in fast_cpu_options() if name in BALANCED_CPU_OPTIONS}


@functools.cache
def fast_cpu_options() -> dict:
    """The entries of ``FAST_CPU_OPTIONS`` that this jaxlib's XLA:CPU accepts.

    XLA rejects a compile option it does not know, and options come and go between
    releases (jaxlib 0.11 has no ``xla_cpu_use_fusion_emitters``). For a jaxlib in
    ``ACCEPTED_BY_JAXLIB`` they are read from there; for another they are probed
    (:func:`probe_cpu_options`: one small compilation per process, 40 ms).
    """
    import jaxlib.version

    release = tuple(int(part) for part in jaxlib.version.__version__.split(".")[:2])
    known = ACCEPTED_BY_JAXLIB.get(release)
    if known is not None:
        return {name: FAST_CPU_OPTIONS[name] for name in known}
    return probe_cpu_options()


def probe_cpu_options() -> dict:
    """The entries of ``FAST_CPU_OPTIONS`` that XLA:CPU accepts, found by compiling with them.

    They are tried together on a one-operation program, and one by one only if
    that fails; an unknown one is left out (its compile-time saving with it), any
    other failure is raised.
    """
    cpu = jax.devices("cpu")[0]
    example = jax.device_put(np.zeros((), np.float32), cpu)

    def accepts(options: dict) -> bool:
        try:
            jax.jit(lambda x: x + 1, compiler_options=options).lower(example).compile()
        except jax.errors.JaxRuntimeError as error:
            if "No such compile option" not in str(error):
                raise
            return False
        return True

    if accepts(FAST_CPU_OPTIONS):  # one small compilation where every option is known
        return dict(FAST_CPU_OPTIONS)
    return {name: value for name, value in FAST_CPU_OPTIONS.items() if accepts({name: value})}


def _on_cpu(leaves: list) -> bool:
    for leaf in leaves:
        if isinstance(leaf, jax.Array):
            return all(device.platform == "cpu" for device in leaf.sharding.device_set)
    return jax.default_backend() == "cpu"


def fast_compile(data: Any, small_bytes: int = SMALL_DATA_BYTES) -> bool:
    """Whether programs over ``data`` (a pytree of arrays) take ``FAST_CPU_OPTIONS``
    (in mode "auto": where the data are at most ``small_bytes``)."""
    if _mode == "optimized":
        return False
    leaves = jax.tree.leaves(data)
    if not _on_cpu(leaves):
        return False
    if _mode == "fast":
        return True
    return sum(_nbytes(leaf) for leaf in leaves) <= small_bytes


_PLANNED_STEPS: contextvars.ContextVar = contextvars.ContextVar("blrppl_planned_steps", default=None)
_MAX_LOOP_DECISIONS = 64  # per loop program; each keeps its static arguments (an algorithm) alive


@contextlib.contextmanager
def planned_steps(num_steps: Optional[int]) -> Iterator[None]:
    """Within this context, step loops (``SizeDependentJit(..., loop=...)``) are compiled for runs
    of up to ``num_steps`` steps (see ``LOOP_FLOP_BUDGET``); None: by the data's size alone."""
    token = _PLANNED_STEPS.set(None if num_steps is None else 1 << (max(int(num_steps), 1) - 1).bit_length())
    try:
        yield
    finally:
        _PLANNED_STEPS.reset(token)


_FIRST_STEPS: contextvars.ContextVar = contextvars.ContextVar("blrppl_first_steps", default=False)


@contextlib.contextmanager
def first_steps(cheap: bool = True) -> Iterator[None]:
    """Within this context (where ``cheap``), step loops over larger data on a CPU take
    ``FAST_CPU_OPTIONS`` in mode "auto" whatever their planned steps: they run a fit's first
    steps after a Newton start (see ``FIRST_STEPS``)."""
    token = _FIRST_STEPS.set(bool(cheap))
    try:
        yield
    finally:
        _FIRST_STEPS.reset(token)


def _nbytes(leaf: Any) -> int:
    # Read from the shape and dtype (jax.Array.nbytes is a slow property; a float has none):
    # the driver asks at every call, and a small model's second fit lasts a millisecond.
    if isinstance(leaf, (bool, int, float, complex)):
        return 8
    try:
        return math.prod(leaf.shape) * leaf.dtype.itemsize
    except (AttributeError, TypeError):
        return np.asarray(leaf).nbytes


def _top_level() -> bool:
    """Whether a call now runs on its own, not inside another jit, vmap or grad trace
    (compiler options belong to the outermost program: JAX refuses them on a nested jit)."""
    from jax._src import core  # jax is pinned below 0.11

    return core.trace_ctx.is_top_level()


class SizeDependentJit:
    """``jax.jit(fun)`` compiled with ``FAST_CPU_OPTIONS`` or XLA's defaults by :func:`fast_compile`.

    ``data_argnum`` names the argument whose size decides (or ``fast`` fixes
    the choice); ``one_shot``: a program run once per fit (bound ``ONE_SHOT_BYTES``).
    ``loop``: the program is a step loop, and ``loop(args)`` says whether its
    cost decides where its data are larger (within :func:`planned_steps`, mode
    "auto", on a CPU; ``LOOP_FLOP_BUDGET``): a count on its jaxpr (traced once for
    every variant: JAX shares the trace), made once per static arguments, shapes
    and step count. Both variants are ordinary ``jax.jit``
    functions (each with its own cache), so a program is compiled once per
    variant, static arguments and shapes. Called inside another trace, it is
    the plain variant (its code becomes part of the outer program).
    """

    def __init__(
        self,
        fun: Callable,
        data_argnum: Optional[int] = None,
        static_argnums: Union[int, Sequence[int]] = (),
        *,
        fast: Optional[bool] = None,
        one_shot: bool = False,
        loop: Optional[Callable[[tuple], bool]] = None,
    ):
        self.data_argnum = data_argnum
        self.loop = loop
        self._cheap_loops: dict = {}
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.fixed = fast
        self.small_bytes = ONE_SHOT_BYTES if one_shot else SMALL_DATA_BYTES
        self.optimized = jax.jit(fun, static_argnums=static_argnums)
        self._fast = None
        self._balanced = None
        self.__wrapped__ = fun
        self.__doc__ = fun.__doc__

    @property
    def fast(self) -> Callable:
        """The variant compiled with ``FAST_CPU_OPTIONS`` (made at its first use)."""
        if self._fast is None:
            self._fast = jax.jit(self.__wrapped__, static_argnums=self.static_argnums, compiler_options=fast_cpu_options())
        return self._fast

    @property
    def balanced(self) -> Callable:
        """The variant compiled with ``BALANCED_CPU_OPTIONS`` (made at its first use)."""
        if self._balanced is None:
            self._balanced = jax.jit(
                self.__wrapped__, static_argnums=self.static_argnums, compiler_options=balanced_cpu_options()
            )
        return self._balanced

    def variant(self, *args: Any) -> Callable:
        """The jitted variant that ``args`` run with."""
        if not _top_level():
            return self.optimized
        fast = self.fixed if self.fixed is not None else fast_compile(args[self.data_argnum], self.small_bytes)
        if fast:
            return self.fast
        if _mode != "auto":
            return self.optimized
        on_cpu = _on_cpu(jax.tree.leaves(args[self.data_argnum] if self.data_argnum is not None else args))
        if self.fixed is None and self.loop is not None and on_cpu:
            steps = _PLANNED_STEPS.get()
            if steps is not None and self.loop(args) and (_FIRST_STEPS.get() or self._cheap_loop(args, steps)):
                return self.fast
        return self.balanced if on_cpu else self.optimized

    def _cheap_loop(self, args: tuple, steps: int) -> bool:
        """Whether the loop's estimated work over ``steps`` steps is within ``LOOP_FLOP_BUDGET``."""
        static = tuple(args[i] for i in self.static_argnums)
        dynamic = [a for i, a in enumerate(args) if i not in self.static_argnums]
        shapes = tuple((np.shape(x), str(getattr(x, "dtype", type(x)))) for x in jax.tree.leaves(dynamic))
        key = (static, jax.tree.structure(dynamic), shapes, steps)
        try:
            hash(key)
        except TypeError:
            return False
        decision = self._cheap_loops.get(key)
        if decision is None:
            try:
                flops = jaxpr_flops(self.optimized.trace(*args).jaxpr)  # the trace is every variant's
            except Exception:  # noqa: BLE001 - no estimate: XLA's defaults, as for any large data
                flops = math.inf
            decision = flops * steps <= LOOP_FLOP_BUDGET
            recently_used(self._cheap_loops, key, lambda: decision, _MAX_LOOP_DECISIONS)
        return decision

    def __call__(self, *args: Any) -> Any:
        return self.variant(*args)(*args)

    def lower(self, *args: Any) -> Any:
        return self.variant(*args).lower(*args)


def jit_for(data: Any, fun: Callable, *, one_shot: bool = False) -> SizeDependentJit:
    """``jax.jit(fun)`` with ``FAST_CPU_OPTIONS`` where :func:`fast_compile` says so for ``data``,
    for programs built per plan (its samplers, its posterior): ``data`` is the plan's arrays;
    ``one_shot``: a program run once per plan (bound ``ONE_SHOT_BYTES``)."""
    return SizeDependentJit(fun, fast=fast_compile(data, ONE_SHOT_BYTES if one_shot else SMALL_DATA_BYTES))


def probe(fun: Callable, *, cheap: Optional[bool] = None) -> Callable:
    """``fun`` as one compiled program, for the few evaluations of model code that planning makes
    (gradient probes, example values, a GLM's design matrix), or evaluated with numpy, equation
    by equation, where its operands are small and every equation has a rule
    (:func:`blrppl.host_ops.evaluate_call`).

    Run eagerly, each ``jnp`` operation of such a call compiles a program of its own (20-60 ms
    each; planning UCBadmit made 185 of them). Here the call is traced to a jaxpr and run by
    one program, compiled (with ``FAST_CPU_OPTIONS`` on a CPU unless the mode is "optimized":
    it runs a few times) once per jaxpr: the arrays it closes over are arguments, so a new
    plan of the same model on new data of the same shapes compiles nothing. Where the
    model's code needs concrete values of the arguments (Python control flow on a latent,
    ``np.asarray`` of one), the call runs eagerly as before; inside another trace it is
    ``fun`` itself. ``cheap`` fixes the choice of ``FAST_CPU_OPTIONS`` (e.g.
    ``fast_compile(data, ONE_SHOT_BYTES)``); by default it is taken on a CPU.
    """

    def call(*args: Any) -> Any:
        if not _top_level():
            return fun(*args)
        try:
            closed, shapes = jax.make_jaxpr(fun, return_shape=True)(*args)
        except (jax.errors.JAXTypeError, jax.errors.JAXIndexError):
            return fun(*args)
        leaves = jax.tree.leaves(args)
        fast = cheap if cheap is not None else _mode != "optimized" and _on_cpu(leaves)
        from blrppl import host_ops  # (it reads this module's helpers)

        outputs = host_ops.evaluate_call(closed, leaves) if fast else None  # numpy: nothing compiles
        if outputs is None:
            outputs = _probe_program(closed.jaxpr, fast)(closed.consts, leaves)
        return jax.tree.unflatten(jax.tree.structure(shapes), outputs)

    return call


_PROBES: dict = {}
_MAX_PROBES = 256


def _probe_program(jaxpr: Any, cheap: bool) -> Callable:
    """The compiled evaluation of ``jaxpr`` (its constants an argument), one per printed jaxpr.

    A jaxpr that calls back into Python prints the callback's address, not its code: it is
    compiled afresh, never looked up."""
    from jax._src import core  # jax is pinned below 0.11

    def evaluate(consts, args):
        return core.eval_jaxpr(jaxpr, consts, *args)

    options = fast_cpu_options() if cheap else None
    text = str(jaxpr)
    if "callback" in text:
        return jax.jit(evaluate, compiler_options=options)
    return recently_used(_PROBES, (text, cheap), lambda: jax.jit(evaluate, compiler_options=options), _MAX_PROBES)


def recently_used(cache: dict, key: Any, make: Callable[[], Any], limit: int) -> Any:
    """``cache[key]``, made by ``make()`` if missing; the ``limit`` most recently used entries are kept."""
    value = cache.pop(key, None)
    if value is None:
        value = make()
    cache[key] = value  # most recent last
    while len(cache) > limit:
        cache.pop(next(iter(cache)))
    return value


def to_device(value: Any) -> Any:
    """``jnp.asarray(value)`` without compiling: a numpy array or a Python or numpy scalar is transferred.

    Outside a trace, JAX 0.10 lifts a host value with ``lax.stage``, an eager primitive that
    compiles a one-operation program per shape and dtype (12-25 ms each, several per first
    call); ``jax.device_put`` makes the same array (dtype canonicalised, Python scalars weakly
    typed) by a transfer, and a numpy array already in a canonical dtype is handed to the
    same transfer directly (:func:`_transfer`). JAX arrays and values inside a trace go to
    ``jnp.asarray``.
    """
    if isinstance(value, (np.ndarray, np.generic, bool, int, float, complex)) and _top_level():
        if type(value) is np.ndarray:
            return _transfer(value)
        return jax.device_put(value)
    return jax.numpy.asarray(value)


RESIDENT_BYTES = 1 << 16
"""Host arrays of a plan of at least this size are moved to the device once (:func:`resident`)."""


def resident(tree: Any, min_bytes: int = RESIDENT_BYTES) -> Any:
    """``tree`` with every numpy leaf of at least ``min_bytes`` transferred to the device once
    (C-contiguous, uncommitted; :func:`to_device`: nothing compiles), the other leaves as they are.

    A numpy argument of a compiled call is transferred at every call, and one whose memory is not
    in C order is transposed on the way: a mixture's plan on 100,000 points holds 6 MB of such
    operands, which cost 3-5 ms per call (every restart's start and loop) before this."""

    def move(leaf):
        if type(leaf) is np.ndarray and leaf.nbytes >= min_bytes:
            return to_device(np.ascontiguousarray(leaf))
        return leaf

    return jax.tree.map(move, tree)


def to_host(tree: Any) -> Any:
    """``jax.device_get(tree)``: every JAX array leaf as a numpy array, other leaves as they are.

    ``jax.device_get`` starts an asynchronous copy of every leaf before it reads them, which
    overlaps an accelerator's transfers but costs ~9 µs per leaf on the CPU, where reading an
    array is a copy in memory (``np.asarray``: under 1 µs once the array is ready). A fit's
    results are read once per call: a small model's refit paid tens of microseconds for it.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if not _on_cpu(leaves):
        return jax.device_get(tree)
    return jax.tree.unflatten(treedef, [np.asarray(x) if _readable(x) else x for x in leaves])


def _readable(leaf: Any) -> bool:
    """A JAX array numpy can hold (a PRNG key array stays as it is, as ``jax.device_get`` leaves it)."""
    return isinstance(leaf, jax.Array) and not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended)


def _transfer(array: np.ndarray) -> jax.Array:
    """``jax.device_put(array)`` for a numpy array, in 15 µs instead of 85.

    ``jax.device_put`` spends most of its time in Python (argument checks, sharding and
    layout resolution) before it calls the transfer that it ends with for a numpy array
    on one device (``pxla.batched_device_put``, as its ``_shard_np_array`` handler does);
    a step's result pays it (the ELBO trace), as do planning's host evaluations. That call is
    made here directly where nothing else applies: the default device (no
    ``jax.default_device`` set) and a dtype that needs no canonicalisation; else
    ``jax.device_put``. Same array: uncommitted, not weakly typed.
    """
    numeric = array.dtype.kind in "biufc"  # else jax.device_put refuses it with its own message
    if not numeric or jax.dtypes.canonicalize_dtype(array.dtype) != array.dtype or jax.config.jax_default_device is not None:
        return jax.device_put(array)
    from jax._src import core  # jax is pinned below 0.11
    from jax._src.interpreters import pxla

    device, sharding = _default_placement()
    return pxla.batched_device_put(core.ShapedArray(array.shape, array.dtype), sharding, [array], [device], committed=False)


@functools.cache
def _default_placement() -> tuple:
    """The device and sharding of ``jax.device_put(x)`` without a device: this process's first."""
    device = jax.local_devices()[0]
    return device, jax.sharding.SingleDeviceSharding(device)


def structure_of(fun: Callable, *args: Any) -> Any:
    """``fun(*args)`` evaluated abstractly (nothing compiled, nothing run), for a result of which
    only the structure is read: which distribution a site has, which arguments, its shapes.

    The arrays in the result are tracers of a finished trace: read their shapes and
    dtypes, never their values. Where the model's code needs concrete values of the
    arguments, ``fun`` runs eagerly instead.
    """
    found = []

    def keep(*inner: Any) -> None:
        found.append(fun(*inner))

    try:
        jax.eval_shape(keep, *args)
    except (jax.errors.JAXTypeError, jax.errors.JAXIndexError):
        return fun(*args)
    return found[0]


def size_dependent_jit(
    *, data_argnum: int, static_argnums: Union[int, Sequence[int]] = (), one_shot: bool = False,
    loop: Optional[Callable[[tuple], bool]] = None,
) -> Callable:
    """Decorator form of :class:`SizeDependentJit`."""
    return lambda fun: SizeDependentJit(fun, data_argnum, static_argnums, one_shot=one_shot, loop=loop)


def full_precision(fun: Callable) -> Callable:
    """``fun`` with the matrix products it traces at full float32 precision (JAX's ``"highest"``).

    On GPUs and TPUs, JAX's default rounds the inputs of a float32 matrix product to
    TF32 or bfloat16 (about 1e-3 relative). That broke the exactness checks of the GLM
    path on an H200 (so a float32 logistic regression took cubature instead of
    Gauss-Hermite on its linear predictors) and left the fit's ELBO moving by 5e-6 per
    step, never converging. Float64 and CPUs are unaffected. A precision the user set
    (``jax_default_matmul_precision``) is kept.
    """

    @functools.wraps(fun)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if jax.config.jax_default_matmul_precision is not None:
            return fun(*args, **kwargs)
        with jax.default_matmul_precision("highest"):
            return fun(*args, **kwargs)

    return wrapped
