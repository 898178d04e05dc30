"""Digest every pruned space of the shipped networks, and compare two digests.

A change to the space enumeration (aotconv/space.py and what it calls) that means to change no
point is checked by digesting before and after and comparing:

    git archive BEFORE | tar -x -C /tmp/before
    python tools/space_digest.py digest --root /tmp/before -o /tmp/before.json
    python tools/space_digest.py digest -o /tmp/after.json
    python tools/space_digest.py compare /tmp/before.json /tmp/after.json

Per (network, batch, target, precision, unique layer, variant): the space's size, how many
points survive, a sha256 of the survivors in order, what each constraint pruned in the search's
staged walk (`first`) and the text of the constraints that raised; with --exact-max N, for a
variant of at most N points also the exact counts of `aotconv space --exact` (first in level
order and alone). The layers are those `aotconv build` enumerates: the network after aotconv's
passes, identical layers once. Only APIs that both sides have are used (layer_space, its parts'
total, points, first, alone, errors), so an older tree needs nothing of this file.
"""
import argparse
import hashlib
import json
from pathlib import Path
import sys
import time

ROOT = Path(__file__).resolve().parent.parent
NETWORKS = ("lenet5", "alexnet", "vgg16", "nin", "inception-v1", "resnet50", "mobilenet_v2")


def _points_sha(points):
    h = hashlib.sha256()
    for c in points:
        h.update(repr(c.items).encode())
        h.update(b"\n")
    return h.hexdigest()


def _part(p, exact=None):
    out = {"total": p.total, "points": len(p.points), "sha": _points_sha(p.points),
           "first": {k: v for k, v in p.first.items() if v}, "errors": dict(p.errors)}
    if exact is not None:
        out["exact_first"] = {k: v for k, v in exact.first.items() if v}
        out["exact_alone"] = {k: v for k, v in exact.alone.items() if v}
        out["exact_errors"] = dict(exact.errors)
        out["exact_sha"] = _points_sha(exact.points)
    return out


def digest(nets, batches, targets, precisions, exact_max, log=print):
    from aotconv.ops import is_alias
    from aotconv.space import layer_space, variant_space
    from aotconv.spec import load_network
    from aotconv.targets import TARGETS
    try:
        from aotconv.passes import optimise
    except ImportError:
        def optimise(net):
            return net
    out = {}
    for name in nets:
        for batch in batches:
            if batch == "default":
                own = load_network(name).input_shape[0]
                if str(own) in batches:
                    continue                    # the same layers as that batch's
            net = optimise(load_network(name, batch=None if batch == "default" else int(batch)))
            for tname in targets:
                for prec in precisions:
                    target, layers_net = TARGETS[tname], net
                    if prec != "fp32":
                        from aotconv.context import with_precision
                        from aotconv.precision import stored
                        target = with_precision(target, prec)
                        layers_net = stored(net, prec)
                    seen = set()
                    t0 = time.monotonic()
                    for layer in layers_net.layers:
                        if is_alias(layer):
                            continue
                        sig = layer.signature_str()
                        if sig in seen:
                            continue
                        seen.add(sig)
                        sp = layer_space(layer, target)
                        parts = {}
                        for p in sp.parts:
                            ex = (variant_space(layer, p.variant, target, explain=True)
                                  if exact_max and p.total <= exact_max else None)
                            parts[p.variant.name] = _part(p, ex)
                        key = f"{name}|{batch}|{tname}|{prec}|{sig}"
                        out[key] = {"layer": layer.name, "parts": parts,
                                    "unsupported": [list(u) for u in sp.unsupported]}
                    log(f"{name} batch {batch} {tname} {prec}: {len(seen)} layers, "
                        f"{time.monotonic() - t0:.1f} s", flush=True)
    return out


def compare(a, b):
    """Lines naming every difference between two digests (none: the spaces are the same)."""
    lines = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            lines.append(f"{key}: only in {'the second' if key in b else 'the first'}")
            continue
        x, y = a[key], b[key]
        if x["unsupported"] != y["unsupported"]:
            lines.append(f"{key}: unsupported {x['unsupported']} != {y['unsupported']}")
        for v in sorted(set(x["parts"]) | set(y["parts"])):
            px, py = x["parts"].get(v), y["parts"].get(v)
            if px is None or py is None:
                lines.append(f"{key} {v}: only in {'the second' if px is None else 'the first'}")
                continue
            for field in sorted(set(px) | set(py)):
                if field in px and field in py and px[field] != py[field]:
                    lines.append(f"{key} {v} {field}: {px[field]} != {py[field]}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("digest")
    d.add_argument("--root", default=str(ROOT), help="the aotconv tree to digest")
    d.add_argument("--nets", default=",".join(NETWORKS))
    d.add_argument("--batches", default="1", help="comma-separated; 'default': the network's own")
    d.add_argument("--targets", default="h100,pocl-cpu")
    d.add_argument("--precisions", default="fp32")
    d.add_argument("--exact-max", type=int, default=0,
                   help="also digest `aotconv space --exact` for variants of at most this many "
                        "points")
    d.add_argument("-o", "--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args(argv)
    if args.cmd == "digest":
        sys.path.insert(0, str(Path(args.root).resolve()))
        t0 = time.monotonic()
        out = digest(args.nets.split(","), args.batches.split(","), args.targets.split(","),
                     args.precisions.split(","), args.exact_max)
        Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
        print(f"{len(out)} layer spaces digested in {time.monotonic() - t0:.1f} s -> {args.out}")
        return 0
    a, b = (json.loads(Path(p).read_text()) for p in (args.a, args.b))
    diff = compare(a, b)
    for line in diff[:200]:
        print(line)
    print(f"{len(set(a) & set(b))} layer spaces compared, {len(diff)} differences")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
