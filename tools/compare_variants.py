"""Snapshot what every kernel variant declares and renders, and compare two snapshots.

A refactor of aotconv/variants or of the kernel templates that means to change no kernel is
checked by taking a snapshot before and after and comparing them:

    git archive BEFORE | tar -x -C /tmp/before
    python tools/compare_variants.py snapshot --root /tmp/before -o /tmp/before.json
    python tools/compare_variants.py snapshot -o /tmp/after.json
    python tools/compare_variants.py compare /tmp/before.json /tmp/after.json

A snapshot covers layers of every shipped network (after aotconv's passes, every fusable pool
also fused into its conv, every fusable residual add into its conv) and a table of odd layers (strides, dilations, groups, asymmetric
padding, prime sizes, every pooling mode, dense at several batches, concat and add of three,
every layout conversion, activations), on several targets. Per (layer, target, variant):
whether it supports the layer (and why not), its knobs, its effective constraints (name, level,
reason, in the order checked), its fallback() and whether the space accepts it, FLOPs and bytes
moved; for the fallback and a seeded sample of the unpruned space: every constraint's verdict
on every sampled point, and for each valid one the rendered source (as a sha256), the launches
(kernel, arguments, sizes, phase), buffers, scratch, local memory, registers, layouts and local
size; for small spaces the whole pruned space (its points and each constraint's toll). Only
APIs that both sides have are used, so the older tree needs nothing of this file.
"""
import argparse
import hashlib
import json
from pathlib import Path
import random
import sys
import time
import zlib

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("h100", "pocl-cpu", "fury-x", "mali-t628", "adreno-530")
SAMPLE = 120            # unpruned points judged per (layer, target, variant)
RENDER = 6              # valid sampled points rendered, besides the fallback
FULL_SPACE = 4000       # spaces at most this large are also enumerated whole


def odd_layers():
    """(name, net dict) of small networks whose layers exercise every variant's corners."""
    def net(name, inp, layers):
        return name, {"name": name, "input": list(inp), "layers": layers}

    conv = lambda **kw: dict(dict(name="c", op="conv"), **kw)            # noqa: E731
    out = [
        net("s2", (2, 5, 13, 11), [conv(out=7, kernel=3, stride=2, pad=1, act="relu")]),
        net("dil", (1, 6, 17, 17), [conv(out=8, kernel=3, dilation=2, pad=2, act="tanh")]),
        net("grp", (3, 8, 9, 9), [conv(out=12, kernel=3, groups=4, pad=1, bias=False)]),
        net("dw", (2, 16, 14, 14), [conv(out=16, kernel=3, groups=16, pad=1, act="relu6")]),
        net("dw2", (1, 8, 15, 15), [conv(out=16, kernel=5, groups=8, stride=2, pad=2)]),
        net("asym", (1, 3, 12, 10), [conv(out=5, kernel=[3, 5], pad=[0, 2],
                                          act="leaky_relu", alpha=0.2)]),
        net("same", (2, 3, 9, 9), [conv(out=4, kernel=4, stride=2, pad="same")]),
        net("k1", (4, 32, 7, 7), [conv(out=24, kernel=1, act="sigmoid")]),
        net("k1s2", (2, 16, 14, 14), [conv(out=32, kernel=1, stride=2)]),
        net("k1g", (2, 16, 8, 8), [conv(out=32, kernel=1, groups=2, bias=False)]),
        net("k7", (1, 3, 31, 29), [conv(out=16, kernel=7, stride=2, pad=3, act="relu")]),
        net("w3", (5, 7, 10, 10), [conv(out=9, kernel=3, pad=1, act="clip", max=0.5)]),
        net("w3b", (1, 64, 28, 28), [conv(out=128, kernel=3, pad=1, act="gelu")]),
        net("dcv", (2, 32, 6, 6), [conv(out=10, kernel=6)]),
        net("d1", (1, 4096, 1, 1), [dict(name="f", op="dense", out=1000, act="relu")]),
        net("d4", (4, 3, 5, 7), [dict(name="f", op="dense", out=13, bias=False)]),
        net("d64", (64, 256, 2, 2), [dict(name="f", op="dense", out=100, act="hardswish")]),
        net("pool", (2, 6, 13, 13), [dict(name="p", op="maxpool", kernel=3, stride=2,
                                          ceil_mode=True)]),
        net("apool", (1, 5, 11, 9), [dict(name="p", op="avgpool", kernel=3, stride=2, pad=1,
                                          count_include_pad=True)]),
        net("apool2", (3, 4, 8, 8), [dict(name="p", op="avgpool", kernel=2, pad=1)]),
        net("gap", (2, 30, 7, 7), [dict(name="g", op="global_avgpool")]),
        net("soft", (3, 10, 2, 2), [dict(name="s", op="softmax")]),
        net("lrn", (2, 17, 5, 5), [dict(name="n", op="lrn", size=5)]),
        net("bn", (2, 7, 3, 5), [dict(name="b", op="batchnorm", act="silu")]),
        net("acts", (1, 3, 5, 7), [dict(name="a", op="gelu_tanh"),
                                   dict(name="b", op="hardsigmoid", alpha=0.3, beta=0.4),
                                   dict(name="c", op="clip", min=-1.0)]),
        net("cat", (1, 3, 6, 6), [dict(name="a", op="relu"),
                                  dict(name="b", op="sigmoid", inputs=["input"]),
                                  dict(name="c", op="tanh", inputs=["input"]),
                                  dict(name="k", op="concat", inputs=["a", "b", "c"])]),
        net("add3", (2, 4, 5, 5), [dict(name="a", op="relu"),
                                   dict(name="b", op="tanh", inputs=["input"]),
                                   dict(name="s", op="add", inputs=["a", "b", "input"],
                                        act="relu")]),
        net("cpool", (2, 3, 16, 16), [conv(out=6, kernel=5, act="relu"),
                                      dict(name="p", op="maxpool", kernel=2)]),
        net("se", (2, 8, 5, 5), [dict(name="g", op="global_avgpool"),
                                 dict(name="s", op="scale", inputs=["input", "g"])]),
        net("mul", (1, 6, 7, 3), [dict(name="a", op="relu"),
                                  dict(name="m", op="mul", inputs=["input", "a"])]),
        net("shuf", (2, 12, 5, 7), [dict(name="s", op="channel_shuffle", groups=3)]),
        net("slice", (1, 10, 6, 6), [dict(name="s", op="channel_slice", start=2, end=7)]),
        net("cpool2", (1, 4, 15, 15), [conv(out=8, kernel=3, pad=1, groups=2),
                                       dict(name="p", op="avgpool", kernel=3, stride=2, pad=1,
                                            ceil_mode=True)]),
    ]
    return out


def collect_layers():
    """Unique layers (by signature) of the shipped networks, the odd ones, their pool fusions,
    and a layout conversion between every pair of layouts."""
    from aotconv import passes, spec
    from aotconv.graph import Layer
    from aotconv.ops import LAYOUTS, infer
    nets = [spec.load_network(n) for n in spec.shipped_networks()]
    for _, d in odd_layers():
        try:
            nets.append(spec.network_from_dict(d))
        except Exception:               # an op the snapshotted tree does not have yet
            pass
    layers = {}
    for net in nets:
        fused = [passes.optimise(net), passes.fuse_pool(passes.optimise(net))]
        if hasattr(passes, "fuse_residual"):        # adds read in a conv's epilogue
            fused.append(passes.fuse_residual(passes.optimise(net)))
        for variant in fused:
            for l in variant.layers:
                layers.setdefault(l.signature_str(), l)
    for src in LAYOUTS:
        for dst in LAYOUTS:
            for shape in ((2, 5, 7, 3), (1, 64, 14, 14)):
                l = Layer(f"cv_{src}_{dst}", "layout_convert", {"src": src, "dst": dst},
                          ["input"], in_shapes=[shape])
                l.out_shape, l.params = infer("layout_convert", l.attrs, l.in_shapes)
                layers.setdefault(l.signature_str(), l)
    return [layers[k] for k in sorted(layers)]


def _sha(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def _plain(x):
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (bool, str)) or x is None:
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    return repr(x)


def _call(fn, *a):
    try:
        return _plain(fn(*a))
    except Exception as e:
        return f"raises {type(e).__name__}: {e}"


def _launches(v, layer, cfg, prefix):
    return [[l.kernel, [[a.kind, a.name, a.index, _plain(a.value)] for a in l.args],
             _plain(l.gsize), _plain(l.lsize), l.phase] for l in v.launches(layer, cfg, prefix)]


def _point(v, layer, cfg, prefix):
    out = {"cfg": str(cfg)}
    out["source"] = _call(lambda: _sha(v.render(layer, cfg, prefix)))
    out["source_k"] = _call(lambda: _sha(v.render(layer, cfg, "k")))
    out["launches"] = _call(_launches, v, layer, cfg, prefix)
    for what in ("buffers", "scratch_floats", "local_mem_bytes", "local_size", "layouts_of"):
        out[what] = _call(getattr(v, what), layer, cfg)
    if hasattr(v, "registers"):
        out["registers"] = _call(v.registers, layer, cfg)
    return out


def _verdicts(cons, layer, cfg, target):
    s = ""
    for c in cons:
        try:
            s += "1" if c.check(layer, cfg, target) else "0"
        except Exception:
            s += "E"
    return s


def case(layer, target, v, space):
    from aotconv.variants.base import Config
    out = {"supports": v.supports(layer)}
    if out["supports"] is not None:
        return out
    knobs = list(v.knobs(layer, target))
    out["knobs"] = [[k.name, _plain(k.values), k.doc] for k in knobs]
    cons = space.constraints_of(v, target)
    out["constraints"] = [[c.name, c.level, c.reason] for c in cons]
    out["flops"] = _call(v.flops, layer)
    out["bytes_moved"] = _call(v.bytes_moved, layer)
    try:
        fb = v.fallback(layer, target)
        out["fallback"] = str(fb)
    except Exception as e:
        fb, out["fallback"] = None, f"raises {type(e).__name__}"
    fp = space.fallback_point(layer, v, target)
    out["fallback_point"] = None if fp is None else str(fp)
    prefix = f"k_{layer.name}"
    if fb is not None:
        out["fallback_verdicts"] = _verdicts(cons, layer, fb, target)
        out["fallback_kernel"] = _point(v, layer, fb, prefix)
    sizes = [len(k.values) for k in knobs]
    total = 1
    for n in sizes:
        total *= n
    rng = random.Random(zlib.crc32(f"{layer.signature_str()}|{target.name}|{v.name}".encode()))
    picks = sorted({rng.randrange(total) for _ in range(SAMPLE)}) if total else []
    verdicts, rendered = [], []
    for i in picks:
        items, rest = [], i
        for k, n in zip(reversed(knobs), reversed(sizes)):
            items.append((k.name, k.values[rest % n]))
            rest //= n
        cfg = Config(tuple(reversed(items)))
        s = _verdicts(cons, layer, cfg, target)
        verdicts.append(f"{cfg}:{s}")
        if set(s) == {"1"} and len(rendered) < RENDER:
            rendered.append(_point(v, layer, cfg, prefix))
    out["sample"] = verdicts
    out["rendered"] = rendered
    if total <= FULL_SPACE:
        vs = space.variant_space(layer, v, target, explain=False)
        out["space"] = {"points": [str(c) for c in vs.points], "first": vs.first,
                        "total": vs.total}
    return out


def snapshot(root, out_path, only=None):
    sys.path.insert(0, str(Path(root).resolve()))
    import aotconv
    assert Path(aotconv.__file__).resolve().parent.parent == Path(root).resolve(), aotconv.__file__
    from aotconv import space
    from aotconv.targets import TARGETS as ALL
    from aotconv.variants import VARIANTS
    t0 = time.time()
    layers = collect_layers()
    cases = {}
    for layer in layers:
        for tname in TARGETS:
            target = ALL[tname]
            for v in VARIANTS:
                if only and v.name not in only:
                    continue
                key = f"{layer.signature_str()} | {tname} | {v.name}"
                cases[key] = case(layer, target, v, space)
        order = {tname: [v.name for v in VARIANTS if v.supports(layer) is None]
                 for tname in TARGETS[:1]}
        cases[f"{layer.signature_str()} | registry order"] = order
    doc = {"root": str(root), "layers": len(layers), "targets": list(TARGETS),
           "seconds": round(time.time() - t0, 1), "cases": cases}
    Path(out_path).write_text(json.dumps(doc, indent=0, sort_keys=True))
    print(f"{out_path}: {len(cases)} cases over {len(layers)} layers x {len(TARGETS)} targets "
          f"in {doc['seconds']} s")


def _count(cases):
    """(layer/target/variant cases supported, points judged, kernels rendered, full spaces)."""
    sup = judged = rendered = spaces = 0
    for c in cases.values():
        if not isinstance(c, dict) or c.get("supports", "") is not None:
            continue
        sup += 1
        judged += len(c.get("sample", ())) + ("fallback_verdicts" in c)
        rendered += len(c.get("rendered", ())) + ("fallback_kernel" in c)
        spaces += "space" in c
    return sup, judged, rendered, spaces


# fields whose change alters no kernel, launch, knob, verdict or fallback: the texts people read
TEXTS = ("supports", "constraints")


def _texts_only(field, x, y):
    """A change of an explanation only: a refusal's wording (still a refusal), or constraint
    reasons with the same names and levels in the same order."""
    if field == "supports":
        return x is not None and y is not None
    if field == "constraints":
        return [c[:2] for c in x] == [c[:2] for c in y]
    return False


def compare(a_path, b_path, ignore=()):
    a = json.loads(Path(a_path).read_text())["cases"]
    b = json.loads(Path(b_path).read_text())["cases"]
    diffs, texts, missing = [], {}, []
    for key in sorted(set(a) | set(b)):
        if any(key.endswith(f"| {name}") for name in ignore):
            continue
        x, y = a.get(key), b.get(key)
        if x == y:
            continue
        if x is None or y is None:
            missing.append(f"{key}: only {'after' if x is None else 'before'}")
            continue
        if not isinstance(x, dict):
            diffs.append(f"{key}: {x} -> {y}")
            continue
        for field in sorted(set(x) | set(y)):
            if x.get(field) == y.get(field):
                continue
            if field in TEXTS and _texts_only(field, x.get(field), y.get(field)):
                variant = key.rsplit("| ", 1)[-1]
                change = (field, variant, str(x.get(field))[:200], str(y.get(field))[:200])
                if field == "supports":
                    change = (field, variant, "", "")
                texts[change] = texts.get(change, 0) + 1
                continue
            diffs.append(f"{key}: {field}: {str(x.get(field))[:300]} -> "
                         f"{str(y.get(field))[:300]}")
    sup, judged, rendered, spaces = _count(a)
    print(f"{len(a)} cases before, {len(b)} after; {sup} supported (layer, target, variant) "
          f"cases, {judged} points judged by every constraint, {rendered} kernels rendered "
          f"(source, launches, buffers, scratch, local memory, registers, layouts), "
          f"{spaces} whole spaces enumerated")
    if missing:
        print(f"{len(missing)} cases on one side only (layers or variants that differ), e.g.:")
        for m in missing[:5]:
            print("  " + m)
    if texts:
        print("explanations reworded (no verdict changed):")
        for (field, variant, old, new), n in sorted(texts.items()):
            what = "why it declines a layer" if field == "supports" else f"{old} -> {new}"
            print(f"  {variant}: {field}: {what} ({n} cases)")
    print(f"{len(diffs)} differences" + (":" if diffs else ""))
    for d in diffs[:200]:
        print("  " + d)
    return 1 if diffs else 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("--root", default=str(ROOT), help="the tree whose aotconv is snapshotted")
    s.add_argument("-o", "--output", required=True)
    s.add_argument("--only", nargs="*", help="only these variants")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--ignore", nargs="*", default=(), help="variants left out of the comparison")
    a = p.parse_args(argv)
    if a.cmd == "snapshot":
        snapshot(a.root, a.output, a.only)
        return 0
    return compare(a.before, a.after, a.ignore)


if __name__ == "__main__":
    sys.exit(main())
