#!/usr/bin/env python3
"""Charts from `strata-bench step --json FILE`.

    python3 -m venv .venv && .venv/bin/pip install matplotlib
    .venv/bin/python bench/plot.py step.json --out docs/img --prefix paper_like

writes <prefix>_phases.png (where one iteration's time goes, per preset, next to the full-duplex
bound of docs/design.md section 2) and <prefix>_paths.png (throughput of each path over the run, with the preset
that was running shaded).
"""
import argparse
import json
import os
import sys

PHASES = [
    ("grads_s", "gradient hand-over (backward I/O)", "#8c564b"),
    ("read_wait_s", "read wait", "#d62728"),
    ("compute_s", "AdamW compute", "#2ca02c"),
    ("write_wait_s", "write wait", "#ff7f0e"),
    ("other_s", "other", "#7f7f7f"),
]
PRESET_COLORS = {"zero_infinity": "#fde0dd", "mlp_offload": "#e5f5e0", "strata": "#deebf7"}


def load(path):
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    if d.get("command") != "step":
        sys.exit(f"plot.py: {path} is not the --json of `strata-bench step`")
    return d


def title(d):
    return (f"{d['params'] / 1e9:g}e9 parameters, subgroups of {d['subgroup'] / 1e6:g}M, "
            f"{d['grad']} gradients, cache {d['cache_bytes'] / 2**30:.1f} GiB")


def phases_chart(d, plt, out):
    presets = d["presets"]
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.8 * len(presets)))
    names = [p["preset"] for p in presets]
    left = [0.0] * len(presets)
    for key, label, color in PHASES:
        widths = [p[key] for p in presets]
        ax.barh(names, widths, left=left, color=color, label=label)
        left = [l + w for l, w in zip(left, widths)]
    for i, p in enumerate(presets):
        note = f"{p['step_s']:.2f} s"
        if "speedup_vs_zero_infinity" in p:
            note += f"  ({p['speedup_vs_zero_infinity']:.2f}x)"
        ax.text(left[i], i, "  " + note, va="center", fontsize=9)
        if p["bound_s"] > 0:
            ax.plot([p["bound_s"]] * 2, [i - 0.4, i + 0.4], color="black", linestyle="--", linewidth=1.5,
                    label="lower bound (docs/design.md 2: full duplex)" if i == 0 else None)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per iteration (median)")
    ax.set_xlim(0, max(max(left), max(p["bound_s"] for p in presets)) * 1.3)
    ax.set_title(title(d), fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def paths_chart(d, plt, out, window):
    tl = d["timeline"]
    names = [p["name"] for p in d["paths"]]
    fig, ax = plt.subplots(figsize=(10, 4))
    # Shade the spans in which each preset ran (consecutive samples of one preset).
    start = 0
    for i in range(1, len(tl) + 1):
        if i == len(tl) or tl[i]["preset"] != tl[start]["preset"]:
            ax.axvspan(tl[start]["t"], tl[i - 1]["t"], color=PRESET_COLORS.get(tl[start]["preset"], "#eeeeee"),
                       zorder=0)
            start = i
    # A request's bytes count when it completes (a whole subgroup at once), so rates are taken
    # over a sliding window of `window` seconds within one preset's span.
    seen = set()
    for k, name in enumerate(names):
        for direction, style in (("read", "-"), ("written", ":")):
            xs, ys = [], []
            seg = 0
            for i in range(1, len(tl)):
                if tl[i]["preset"] != tl[i - 1]["preset"]:
                    seg = i
                    xs.append(tl[i]["t"])
                    ys.append(float("nan"))  # a gap between presets
                    continue
                j = i
                while j > seg and tl[i]["t"] - tl[j]["t"] < window:
                    j -= 1
                a, b = tl[j], tl[i]
                if k >= len(b[direction]) or b["t"] <= a["t"]:
                    continue
                xs.append(b["t"])
                ys.append((b[direction][k] - a[direction][k]) / (b["t"] - a["t"]) / 1e9)
            label = f"{name} {'read' if direction == 'read' else 'write'}"
            ax.plot(xs, ys, style, linewidth=1.2, label=label, color=f"C{k}")
    for preset, color in PRESET_COLORS.items():
        if any(s["preset"] == preset for s in tl) and preset not in seen:
            ax.fill_between([], [], color=color, label=preset)
            seen.add(preset)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel(f"GB/s ({window:g} s sliding window)")
    ax.set_title("throughput per path; " + title(d), fontsize=10)
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="output of strata-bench step --json")
    ap.add_argument("--out", default=".", help="directory for the PNG files")
    ap.add_argument("--prefix", default="step", help="file name prefix")
    ap.add_argument("--window", type=float, default=1.0,
                    help="seconds over which path throughput is averaged (a request counts when it completes)")
    a = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot.py: needs matplotlib (pip install matplotlib)")
    d = load(a.json)
    os.makedirs(a.out, exist_ok=True)
    phases = os.path.join(a.out, f"{a.prefix}_phases.png")
    paths = os.path.join(a.out, f"{a.prefix}_paths.png")
    phases_chart(d, plt, phases)
    paths_chart(d, plt, paths, a.window)
    print(f"wrote {phases} and {paths}")


if __name__ == "__main__":
    main()
