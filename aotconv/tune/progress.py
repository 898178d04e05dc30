"""Progress of a tuning run: a one-line bar on a terminal, JSON events, or nothing.

    bar    stderr is a terminal and not --quiet: one line per layer, redrawn after each trial
           (trials, best GFLOP/s so far and its variant, failures), kept when the layer ends
    lines  stderr is not a terminal and not --quiet: one summary line per finished layer
    json   --json: one JSON object per event on stderr (layer_start, trial, layer_done, warning)
    quiet  --quiet: nothing but warnings

Warnings (untuned layers...) always go to stderr, whatever the mode.

Several layers may be searched at once (tune.search lanes), each on a thread of its own: a
layer's events come from its thread (layer_start, its trials, layer_done), so a trial belongs
to the layer its thread started; a bar shows the layer of the latest trial.
"""
import json
import shutil
import sys
import threading

from ..ops import flops


def gflops(layer, ms):
    return flops(layer) / (ms * 1e6) if ms else 0.0


class Progress:
    def __init__(self, mode="quiet", stream=None):
        self.mode = mode
        self.stream = stream or sys.stderr
        self._here = threading.local()        # the layer this thread searches
        self._write = threading.RLock()

    @property
    def _layer(self):
        return getattr(self._here, "layer", None)

    @_layer.setter
    def _layer(self, state):
        self._here.layer = state

    @classmethod
    def make(cls, quiet=False, json_progress=False, stream=None):
        if json_progress:
            return cls("json", stream)
        if quiet:
            return cls("quiet", stream)
        s = stream or sys.stderr
        return cls("bar" if hasattr(s, "isatty") and s.isatty() else "lines", s)

    # -- events --------------------------------------------------------------------------------
    def layer_start(self, i, n, group, space, grant, deadline):
        self._layer = dict(i=i, n=n, layer=group[0], names=[l.name for l in group],
                           space=len(space.candidates), total=space.total, grant=grant,
                           tried=0, failed=0, best=None, best_variant="")
        if self.mode == "json":
            self._emit(event="layer_start", index=i + 1, of=n, layers=self._layer["names"],
                       op=group[0].op, space=space.total, candidates=len(space.candidates),
                       trials=grant)
        elif self.mode == "bar":
            self._draw()

    def trial(self, cand, outcome, outcomes):
        s = self._layer
        if s is None:
            return
        s["tried"] += 1
        if not outcome.ok:
            s["failed"] += 1
        elif s["best"] is None or outcome.time_ms < s["best"]:
            s["best"], s["best_variant"] = outcome.time_ms, cand.variant
        if self.mode == "json":
            self._emit(event="trial", layer=s["names"][0], variant=cand.variant,
                       cfg=dict(cand.cfg.items), status=outcome.status.value,
                       time_ms=outcome.time_ms,
                       best_gflops=round(gflops(s["layer"], s["best"]), 3) if s["best"] else None)
        elif self.mode == "bar":
            self._draw()

    def layer_done(self, result):
        s = self._layer
        best = result.best_outcome.time_ms if result.best_outcome else None
        if self.mode == "json":
            self._emit(event="layer_done", layers=[l.name for l in result.layers],
                       variant=result.best.variant if result.best else None,
                       cfg=dict(result.best.cfg.items) if result.best else None,
                       time_ms=best, gflops=round(gflops(result.layers[0], best), 3) if best
                       else None, new=result.new, known=len(result.outcomes))
            return
        if self.mode == "quiet":
            return
        if s is not None and best is not None:
            s["best"], s["best_variant"] = best, result.best.variant
        line = self._line(final=True, result=result)
        with self._write:
            if self.mode == "bar":
                self.stream.write("\r" + line.ljust(self._width())[:self._width()] + "\n")
            else:
                self.stream.write(line + "\n")
            self.stream.flush()

    def warn(self, text):
        if self.mode == "json":
            self._emit(event="warning", message=text)
            return
        with self._write:
            if self.mode == "bar":
                self.stream.write("\n")
            sys.stderr.write(f"aotconv: WARNING: {text}\n")
            sys.stderr.flush()

    # -- drawing -------------------------------------------------------------------------------
    def _width(self):
        return max(40, shutil.get_terminal_size((100, 20)).columns - 1)

    def _line(self, final=False, result=None):
        s = self._layer
        names = s["names"][0] + (f" (x{len(s['names'])})" if len(s["names"]) > 1 else "")
        head = f"[{s['i'] + 1}/{s['n']}] {names} {s['layer'].op}"
        if final and result is not None:
            tried = f"{result.new} new / {len(result.outcomes)} measured of {s['space']}"
        else:
            tried = f"{s['tried']}/{s['grant']} trials of {s['space']}"
        best = "no valid kernel yet"
        if s["best"]:
            best = (f"best {gflops(s['layer'], s['best']):.1f} GFLOP/s ({s['best']:.4g} ms, "
                    f"{s['best_variant']})")
        return f"{head}: {tried}, {best}, {s['failed']} failed or wrong"

    def _draw(self):
        w = self._width()
        with self._write:
            self.stream.write("\r" + self._line()[:w].ljust(w))
            self.stream.flush()

    def _emit(self, **event):
        with self._write:
            self.stream.write(json.dumps(event, default=str) + "\n")
            self.stream.flush()
