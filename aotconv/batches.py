"""One library for several batch sizes (`aotconv build --batch 1,8,32`): the sizes' own
schedules (each its kernels, launch configurations and buffer plan) merged into the tables
one emitted library replays, sharing the device buffers that can be shared.

- The sizes run one at a time on a handle (its queue is in order), so activation buffer i of
  every size is one device buffer, as large as the largest of them, and so is the scratch
  buffer.
- A parameter buffer is shared where every size fills it the same way: the same tensor of the
  user's array, or the same fold of a conv's weight and bias with its batchnorms.
- Variant-owned buffers (packed or transformed weights, split-K counters) stay per size: each
  size's chosen variant and configuration shape them.
- Kernel files and kernels are named `<layer>_b<N>` per size (schedule.build_schedule's
  file_suffix), so one program holds every size.

A single size gives back exactly its schedule's tables: a library built with `--batch N` is
the one built before batch ranges existed.
"""
from dataclasses import dataclass, field, replace
import numbers

from .errors import AotconvError
from .names import shown
from .schedule import Buffer, InOut, LaunchRow, ParamRow


class BatchError(AotconvError):
    pass


def _integer(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def parse_sizes(value, where="--batch"):
    """The batch sizes of `value`: None, an int, a sequence of ints or the text of `--batch`
    ("8", "1,8,32"). None stays None; anything else is a tuple of increasing positive ints.
    A list out of order or with a size twice is refused with the list to write instead."""
    if value is None:
        return None
    what = ("give a positive integer (8) or increasing positive integers separated by commas "
            "(1,8,32)")
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isascii() and p.isdigit() for p in parts):
            raise BatchError(f"{where} {shown(value)}: {what}")
        sizes = [int(p) for p in parts]
    elif _integer(value):
        sizes = [int(value)]
    elif isinstance(value, (list, tuple)) and value and all(map(_integer, value)):
        sizes = [int(v) for v in value]
    else:
        raise BatchError(f"{where} {shown(value)}: {what}")
    given = ",".join(map(str, sizes))
    if any(b < 1 for b in sizes):
        raise BatchError(f"{where} {given}: {what}")
    want = sorted(set(sizes))
    if sizes != want:
        raise BatchError(f"{where} {given}: give each batch size once, in increasing order: "
                         f"{where} {','.join(map(str, want))}")
    return tuple(sizes)


def file_suffix(batch, ranged):
    """What ends the kernel file and kernel names of size `batch` in a library of several
    sizes (none in a single-size library). `_b<digits>` at the end: no two sizes meet, and a
    size keeps its own stems apart as program_files made them."""
    return f"_b{batch}" if ranged else ""


@dataclass
class Size(InOut):
    """One batch size of a library: its own schedule and where its rows are in the library's
    tables."""
    batch: int
    schedule: object            # schedule.Schedule of the network at this batch
    inputs: list                # [(library buffer, floats)] in the network's input order
    outputs: list               # [(library buffer, floats)] in the network's output order
    first_launch: int           # its launches: launches[first_launch:first_launch + nlaunches]
    nlaunches: int
    first_run: int              # its profile() entries: [first_run:first_run + nrun]
    nrun: int

    @property
    def net(self):
        return self.schedule.net


@dataclass
class Library(InOut):
    """The tables of one emitted library: every size's programs and launches, the buffers they
    share, the parameter rows set_params fills. Reads like a Schedule of the largest size
    where emit and report need one (net, input, outputs, param layout)."""
    sizes: list
    programs: list = field(default_factory=list)
    buffers: list = field(default_factory=list)
    params: list = field(default_factory=list)
    folds: list = field(default_factory=list)
    launches: list = field(default_factory=list)

    @property
    def ranged(self):
        return len(self.sizes) > 1

    @property
    def batches(self):
        return [s.batch for s in self.sizes]

    @property
    def largest(self):
        return self.sizes[-1]

    @property
    def net(self):
        return self.largest.schedule.net

    @property
    def inputs(self):
        return self.largest.inputs

    @property
    def outputs(self):
        return self.largest.outputs

    @property
    def run_launches(self):
        return [l for l in self.launches if l.phase == "run"]

    @property
    def param_count(self):
        return self.largest.schedule.param_count

    def param_layout(self):
        return self.largest.schedule.param_layout()

    @property
    def act_bytes(self):
        return sum(b.bytes for b in self.buffers if b.kind == "act")

    @property
    def input_sample(self):
        """Floats of one sample's inputs, all of them."""
        return self.input_count // self.largest.batch

    @property
    def input_samples(self):
        """Floats of one sample of each input."""
        return [c // self.largest.batch for _, c in self.inputs]

    @property
    def output_sample(self):
        """Floats of one sample's outputs, all of them."""
        return self.output_count // self.largest.batch

    def serving(self, n):
        """The size that serves a call with `n` samples: the smallest >= n."""
        return next(s for s in self.sizes if s.batch >= n)


def _param_sources(sch):
    """{buffer index: what fills it in set_params}: a ParamRow's user tensor, or a FoldRow's
    weight or bias (the fold's own definition). Two sizes share a parameter buffer only where
    these are equal."""
    src = {}
    for p in sch.params:
        src[p.buffer] = ("tensor", p.offset, p.count)
    for f in sch.folds:
        key = (f.layer, f.channels, f.per_channel, f.weight_offset, f.bias_offset,
               tuple(map(tuple, f.batchnorms)))
        src[f.weight], src[f.bias] = ("fold weight", key), ("fold bias", key)
    return src


def merge(schedules):
    """The Library of `schedules`, [(batch, Schedule)] in increasing batch order."""
    ranged = len(schedules) > 1
    lib = Library([])
    where = {}                       # sharing key -> library buffer
    per_sample = None
    for batch, sch in schedules:
        sources = _param_sources(sch)
        remap = []
        for i, b in enumerate(sch.buffers):
            if b.kind == "act":
                key = ("act", b.name)
            elif b.kind == "scratch":
                key = ("scratch",)
            elif b.kind == "param":
                key = ("param", b.name, b.bytes, sources.get(i))
            else:
                key = None           # variant-owned: this size's own
            if key is not None and key in where:
                j = where[key]
                if lib.buffers[j].bytes < b.bytes:
                    lib.buffers[j] = replace(lib.buffers[j], bytes=b.bytes)
            else:
                name = f"{b.name} (batch {batch})" if ranged and key is None else b.name
                lib.buffers.append(Buffer(name, b.bytes, b.kind))
                j = len(lib.buffers) - 1
                if key is not None:
                    where[key] = j
            remap.append(j)
        for p in sch.params:
            row = ParamRow(p.name, remap[p.buffer], p.offset, p.count)
            if row not in lib.params:
                lib.params.append(row)
        for f in sch.folds:
            row = replace(f, weight=remap[f.weight], bias=remap[f.bias])
            if row not in lib.folds:
                lib.folds.append(row)
        first_program, first_launch = len(lib.programs), len(lib.launches)
        first_run = len(lib.run_launches)
        lib.programs.extend(sch.programs)
        for l in sch.launches:
            args = [("buf", remap[v]) if k == "buf" else (k, v) for k, v in l.args]
            lib.launches.append(LaunchRow(l.layer, l.kernel, l.program + first_program, l.phase,
                                          args, l.gsize, l.lsize))
        size = Size(batch, sch, [(remap[b], c) for b, c in sch.inputs],
                    [(remap[b], c) for b, c in sch.outputs], first_launch, len(sch.launches),
                    first_run, len(sch.run_launches))
        counts = [c for _, c in size.inputs] + [c for _, c in size.outputs]
        sample = tuple(c // batch for c in counts)
        if any(c % batch for c in counts) or per_sample not in (None, sample):
            raise BatchError(f"network '{sch.net.name}': at batch {batch} one sample's input "
                             f"or output is not the size it is at batch {lib.sizes[0].batch}; "
                             f"build its batch sizes as separate libraries")
        per_sample = sample
        lib.sizes.append(size)
    return lib


def unshared_bytes(lib):
    """The device bytes the sizes would take as libraries of their own."""
    return sum(sum(b.bytes for b in s.schedule.buffers) for s in lib.sizes)

