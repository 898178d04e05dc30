"""Figures for report.md (the `report` extra, matplotlib): per-layer histograms of every valid
candidate measured (BEAST's Fig. 7) and a roofline of the chosen kernels.

Both functions return the path written, or None when matplotlib is absent or there is nothing
to plot; they never fail a build.
"""
import math


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        return None


def _unique(choices):
    """One entry per distinct choice (identical layers share one), in network order."""
    seen, out = set(), []
    for name, c in choices.items():
        if id(c) not in seen:
            seen.add(id(c))
            out.append((name, c))
    return out


def histogram_png(choices, path, cols=3):
    """GFLOP/s of every valid candidate tried, one panel per tuned layer; the chosen kernel
    and the untuned fallback are marked."""
    plt = _pyplot()
    items = [(n, c) for n, c in _unique(choices) if c.stats.times and c.stats.flops]
    if plt is None or not items:
        return None
    rows = math.ceil(len(items) / cols)
    fig, axes = plt.subplots(rows, min(cols, len(items)), squeeze=False,
                             figsize=(4.2 * min(cols, len(items)), 2.9 * rows))
    for ax, (name, c) in zip(axes.flat, items):
        st = c.stats
        g = [st.flops / (t * 1e6) for t in st.times if t]
        ax.hist(g, bins=min(40, max(5, len(g) // 3)), color="#4878a8")
        if c.time_ms:
            ax.axvline(st.flops / (c.time_ms * 1e6), color="#c0392b", lw=1.5, label="chosen")
        if st.fallback_ms:
            ax.axvline(st.flops / (st.fallback_ms * 1e6), color="#888", ls="--", lw=1.2,
                       label="fallback")
        label = name + (f" (+{len(st.layers) - 1})" if len(st.layers) > 1 else "")
        ax.set_title(f"{label}: {len(g)} valid of {st.tried} tried, {st.pruned} pruned",
                     fontsize=8)
        ax.set_xlabel("GFLOP/s", fontsize=8)
        ax.set_ylabel("kernels", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(items):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def roofline_png(net, choices, target, path):
    """Chosen kernels (arithmetic intensity = FLOPs / fewest bytes, achieved GFLOP/s) under
    the target's compute and bandwidth roofs."""
    plt = _pyplot()
    pts = [(n, c) for n, c in _unique(choices)
           if c.time_ms and c.stats.flops and c.stats.bytes]
    if plt is None or not pts or not (target.peak_gflops and target.peak_gbps):
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ai = [c.stats.flops / c.stats.bytes for _, c in pts]
    lo, hi = min(ai + [0.1]) / 2, max(ai + [100]) * 2
    ridge = target.peak_gflops / target.peak_gbps
    xs = [lo, ridge, hi]
    ax.plot(xs, [min(target.peak_gflops, x * target.peak_gbps) for x in xs], color="k", lw=1.2)
    ax.text(hi, target.peak_gflops * 1.08, f"{target.peak_gflops:.0f} GFLOP/s", ha="right",
            fontsize=7)
    ax.text(lo * 1.1, lo * target.peak_gbps * 1.3, f"{target.peak_gbps:.0f} GB/s", fontsize=7,
            rotation=30)
    for (name, c), x in zip(pts, ai):
        y = c.stats.flops / (c.time_ms * 1e6)
        ax.scatter([x], [y], s=18, color="#c0392b" if c.source != "fallback" else "#888")
        ax.annotate(name, (x, y), fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte, fewest bytes)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"{net.name} on {target.name}: chosen kernels", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
