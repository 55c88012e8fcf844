"""`@record`: a frozen, typed record for modules on the hooks' start path,
without the import of `dataclasses` and the methods it compiles per class.

Every opted-in job's Prolog and every `sbatch --snapshot-*` starts a Python
process, and a frozen dataclass costs it twice (measured with callgrind on
the 2-core machine of docs/benchmarks.md): `import dataclasses` pulls in
`inspect` and friends, 57 M instructions (~17 ms, more than the interpreter's
own start), and each class then compiles its __init__/__repr__/__eq__/
__hash__/__setattr__ with exec, ~3 M instructions (~1 ms) a class; the hook
path had 37 of them. `@record` builds the same methods from closures, which
costs almost nothing to define.

A record is still a dataclass to everything that asks: `dataclasses.fields`,
`asdict`, `replace` and `is_dataclass` work on it (the first look at the
class's `__dataclass_fields__` builds the real Field objects, importing
`dataclasses` then), and assigning to a field raises
`dataclasses.FrozenInstanceError`. Written like a dataclass:

    @record
    class VolumeRecord:
        path: str
        scope: str
        node: str = ""
        options: dict = factory(dict)      # field(default_factory=dict)

Annotations are read as strings (modules use `from __future__ import
annotations`); names annotated `ClassVar[...]` are not fields. `order=True`
adds the comparisons, as dataclasses' does. A class that is instantiated
often (1,000s of parts in one set) gets a compiled __init__ after its first
few hundred instances, as fast as a dataclass's.
"""
from __future__ import annotations

_MISSING = object()
# After this many instances a class's __init__ is compiled (one exec, ~0.2 ms):
# the hook path builds a handful of each class, the coordinator thousands.
_COMPILE_AFTER = 256


class factory:
    """The default of a field made fresh for each instance (dataclasses'
    `field(default_factory=...)`)."""

    __slots__ = ("make",)

    def __init__(self, make):
        self.make = make


class _DataclassView:
    """`__dataclass_fields__`/`__dataclass_params__` of a record, built on
    first use, so the dataclasses module is imported only by code that asks."""

    def __init__(self, attr: str):
        self.attr = attr

    def __get__(self, obj, owner):
        if "__dataclass_fields__" not in owner.__dict__ or isinstance(owner.__dict__["__dataclass_fields__"],
                                                                      _DataclassView):
            _as_dataclass(owner)
        return owner.__dict__[self.attr]


def _as_dataclass(cls) -> None:
    import dataclasses

    specs = []
    for name in cls.__record_fields__:
        default = cls.__record_defaults__.get(name, _MISSING)
        if isinstance(default, factory):
            specs.append((name, _annotation(cls, name), dataclasses.field(default_factory=default.make)))
        elif default is _MISSING:
            specs.append((name, _annotation(cls, name)))
        else:
            specs.append((name, _annotation(cls, name), dataclasses.field(default=default)))
    twin = dataclasses.make_dataclass(cls.__name__, specs, frozen=True, order=cls.__record_order__)
    cls.__dataclass_fields__ = twin.__dataclass_fields__
    cls.__dataclass_params__ = twin.__dataclass_params__


def _annotation(cls, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__.get("__annotations__", {}):
            return klass.__dict__["__annotations__"][name]
    return "object"


def _frozen(self, name, value=None):
    import dataclasses

    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _is_classvar(annotation) -> bool:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text.startswith(("ClassVar", "typing.ClassVar"))


def record(cls=None, /, *, order: bool = False):
    """Make `cls` a frozen record (see the module's docstring)."""
    if cls is None:
        return lambda c: record(c, order=order)
    return _build(cls, order)


def _build(cls, order: bool):
    names: list[str] = []
    defaults: dict[str, object] = {}
    for klass in reversed(cls.__mro__[:-1]):     # a record's base records' fields first, as dataclasses do
        for name in klass.__dict__.get("__record_fields__", ()):
            if name not in names:
                names.append(name)
            if name in klass.__record_defaults__:
                defaults[name] = klass.__record_defaults__[name]
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        if _is_classvar(annotation):
            continue
        if name not in names:
            names.append(name)
        if name in cls.__dict__:
            defaults[name] = cls.__dict__[name]
        elif name not in defaults and any(n in defaults for n in names[:names.index(name)]):
            raise TypeError(f"non-default argument {name!r} follows default argument")
    for name in names:
        if isinstance(cls.__dict__.get(name), factory):
            delattr(cls, name)   # as dataclasses do: no class attribute for a made-fresh default
    fields = tuple(names)
    values = _values_getter(fields)
    own = {
        "__record_fields__": fields, "__record_defaults__": defaults, "__record_order__": order,
        "__match_args__": fields, "__setattr__": _frozen, "__delattr__": _frozen,
        "__dataclass_fields__": _DataclassView("__dataclass_fields__"),
        "__dataclass_params__": _DataclassView("__dataclass_params__"),
    }
    made = {
        "__init__": _generic_init(cls, fields, defaults),
        "__repr__": lambda self: f"{type(self).__qualname__}(" + ", ".join(
            f"{n}={getattr(self, n)!r}" for n in fields) + ")",
        "__eq__": lambda self, other: ((self is other or values(self) == values(other))
                                       if other.__class__ is self.__class__ else NotImplemented),
        "__hash__": lambda self: hash(values(self)),
    }
    if order:
        made.update({op: _comparison(test, values) for op, test in (("__lt__", tuple.__lt__), ("__le__", tuple.__le__),
                                                             ("__gt__", tuple.__gt__), ("__ge__", tuple.__ge__))})
    for attr, value in own.items():
        setattr(cls, attr, value)
    for attr, value in made.items():
        # A method the class writes itself stays, as with dataclasses (an
        # explicit __hash__ included; the __hash__ = None that defining
        # __eq__ implies is not the class's own choice).
        if attr not in cls.__dict__ or (attr == "__hash__" and cls.__dict__[attr] is None):
            setattr(cls, attr, value)
    return cls


def _values_getter(fields: tuple[str, ...]):
    """obj -> the tuple of its field values, by operator.attrgetter (in C):
    the coordinator compares thousands of acknowledgements per barrier
    (protocol/ackledger.py). Built on first use: the hooks never compare."""
    got = None

    def values(obj) -> tuple:
        nonlocal got
        if got is None:
            from operator import attrgetter

            if len(fields) > 1:
                got = attrgetter(*fields)
            elif fields:
                one = attrgetter(fields[0])
                got = lambda o: (one(o),)  # noqa: E731
            else:
                got = lambda o: ()  # noqa: E731
        return got(obj)

    return values


def _comparison(test, values):
    def compare(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return test(values(self), values(other))
    return compare


def _generic_init(cls, fields: tuple[str, ...], defaults: dict[str, object]):
    setter = object.__setattr__
    post_init = getattr(cls, "__post_init__", None)
    count = [0]

    def __init__(self, *args, **kwargs):
        if len(args) > len(fields):
            raise TypeError(f"{cls.__name__}.__init__() takes {len(fields) + 1} positional arguments "
                            f"but {len(args) + 1} were given")
        for name, value in zip(fields, args):
            if name in kwargs:
                raise TypeError(f"{cls.__name__}.__init__() got multiple values for argument {name!r}")
            setter(self, name, value)
        missing = []
        for name in fields[len(args):]:
            if name in kwargs:
                setter(self, name, kwargs.pop(name))
                continue
            default = defaults.get(name, _MISSING)
            if default is _MISSING:
                missing.append(name)
            else:
                setter(self, name, default.make() if isinstance(default, factory) else default)
        if kwargs:
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument {next(iter(kwargs))!r}")
        if missing:
            raise TypeError(f"{cls.__name__}.__init__() missing {len(missing)} required argument"
                            f"{'s' if len(missing) > 1 else ''}: {', '.join(repr(m) for m in missing)}")
        if post_init is not None:
            post_init(self)
        count[0] += 1
        if count[0] == _COMPILE_AFTER and cls.__dict__.get("__init__") is __init__:
            cls.__init__ = _compiled_init(cls, fields, defaults, post_init)

    return __init__


def _compiled_init(cls, fields, defaults, post_init):
    """The same __init__ as one compiled function: a dataclass's speed for
    the classes the coordinator makes thousands of."""
    env = {"_set": object.__setattr__, "_post": post_init, "_factory": factory}
    params, lines = [], []
    for i, name in enumerate(fields):
        default = defaults.get(name, _MISSING)
        if default is _MISSING:
            params.append(name)
        elif isinstance(default, factory):
            env[f"_d{i}"] = default.make
            params.append(f"{name}=_factory")
            lines.append(f"  if {name} is _factory: {name} = _d{i}()")
        else:
            env[f"_d{i}"] = default
            params.append(f"{name}=_d{i}")
        lines.append(f"  _set(self, {name!r}, {name})")
    if post_init is not None:
        lines.append("  _post(self)")
    src = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines or ["  pass"]) + "\n"
    ns: dict = {}
    exec(src, env, ns)  # noqa: S102 - source built from the class's own field names
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    return init


def replace(obj, /, **changes):
    """A copy of record `obj` with `changes` (dataclasses.replace without
    importing dataclasses)."""
    cls = type(obj)
    for name in cls.__record_fields__:
        if name not in changes:
            changes[name] = getattr(obj, name)
    return cls(**changes)
