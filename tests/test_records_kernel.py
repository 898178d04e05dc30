"""Tuning records stay valid as long as the kernel they timed is the one that would run now.

A record matches its key by the variant's template hash (the template file and the class's
source) or, when that is stale, by its `kernel` field: the hash of the rendered source, build
options, launches, buffers and layouts of its configuration (tune.records.kernel_hash). So a
refactor that renders the same kernels keeps every record; one that renders another kernel, or
launches it differently, drops exactly the records of what changed. Device-free.
"""
import json
import os
from pathlib import Path
import subprocess
import sys

import pytest

from aotconv import passes, spec, variants
from aotconv.choose import choose
from aotconv.spec import network_from_dict
from aotconv.targets import get_target
from aotconv.tune import search
from aotconv.tune.measure import Outcome, Status
from aotconv.tune.records import (DATA_DIR, Key, Store, cfg_from_json, cfg_to_json,
                                  check_record, kernel_hash, layer_of, read_log, stamp_kernels)
from aotconv.variants import BY_NAME
from aotconv.variants.base import Launch
from aotconv.variants.conv_direct import ConvDirect

ROOT = Path(__file__).resolve().parent.parent
FURY = get_target("fury-x")          # its device is absent here: choices come from records


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AOTCONV_SHIPPED_RECORDS", "0")
    return tmp_path / "cache"


def conv_net(name="c"):
    return network_from_dict({"name": "n", "input": [2, 5, 9, 9], "layers": [
        {"name": name, "op": "conv", "out": 6, "kernel": 3, "pad": 1, "act": "relu"}]})


# Variants as a later version might have them, all named conv_direct like the one that made
# the records: each class's source differs from ConvDirect's, so its template hash does too.

class Refactored(ConvDirect):
    """The same kernels, declared by other code (a renamed helper, a moved line)."""

    def launches(self, layer, cfg, prefix):
        return list(super().launches(layer, cfg, prefix))


class Recoded(ConvDirect):
    """Another kernel: the rendered source differs."""

    def render(self, layer, cfg, prefix):
        return super().render(layer, cfg, prefix).replace("{", "{\n    /* recoded */", 1)


class Relaunched(ConvDirect):
    """The same source, launched with a different work-group split."""

    def launches(self, layer, cfg, prefix):
        return [Launch(l.kernel, l.args, l.gsize, None, l.phase)
                for l in super().launches(layer, cfg, prefix)]


def _records(key, cfgs, ms=1.0):
    return [dict(key.fields(), kernel=key.kernel(c), cfg=cfg_to_json(c), status="ok",
                 time_ms=ms + i, layer="c") for i, c in enumerate(cfgs)]


def _cfgs(layer, n=3):
    """The first `n` valid points of conv_direct's space for `layer` on fury-x."""
    from aotconv.space import variant_space
    return variant_space(layer, ConvDirect(), FURY).points[:n]


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_kernel_hash_ignores_the_layer_name_and_the_class_text():
    a, b = conv_net("c").layer("c"), conv_net("WG").layer("WG")
    cfg = _cfgs(a, 1)[0]
    v = ConvDirect()
    assert kernel_hash(v, a, cfg) == kernel_hash(v, b, cfg)
    assert kernel_hash(Refactored(), a, cfg) == kernel_hash(v, a, cfg)
    assert Refactored().template_hash() != v.template_hash()
    assert kernel_hash(Recoded(), a, cfg) != kernel_hash(v, a, cfg)
    assert kernel_hash(Relaunched(), a, cfg) != kernel_hash(v, a, cfg)
    other = type(cfg)(tuple((k, 128 if k == "WG" else x) for k, x in cfg.items))
    assert kernel_hash(v, a, other) != kernel_hash(v, a, cfg)


@pytest.mark.parametrize("edited, used", [(Refactored, True), (Recoded, False),
                                          (Relaunched, False)])
def test_a_stale_template_hash_is_used_exactly_when_the_kernel_is_the_same(tmp_path, edited,
                                                                           used):
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer)
    db = _write(tmp_path / "db.jsonl", _records(Key(layer, ConvDirect(), FURY), cfgs))
    key = Key(layer, edited(), FURY)
    assert all(r["template"] != key.template for r in read_log(db))
    got = Store(read=[db]).lookup(key)
    assert set(got) == (set(cfgs) if used else set())


def test_without_the_field_a_record_behaves_as_before(tmp_path):
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer)
    recs = _records(Key(layer, ConvDirect(), FURY), cfgs)
    for r in recs:
        del r["kernel"]
    db = _write(tmp_path / "db.jsonl", recs)
    assert set(Store(read=[db]).lookup(Key(layer, ConvDirect(), FURY))) == set(cfgs)
    assert Store(read=[db]).lookup(Key(layer, Refactored(), FURY)) == {}


def test_a_matching_kernel_does_not_excuse_another_key(tmp_path):
    """The kernel hash stands in for the template hash only: version, op, device still count."""
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer, 1)
    key = Key(layer, Refactored(), FURY)
    base = _records(Key(layer, ConvDirect(), FURY), cfgs)[0]
    for change in ({"aotconv": "0.0.1"}, {"target": "h100"},
                   {"op": base["op"].replace("relu", "tanh")}):
        db = _write(tmp_path / "db.jsonl", [dict(base, **change)])
        assert Store(read=[db]).lookup(key) == {}, change


def test_the_kernel_is_computed_once_per_configuration_and_only_for_stale_records(
        tmp_path, monkeypatch):
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer, 2)
    old = _records(Key(layer, ConvDirect(), FURY), cfgs)
    db = _write(tmp_path / "db.jsonl", old + old)
    calls = []
    real = kernel_hash

    def counted(v, l, c):
        calls.append(c)
        return real(v, l, c)

    import aotconv.tune.records as records
    monkeypatch.setattr(records, "kernel_hash", counted)
    Store(read=[db]).lookup(Key(layer, ConvDirect(), FURY))
    assert calls == []                               # current template hash: nothing rendered
    Store(read=[db]).lookup(Key(layer, Refactored(), FURY))
    assert sorted(map(str, calls)) == sorted(map(str, cfgs))   # four stale records, two configurations


def test_new_records_carry_their_kernel_hash(tmp_path):
    layer = conv_net().layer("c")
    cfg = _cfgs(layer, 1)[0]
    db = tmp_path / "db.jsonl"
    db.touch()
    key = Key(layer, ConvDirect(), FURY)
    Store(read=[db], write=[db]).append(key, cfg, Outcome(Status.OK, time_ms=2.0), layer="c")
    (rec,) = read_log(db)
    assert rec["kernel"] == kernel_hash(ConvDirect(), layer, cfg)
    assert list(rec).index("kernel") == list(rec).index("template") + 1


@pytest.mark.parametrize("bad", [12, "", "0123", "0123456789ABCDEF", "0123456789abcdefg"])
def test_a_malformed_kernel_field_is_a_damaged_record(bad):
    layer = conv_net().layer("c")
    rec = _records(Key(layer, ConvDirect(), FURY), _cfgs(layer, 1))[0]
    assert check_record(rec) is None
    assert "kernel" in check_record(dict(rec, kernel=bad))


def test_a_build_keeps_its_records_across_a_refactor(monkeypatch):
    """Through choose, records only, on a target whose device is absent: the refactored
    variant takes the records; a recoded one does not (its layer falls back)."""
    net = conv_net()
    layer = net.layer("c")
    cfgs = _cfgs(layer)
    cache = Path(os.environ["AOTCONV_CACHE_DIR"])
    cache.mkdir(parents=True)
    _write(cache / "records.jsonl", _records(Key(layer, ConvDirect(), FURY), cfgs))

    def with_variant(v):
        reg = [v if x.name == v.name else x for x in variants.VARIANTS]
        monkeypatch.setattr(variants, "VARIANTS", reg)
        monkeypatch.setitem(variants.BY_NAME, v.name, v)
        return choose(conv_net(), "fury-x", quiet=True)["c"]

    got = with_variant(Refactored())
    assert got.source == "record" and got.variant == "conv_direct" and got.cfg == cfgs[0]
    assert with_variant(Recoded()).source == "fallback"


# -- rebuilding layers, stamping records, the shipped files ---------------------------------------

def _shipped_layers():
    out = []
    for name in spec.shipped_networks():
        out += passes.optimise(spec.load_network(name)).layers
    return out


def test_layer_of_rebuilds_shapes_attributes_and_parameters():
    layers = _shipped_layers()
    assert len({l.op for l in layers}) >= 8
    for l in layers:
        r = layer_of(l.signature_str())
        assert r is not None, l.signature_str()
        assert (r.op, r.attrs, list(map(tuple, r.in_shapes)), tuple(r.out_shape)) == \
            (l.op, l.attrs, list(map(tuple, l.in_shapes)), tuple(l.out_shape))
        assert [(n, tuple(s)) for n, s in r.params] == [(n, tuple(s)) for n, s in l.params]
    for bad in ("conv|1x2|1x2|", "nonsense", "conv|1x3x8x8|1x4x8x8|out=9", "relu|axb|1|"):
        assert layer_of(bad) is None


def test_stamping_gives_current_records_their_kernel_hash_and_leaves_stale_ones():
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer, 2)
    recs = _records(Key(layer, ConvDirect(), FURY), cfgs)
    want = [r.pop("kernel") for r in recs]
    stale = dict(recs[0], template="0123456789abcdef")
    kept = dict(recs[1], kernel="fedcba9876543210")
    unknown = dict(recs[0], variant="gone")
    assert stamp_kernels([*recs, stale, kept, unknown]) == (2, 1, 2)
    assert [r["kernel"] for r in recs] == want
    assert "kernel" not in stale and kept["kernel"] == "fedcba9876543210"


@pytest.mark.parametrize("target", sorted(p.stem for p in DATA_DIR.glob("*.jsonl")))
def test_every_shipped_record_names_the_kernel_the_current_code_renders(target):
    """Every shipped record carries its kernel hash, and it is the hash of what this version
    renders for it: the shipped records are valid, by template or by kernel."""
    recs = read_log(DATA_DIR / f"{target}.jsonl")
    assert recs and all("kernel" in r for r in recs)
    layers, differ = {}, []
    for r in recs:
        layer = layers.setdefault(r["op"], layer_of(r["op"]))
        if kernel_hash(BY_NAME[r["variant"]], layer, cfg_from_json(r["cfg"])) != r["kernel"]:
            differ.append(f"{r['variant']} {r['cfg']} of {r['op']}")
    assert not differ, f"{len(differ)} shipped records timed another kernel: {differ[:3]}"


def test_the_kernel_hash_is_the_same_in_another_process():
    layer = conv_net().layer("c")
    cfg = _cfgs(layer, 1)[0]
    code = ("from aotconv.spec import network_from_dict; from aotconv.targets import get_target;"
            "from aotconv.tune.records import kernel_hash; from aotconv.variants import BY_NAME;"
            "import json; l = network_from_dict(json.loads(input())).layer('c');"
            "v = BY_NAME['conv_direct']; print(kernel_hash(v, l, list(v.configs(l, "
            "get_target('fury-x')))[0]))")
    doc = json.dumps({"name": "n", "input": [2, 5, 9, 9], "layers": [
        {"name": "c", "op": "conv", "out": 6, "kernel": 3, "pad": 1, "act": "relu"}]})
    r = subprocess.run([sys.executable, "-c", code], input=doc, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONHASHSEED="7"), cwd=ROOT, check=True)
    assert r.stdout.strip() == kernel_hash(ConvDirect(), layer, cfg)


def test_search_reads_refactored_records(tmp_path):
    """records_only (what choose, distill and the shipped-choices test call) with a key of the
    refactored variant: the recorded best is chosen."""
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer)
    db = _write(tmp_path / "db.jsonl", _records(Key(layer, ConvDirect(), FURY), cfgs))
    store = Store(read=[db])
    key = Key(layer, Refactored(), FURY)
    assert set(store.lookup(key)) == set(cfgs)
    r = search.records_only([[layer]], FURY, store)[layer.signature_str()]
    assert r.best is not None and r.best.variant == "conv_direct" and r.best.cfg == cfgs[0]


def test_distill_keeps_the_field_and_stamps_current_records(tmp_path, capsys):
    import importlib.util
    spec_ = importlib.util.spec_from_file_location("distill_records",
                                                   ROOT / "tools" / "distill_records.py")
    dr = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(dr)
    layer = conv_net().layer("c")
    cfgs = _cfgs(layer, 2)
    old, new = _records(Key(layer, ConvDirect(), FURY), cfgs)
    del new["kernel"]                                        # made before the field existed
    old = dict(old, template="0123456789abcdef")             # made by an earlier class text
    src = _write(tmp_path / "raw.jsonl", [old, new])
    out = tmp_path / "out.jsonl"
    assert dr.main([str(src), "-o", str(out)]) == 0
    assert "1 added, 1 kept" in capsys.readouterr().out
    got = read_log(out)
    assert [r["kernel"] for r in got] == [old["kernel"],
                                          kernel_hash(ConvDirect(), layer, cfgs[1])]
    assert set(Store(read=[out]).lookup(Key(layer, Refactored(), FURY))) == set(cfgs)
