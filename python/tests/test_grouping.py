"""group_by_window, bucket_by_sequence_length and ragged_batch from
Python: the stages through Dataset's attribute form, ragged batches as
values and row_splits (named ones as dict keys), in-process and through
the embedded service."""
import pytest

import cachew

RANGES = "from_list([[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]])"


def rows(values, splits):
    """The rows of a ragged batch, as tf.RaggedTensor.from_row_splits."""
    v, s = values.tolist(), splits.tolist()
    return [v[s[i]:s[i + 1]] for i in range(len(s) - 1)]


@pytest.mark.parametrize("service", [None, "embedded"])
def test_ragged_batch_rows_are_tf_datas(service):
    ds = cachew.Dataset.parse(RANGES).ragged_batch(5)
    opts = {"service": service} if service else {}
    got = [rows(*e) for e in ds.iterator(**opts)]
    # tf.data: range(6).map(tf.range).ragged_batch(5)
    assert got == [[[], [0], [0, 1], [0, 1, 2], [0, 1, 2, 3]], [[0, 1, 2, 3, 4]]]


def test_named_ragged_components_are_keys():
    ds = cachew.Dataset.parse(
        "from_list([{ids=[1, 2], label=7}, {ids=[3], label=8}])").ragged_batch(2)
    (e,) = list(ds)
    assert list(e) == ["ids", "ids_row_splits", "label"]
    assert rows(e["ids"], e["ids_row_splits"]) == [[1, 2], [3]]
    assert e["label"].tolist() == [7, 8]
    assert list(ds.element_spec) == ["ids", "ids_row_splits", "label"]


@pytest.mark.parametrize("service", [None, "embedded"])
def test_group_by_window_and_buckets(service):
    opts = {"service": service} if service else {}
    g = cachew.range(10).group_by_window("mod", 5, value=2)
    assert [e[0].tolist() for e in g.iterator(**opts)] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    b = cachew.Dataset.parse(
        "from_list([[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11], "
        "[13, 14, 15, 16, 19, 20], [21, 22]])").bucket_by_sequence_length(
            0, [3, 5], [2, 2, 2])
    assert [e[0].tolist() for e in b.iterator(**opts)] == [
        [[1, 2, 3, 4], [5, 6, 7, 0]],
        [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]],
        [[0, 0], [21, 22]]]


def test_on_two_real_workers(cluster2):
    """Through a dispatcher and two cachewd workers: the grouping runs in
    the client part over the stream in split order, so the output is the
    in-process one."""
    g = cachew.range(40).group_by_window("mod", 4, value=3)
    want = [e[0].tolist() for e in g]
    assert [e[0].tolist() for e in g.iterator(service=cluster2.url)] == want
    lists = ", ".join(str(list(range(k % 5))) for k in range(30))
    r = cachew.Dataset.parse("from_list([%s])" % lists).ragged_batch(4)
    want = [rows(*e) for e in r]
    assert [rows(*e) for e in r.iterator(service=cluster2.url)] == want
