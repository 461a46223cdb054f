"""cachew.torch.IterableDataset under DataLoader(batch_size=None): workers
0 and 2 (fork), in-process and through a service; disjoint shares whose
union is the epoch; set_epoch and seed."""
import collections

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
from torch.utils.data import DataLoader  # noqa: E402

import cachew  # noqa: E402
import cachew.torch  # noqa: E402

from conftest import run_python


def epoch_values(data, workers):
    loader = DataLoader(data, batch_size=None, num_workers=workers)
    out = []
    for (x,) in loader:
        assert isinstance(x, torch.Tensor)
        out.extend(x.tolist())
    return out


PIPE = "range(1000) | shuffle(64, reshuffle_each_iteration=true) | batch(10)"


@pytest.mark.parametrize("workers", [0, 2])
def test_in_process_every_element_once(workers):
    data = cachew.torch.IterableDataset(PIPE, seed=5)
    got = epoch_values(data, workers)
    assert collections.Counter(got) == collections.Counter(range(1000))


def test_in_process_shards_after_stages_that_see_the_whole_stream():
    # take(100) sharded before it gave each of 2 workers 100 (200 in all);
    # enumerate restarted its count in each worker.
    data = cachew.torch.IterableDataset(cachew.Dataset.parse("range(1000) | take(100) | batch(10)"), seed=1)
    assert collections.Counter(epoch_values(data, 2)) == collections.Counter(range(100))
    data = cachew.torch.IterableDataset(
        cachew.Dataset.parse("range(10, 60) | enumerate | map(add, value=0)"), seed=1)
    pairs = [(i.item(), x.item()) for i, x in DataLoader(data, batch_size=None, num_workers=2)]
    assert sorted(pairs) == [(i, i + 10) for i in range(50)]
    text = str(cachew.Dataset.parse("range(9) | map(add) | take(5) | map(add)").shard_source(2, 1))
    assert text.startswith("range(") and "take(n=5) | shard(" in text, text


def test_a_service_set_with_options_wins_over_the_environment(monkeypatch):
    # CACHEW_SERVICE names a dispatcher, the dataset says service="local":
    # the iterator runs locally, so the workers must shard (each read the
    # whole epoch: every element twice).
    monkeypatch.setenv("CACHEW_SERVICE", "tcp://127.0.0.1:9")
    data = cachew.torch.IterableDataset(cachew.range(200).batch(10).with_options(service="local"), seed=1)
    assert collections.Counter(epoch_values(data, 2)) == collections.Counter(range(200))


def test_two_workers_shard_by_file(tmp_path):
    for i in range(4):
        (tmp_path / ("f%d.txt" % i)).write_text("".join("%d\n" % (i * 100 + j) for j in range(100)))
    ds = cachew.text_lines(str(tmp_path / "*.txt")).batch(7)
    data = cachew.torch.IterableDataset(ds, seed=1)
    loader = DataLoader(data, batch_size=None, num_workers=2)
    got = []
    for (lines,) in loader:
        got.extend(int(v) for v in lines)
    assert sorted(got) == list(range(400))


def test_set_epoch_reshuffles_and_seed_replays():
    data = cachew.torch.IterableDataset(PIPE, seed=5)
    e0 = epoch_values(data, 2)
    data.set_epoch(1)
    e1 = epoch_values(data, 2)
    data.set_epoch(0)
    assert epoch_values(data, 2) == e0
    assert e1 != e0 and sorted(e1) == sorted(e0)


def test_without_a_seed_workers_agree_on_one_per_epoch():
    data = cachew.torch.IterableDataset(PIPE)
    got = epoch_values(data, 2)
    assert collections.Counter(got) == collections.Counter(range(1000))


SERVICE_EPOCHS = """
import collections, sys
from torch.utils.data import DataLoader
import cachew.torch
data = cachew.torch.IterableDataset("range(1000) | batch(10)", seed=3, service=%r)
for epoch in range(2):
    data.set_epoch(epoch)
    loader = DataLoader(data, batch_size=None, num_workers=%d%s)
    got = [v for (x,) in loader for v in x.tolist()]
    assert collections.Counter(got) == collections.Counter(range(1000)), len(got)
print("ok")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_through_a_service_the_workers_share_one_job(cluster2, workers):
    # A fresh interpreter: its parent process has not used nng before the
    # DataLoader forks its workers.
    r = run_python(SERVICE_EPOCHS % (cluster2.url, workers, ""))
    assert r.stdout.strip() == "ok", r.stderr


def test_a_parent_that_used_the_service_forks_with_a_clear_error(cluster):
    ds = cachew.Dataset.parse("range(100) | batch(10)")
    assert len(list(ds.iterator(service=cluster.url))) == 10  # nng in use
    data = cachew.torch.IterableDataset(ds, seed=3, service=cluster.url)
    with pytest.raises(Exception, match="forked from one that had used nng"):
        epoch_values(data, 2)
    # The recipe for that case: workers that do not fork from it.
    loader = DataLoader(data, batch_size=None, num_workers=2,
                        multiprocessing_context="forkserver")
    got = [v for (x,) in loader for v in x.tolist()]
    assert collections.Counter(got) == collections.Counter(range(100))


@pytest.mark.parametrize("workers", [0, 2])
def test_named_components_are_dicts_of_torch_tensors(workers):
    ds = cachew.Dataset.parse("range(100) | map(cast, dtype=f32) | enumerate | batch(10)")
    named = cachew.from_tensors({"x": 1.5, "tag": "t"}).repeat(100).batch(10)
    data = cachew.torch.IterableDataset(cachew.zip(ds, named), seed=2)
    loader = DataLoader(data, batch_size=None, num_workers=workers)
    got = list(loader)
    assert len(got) == 10
    seen = []
    for item in got:
        assert list(item) == [0, 1, "tag", "x"]
        assert item[0].dtype == torch.int64 and item[1].dtype == torch.float32
        assert item["x"].dtype == torch.float64 and item["x"].tolist() == [1.5] * 10
        assert item["tag"] == [b"t"] * 10  # bytes: no torch dtype
        seen.extend(item[0].tolist())
    assert sorted(seen) == list(range(100))


def test_len_is_the_epoch_over_all_workers_when_known():
    data = cachew.torch.IterableDataset(PIPE, seed=5)
    assert len(data) == 100
    loader = DataLoader(data, batch_size=None, num_workers=2)
    assert len(loader) == 100 and len(list(loader)) == 100
    for pipeline, needle in [("range(10) | repeat", "infinite"),
                             ('from_list(["a"]) | filter(is_valid_jpeg)', "unknown")]:
        data = cachew.torch.IterableDataset(pipeline)
        with pytest.raises(TypeError, match=needle):
            len(data)
        with pytest.raises(TypeError, match=needle):
            len(DataLoader(data, batch_size=None))
        assert data
