"""PyTorch integration: ``cachew.torch.IterableDataset``.

    from torch.utils.data import DataLoader
    import cachew, cachew.torch

    ds = cachew.Dataset.parse('tfrecord("train/*.tfrecord") | parse_example('
                              'image="image/encoded:bytes", label="image/class/label:i64")'
                              ' | ... | batch(64)')
    data = cachew.torch.IterableDataset(ds, seed=0)
    loader = DataLoader(data, batch_size=None, num_workers=2)
    for epoch in range(epochs):
        data.set_epoch(epoch)
        for batch in loader:            # named components: a dict
            images, labels = batch["image"], batch["label"]

The pipeline batches, so the loader must not (``batch_size=None``). Each
item is a tuple of torch tensors viewing the element's memory (DLPack, no
copy), or a dict of them when the components are named
(``parse_example``, ``from_tensors({...})``). ``len()`` is the epoch's
length over all workers when the pipeline knows it.

Workers (``num_workers`` > 0, the default fork start method): each gets a
disjoint share of the epoch.
  - In-process (the embedded service or ``service="local"``): the
    pipeline is sharded right after its source (``Dataset.shard_source``):
    by file for ``list_files``, by record, line or value otherwise.
  - Through a service (``service`` or ``CACHEW_SERVICE`` naming a
    dispatcher): the workers join one shared job (``job_name``, made from
    a token drawn when this object was made and the epoch), over which the
    dispatcher hands out splits: each element goes to one worker.
The parent process creates no iterator: forked workers may then use a
remote service (nng cannot run in a child forked after its parent used
it; the library then raises NotSupportedError saying so).

``set_epoch(n)`` sets the ``epoch`` option: shuffles with
``reshuffle=true``, ``list_files(shuffle=true)`` and random functions draw
anew. Call it before the loader's iteration starts the workers (with
``persistent_workers=True`` the workers keep the epoch they were started
with). ``seed`` fixes the pipeline seed in every worker; without it each
iteration draws a fresh one, shared by the workers of one epoch.
"""
import os

import torch.utils.data as _data

from . import Dataset

_REMOTE = ("tcp://", "ipc://", "tls+tcp://")


def _is_remote(service):
    return any(service.startswith(p) for p in _REMOTE)


class IterableDataset(_data.IterableDataset):
    """A cachew pipeline as a torch IterableDataset (see the module's doc).

    ``dataset``: a ``cachew.Dataset`` (or a pipeline string). ``seed``: the
    pipeline seed (None: drawn per epoch, the same in every worker).
    ``epoch``: the first epoch. ``writable``: writable tensors (copies
    buffers received from a service). Other keyword arguments are
    iterator options (``service``, ``threads``, ``job_name``...).
    """

    def __init__(self, dataset, *, seed=None, epoch=0, writable=False, **options):
        super().__init__()
        if isinstance(dataset, str):
            dataset = Dataset.parse(dataset)
        self.dataset = dataset
        self.seed = seed
        self.epoch = epoch
        self.writable = writable
        self.options = options
        # Names this object's shared jobs; drawn in the parent, so every
        # forked worker has the same.
        self._token = os.urandom(8).hex()
        self._seed_of_epoch = {}
        self.set_epoch(epoch)

    def set_epoch(self, epoch):
        """Sets the epoch the next iteration reads (and, without a fixed
        seed, draws its seed here, in the parent, so that the workers it
        forks agree on it)."""
        self.epoch = epoch
        if self.seed is None and epoch not in self._seed_of_epoch:
            self._seed_of_epoch[epoch] = int.from_bytes(os.urandom(7), "little")

    def _epoch_seed(self):
        if self.seed is not None:
            return self.seed
        return self._seed_of_epoch[self.epoch]

    def _plan(self):
        """The pipeline and options this process iterates."""
        opts = dict(self.options)
        opts.setdefault("seed", self._epoch_seed())
        opts["epoch"] = self.epoch
        ds = self.dataset
        info = _data.get_worker_info()
        if info is None or info.num_workers <= 1:
            return ds, opts
        # The service the iterator will use: its own option, the
        # dataset's (with_options), then the environment.
        service = (opts.get("service") or ds._options.get("service")
                   or os.environ.get("CACHEW_SERVICE", ""))
        if _is_remote(service):
            # One job per pass of the loader: torch draws its base seed
            # per pass in the parent (info.seed is it plus the worker's
            # id), so a pass re-run over the same epoch never joins the
            # job an earlier, abandoned pass left unfinished.
            opts.setdefault("job_name", "torch-%s-e%d-%x" % (
                self._token, self.epoch, (info.seed - info.id) & (2**64 - 1)))
            return ds, opts
        return ds.shard_source(info.num_workers, info.id), opts

    def __len__(self):
        """The elements of an epoch over all workers, when the pipeline
        knows it (``Dataset.cardinality()``); TypeError otherwise, as
        ``len()`` of a ``cachew.Dataset`` (the DataLoader then has no
        length either)."""
        return len(self.dataset)

    def __bool__(self):
        return True

    def __iter__(self):
        ds, opts = self._plan()
        with ds.iterator(writable=self.writable, **opts) as it:
            for element in it:
                if isinstance(element, dict):
                    yield {k: _to_torch(t) for k, t in element.items()}
                else:
                    yield tuple(_to_torch(t) for t in element)


def _to_torch(t):
    """A component as torch sees it: a tensor viewing it, or for bytes
    (which torch has no dtype for) the bytes themselves."""
    return t.to_torch() if t.dtype != "bytes" else t.tolist()
