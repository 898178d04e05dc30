"""`aotconv bench` and the studies beside it: aotconv's kernels and emitted libraries measured
against the libraries a user would otherwise call.

    sets.py             the benchmark layer sets and the conv layer of each
    device.py           the OpenCL device of the target and what the JSON says about it
    options.py          the parsed command line, the deadline and the tuner's measurer
    layer.py            one layer: pick our kernel, verify and time it and the references
    refs/               the references (PyTorch, CLBlast's convgemm) as measurement subjects
    e2e.py              one network end to end: the emitted library against PyTorch, in one
                        precision (--precision fp32, tf32 or fp16)
    library_timing.py   the library's timing end to end, in a process of its own (no PyTorch)
    report.py           derived figures (roofline, hints, summaries) and the tables
    rerender.py         --from-json: merge earlier results and render them again
    cli.py              the `aotconv bench` command line
    run.py              one `aotconv bench` run: the sets, then the networks end to end
    study.py            the search-quality study (python -m aotconv.bench.study)
    compile_speedup.py  the parallel-compile speed-up (python -m aotconv.bench.compile_speedup)

Every kernel is run, checked and timed by the one measurement protocol, aotconv.protocol.
"""
from .sets import conv_layer  # noqa: F401  (the benchmark layer of a tuple, for tests and tools)
