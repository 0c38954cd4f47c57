"""Finding a backend by name: built-ins, installed plugins, ``module:object`` and ``auto``.

A backend is named on the command line as one of:
- a registered name: a built-in (``BUILTIN``) or an installed plugin, i.e. an entry point in
  the group ``flexattention_conformance.backends`` whose value is ``package.module:object``;
- ``package.module:object``: a backend importable from the current environment;
- ``auto``: the first available backend of ``AUTO_PREFERENCE``.
``object`` may be a Backend subclass (instantiated without arguments), an instance, or a
function returning one. Modules are imported only when their backend is asked for.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from importlib.metadata import entry_points

from conformance.backends.base import Backend

ENTRY_POINT_GROUP = "flexattention_conformance.backends"

#: Built-in backends: name -> "module:object" (imported lazily).
BUILTIN: dict[str, str] = {
    "cpu-eager": "conformance.backends.cpu:CpuEager",
    "cpu-inductor": "conformance.backends.cpu:CpuInductor",
    "cuda-eager": "conformance.backends.cuda:CudaEager",
    "cuda-inductor": "conformance.backends.cuda:CudaInductor",
    "neuron": "conformance.backends.neuron:Neuron",
}

#: What ``auto`` picks: the first of these that is registered and available here.
AUTO_PREFERENCE = ("cuda-inductor", "neuron", "cpu-inductor")


class BackendError(ValueError):
    """A backend that cannot be used; the message says which and what to do."""


def registered() -> dict[str, str]:
    """Every backend known by name: built-ins, then installed plugins (name -> target). A
    plugin's name that is taken already (by a built-in, or an earlier plugin) is not used:
    ``shadowed`` says which."""
    return _registry()[0]


def shadowed() -> list[str]:
    """One line per installed plugin entry point whose name another backend holds (it can
    still be run as ``package.module:object``)."""
    return _registry()[1]


def _registry() -> tuple[dict[str, str], list[str]]:
    names, unused = dict(BUILTIN), []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in names and names[ep.name] != ep.value:
            holder = "the built-in" if ep.name in BUILTIN else names[ep.name]
            unused.append(f"plugin entry point {ep.name} = {ep.value!r} is not used: "
                          f"{ep.name!r} is {holder}; rename it, or run it as "
                          f"--backend {ep.value}")
        names.setdefault(ep.name, ep.value)
    return names, unused


def load_backend(spec: str) -> Backend:
    """The backend named ``spec`` (a registered name or ``package.module:object``), available
    or not; ``auto`` is resolved by ``resolve_backend``."""
    names = registered()
    target = names.get(spec)
    if target is None and ":" not in spec:
        if "." in spec and _is_a_module(spec):  # the object left out (an audit: no hint of it)
            raise BackendError(f"--backend {spec!r} names a module, not a backend in it; name "
                               f"the backend class or object too: {spec}:CLASS")
        raise BackendError(
            f"unknown backend {spec!r}; known: auto, {', '.join(names)} (flexconf backends "
            "says which can run here), or package.module:object")
    return _instantiate(target or spec, spec)


def _is_a_module(spec: str) -> bool:
    """Whether ``spec`` names an importable module (importing its parent packages to tell;
    a parent that fails to import, however, says no: the unknown-backend line follows)."""
    import importlib.util

    try:
        return importlib.util.find_spec(spec) is not None
    except Exception:  # noqa: BLE001 - a parent's own error (a SyntaxError too): not a module
        return False


def resolve_backend(spec: str) -> Backend:
    """The backend to run: ``spec`` itself if available, or for ``auto`` the best available.

    Raises BackendError naming the backend and the reason when it cannot run here.
    """
    if spec == "auto":
        names = registered()
        reasons = []
        for name in AUTO_PREFERENCE:
            if name not in names:
                continue
            try:
                backend = load_backend(name)
            except BackendError as exc:  # a broken plugin must not stop auto from choosing
                reasons.append(f"{name}: {exc}")
                continue
            availability = availability_of(backend)
            if availability.available:
                return backend
            reasons.append(f"{name}: {availability.reason}")
        raise BackendError("no backend is available for --backend auto; " + "; ".join(reasons))
    backend = load_backend(spec)
    availability = availability_of(backend)
    if not availability.available:
        raise BackendError(f"backend {spec!r} is not available here: {availability.reason}")
    return backend


def import_root(spec: str) -> str | None:
    """For a ``package.module:object`` backend, the directory its package is imported from
    (what PYTHONPATH must name for a later command to load it again); None for a registered
    name or a module that cannot be found."""
    if ":" not in spec:
        return None
    return module_root(spec.partition(":")[0])


def module_root(module: str) -> str | None:
    """The directory ``module``'s top-level package is imported from (None when it cannot be
    found): what PYTHONPATH must name for another process to import it."""
    import importlib.util
    from pathlib import Path

    try:
        found = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    if found is None or not found.origin:
        return None
    origin = Path(found.origin).resolve()
    return str(origin.parent.parent if found.submodule_search_locations else origin.parent)


def availability_of(backend: Backend):
    """``backend.availability()``; one that raises, or returns something else than an
    Availability, is unavailable, with what went wrong in one line."""
    from conformance.backends.base import Availability
    from records.text import one_line

    try:
        availability = backend.availability()
    except Exception as exc:  # noqa: BLE001 - a plugin's bug is its unavailability, not ours
        return Availability(False, f"its availability() raised {_first_line(exc)}")
    if not isinstance(availability, Availability):
        return Availability(False, (
            f"its availability() returned {type(availability).__name__} "
            f"{one_line(repr(availability))[:40]}, not an Availability; return "
            "Availability(True) or Availability(False, 'why') (docs/backends.md)"))
    return availability


def check_env_hooks(backend: Backend, spec: str, workers: int) -> None:
    """The backend's environment hooks (child_env, process_cache_env, artifact_env), called
    once at the start as a worker's executor will call them: BackendError, one line naming
    the hook, where one raises or returns something else than a dict of str to str (a value
    of another type failed each case later as a HARNESS_ERROR that named no hook)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="flexconf-check-") as directory:  # a hook may make it
        _check_env_hooks(backend, spec, workers, directory)


def _check_env_hooks(backend: Backend, spec: str, workers: int, directory: str) -> None:
    from conformance.backends.base import WorkerSlot

    calls = (("child_env", lambda: backend.child_env(WorkerSlot(0, max(1, workers)),
                                                     f"{directory}/cache")),
             ("process_cache_env", lambda: backend.process_cache_env(f"{directory}/process",
                                                                     True)),
             ("artifact_env", lambda: backend.artifact_env(f"{directory}/artifacts")))
    for hook, call in calls:
        try:
            env = call()
        except Exception as exc:  # noqa: BLE001
            raise BackendError(f"backend {spec!r}: its {hook}() raised {_first_line(exc)}; "
                               "fix the plugin") from None
        if not isinstance(env, dict):
            raise BackendError(f"backend {spec!r}: its {hook}() returned a "
                               f"{type(env).__name__}, not a dict of str to str; fix the plugin")
        bad = next(((k, v) for k, v in env.items()
                    if not isinstance(k, str) or not isinstance(v, str)), None)
        if bad is not None:
            raise BackendError(f"backend {spec!r}: its {hook}() gives {bad[0]!r}: {bad[1]!r} "
                               f"({type(bad[0]).__name__}: {type(bad[1]).__name__}); environment "
                               "variables are str to str; fix the plugin")


def environment_of(backend: Backend, spec: str | None = None) -> dict:
    """``backend.environment()``, checked: BackendError, one line, where it raises or does not
    return a dict (a plugin's bug, told at the start of a run, not as a traceback at its end).
    ``spec``: the --backend value, named in the message (the backend's name otherwise)."""
    which = repr(spec or backend.name)
    try:
        environment = backend.environment()
    except Exception as exc:  # noqa: BLE001
        raise BackendError(f"backend {which}: its environment() raised {_first_line(exc)}; "
                           "fix the plugin") from None
    if not isinstance(environment, dict):
        raise BackendError(f"backend {which}: its environment() returned a "
                           f"{type(environment).__name__}, not a dict; extend "
                           "super().environment() (docs/backends.md)")
    return environment


class HookTimeout(Exception):
    """A backend hook that the worker calls itself did not return within its budget."""


def unsupported_reason_of(backend: Backend, case, timeout: float | None = None
                          ) -> tuple[str | None, str | None]:
    """``backend.unsupported_reason(case)`` as (reason, None); where it raises, (None, the
    failure): ``setup: its unsupported_reason raised Type: text``, then the traceback's end, a
    RUNTIME_ERROR of the case (the backend's code failed, not the suite's). A falsy answer is
    "supported"; a truthy one that is no str (``True``) is unsupported, and the reason says
    what the hook should return. With ``timeout``, HookTimeout (one line) when the hook has
    not returned after that many seconds: it runs in the worker, not in the watched child, so
    a hook that hangs would otherwise stop the run; it is left behind in a daemon thread."""
    import traceback

    try:
        reason = _within(timeout, "unsupported_reason", backend.unsupported_reason, case)
    except HookTimeout:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin's bug is its case's failure
        detail = "".join(traceback.format_exception(exc)[-12:]).rstrip()
        return None, f"setup: its unsupported_reason raised {_first_line(exc)}\n{detail}"
    if not reason:
        return None, None
    if not isinstance(reason, str):
        from records.text import one_line

        return (f"unsupported_reason returned {type(reason).__name__} "
                f"{one_line(repr(reason))[:60]}; it should return a str that says why"), None
    return reason, None


def _within(timeout: float | None, name: str, hook, *args):
    """``hook(*args)``, in a daemon thread when ``timeout`` is given (HookTimeout, naming the
    hook ``name``, after it)."""
    if timeout is None:
        return hook(*args)
    import threading

    outcome: dict = {}

    def call() -> None:
        try:
            outcome["value"] = hook(*args)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=call, name=f"flexconf-{name}", daemon=True)
    thread.start()
    thread.join(min(timeout, threading.TIMEOUT_MAX))  # a budget of 1e10 s: no OverflowError
    if thread.is_alive():
        raise HookTimeout(f"setup: its {name} did not return within {timeout:g} s (the run "
                          "budget); it runs in the worker before the case starts, so it must "
                          "answer at once (docs/backends.md)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _first_line(exc: BaseException) -> str:
    from records.text import first_line

    text = first_line(str(exc).strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _instantiate(target: str, spec: str) -> Backend:
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise BackendError(f"bad backend {spec!r}; write package.module:object")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        path = Path(module_name)
        raise BackendError(
            f"backend {spec!r} names a file; name its module: "
            f"--backend {path.stem if path.suffix == '.py' else path.name}:{attr} with "
            f"PYTHONPATH={path.parent if str(path.parent) != '.' else '.'} (docs/backends.md)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"backend {spec!r}: cannot import {module_name!r} ("
                           f"{_first_line(exc)}); install it or fix PYTHONPATH") from None
    except Exception as exc:  # noqa: BLE001 - a module that raises while imported
        raise BackendError(f"backend {spec!r}: importing {module_name!r} raised "
                           f"{_first_line(exc)}; fix the plugin") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            offered = sorted(name for name, value in vars(module).items()
                             if isinstance(value, type) and issubclass(value, Backend)
                             and value.__module__ == module.__name__ and not name.startswith("_"))
            raise BackendError(
                f"backend {spec!r}: module {module_name!r} has no {attr!r}"
                + (f"; its backends: {', '.join(offered)}" if offered else "")) from None
    if (isinstance(obj, type) and issubclass(obj, Backend)) or (
            not isinstance(obj, Backend) and callable(obj)):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - a plugin whose constructor raises
            raise BackendError(f"backend {spec!r}: constructing {attr!r} raised "
                               f"{_first_line(exc)}; fix the plugin") from None
    if not isinstance(obj, Backend):
        raise BackendError(f"backend {spec!r} is {_a(type(obj).__name__)}, not a"
                           " conformance.backends.base.Backend (subclass it)")
    if not obj.name:
        raise BackendError(f"backend {spec!r} has an empty name; set the class attribute `name`")
    return obj
