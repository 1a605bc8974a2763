"""Compile a fit's two programs side by side, on two cores.

A first call compiles the start (``driver._init``) and then the step loop
(``driver._chunk``): on a CPU most of a small model's first call, one after
the other. XLA compiles without holding Python's lock, so
:func:`compile_side_by_side` compiles the first program in a thread while
this thread traces and lowers the second, whose argument types are read from
the first program's lowering (its outputs feed the second), and compiles it
in another thread. Both programs land in ``jax.jit``'s own caches; the first
is started from this thread as soon as it is compiled, while the second
still compiles, and the calls that follow run the second: the results are
those of the plain calls, bit for bit (the same programs, compiled with the
same options).

Done once per program and static arguments (an algorithm is built once per
plan signature), so a later run pays a hash. Skipped where an argument is
committed to a device: the outputs' placement, hence the second program's
signature, is then known only once the first has run, and a guess could
compile the second program twice. Any failure here is left to the plain
calls, which raise it as they would.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
from typing import Any, Callable, Iterator, NamedTuple, Optional

import jax

from blrppl.compile_mode import SizeDependentJit

_DONE: "collections.OrderedDict[Any, None]" = collections.OrderedDict()
_MAX_DONE = 256
_LOCK = threading.Lock()


def compile_side_by_side(
    first: SizeDependentJit, first_args: tuple, second: SizeDependentJit, second_args: Callable[[Any], tuple],
    then: Optional[Callable[[tuple], Any]] = None, more: Optional[Callable[[Callable], None]] = None,
) -> Optional[Any]:
    """Compile ``first(*first_args)`` and ``second(*second_args(outputs))`` at once, and start
    ``first`` as soon as it is compiled.

    Each compiles in a thread; ``first`` is called as soon as it is compiled (jit's cache: a
    dispatch, which returns at once), so the start runs while ``second`` still compiles: a
    start that takes Newton steps over 100,000 rows (0.4 s) no longer waits for the loop.

    Args:
      first, second: the programs (their variants are chosen by their arguments).
      first_args: ``first``'s arguments, static ones included.
      second_args: ``first``'s outputs (``jax.ShapeDtypeStruct`` leaves) -> ``second``'s arguments.
      then: ``second``'s arguments -> lowered programs that run after it (one, a list, or
        None: the best restart's rows, an EM fit's boundary check); lowered here while the two
        compile and compiled beside them: a first call no longer compiles them after its run.
      more: called with ``first``'s compiled program right after its call, to dispatch more
        calls of it while ``second`` compiles (the other restarts' starts); not called where
        ``first`` was not called here.

    Returns:
      ``first(*first_args)`` where it was called here (the plain call's outputs, computed by the
      same program), else None: the caller calls it.
    """
    key = _signature(first, first_args)
    with _LOCK:
        if key is None or key in _DONE:
            return None
        _DONE[key] = None
        while len(_DONE) > _MAX_DONE:
            _DONE.popitem(last=False)
    if not _uncommitted(first_args):
        return None
    try:
        program = first.variant(*first_args)
        traced = program.trace(*first_args)  # held by jit's cache
        lowered = traced.lower()
    except Exception:  # noqa: BLE001 - the plain call raises it, with its own message
        return None
    compiled: dict = {}
    worker = threading.Thread(target=_compile_quietly, args=(lowered, compiled), daemon=True)
    worker.start()
    beside = after = None
    try:
        # The outputs' types as the call returns them: weak types included (``out_info`` drops
        # them, and a point estimate passed through weakly typed would compile ``second`` twice).
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in traced.jaxpr.out_avals]
        outputs = jax.tree.unflatten(jax.tree.structure(lowered.out_info), avals)
        args = second_args(outputs)
        beside = threading.Thread(target=_compile_quietly, args=(second.lower(*args), {}), daemon=True)
        beside.start()
        lowered = [] if then is None else then(args)
        lowered = [p for p in (lowered if isinstance(lowered, (list, tuple)) else [lowered]) if p is not None]
        if lowered:
            after = threading.Thread(target=_compile_all, args=(lowered,), daemon=True)
            after.start()
    except Exception:  # noqa: BLE001 - as above
        pass
    finally:
        worker.join()
    started = None
    if compiled:
        # Called from this thread: jit's cache key holds thread-local settings (the engines'
        # matmul precision), so a call from the compiling thread would compile again.
        try:
            started = program(*first_args)  # a dispatch: it runs while ``second`` compiles
            if more is not None:
                more(program)
        except Exception:  # noqa: BLE001 - the plain call raises it
            started = None
    do_idle_work()  # this thread's idle time, and a core's (:func:`idle_time`)
    for thread in (beside, after):
        if thread is not None:
            thread.join()
    return started


def _compile_all(programs: list) -> None:
    for lowered in programs:
        _compile_quietly(lowered, {})


def _compile_quietly(lowered: Any, done: dict) -> None:
    try:
        lowered.compile()  # lands in jit's cache
        done["compiled"] = True
    except Exception:  # noqa: BLE001 - the plain call compiles again and raises it
        pass


def _uncommitted(args: tuple) -> bool:
    return not any(getattr(leaf, "committed", False) for leaf in jax.tree.leaves(args))


def _signature(program: SizeDependentJit, args: tuple) -> Any:
    """The program and its static arguments, compared by equality (the starts' tests are a new
    tuple of the same bound methods at every call), or None where they do not hash.

    The static arguments (the algorithm, built once per plan signature, so once per data
    shapes and dtypes) stand for the rest: a later run with the same ones skips this at the
    cost of a hash, where looking at every array would cost a fifth of a small model's second
    call. The record keeps them alive no longer than ``jax.jit``'s own caches, which hold
    them as keys too.
    """
    key = (id(program), tuple(args[i] for i in program.static_argnums))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class CompiledInBackground:
    """A program compiled in a thread, for a program a first call does not run.

    The compiled planner (:mod:`blrppl.blr.replan`) serves the second data
    set, and the linear-response check (:mod:`blrppl.linear_response`) runs
    after the fit: neither is needed before the fit's own programs. ``lower``
    (``() -> lowered program``) traces and lowers it when the main thread is
    idle (:func:`when_idle`), and a thread compiles it there. Calling it
    waits for the compilation (lowering it first where that has not happened);
    one that failed in the thread is compiled again here, where its error is
    raised; a lowering that failed raises :class:`NotLowered`.
    """

    def __init__(self, lower: Callable[[], Any]):
        self._lower = lower
        self._lowered = None
        self._compiled = None
        self._worker: Optional[threading.Thread] = None
        self._failure: Optional[Exception] = None
        when_idle(self.start)

    def start(self) -> None:
        """Lower the program here and compile it in a thread (once)."""
        if self._worker is not None or self._failure is not None:
            return
        try:
            self._lowered = self._lower()
        except Exception as error:  # noqa: BLE001 - raised as NotLowered where the program is called
            self._failure = error
            return
        finally:
            self._lower = None  # (it holds the reference data's arrays)
        # Not a daemon: a process that ends while XLA compiles in a daemon thread aborts.
        self._worker = threading.Thread(target=self._compile, daemon=False)
        self._worker.start()
        waiting = _IDLE_WORK.get()
        if waiting is not None:  # the call that started it ends when it is compiled (idle_time)
            waiting.threads.append(self._worker)

    def _compile(self) -> None:
        try:
            self._compiled = self._lowered.compile()
        except Exception:  # noqa: BLE001 - compiled again, and raised, where it is called
            pass

    def __call__(self, *args: Any) -> Any:
        self.start()
        if self._failure is not None:
            raise NotLowered(f"the program could not be lowered: {self._failure!r}")
        self._worker.join()
        if self._compiled is None:
            self._compiled = self._lowered.compile()
        return self._compiled(*args)


class NotLowered(ValueError):
    """A :class:`CompiledInBackground` program whose lowering failed (its callers then take the plain path)."""


class _IdleWork(NamedTuple):
    work: list  # () -> None, waiting for idle time
    threads: list  # compilations started by that work, finished by the end of the block


_IDLE_WORK: contextvars.ContextVar = contextvars.ContextVar("blrppl_idle_work", default=None)


@contextlib.contextmanager
def idle_time() -> Iterator[None]:
    """Within this block, work given to :func:`when_idle` waits for this thread's first idle
    time, :func:`compile_side_by_side`'s wait for the step loop to compile (a core is then free:
    the start has compiled and runs), and is done at the latest when the block ends without an
    error, which also waits for the compilations that work started: a user's call does its own
    work, and the next call finds it done. A first call plans, then traces and compiles its fit;
    the programs it does not run itself (a refit's planner, the linear-response check after the
    fit) were traced and lowered before the fit's, on its critical path (a tenth of a
    hierarchical model's first call). Nested blocks share the outermost one's work."""
    if _IDLE_WORK.get() is not None:
        yield
        return
    waiting = _IdleWork([], [])
    token = _IDLE_WORK.set(waiting)
    try:
        yield
        do_idle_work()
        for thread in waiting.threads:
            thread.join()
    finally:
        _IDLE_WORK.reset(token)


def when_idle(work: Callable[[], None]) -> None:
    """Do ``work`` at this thread's next idle time within :func:`idle_time` (outside one: now)."""
    waiting = _IDLE_WORK.get()
    if waiting is None:
        work()
    else:
        waiting.work.append(work)


def do_idle_work() -> None:
    """Do the work waiting for idle time (:func:`when_idle`), in the order it was given."""
    waiting = _IDLE_WORK.get()
    while waiting is not None and waiting.work:
        waiting.work.pop(0)()
