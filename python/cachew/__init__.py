"""cachew: ML input-data processing as a library and as a service.

Pipelines read like tf.data::

    import cachew
    ds = cachew.range(1000).map("add", value=1).batch(64)
    for (x,) in ds:                 # tuples of cachew.Tensor
        a = x.to_numpy()            # zero-copy, read-only

    ds = cachew.Dataset.parse('from_tensors({image=[1, 2], label=3})')
    for e in ds:                    # named components: dicts
        e["image"], e["label"]
    ds.element_spec                 # {'image': TensorSpec(...), 'label': ...}
    ds.cardinality(), len(ds)       # 1, 1

    ds = cachew.Dataset.parse('tfrecord("data/*.tfrecord") | parse_example('
                              'img="image/encoded:bytes", label="y:i64") | batch(32)')
    for e in ds.iterator(service="tcp://dispatcher:7070"):
        img, label = e["img"], e["label"]
        ...

Each builder appends one stage to the pipeline string, so every operator
of the library (and of loaded plugins) is reachable as a method with
tf.data's spelling: positional values fill its parameters in table order,
keyword arguments name them (``docs/operators.md``). Options
(``docs/configuration.md``) are keyword arguments of ``iterator()`` or
``with_options()``. Failures raise the exception of their error code
(``ParseError``, ``CorruptDataError``, ``ServiceError`` and its
subclasses...), carrying the library's message.
"""
import logging as _logging
import math as _math
import numbers as _numbers
import re as _re
import threading as _threading
from builtins import zip as _builtin_zip

from . import _cachew
from ._cachew import (  # noqa: F401  (the public names)
    AlreadyExistsError,
    AuthenticationError,
    CanceledError,
    ClosedError,
    CorruptDataError,
    DeadlineExceededError,
    Error,
    InternalError,
    InvalidArgumentError,
    IOFailedError,
    Iterator,
    NotFoundError,
    NotSupportedError,
    OperatorError,
    OutOfMemoryError,
    OutOfRangeError,
    ParseError,
    PermissionDeniedError,
    ProtocolError,
    ServiceError,
    Tensor,
    TypeMismatchError,
)

__version__ = _cachew.version()

AUTO = "auto"  # parallel=AUTO, prefetch(AUTO): tuned online

# Dataset.cardinality() of a dataset that never ends, and of one whose
# length is not known before iterating it: tf.data's values, also under
# tf.data's names.
INFINITE = -1
UNKNOWN = -2
INFINITE_CARDINALITY = INFINITE
UNKNOWN_CARDINALITY = UNKNOWN


class TensorSpec:
    """What one component of a dataset's elements holds, known when the
    pipeline is built (tf.data's ``tf.TensorSpec``).

    ``shape``: a tuple of dimensions, ``None`` for a dimension not known
    (a batch without ``drop_remainder``), or ``None`` itself when the rank
    is not known. ``dtype``: a ``Tensor.dtype`` name (``"u8"``, ``"i64"``,
    ``"bytes"``...), ``None`` when not known. ``name``: the component's
    name, ``None`` when unnamed.
    """

    __slots__ = ("shape", "dtype", "name")

    def __init__(self, shape, dtype, name=None):
        self.shape = None if shape is None else tuple(shape)
        self.dtype = dtype
        self.name = name

    def __eq__(self, other):
        if not isinstance(other, TensorSpec):
            return NotImplemented
        return (self.shape, self.dtype, self.name) == (other.shape, other.dtype, other.name)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.name))

    def __repr__(self):
        return "TensorSpec(shape=%r, dtype=%r, name=%r)" % (self.shape, self.dtype, self.name)

    def is_compatible_with(self, tensor):
        """Whether ``tensor`` (a ``Tensor`` or a ``TensorSpec``) fits this
        spec: the same dtype and rank, and equal dimensions where both are
        known."""
        dtype, shape = tensor.dtype, tensor.shape
        if self.dtype is not None and dtype is not None and dtype != self.dtype:
            return False
        if self.shape is None or shape is None:
            return True
        return len(shape) == len(self.shape) and all(
            a is None or b is None or a == b for a, b in _builtin_zip(self.shape, shape))


_NAME = _re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _literal(v):
    """A Python value as a pipeline-string value."""
    if isinstance(v, Dataset):
        return str(v)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, _numbers.Integral):
        return str(int(v))
    if isinstance(v, _numbers.Real):
        f = float(v)
        if _math.isnan(f):
            return "nan"
        if _math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return repr(f)
    if isinstance(v, str):
        v = v.encode("utf-8", "surrogateescape")
    if isinstance(v, (bytes, bytearray)):
        out = []
        for b in v:
            c = chr(b)
            if c in "\"\\":
                out.append("\\" + c)
            elif 0x20 <= b < 0x7F:
                out.append(c)
            else:
                out.append("\\x%02x" % b)
        return '"' + "".join(out) + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_literal(x) for x in v) + "]"
    if isinstance(v, tuple):
        return "(" + ", ".join(_literal(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, dict):
        # A map: named components in from_tensors and from_list.
        for k in v:
            if not isinstance(k, str) or not _NAME.fullmatch(k):
                raise TypeError("cachew: a map key must be a name ([A-Za-z_][A-Za-z0-9_]*), "
                                "not %r" % (k,))
        return "{" + ", ".join("%s=%s" % (k, _literal(x)) for k, x in v.items()) + "}"
    if hasattr(v, "tolist"):  # numpy arrays and scalars
        return _literal(v.tolist())
    raise TypeError("cachew: cannot write %r (%s) as a pipeline value" % (v, type(v).__name__))


def _stage(op, args, kwargs):
    parts = [_literal(a) for a in args]
    for k, v in kwargs.items():
        if v is not None:
            parts.append("%s=%s" % (k, _literal(v)))
    return "%s(%s)" % (op, ", ".join(parts))


def _source(op, *args, **kwargs):
    return Dataset.parse(_stage(op, args, kwargs))


class Dataset:
    """A pipeline: immutable, shareable between threads, cheap to copy.

    Iterating it (``for e in ds``) runs it with the options given to
    ``with_options`` (none: the defaults, ``CACHEW_SERVICE`` if set);
    ``iterator(**options)`` runs it with more.
    """

    __slots__ = ("_ds", "_options")

    def __init__(self, handle, options=None):
        if not isinstance(handle, _cachew.Dataset):
            raise TypeError("cachew: use Dataset.parse() or the builders")
        self._ds = handle
        self._options = dict(options or {})

    @staticmethod
    def parse(pipeline):
        """Parses a pipeline string (``docs/pipeline-syntax.md``)."""
        return Dataset(_cachew.parse(pipeline))

    def __str__(self):
        return self._ds.to_string()

    def __reduce__(self):
        # Pickled as its canonical string (spawned DataLoader workers,
        # multiprocessing): the same fingerprint on the other side.
        return (_unpickle, (str(self), self._options))

    def __repr__(self):
        return "cachew.Dataset.parse(%r)" % str(self)

    @property
    def fingerprint(self):
        """The 128-bit structural fingerprint as 32 hex digits: equal for
        pipelines that compute the same data."""
        return self._ds.fingerprint()

    @property
    def element_spec(self):
        """What the elements hold, known before any is read, in the
        structure iteration yields: a tuple of ``TensorSpec``, one per
        component, or a dict ``{name: TensorSpec}`` in component order
        when components are named (an unnamed one beside them keyed by
        its position). ``None`` when not known: downstream of a function
        registered from C or by a plugin (``docs/element-spec.md``)."""
        spec = self._ds.spec()
        if spec is None:
            return None
        specs = [TensorSpec(shape, dtype, name) for dtype, shape, name in spec]
        if all(s.name is None for s in specs):
            return tuple(specs)
        return {(i if s.name is None else s.name): s for i, s in enumerate(specs)}

    def cardinality(self):
        """Elements per epoch, known before iterating: a count,
        ``cachew.INFINITE`` (``repeat()``) or ``cachew.UNKNOWN``
        (``filter``, files not yet read). Per operator in
        ``docs/element-spec.md``."""
        return self._ds.cardinality()

    def __len__(self):
        # tf.data's: only a known, finite count is a length.
        n = self._ds.cardinality()
        if n == INFINITE:
            raise TypeError("cachew: the dataset is infinite")
        if n < 0:
            raise TypeError("cachew: the dataset's length is unknown; "
                            "cardinality() is cachew.UNKNOWN")
        return n

    def __bool__(self):
        # A dataset is true even when empty, infinite or of unknown length
        # (__len__ alone would make bool() raise or say False).
        return True

    @property
    def op(self):
        """The last stage's operator name."""
        return self._ds.op

    @property
    def inputs(self):
        """The input pipelines of the last stage."""
        return tuple(Dataset(h, self._options) for h in self._ds.inputs)

    def apply(self, op, *args, **kwargs):
        """Appends the stage ``op(args, key=value...)``: any operator,
        including a plugin's."""
        return Dataset(_cachew.parse("%s | %s" % (self, _stage(op, args, kwargs))), self._options)

    def __getattr__(self, op):
        if op.startswith("_"):
            raise AttributeError(op)

        def stage(*args, **kwargs):
            return self.apply(op, *args, **kwargs)

        stage.__name__ = op
        return stage

    # -- the tf.data transformations, spelled out for help() and stubs --

    def map(self, fn, *args, parallel=None, deterministic=None, **params):
        """Applies the registered map function ``fn`` (its parameters as
        keyword arguments); ``parallel``: threads or ``AUTO``."""
        return self.apply("map", fn, *args, parallel=parallel, deterministic=deterministic, **params)

    def filter(self, fn, **params):
        return self.apply("filter", fn, **params)

    def flat_map(self, fn, **params):
        return self.apply("flat_map", fn, **params)

    def interleave(self, fn, *args, **kwargs):
        return self.apply("interleave", fn, *args, **kwargs)

    def batch(self, n, drop_remainder=None):
        return self.apply("batch", n, drop_remainder=drop_remainder)

    def padded_batch(self, n, **kwargs):
        return self.apply("padded_batch", n, **kwargs)

    def unbatch(self):
        return self.apply("unbatch")

    def shuffle(self, buffer, **kwargs):
        return self.apply("shuffle", buffer, **kwargs)

    def repeat(self, count=-1):
        return self.apply("repeat", count)

    def take(self, n):
        return self.apply("take", n)

    def skip(self, n):
        return self.apply("skip", n)

    def prefetch(self, n=AUTO):
        return self.apply("prefetch", n)

    def shard(self, num, index):
        return self.apply("shard", num, index)

    def zip(self, *others):
        return self.apply("zip", *others)

    def concatenate(self, other):
        return self.apply("concatenate", other)

    def enumerate(self, start=None):
        return self.apply("enumerate", start=start)

    def autocache(self):
        return self.apply("autocache")

    def read_file(self):
        return self.apply("read_file")

    # -- running --

    def with_options(self, **options):
        """The same pipeline, iterated with these options by default."""
        merged = dict(self._options)
        merged.update(options)
        return Dataset(self._ds, merged)

    def iterator(self, writable=False, **options):
        """Runs the pipeline: an Iterator yielding tuples of Tensors, or
        dicts ``{name: Tensor}`` when the components are named.

        ``writable=True`` gives writable arrays: a buffer the element
        alone owns is written in place, one that belongs to a received
        message (through a service) or is shared is copied first.
        """
        merged = dict(self._options)
        merged.update(options)
        return Iterator(self._ds, merged, writable)

    def __iter__(self):
        return self.iterator()

    def shard_source(self, num, index):
        """The pipeline with ``shard(num, index)`` right after its source,
        so that ``num`` readers each compute a disjoint share: by file for
        ``list_files``, by element (record, line, value) otherwise. A
        stage that sees the stream as a whole (``take``, ``skip``,
        ``enumerate``, ``unique``, ``scan``, ``reduce``, ``window``, a
        cache or a writer: see ``_WHOLE_STREAM``) keeps it: the shard goes
        after the last such stage, and every reader computes the stages up
        to it. A pipeline of several sources is sharded at its end."""
        node, chain = self, []
        while len(node._ds.inputs) == 1:
            chain.append(node)
            node = node.inputs[0]
        if len(node._ds.inputs) > 1:
            return self.shard(num, index)
        cut = node
        for stage in reversed(chain):  # from the source on
            if stage.op in _WHOLE_STREAM:
                cut = stage
        whole, head = str(self), str(cut)
        if not whole.startswith(head):
            return self.shard(num, index)
        text = head + " | " + _stage("shard", (num, index), {}) + whole[len(head):]
        return Dataset(_cachew.parse(text), self._options)


# Stages whose output depends on the whole stream before them (positions,
# counts, what came earlier) or that write the whole dataset somewhere: a
# reader's shard must not run before them (take(100) over 4 shards gave
# 400 elements; enumerate restarted in each reader).
_WHOLE_STREAM = frozenset((
    "take", "skip", "shard", "enumerate", "unique", "scan", "reduce",
    "take_while", "window", "cache", "cache_put", "autocache",
    "tfrecord_write"))


def _unpickle(text, options):
    return Dataset(_cachew.parse(text), options)


# -- sources --


def range(*args, **kwargs):  # noqa: A001  (tf.data's name)
    """i64 scalars: range(stop), range(start, stop), range(start, stop, step)."""
    return _source("range", *args, **kwargs)


def from_tensors(values):
    """One element from a literal; a tuple gives several components, a
    dict named ones (in key order)."""
    return _source("from_tensors", values)


def from_list(values):
    """One element per item of a list."""
    return _source("from_list", list(values))


def list_files(files, **kwargs):
    """The paths matching glob patterns, as bytes scalars."""
    return _source("list_files", files, **kwargs)


def text_lines(files, **kwargs):
    return _source("text_lines", files, **kwargs)


def fixed_length_records(files, record_bytes, **kwargs):
    return _source("fixed_length_records", files, record_bytes, **kwargs)


def tfrecord(files, **kwargs):
    """The records of TFRecord files, as bytes scalars."""
    return _source("tfrecord", files, **kwargs)


def zip(*datasets):  # noqa: A001
    first, rest = datasets[0], datasets[1:]
    return first.zip(*rest)


def counter(start=None, step=None):
    """Endless i64 scalars start, start+step, ... (tf.data's Counter)."""
    return _source("counter", start=start, step=step)


def random(seed=None, rerandomize_each_iteration=None):
    """Endless i64 values uniform over [0, 2^63) (tf.data's
    Dataset.random); seed None follows the pipeline seed."""
    return _source("random", seed=seed,
                   rerandomize_each_iteration=rerandomize_each_iteration)


def sample_from_datasets(datasets, weights=None, seed=None,
                         stop_on_empty_dataset=None,
                         rerandomize_each_iteration=None):
    """Each element drawn from one of ``datasets`` at random, input i with
    probability weights[i] / sum(weights) (tf.data's
    sample_from_datasets: a data mixture)."""
    first, rest = datasets[0], list(datasets[1:])
    return first.apply("sample_from_datasets", *rest, weights=weights,
                       seed=seed, stop_on_empty_dataset=stop_on_empty_dataset,
                       rerandomize_each_iteration=rerandomize_each_iteration)


def choose_from_datasets(datasets, choice_dataset, stop_on_empty_dataset=None):
    """For each integer of ``choice_dataset``, the next element of
    ``datasets[that integer]`` (tf.data's choose_from_datasets)."""
    first, rest = datasets[0], list(datasets[1:])
    return first.apply("choose_from_datasets", *rest, choice_dataset,
                       stop_on_empty_dataset=stop_on_empty_dataset)


def options():
    """The option table: (name, type, default, help) tuples."""
    return _cachew.options()


def load_plugin(path):
    """Loads a plugin (a shared object with ``cachew_plugin_init``, as
    ``cachew_plugin_load`` in C): its operators become builders and
    pipeline-string operators like the library's. Loading the same file
    twice is a no-op; a plugin is never unloaded. Raises ``NotFoundError``
    for a missing file or one without the init symbol, and what the
    plugin's init returned otherwise, with the library's message."""
    _cachew.load_plugin(path)


# -- logging --

# cachew's levels (error, warn, info, debug) and Python's.
_PY_LEVELS = (_logging.ERROR, _logging.WARNING, _logging.INFO, _logging.DEBUG)
_bridge = {"thread": None, "pid": None}


def _forward_logs():
    while True:
        dropped, lines = _cachew.log_wait(500)
        if dropped:
            _logging.getLogger("cachew").warning(
                "%d library log lines were dropped (the bridge fell behind)", dropped)
        for level, module, msg in lines:
            _logging.getLogger("cachew." + module).log(_PY_LEVELS[level], "%s", msg)


def enable_logging(level=_logging.INFO):
    """Sends the library's log lines at ``level`` and above to Python's
    ``logging``, as loggers ``cachew.<module>`` (``cachew.exec``,
    ``cachew.client``...). The library logs on its own threads; a daemon
    thread forwards the lines (so handlers run on it, never on the
    library's threads). ``level=None`` stops it. Call it again in a forked
    child: the forwarding thread does not cross fork()."""
    import os
    if level is None:
        _cachew.log_enable(-1)
        return
    clevel = 0
    for i, py in enumerate(_PY_LEVELS):
        if level <= py:
            clevel = i
    _cachew.log_enable(clevel)
    if _bridge["pid"] != os.getpid():
        t = _threading.Thread(target=_forward_logs, name="cachew-log", daemon=True)
        t.start()
        _bridge["thread"], _bridge["pid"] = t, os.getpid()
