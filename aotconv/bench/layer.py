"""One benchmark layer: pick our kernel (the tuner, or the best registered fallback), then
verify and time it and the references on the same inputs and weights; the layer's JSON row.

Our kernel and the references are measured by aotconv.protocol: one set of inputs and
weights, the float64 reference on the first --verify-images images, the same number of buffer
copies for every implementation, warm-up and the median of the repeats.
"""
import copy
import time

import numpy as np

from .. import protocol
from ..choose import choose
from ..errors import AotconvError
from ..graph import Network
from ..harness import random_inputs
from ..ops import bytes_moved, flops
from ..space import device_constraints
from ..variants import for_layer
from .refs import NAMES as REF_NAMES
from .report import failure, log, rounded
from .sets import conv_layer


def skeleton(s, t, opts):
    """A layer's row before anything is measured: its shape, FLOPs and compulsory bytes."""
    layer, n0 = conv_layer(t, opts.max_batch)
    return {"set": s, "name": t[0], "N": layer.in_shape[0], "N_orig": n0, "C": t[2], "H": t[3],
            "W": t[4], "K": t[5], "R": t[6], "S": t[7], "stride": t[8], "pad": t[9],
            "P": layer.out_shape[2], "Q": layer.out_shape[3], "flops": flops(layer),
            "bytes": bytes_moved(layer), "refs": {}}


# -- picking our kernel -----------------------------------------------------------------------

def one_layer_net(layers, name="bench"):
    """A Network holding independent layers (each reading its own input), for `choose`."""
    return Network(name, layers[0].in_shape, list(layers), [layers[-1].name])


def tune_layers(dev, layers, opts, budget=None):
    """{name: Choice} from the tuner (from the records alone with --records-only) for
    independent `layers` sharing one budget."""
    net = one_layer_net(layers)
    # each layer of a set counts once in its geometric mean: the set budget is shared equally
    return choose(net, dev.target, mode="records" if opts.mode == "records" else "tune",
                  budget=budget or opts.budget,
                  strategy=opts.strategy, quiet=opts.quiet, measurer=opts.measurer(dev),
                  share="equal")


def fallback_candidates(layer, target):
    """[(variant, cfg)] of every registered variant's fallback that is valid for `layer`."""
    out, skipped = [], []
    for v in for_layer(layer):
        try:
            cfg = v.fallback(layer, target)
            bad = [c.name for c in list(v.constraints) + device_constraints(v, target)
                   if not c.check(layer, cfg, target)]
        except Exception as e:                     # a variant without a valid fallback here
            skipped.append(f"{v.name}: {type(e).__name__}: {e}")
            continue
        if bad:
            skipped.append(f"{v.name}: fallback violates {', '.join(bad)}")
        else:
            out.append((v, cfg))
    return out, skipped


def best_fallback(dev, layer, xs, params, ref, opts, quick_repeats=3):
    """--no-tune: time each variant's fallback (verified) and keep the fastest; one whose
    single run is over 3x the best median so far is not timed further (it cannot win).
    Returns (variant, cfg, tried) with tried = [{variant, cfg, ms | error}]."""
    cands, skipped = fallback_candidates(layer, dev.target)
    tried = [{"variant": s.split(":")[0], "error": s} for s in skipped]
    quick = copy.copy(opts)
    quick.repeats = quick_repeats
    best = None
    for v, cfg in cands:
        entry = {"variant": v.name, "cfg": str(cfg)}
        try:
            k = protocol.Kernel(dev.ctx, dev.queue, layer, v, cfg, xs, params)
            chk, _ = protocol.verify(k, ref)
            if chk.get("ok") is False:
                entry["error"] = f"wrong (max scaled error {chk['error']:.2g})"
            else:
                one = protocol.estimate_ms(k)
                if best is not None and one > 3 * best[2]:
                    entry["ms_once"] = one
                else:
                    warm, reps = protocol.counts(one, quick)
                    ms = protocol.median(protocol.time_repeats(k, warm, reps))
                    entry["ms"] = ms
                    if best is None or ms < best[2]:
                        best = (v, cfg, ms)
        except Exception as e:
            entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        tried.append(entry)
    if best is None:
        raise AotconvError(f"layer {layer.name}: no variant's fallback ran correctly: "
                           + "; ".join(t.get("error", "") for t in tried))
    return best[0], best[1], tried


# -- one layer --------------------------------------------------------------------------------

def bench_layer(dev, refs, set_name, t, opts, choice=None):
    """Measure one benchmark layer; returns its JSON row (derived figures added later)."""
    layer, _ = conv_layer(t, opts.max_batch)
    row = skeleton(set_name, t, opts)
    row["variants"] = [v.name for v in for_layer(layer)]
    rng = np.random.default_rng([opts.seed, len(layer.name), sum(map(ord, layer.name))])
    xs, params = random_inputs(layer, rng)
    x, w = xs[0], params["weight"]
    ref = protocol.Reference(layer, xs, params, opts.verify_images, opts.verify_max_gflop)
    copies = dev.copies(protocol.layer_footprint(layer))
    row["copies"] = copies
    ours = {}
    row["ours"] = ours
    try:
        t0 = time.monotonic()
        if choice is None and opts.mode in ("tune", "records"):
            choice = tune_layers(dev, [layer], opts)[layer.name]
        if choice is not None:
            variant, cfg = choice.impl, choice.cfg
            ours.update(source=choice.source, tuner_ms=choice.time_ms,
                        tune_s=getattr(choice.stats, "seconds", None) or
                        round(time.monotonic() - t0, 3),
                        tried=getattr(choice.stats, "tried", None))
        else:
            variant, cfg, tried = best_fallback(dev, layer, xs, params, ref, opts)
            ours.update(source="best fallback", tune_s=round(time.monotonic() - t0, 3),
                        tried=tried)
        ours.update(variant=variant.name, cfg=str(cfg))
        k = protocol.Kernel(dev.ctx, dev.queue, layer, variant, cfg, xs, params, copies)
        ours["launches"] = len([l for l in k.runs[0].launches if l.phase == "run"])
        ours["verify"], _ = protocol.verify(k, ref)
        warm, reps = protocol.counts(protocol.estimate_ms(k), opts)
        times = protocol.time_repeats(k, warm, reps)
        ours.update(ms=protocol.median(times), times=rounded(times))
        del k
    except Exception as e:
        ours.update(failure(e))
        log(f"aotconv bench: {layer.name}: ours failed: {ours['error']}", opts.quiet)
    for name in REF_NAMES:
        st = refs.status[name]
        if not st["available"]:
            row["refs"][name] = {"note": "absent"}
            continue
        try:
            row["refs"][name] = refs.measure(name, layer, x, w, ref, copies, opts)
        except Exception as e:
            row["refs"][name] = {"note": "failed", **failure(e)}
            log(f"aotconv bench: {layer.name}: {name} failed: {row['refs'][name]['error']}",
                opts.quiet)
    return row
