"""The API: builders, pipeline strings, options, elements, exceptions."""
import subprocess
import os

import numpy as np
import pytest

import cachew

from conftest import BUILD


def values(ds, **opts):
    return [tuple(t.tolist() for t in e) for e in ds.iterator(**opts)]


def test_builders_write_the_pipeline_string():
    ds = cachew.range(10).map("add", value=1).batch(4)
    assert str(ds) == ("range(start=0, stop=10, step=1) | map(add, parallel=1, "
                       "deterministic=true, value=1) | batch(n=4, drop_remainder=false)")
    assert ds.fingerprint == cachew.Dataset.parse(str(ds)).fingerprint
    assert ds.op == "batch" and ds.inputs[0].op == "map"


def test_iteration_yields_tuples_of_arrays_as_the_cli_computes():
    ds = cachew.range(10).map("add", value=1).batch(4)
    got = values(ds)
    assert got == [([1, 2, 3, 4],), ([5, 6, 7, 8],), ([9, 10],)]
    # The same digest as the C CLI's run of the same pipeline.
    out = subprocess.run([os.path.join(BUILD, "cachew"), "run", "--json", str(ds)],
                         capture_output=True, text=True, check=True).stdout
    assert '"elements":3' in out.replace(" ", "")


def test_every_builder_and_any_operator_by_name():
    ds = cachew.range(20).skip(2).take(12).shard(2, 0).enumerate(start=100).batch(3, drop_remainder=True)
    assert values(ds, seed=1) == [([100, 101, 102], [2, 4, 6]), ([103, 104, 105], [8, 10, 12])]
    z = cachew.zip(cachew.range(3), cachew.from_list([5, 6, 7]))
    assert values(z) == [(0, 5), (1, 6), (2, 7)]
    c = cachew.range(2).concatenate(cachew.range(5, 7))
    assert values(c) == [(0,), (1,), (5,), (6,)]
    # An operator with no method of its own, by attribute.
    assert values(cachew.range(4).batch(2).unbatch()) == [(0,), (1,), (2,), (3,)]
    assert values(cachew.range(3).apply("map", "add", value=10)) == [(10,), (11,), (12,)]


def test_literals_round_trip_strings_bytes_floats_and_tuples():
    ds = cachew.from_tensors(("a \"quoted\"\n\\ line", b"\x00\xff", 1.5, True, [1, 2]))
    (e,) = list(ds)
    assert e[0].tolist() == b'a "quoted"\n\\ line'
    assert e[1].tolist() == b"\x00\xff"
    assert e[2].tolist() == 1.5 and e[2].dtype == "f64"
    assert e[3].tolist() is True
    assert e[4].tolist() == [1, 2] and e[4].shape == (2,)
    with pytest.raises(TypeError, match="cannot write"):
        cachew.from_tensors(object())


def test_bytes_components_are_object_arrays():
    ds = cachew.from_list(["x", "yy", "zzz"]).batch(3)
    (e,) = list(ds)
    a = e[0].to_numpy()
    assert a.dtype == object and a.tolist() == [b"x", b"yy", b"zzz"]
    with pytest.raises(BufferError, match="bytes tensor has no buffer-protocol format"):
        memoryview(e[0])


def test_options_as_keyword_arguments():
    ds = cachew.range(100).shuffle(100, reshuffle_each_iteration=True)
    a = values(ds, seed=3, service="local")
    assert values(ds.with_options(seed=3), service="local") == a
    assert values(ds, seed=3, epoch=1, service="local") != a
    assert sorted(a) == [(i,) for i in range(100)]
    names = [o[0] for o in cachew.options()]
    assert "threads" in names and "service" in names


@pytest.mark.parametrize("kw, exc, needle", [
    ({"threads": -5}, cachew.OutOfRangeError, "option 'threads' must be in [0, 1024], not -5"),
    ({"nosuch": 1}, cachew.NotFoundError, "unknown option 'nosuch'"),
    ({"threads": "x"}, cachew.TypeMismatchError, "option 'threads' is of type int, not str"),
])
def test_bad_options_raise_naming_them(kw, exc, needle):
    with pytest.raises(exc) as ei:
        cachew.range(3).iterator(**kw)
    assert needle in str(ei.value)
    assert isinstance(ei.value, cachew.Error)


def test_parse_errors_carry_the_library_message_and_code():
    with pytest.raises(cachew.ParseError) as ei:
        cachew.Dataset.parse("range(3) | nope(")
    assert "column 17" in str(ei.value) and ei.value.code == 6
    assert isinstance(ei.value, ValueError)
    with pytest.raises(cachew.NotFoundError, match="unknown function 'nosuchfn'"):
        cachew.range(3).map("nosuchfn")
    with pytest.raises(cachew.OutOfRangeError, match="parameter 'n' must be in"):
        cachew.range(3).batch(-1)


def test_long_non_ascii_messages_raise_the_library_error():
    # A message cut at its buffer's end inside a character was a
    # UnicodeDecodeError in place of the library's error (one of the two
    # prefixes puts the cut inside an 'é').
    for prefix in ("", "x"):
        with pytest.raises(cachew.NotFoundError, match="unknown function") as ei:
            cachew.Dataset.parse('range(3) | map(fn="' + prefix + "é" * 400 + '")')
        assert ei.value.code == 5 and "éééé" in str(ei.value)


def test_pipeline_errors_raise_per_code(tmp_path):
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(b"garbage-not-a-tfrecord-file-at-all")
    with pytest.raises(cachew.CorruptDataError, match="length checksum mismatch"):
        list(cachew.tfrecord(str(bad)))
    with pytest.raises(cachew.NotFoundError, match="No such file"):
        list(cachew.text_lines(str(tmp_path / "missing")))


def test_closed_iterator_raises_closed_error():
    it = cachew.range(5).iterator()
    assert next(it)[0].tolist() == 0
    it.close()
    with pytest.raises(cachew.ClosedError, match="closed"):
        next(it)
    with cachew.range(3).iterator() as it2:
        assert [e[0].tolist() for e in it2] == [0, 1, 2]


def test_stats_list_the_operators():
    it = cachew.range(10).map("add", value=1).iterator(service="local")
    assert len(list(it)) == 10
    rows = it.stats()
    assert [r["name"] for r in rows] == ["range", "map"]
    assert rows[1]["elements"] == 10 and rows[1]["detail"] == "add"
    assert rows[1]["cache_hit_bytes"] == 0


def test_stats_count_the_bytes_an_in_memory_cache_replays():
    it = cachew.range(10).cache().repeat(2).iterator(service="local")
    assert len(list(it)) == 20
    cache = [r for r in it.stats() if r["name"] == "cache"][0]
    assert cache["bytes"] == 160 and cache["cache_hit_bytes"] == 80


def test_library_log_lines_reach_python_logging(tmp_path, caplog):
    import logging
    import time
    cachew.enable_logging(logging.INFO)
    try:
        out = tmp_path / "out.tfrecord"
        with caplog.at_level(logging.INFO, logger="cachew"):
            list(cachew.from_list(["a", "b"]).tfrecord_write(str(out)))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any(
                    r.name == "cachew.tfrecord" for r in caplog.records):
                time.sleep(0.01)
        recs = [r for r in caplog.records if r.name == "cachew.tfrecord"]
        assert recs and "wrote 2 records to" in recs[0].getMessage()
        assert recs[0].levelno == logging.INFO
    finally:
        cachew.enable_logging(None)


def test_log_lines_cut_inside_a_character_keep_the_bridge(tmp_path, caplog):
    # Lines longer than the bridge's ring slot are cut; a cut inside a
    # character made the bridge thread die of UnicodeDecodeError, and no
    # later line reached logging. Paths of 'é's make the lines long; the
    # two names differ by one byte so that one of them is cut mid-'é'.
    import logging
    import time
    d = tmp_path
    for _ in range(3):
        d = d / ("é" * 100)
    d.mkdir(parents=True)
    cachew.enable_logging(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="cachew"):
            for name in ("a.tfrecord", "ab.tfrecord", "last.tfrecord"):
                list(cachew.from_list(["a"]).tfrecord_write(str(d / name)))
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and sum(
                    r.name == "cachew.tfrecord" for r in caplog.records) < 3:
                time.sleep(0.01)
        recs = [r for r in caplog.records if r.name == "cachew.tfrecord"]
        assert len(recs) == 3, [r.getMessage()[:60] for r in recs]
        assert all("wrote 1 records to" in r.getMessage() for r in recs)
    finally:
        cachew.enable_logging(None)


def test_a_plugin_loaded_from_python_gives_its_operators():
    missing = os.path.join(BUILD, "no_such_plugin.so")
    with pytest.raises(cachew.NotFoundError, match="no_such_plugin.so"):
        cachew.load_plugin(missing)
    cachew.load_plugin(os.path.join(BUILD, "plugin_example.so"))
    cachew.load_plugin(os.path.join(BUILD, "plugin_example.so"))  # no-op
    ds = cachew.range(6).map("square").filter("is_even")
    assert values(ds) == [(0,), (4,), (16,)]
    assert [v for (v,) in values(cachew.Dataset.parse("range(4) | map(square)"))] == [0, 1, 4, 9]


def test_mixture_and_endless_sources_as_module_functions():
    a, b = cachew.range(3), cachew.range(10, 13)
    mixed = sorted(v for (v,) in values(cachew.sample_from_datasets([a, b], weights=[1, 3], seed=7)))
    assert mixed == [0, 1, 2, 10, 11, 12]
    chosen = cachew.choose_from_datasets([a, b], cachew.from_list([1, 0, 1, 1, 0]))
    assert [v for (v,) in values(chosen)] == [10, 0, 11, 12, 1]
    assert [v for (v,) in values(cachew.counter(start=5, step=2).take(3))] == [5, 7, 9]
    r1 = values(cachew.random(seed=3).take(4))
    assert r1 == values(cachew.random(seed=3).take(4)) and len(set(r1)) == 4
