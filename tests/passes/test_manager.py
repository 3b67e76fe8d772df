"""The pass manager: records, disabling by name, dumps, the pipeline as one list."""

import os

import jax.numpy as jnp
import optax

import jgsess
from jgsess.passes.manager import Context, Pass, run_pipeline
from jgsess.passes.pipeline import default_pipeline
from tests.helpers import graph_of, rand


def test_records_time_and_rewrites():
    calls = []

    def count_nodes(graph, ctx):
        calls.append(graph)
        return len(graph.live())

    graph = graph_of(lambda x: jnp.sin(x) + 1, rand((3,)))
    (record,) = run_pipeline(graph, [Pass("count", count_nodes)], Context(verify=True))
    assert record.name == "count" and record.rewrites == 2 and record.seconds >= 0
    assert calls == [graph]


def test_pass_names_are_kebab_case_and_documented():
    for p in default_pipeline():
        assert p.name == p.name.lower() and " " not in p.name and "_" not in p.name
        assert p.doc, p.name


def test_disable_by_name(monkeypatch):
    monkeypatch.setenv("JGSESS_DISABLE", "canonicalize, fuse-adamw")
    graph = graph_of(lambda x: x**1 * 2, rand((3,)))
    records = run_pipeline(graph, default_pipeline(), Context(verify=True))
    skipped = {r.name for r in records if r.skipped}
    assert skipped == {"canonicalize", "fuse-adamw"}
    assert any(n.name == "integer_pow" for n in graph.live())


def test_dump_writes_each_pass_and_the_order(monkeypatch, tmp_path):
    monkeypatch.setenv("JGSESS_DUMP", str(tmp_path))
    opt = optax.adam(1e-3)
    params = [rand((4,))]

    def step(p, s):
        u, s = opt.update(p, s, p)
        return optax.apply_updates(p, u), s

    jgsess.jit(step).lower(params, opt.init(params))
    (folder,) = os.listdir(tmp_path)
    files = sorted(os.listdir(tmp_path / folder))
    assert "00-input.txt" in files and "00-input.dot" in files and "order.csv" in files
    fused = [f for f in files if f.endswith("fuse-adamw.txt")]
    assert fused and "jgsess.adamw" in (tmp_path / folder / fused[0]).read_text()
