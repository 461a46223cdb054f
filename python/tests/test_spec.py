"""Named components as dicts (in-process, the embedded service, a real
dispatcher and worker), Dataset.element_spec, cardinality() and len()."""
import os
import subprocess

import numpy as np
import pytest

import cachew

from conftest import BUILD

NAMED = "from_list([{image=[1, 2], label=3}, {image=[4, 5], label=6}, {image=[7, 8], label=9}])"


def plain(e):
    """An element's values: a dict or a tuple of lists and scalars."""
    if isinstance(e, dict):
        return {k: t.tolist() for k, t in e.items()}
    return tuple(t.tolist() for t in e)


def spec(shape, dtype, name=None):
    return cachew.TensorSpec(shape, dtype, name)


# -- dicts --


def test_named_components_are_dicts_in_component_order():
    ds = cachew.Dataset.parse("from_tensors({label=3, image=[1, 2]})")
    (e,) = list(ds)
    assert isinstance(e, dict)
    # Key order, as tf.data flattens a dict: image sorts before label.
    assert list(e) == ["image", "label"]
    assert e["image"].tolist() == [1, 2] and e["image"].shape == (2,)
    assert e["label"].tolist() == 3 and isinstance(e["label"], cachew.Tensor)


def test_unnamed_components_stay_tuples():
    assert [plain(e) for e in cachew.range(3).batch(2)] == [([0, 1],), ([2],)]
    (e,) = list(cachew.from_tensors((1, "x")))
    assert type(e) is tuple and plain(e) == (1, b"x")


def test_a_batch_of_named_elements_keeps_the_names():
    ds = cachew.Dataset.parse(NAMED).batch(2)
    assert [plain(e) for e in ds] == [
        {"image": [[1, 2], [4, 5]], "label": [3, 6]},
        {"image": [[7, 8]], "label": [9]}]


def test_an_unnamed_component_beside_named_ones_is_keyed_by_position():
    ds = cachew.Dataset.parse(NAMED).enumerate(start=10).take(2)
    assert [plain(e) for e in ds] == [{0: 10, "image": [1, 2], "label": 3},
                                      {0: 11, "image": [4, 5], "label": 6}]
    z = cachew.zip(cachew.from_tensors({"a": 1}), cachew.range(5, 6))
    (e,) = list(z)
    assert list(e) == ["a", 1] and plain(e) == {"a": 1, 1: 5}


def test_parse_example_yields_its_parameters_as_keys(tmp_path):
    subprocess.run([os.path.join(BUILD, "cachew"), "gen", "imagenet", "--out", str(tmp_path),
                    "--images", "6", "--shards", "1", "--seed", "1"],
                   check=True, capture_output=True)
    ds = (cachew.tfrecord(str(tmp_path / "*.tfrecord"))
          .parse_example(label="image/class/label:i64", image="image/encoded:bytes")
          .map("decode_jpeg", component="image").batch(3))
    got = list(ds)
    assert len(got) == 2
    for e in got:
        assert list(e) == ["image", "label"]
        assert e["image"].dtype == "u8" and e["image"].shape[0] == 3
        assert e["image"].shape[3] == 3
        assert e["label"].dtype == "i64" and e["label"].shape == (3,)


def test_writable_dict_values_are_written_in_place():
    ds = cachew.Dataset.parse(NAMED).batch(3)
    (e,) = list(ds.iterator(writable=True))
    a = e["label"].to_numpy()
    a[0] = 100
    assert e["label"].tolist() == [100, 6, 9]
    with pytest.raises(ValueError):
        next(iter(ds))["label"].to_numpy()[0] = 1


def test_dicts_through_the_embedded_service():
    ds = cachew.Dataset.parse(NAMED).map("add", value=1).batch(2)
    assert [plain(e) for e in ds.iterator(service="embedded")] == [
        {"image": [[2, 3], [5, 6]], "label": [4, 7]}, {"image": [[8, 9]], "label": [10]}]


def test_dicts_from_a_dispatcher_and_worker(cluster):
    ds = cachew.Dataset.parse(NAMED).repeat(4).batch(3, drop_remainder=True)
    got = [plain(e) for e in ds.iterator(service=cluster.url)]
    assert len(got) == 4
    assert all(list(e) == ["image", "label"] for e in got)
    assert sorted(v for e in got for v in e["label"]) == sorted([3, 6, 9] * 4)
    # Names survive a cache, which stores the components' bytes only: the
    # first pass writes it, the second reads it.
    root = os.path.join(cluster.dir, "named-cache")
    cached = cachew.Dataset.parse(NAMED).apply("cache", root=root).batch(3)
    for _ in range(2):
        assert [plain(e) for e in cached.iterator(service=cluster.url)] == [
            {"image": [[1, 2], [4, 5], [7, 8]], "label": [3, 6, 9]}]
        assert os.listdir(root)


# -- element_spec --


@pytest.mark.parametrize("pipeline, expected", [
    ("range(10)", (spec((), "i64"),)),
    ("range(10) | batch(3)", (spec((None,), "i64"),)),
    ("range(10) | batch(3, drop_remainder=true)", (spec((3,), "i64"),)),
    ('from_tensors((1, "x", 2.5))', (spec((), "i64"), spec((), "bytes"), spec((), "f64"))),
    ("from_list([[1, 2], [3]])", (spec((None,), "i64"),)),
    ("range(4) | map(cast, dtype=f32) | enumerate", (spec((), "i64"), spec((), "f32"))),
    ('from_tensors({image=[1, 2], label=3}) | batch(4, drop_remainder=true)',
     {"image": spec((4, 2), "i64", "image"), "label": spec((4,), "i64", "label")}),
    ('from_list(["a b", "c"]) | map(tokenize)', (spec((None,), "i64"),)),
    ('from_list(["x.jpg"]) | read_file | map(decode_jpeg)', (spec((None, None, 3), "u8"),)),
])
def test_element_spec_of_pipelines(pipeline, expected):
    assert cachew.Dataset.parse(pipeline).element_spec == expected


def test_element_spec_is_what_iteration_yields():
    ds = cachew.Dataset.parse(NAMED).enumerate().batch(2)
    es = ds.element_spec
    assert list(es) == [0, "image", "label"]
    assert es[0] == spec((None,), "i64") and es["image"] == spec((None, 2), "i64", "image")
    for e in ds:
        assert list(e) == list(es)
        assert all(es[k].is_compatible_with(t) for k, t in e.items())
    assert not spec((None, 3), "i64").is_compatible_with(next(iter(ds))["image"])
    assert not spec((None, 2), "f32").is_compatible_with(next(iter(ds))["image"])
    assert repr(es["label"]) == "TensorSpec(shape=(None,), dtype='i64', name='label')"


# -- cardinality and len --


def test_cardinality_as_tf_data_documents_it():
    r = cachew.range(42)
    assert r.cardinality() == 42
    assert r.repeat().cardinality() == cachew.INFINITE == cachew.INFINITE_CARDINALITY == -1
    assert r.repeat(3).cardinality() == 126
    assert cachew.range(0).repeat().cardinality() == 0
    assert r.repeat().take(5).cardinality() == 5
    assert r.take(100).cardinality() == 42 and r.skip(40).cardinality() == 2
    assert cachew.range(8).batch(3).cardinality() == 3
    assert cachew.range(8).batch(3, drop_remainder=True).cardinality() == 2
    assert cachew.range(8).shard(3, 1).cardinality() == 3
    files = cachew.from_list(["a", "b"]).filter("is_valid_jpeg")
    assert files.cardinality() == cachew.UNKNOWN == cachew.UNKNOWN_CARDINALITY == -2
    assert files.repeat(2).cardinality() == cachew.UNKNOWN


@pytest.mark.parametrize("pipeline", [
    "range(42)", "range(42) | repeat(3)", "range(8) | batch(3)",
    "range(8) | batch(3, drop_remainder=true)", "range(100) | repeat | take(7)",
    "range(8) | shard(3, 1)", "range(10) | skip(4) | take(100)"])
def test_len_is_the_number_of_elements_iteration_yields(pipeline):
    ds = cachew.Dataset.parse(pipeline)
    assert len(ds) == ds.cardinality() == len(list(ds))


def test_len_of_an_infinite_or_unknown_dataset_raises_type_error():
    with pytest.raises(TypeError, match="the dataset is infinite"):
        len(cachew.range(3).repeat())
    unknown = cachew.from_list(["a", "b"]).filter("is_valid_jpeg")
    with pytest.raises(TypeError, match="length is unknown"):
        len(unknown)
    # Still true, still listable (list() asks __len__ for a hint only).
    assert cachew.range(0) and cachew.range(3).repeat() and unknown
    assert list(unknown) == [] and len(cachew.range(0)) == 0
