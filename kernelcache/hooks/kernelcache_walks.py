"""Triton's dependency walk of a ``@triton.jit`` function, replayed from a kept record when every input it read holds.

The first time a process looks up a kernel, ``JITCallable.cache_key`` (https://github.com/triton-lang/triton/blob/
main/python/triton/runtime/jit.py) parses the function's source and walks it (``DependenciesFinder``): each global
name and attribute chain is looked up in the function's ``__globals__``; each ``@jit`` callee met merges its
``used_global_vals`` as they are at that moment, then adds its ``cache_key`` (walking it first if needed); each
plain global read goes into ``used_global_vals``, which every launch checks again. The key is the sha256 of the
walk's digest, the source's first line number and the ``constexpr`` globals. That is 1-30 ms per kernel of every
process's first call (a vLLM sampler step looks up 5-7 kernels).

The walk is a function of its inputs: the source text, what each name and attribute chain resolves to, and the
callees' state when they are met. So a served process that walked keeps, per function, in
``<cache>/.kernelcache/triton-walks/<id>.json`` (tied to the kept ``triton_key()`` of ``triton-keys/<id>.json``):

* the sha256 of the source and the walk's digest (``DependenciesFinder.ret``);
* every name and attribute chain on a name the source reads, but the parameters (a superset of what the walk looks
  up: locals that shadow a global are checked too), each with what it resolved to: a module, class or function by
  name, a ``@jit`` function by name, a plain value (bool, int, float, str, a tuple of them, or a ``constexpr`` of
  one) by type and repr. A closure, an aggregate or any other value keeps no record;
* the globals the walk itself recorded (by name), and the ``@jit`` callees in the order the walk met them, each with
  the ``cache_key`` it added.

A later process replays instead of walking when the kept ``triton_key()`` is the one the record names (the same
Triton, so the same walk), the source hashes the same and every chain resolves as recorded. It then does what the
walk does with the callees, in the recorded order: merges each one's ``used_global_vals`` as they are now, takes its
``cache_key`` (replayed or walked) and checks it is the recorded one. The walk would have read exactly that, so its
digest is the recorded one; ``used_global_vals`` holds the live values and dicts (launches check them as always)
and the key is computed from them as ``cache_key`` computes it. On any difference nothing is set: every function
whose key the attempt computed is reset, and Triton walks as it would have. Only Triton versions whose walk this
model was checked against replay (``VERIFIED``, with the few ``Rules`` in which their walks differ: 3.6 and 3.8;
tests/test_walk_replay.py compares replayed keys and globals with Triton's own over vLLM's sampler kernels on each
stack). ``KERNELCACHE_REPLAY_WALKS=0`` turns it off. Standard library only (and the Triton it hooks).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading

OFF_ENV = "KERNELCACHE_REPLAY_WALKS"  # "0": walk as Triton does, keep nothing
FORMAT = 1
_PLAIN = (bool, int, float, str)


class Rules:
    """Where one Triton's walk differs from the others', as a replay must follow it (all else is the same walk):

    * ``callee_key_first``: ``DependenciesFinder._update_hash`` takes the callee's ``cache_key`` (walking it first
      if needed) before merging its ``used_global_vals`` (3.8), or merges them as they are when the walk meets the
      callee and takes its key after (3.6: a callee not walked yet brings no globals);
    * ``missing_attribute_is_none``: ``DependenciesFinder.visit_Attribute`` reads ``getattr(lhs, attr, None)``, so a
      missing attribute ends the chain as None (3.8), or ``getattr(lhs, attr)``, which raises (3.6: nothing to
      replay);
    * ``sorted_constexprs``: ``JITCallable.cache_key`` hashes the ``constexpr`` globals sorted by (name, repr)
      (3.8), or in the order of ``used_global_vals`` (3.6)."""

    __slots__ = ("callee_key_first", "missing_attribute_is_none", "sorted_constexprs")

    def __init__(self, callee_key_first: bool, missing_attribute_is_none: bool, sorted_constexprs: bool):
        self.callee_key_first = callee_key_first
        self.missing_attribute_is_none = missing_attribute_is_none
        self.sorted_constexprs = sorted_constexprs


# The Tritons whose walk was checked against this model (tests/test_walk_replay.py, on each stack): a version is added
# with its rules once the conformance test passes on it; any other Triton walks as it always does.
VERIFIED = {
    "3.6.": Rules(callee_key_first=False, missing_attribute_is_none=False, sorted_constexprs=False),
    "3.8.": Rules(callee_key_first=True, missing_attribute_is_none=True, sorted_constexprs=True),
}


def rules_for(version: str) -> Rules | None:
    """The rules of Triton ``version`` ("3.8.0"), or None when its walk was never checked here."""
    return next((rules for prefix, rules in VERIFIED.items() if version.startswith(prefix)), None)


def enabled() -> bool:
    return os.environ.get(OFF_ENV, "1") != "0"


def _base():
    try:
        from . import kernelcache_tritonkey  # imported as kernelcache.hooks.kernelcache_walks
    except ImportError:
        import kernelcache_tritonkey  # imported from the served site dir
    return kernelcache_tritonkey


BUNDLE_DIR, BUNDLE_FILE = "triton-walks", "walks.json"  # a bundle's records: <cache>/triton-walks/<digest>/walks.json


def bundle_records(folder: str) -> list[str]:
    """The walk records installed bundles put in the cache dir whose kept keys are in ``folder`` (``<cache>/
    .kernelcache/triton-keys``), in order of name."""
    walks = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(folder))), BUNDLE_DIR)
    try:
        names = sorted(os.listdir(walks))
    except OSError:
        return []
    return [os.path.join(walks, name, BUNDLE_FILE) for name in names]


def record_path(folder: str, root: str) -> str:
    """``<cache>/.kernelcache/triton-walks/<id>.json`` for the kept keys in ``folder`` (``.../triton-keys``), the id
    of the kept key of the Triton at ``root``. Not in ``folder``: a write there would move its mtime, which the kept
    served variables are stamped with (runtime/served.py)."""
    walks = os.path.join(os.path.dirname(os.path.abspath(folder)), "triton-walks")
    return os.path.join(walks, os.path.basename(_base().record_path(folder, root)))


# -- what a name resolves to ------------------------------------------------------------------------


class Model:
    """What the walk of this Triton can tell apart: its ``@jit`` and ``constexpr`` types, the modules it does not
    enter."""

    def __init__(self, jit_type, finder_type, rules: Rules):
        import importlib

        self.jit_type, self.rules = jit_type, rules
        self.constexpr_type = importlib.import_module("triton.language.core").constexpr  # the Triton hooked
        self.supported = frozenset(getattr(finder_type("", {}, {}, ""), "supported_modules", ()))

    def describe(self, value):
        """``value`` as JSON, as far as the walk can tell it from another; None when it is not kept."""
        if value is None:
            return ["none"]
        if type(value) is type(sys):
            return ["module", value.__name__]
        if isinstance(value, self.jit_type):
            return ["jit", value._fn_name, str(getattr(value, "noinline", False))]
        if getattr(value, "__triton_aggregate__", False):
            return None
        if isinstance(value, self.constexpr_type):
            inner = _plain(value.value)
            return None if inner is None else ["constexpr", inner]
        plain = _plain(value)
        if plain is not None:
            return ["value", plain]
        module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if (callable(value) or isinstance(value, type)) and isinstance(module, str) and isinstance(name, str):
            kind = type(value)
            return ["object", f"{kind.__module__}.{kind.__qualname__}", module, name]
        return None

    def resolve(self, scope: dict, chain: list[str]) -> tuple[list, list]:
        """(descriptions, values) along ``chain``, as ``DependenciesFinder.visit_Attribute`` follows it: the name
        in ``scope``, then each attribute until a value is None or a module the walk does not enter."""
        value = scope.get(chain[0])
        found, values = [self.describe(value)], [value]
        for attr in chain[1:]:
            try:
                if value is None or getattr(value, "__name__", "") in self.supported:
                    break
                value = getattr(value, attr, None) if self.rules.missing_attribute_is_none else getattr(value, attr)
            except Exception:  # noqa: BLE001 -- the walk would have raised: nothing to replay
                return [None], []
            found.append(self.describe(value))
            values.append(value)
        return found, values


def _plain(value):
    if type(value) in _PLAIN:
        return [type(value).__name__, repr(value)]
    if type(value) is tuple:
        items = [_plain(v) for v in value]
        return None if any(i is None for i in items) else ["tuple", items]
    return None


def chains(tree) -> list[list[str]]:
    """Every name and maximal attribute chain on a name that the function's source reads, but its parameters (the
    walk's first local names); each once, in the order ``ast.walk`` meets them."""
    import ast

    params = {a.arg for a in tree.body[0].args.args}
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found: dict[tuple, None] = {}
    for node in ast.walk(tree):
        if id(node) in inner or not isinstance(node, (ast.Attribute, ast.Name)):
            continue
        if not isinstance(node.ctx, ast.Load):
            continue
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id not in params:
            found[(node.id, *reversed(parts))] = None
    return [list(chain) for chain in found]


def key_from(ret: str, line: int, used: dict, model: Model) -> str:
    """The end of ``JITCallable.cache_key``: the walk's digest, the first line, the ``constexpr`` globals."""
    constexprs = [(name, val) for (name, _), (val, _) in used.items() if isinstance(val, model.constexpr_type)]
    if model.rules.sorted_constexprs:
        constexprs.sort(key=lambda item: (item[0], repr(item[1])))
    return hashlib.sha256((ret + str(line) + str(constexprs)).encode("utf-8")).hexdigest()


# -- the hook ----------------------------------------------------------------------------------------


class Walks:
    """``JITCallable.cache_key`` of one process: replays kept walks, keeps the walks it makes (at exit)."""

    def __init__(self, jit_module, folder: str, rules: Rules):
        self.jit, self.folder, self.rules = jit_module, folder, rules
        self.original = jit_module.JITCallable.__dict__["cache_key"].fget
        self.finder_type = jit_module.DependenciesFinder  # Triton's own, before ``finder_class`` replaces it
        self.model: Model | None = None  # at the first lookup: Triton is imported by then
        self.broken = False  # the first lookup could not set up the replay: Triton walks every function
        self.path = ""
        self.kept: dict | None = None  # fn name -> record entry, read at the first lookup
        self.walked: list = []  # what each walk here saw, kept at exit: off the first call's clock
        self.local = threading.local()  # per thread: finders of the walks in progress; keys set by a replay

    def cache_key(self, fn) -> str:
        with fn._hash_lock:
            if fn.hash is not None:
                return fn.hash
            if self.model is None and (self.broken or not self.ready()):
                return self.original(fn)
            if self.replay(fn):
                self._computed(fn)
                return fn.hash
            return self.walk(fn)

    def ready(self) -> bool:
        """Triton's types and the record's path, at the first lookup; False (walk, keep nothing) if they fail."""
        try:
            if self.folder:  # (none: a build's record of its walks, kept by walk_records)
                self.path = record_path(self.folder, _base().triton_root(sys.modules["triton.runtime.cache"]))
            self.model = Model(self.jit.JITCallable, self.finder_type, self.rules)
        except Exception as exc:  # noqa: BLE001 -- the hook must never cost a lookup more than Triton's own walk
            self.model, self.broken = None, True
            _say("every function", "walked", f"{type(exc).__name__}: {exc}")
            return False
        return True

    def walk(self, fn) -> str:
        """Triton's own walk of ``fn``, kept (with those of the callees it walked) once the outermost one ends."""
        stack = self.local.__dict__.setdefault("finders", [])
        stack.append([])
        try:
            key = self.original(fn)
        finally:
            finders = stack.pop()
        self._computed(fn)
        if finders:  # what the walk saw, small; the rest is read at exit (keeping its tree would cost GC time)
            if not self.walked:
                import atexit

                atexit.register(self.keep)
            finder = finders[0]
            source = hashlib.sha256(fn.src.encode("utf-8")).hexdigest()
            self.walked.append((fn, source, finder.ret, finder.kernelcache_own, finder.kernelcache_callees))
        return key

    def _computed(self, fn) -> None:
        computed = getattr(self.local, "computed", None)
        if computed is not None:
            computed.append(fn)

    # Replaying.
    def records(self) -> dict:
        """fn name -> (entry, where it was kept): the bundles' records, then this cache's served processes' (theirs
        win: the same walks, made where they are replayed), each only when it is for this process's Triton."""
        if self.kept is None:
            key, self.kept, used = _triton_key(), {}, []
            for path, origin in [*((p, "the bundle") for p in bundle_records(self.folder)), (self.path, "served")]:
                record = _read(path)
                if record.get("format") == FORMAT and key is not None and record.get("triton_key") == key:
                    functions = record.get("functions")
                    self.kept.update((name, (entry, origin)) for name, entry in (functions or {}).items())
                    used.append(f"{len(functions or {})} from {path}")
                elif record:
                    _say("kept walks", "refused", f"{path} is for another Triton or malformed")
            _say("kept walks", "read" if used else "none used",
                 "; ".join(used) or f"no record for this Triton in {self.path} or the bundles'")
        return self.kept

    def replay(self, fn) -> bool:
        """Set ``fn.hash`` and ``fn.used_global_vals`` from its kept walk if every input holds; else set nothing."""
        entry, origin = self.records().get(fn._fn_name, (None, ""))
        if entry is None:
            _say(fn._fn_name, "walked", "no kept walk")
            return False
        outer = getattr(self.local, "computed", None)
        self.local.computed = []
        try:
            why = self.mismatch(fn, entry)
        except Exception as exc:  # noqa: BLE001 -- a malformed record, or what the walk itself would raise
            why = f"{type(exc).__name__}: {exc}"
        finally:
            computed, self.local.computed = self.local.computed, outer
        if why:
            for other in computed:  # Triton's walk then meets them as it would have
                other.hash, other.used_global_vals = None, {}
            _say(fn._fn_name, "walked", why)
            return False
        if outer is not None:
            outer.extend(computed)
        _say(fn._fn_name, "replayed", f"{len(entry['chains'])} names and {len(entry['callees'])} callees as "
             f"recorded by {origin}")
        return True

    def mismatch(self, fn, entry: dict) -> str:
        """Why the kept walk of ``fn`` does not hold now, or "" once ``fn``'s key is set from it."""
        import copy

        model = self.model
        if getattr(fn.fn, "__closure__", None):
            return "a closure"
        if hashlib.sha256(fn.src.encode("utf-8")).hexdigest() != entry["src"]:
            return "the source changed"
        scope, callees = fn.__globals__, {}
        for chain, recorded in entry["chains"]:
            found, values = model.resolve(scope, chain)
            if found != recorded:
                return f"{'.'.join(chain)} is {found[-1]}, was {recorded[-1]}"
            callees.update((v._fn_name, v) for v in values if isinstance(v, model.jit_type))
        used = {}
        for name, recorded in entry["own"]:
            value = scope.get(name)
            if model.describe(value) != recorded:
                return f"the global {name} changed"
            used[(name, id(scope))] = (copy.deepcopy(value), scope)
        fn.hash = f"recursion:{fn._fn_name}"  # as the walk marks the function it is in
        try:
            for name, key in entry["callees"]:
                why = _met(used, callees[name], key, model.rules.callee_key_first)
                if why:
                    return why
        finally:
            fn.hash = None
        fn.used_global_vals = dict(sorted(used.items()))
        fn.hash = key_from(entry["ret"], fn.starting_line_number, fn.used_global_vals, model)
        return ""

    # Keeping.
    def entry(self, fn, source: str, ret: str, own: list, callees: list) -> dict | None:
        """What the walk of ``fn`` read (its source's sha256, digest, own globals and callees as the walk saw
        them), if all of it can be told again and still holds; else None."""
        model = self.model
        if getattr(fn.fn, "__closure__", None) or not isinstance(fn.hash, str) or fn.hash.startswith("recursion:"):
            return None
        if hashlib.sha256(fn.src.encode("utf-8")).hexdigest() != source:
            return None
        if key_from(ret, fn.starting_line_number, fn.used_global_vals, model) != fn.hash:
            return None
        scope, found, jit = fn.__globals__, [], {}
        for chain in chains(fn.parse()):
            described, values = model.resolve(scope, chain)
            if None in described:
                return None
            found.append([chain, described])
            jit.update((v._fn_name, v) for v in values if isinstance(v, model.jit_type))
        if any(name not in jit or jit[name].hash != key for name, key in callees):
            return None  # a callee rebound or reset since the walk
        kept = []
        for name in dict.fromkeys(own):
            value, copied = scope.get(name), fn.used_global_vals.get((name, id(scope)), (None,))[0]
            if model.describe(value) is None or model.describe(value) != model.describe(copied):
                return None  # changed since the walk, which a launch refuses too
            kept.append([name, model.describe(value)])
        return {"src": source, "ret": ret, "chains": found, "own": kept, "callees": callees}

    def keep(self) -> None:
        """Add this process's walks to the record (one rename), at exit; a read-only folder keeps nothing."""
        try:
            self._keep()
        except Exception as exc:  # noqa: BLE001 -- at exit: nothing kept is all it may cost
            _say("kept walks", "not written", f"{type(exc).__name__}: {exc}")

    def entries(self) -> dict:
        """What each walk made here read, by function name, as a record keeps it (those that can be told again)."""
        found = {seen[0]._fn_name: entry for seen in self.walked if (entry := self.entry(*seen)) is not None}
        self.walked = []
        return found

    def _keep(self) -> None:
        new = self.entries()
        key = _triton_key()
        if key is None or not new:
            return
        record = _read(self.path)
        functions = record.get("functions") if record.get("triton_key") == key else None
        functions = {**(functions or {}), **new}
        try:
            _base().write_json(self.path, {"format": FORMAT, "triton_key": key, "functions": functions})
        except OSError as exc:
            _say("kept walks", "not written", str(exc))
            return
        _say("kept walks", f"{len(functions)} functions", self.path)

    def finder_class(self):
        """``DependenciesFinder`` as it is, telling this hook the globals it recorded and the callees it met."""
        base, hook = self.finder_type, self

        class Finder(base):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.kernelcache_own, self.kernelcache_callees = [], []
                stack = getattr(hook.local, "finders", None)
                if stack and not stack[-1]:
                    stack[-1].append(self)

            def record_reference(self, val, var_dict=None, name=None):
                before = self.used_global_vals.get((name, id(var_dict)))
                super().record_reference(val, var_dict, name)
                if var_dict is self.globals and self.used_global_vals.get((name, id(var_dict))) is not before:
                    self.kernelcache_own.append(name)

            def _update_hash(self, func):
                super()._update_hash(func)
                self.kernelcache_callees.append([func._fn_name, func.hash])

        Finder.__name__, Finder.__qualname__ = base.__name__, base.__qualname__
        return Finder


def _met(used: dict, callee, key: str, key_first: bool) -> str:
    """What ``DependenciesFinder._update_hash`` does with a callee, in this Triton's order (``Rules``): why the
    recorded walk does not hold for it, or ""."""
    if key_first and callee.cache_key != key:
        return f"the callee {callee._fn_name} has another key"
    why = _merge(used, callee)
    if why or key_first:
        return why
    return "" if callee.cache_key == key else f"the callee {callee._fn_name} has another key"


def _merge(used: dict, callee) -> str:
    """``DependenciesFinder._update_hash``'s merge of a callee's globals; why not, where the walk would raise."""
    for key in used.keys() & callee.used_global_vals.keys():
        if used[key][0] != callee.used_global_vals[key][0]:
            return f"the global {key[0]} conflicts with {callee._fn_name}'s"
    used.update(callee.used_global_vals)
    return ""


def _triton_key() -> str | None:
    """This process's ``triton_key()`` when it is kernelcache's seeded one (kept, or computed once), else None. A
    wrapper around it (a profiler's, with ``__wrapped__``) is looked through."""
    function = getattr(sys.modules.get("triton.runtime.cache"), "triton_key", None)
    while function is not None and not getattr(function, "kernelcache_seeded", False):
        function = getattr(function, "__wrapped__", None)
    return function() if function is not None else None


def _read(path: str) -> dict:
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _say(subject: str, outcome: str, why: str) -> None:
    base = _base()
    if base.debugging():
        base.say(subject if subject == "kept walks" else f"Triton's walk of {subject}", outcome, why)


def walk_records(jit_module, functions) -> dict | None:
    """The record a bundle carries of Triton's walks of ``functions`` (``@jit`` functions a build ran) and of every
    callee they reach: each walked again here, in order of name, so that the record does not depend on the order
    the build's threads first walked them in, and kept as ``keep`` keeps a served process's. None for a Triton this
    replay was not checked against. Call it last: every ``@jit`` function of the process walks again when next
    looked up."""
    import gc

    version = getattr(sys.modules.get("triton"), "__version__", "")
    rules, cache = rules_for(version), sys.modules.get("triton.runtime.cache")
    if rules is None or cache is None or not hasattr(cache, "triton_key"):
        return None
    walks = Walks(jit_module, "", rules)
    walks.kept = {}  # replays nothing: every function is walked
    if not walks.ready():
        return None
    jit_type, finder = jit_module.JITCallable, jit_module.DependenciesFinder
    prop = jit_type.__dict__["cache_key"]
    for fn in gc.get_objects():
        if isinstance(fn, jit_type) and fn.hash is not None:
            fn.hash, fn.used_global_vals = None, {}
    jit_module.DependenciesFinder, jit_type.cache_key = walks.finder_class(), property(walks.cache_key)
    try:
        for fn in sorted(functions, key=lambda f: f._fn_name):
            fn.cache_key  # noqa: B018 -- walks it (and the callees it meets) through the hook
    finally:
        jit_module.DependenciesFinder, jit_type.cache_key = finder, prop
    found = walks.entries()
    return {"format": FORMAT, "triton_key": cache.triton_key(), "functions": dict(sorted(found.items()))}


def seed(jit_module, folder: str) -> None:
    """Make ``jit_module.JITCallable.cache_key`` (``triton.runtime.jit``) replay the walks kept in ``folder``."""
    current = jit_module.JITCallable.__dict__.get("cache_key")
    if not enabled() or not isinstance(current, property) or getattr(current.fget, "kernelcache_walks", None):
        return
    version = getattr(sys.modules.get("triton"), "__version__", "")
    rules = rules_for(version)
    if rules is None:
        _say("every function", "walked", f"Triton {version} is not one this replay was checked against")
        return
    walks = Walks(jit_module, folder, rules)
    jit_module.DependenciesFinder = walks.finder_class()

    def cache_key(fn) -> str:
        return walks.cache_key(fn)

    cache_key.kernelcache_walks = walks
    jit_module.JITCallable.cache_key = property(cache_key)
