#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/plot.py - turns the JSON lines of `sdpa bench --json` and the peer scripts into a PNG.
"""Plots GFLOP/s against sequence length (Tk) per ISA, with the measured fp32
FMA peak of each ISA as a horizontal line and the rows of the other
implementations beside them (naive-blas; torch-sdpa, openvino-sdpa, and
ort-attention / ort-mha / ort-gqa from bench/torch_sdpa.py, openvino_sdpa.py
and ort_sdpa.py; any other "impl" is drawn the same way, one series per impl
and dtype): one panel per pass (forward, backward) and thread count.
Colours tell the implementation / ISA, markers the mask; points of one
implementation and mask (decode apart) are joined in order of Tk. Decode-like rows
(Tq <= 16) are drawn hollow: they are bound by memory bandwidth, not FLOPs.

    sdpa bench --json > sdpa.jsonl
    python3 bench/torch_sdpa.py --from-sdpa sdpa.jsonl > torch.jsonl
    python3 bench/ort_sdpa.py --from-sdpa sdpa.jsonl > ort.jsonl
    python3 bench/plot.py sdpa.jsonl torch.jsonl ort.jsonl -o bench.png

Needs matplotlib (python3 -m pip install -r bench/requirements.txt). Lines
that are not JSON objects (comments, tables) are ignored; '-' reads stdin.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa as common  # noqa: E402  (the JSON-lines reader; no torch import at this level)

DECODE_MAX_TQ = 16
MASK_MARKERS = {"none": "o", "causal": "^", "causal-bottom-right": "v", "padding": "s"}
ISA_ORDER = ["scalar", "avx2", "avx512", "amx", "neon"]


def read_rows(paths):
    # rows of a logit variant (--softcap, --alibi, --sinks: "variant") are not the plain
    # problem's: left out, as table.py does, so they never join its series
    return [r for r in common.json_rows(paths)
            if all(k in r for k in ("impl", "op", "threads", "Tk", "gflops", "mask"))
            and r.get("variant", "plain") == "plain"]


def series_name(r):
    # rows of `sdpa bench --dtype bf16,fp16` are their own series ("sdpa avx512 bf16"); fp32 keeps its name
    dtype = r.get("dtype", "fp32")
    suffix = "" if dtype == "fp32" else f" {dtype}"
    return f"sdpa {r.get('isa', '?')}{suffix}" if r["impl"] == "sdpa" else r["impl"] + suffix


def series_key(name):
    if name.startswith("sdpa "):
        isa, _, dtype = name[5:].partition(" ")
        return (0, ISA_ORDER.index(isa) if isa in ISA_ORDER else 99, isa, dtype)
    return (1, 0, name, "")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="JSON-lines files ('-' for stdin)")
    p.add_argument("-o", "--output", default="bench.png", help="PNG to write (default bench.png)")
    p.add_argument("--title", default=None)
    args = p.parse_args()

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        print(f"plot.py needs matplotlib: {sys.executable} -m pip install -r bench/requirements.txt",
              file=sys.stderr)
        return 3

    rows = read_rows(args.inputs)
    if not rows:
        print("plot.py: no benchmark rows in the input", file=sys.stderr)
        return 1
    ops = [op for op in ("forward", "backward") if any(r["op"] == op for r in rows)]
    threads = sorted({r["threads"] for r in rows})
    names = sorted({series_name(r) for r in rows}, key=series_key)
    ncolours = 10 if len(names) <= 10 else 20  # with every peer there are more than 10 series
    cmap = plt.get_cmap("tab10" if ncolours == 10 else "tab20")
    colour = {n: cmap(i % ncolours) for i, n in enumerate(names)}

    fig, axes = plt.subplots(len(ops), len(threads), figsize=(max(9.0, 5.5 * len(threads)), 4.2 * len(ops) + 0.8),
                             squeeze=False, sharex=True)
    for oi, op in enumerate(ops):
        for ti, nt in enumerate(threads):
            ax = axes[oi][ti]
            sel = [r for r in rows if r["op"] == op and r["threads"] == nt]
            # measured peaks: per ISA from the sdpa rows; the machine's best from any row
            peaks = {}
            for r in sel:
                if r["impl"] == "sdpa" and r.get("peak_gflops"):
                    peaks[r["isa"]] = r["peak_gflops"]
            labels = []  # peaks within 10% of each other share one label
            for isa, pk in sorted(peaks.items(), key=lambda kv: kv[1]):
                c = colour.get(f"sdpa {isa}", "grey")
                ax.axhline(pk, color=c, linestyle="--", linewidth=1.0, alpha=0.8)
                if labels and pk <= labels[-1][0] * 1.1:
                    labels[-1][1].append(f"{isa} {pk:.0f}")
                    labels[-1] = (labels[-1][0], labels[-1][1], "grey")  # one label, several lines
                else:
                    labels.append((pk, [f"{isa} {pk:.0f}"], c))
            for pk, parts, c in labels:
                ax.annotate("peak " + ", ".join(parts), xy=(1.0, pk), xycoords=("axes fraction", "data"),
                            xytext=(-4, 2), textcoords="offset points", ha="right", va="bottom",
                            fontsize=7, color=c)
            groups = {}
            for r in sel:
                decode = r.get("Tq", DECODE_MAX_TQ + 1) <= DECODE_MAX_TQ
                groups.setdefault((series_name(r), r["mask"], decode), []).append(r)
            for (name, mask, _), g in sorted(groups.items(),
                                             key=lambda kv: (series_key(kv[0][0]), kv[0][1], kv[0][2])):
                g.sort(key=lambda r: (r["Tk"], r.get("Tq", 0)))
                xs = [r["Tk"] for r in g]
                ys = [r["gflops"] for r in g]
                c = colour[name]
                m = MASK_MARKERS.get(mask, "x")
                ax.plot(xs, ys, color=c, linewidth=1.0, alpha=0.6)
                for r, x, y in zip(g, xs, ys):
                    decode = r.get("Tq", DECODE_MAX_TQ + 1) <= DECODE_MAX_TQ
                    ax.plot([x], [y], marker=m, color=c, markersize=6, linestyle="none",
                            markerfacecolor="none" if decode else c)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.25)
            ax.set_title(f"{op}, {nt} thread{'s' if nt > 1 else ''}", fontsize=10)
            if oi == len(ops) - 1:
                ax.set_xlabel("sequence length Tk")
            if ti == 0:
                ax.set_ylabel("GFLOP/s (useful FLOPs, log)")
    handles = [Line2D([], [], color=colour[n], marker="o", linestyle="-", label=n) for n in names]
    handles += [Line2D([], [], color="black", marker=mk, linestyle="none", markerfacecolor="none",
                       label=f"mask {mask}") for mask, mk in MASK_MARKERS.items()
                if any(r["mask"] == mask for r in rows)]
    handles.append(Line2D([], [], color="grey", linestyle="--", label="measured FMA peak"))
    ncol = 4
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    version = next((r["version"] for r in rows if "version" in r), None)
    any_decode = any(r.get("Tq", DECODE_MAX_TQ + 1) <= DECODE_MAX_TQ for r in rows)
    note = f" (hollow: decode, Tq <= {DECODE_MAX_TQ})" if any_decode else ""
    fig.suptitle(args.title or f"libsdpa{' ' + version if version else ''} attention throughput{note}", fontsize=11)
    legend_rows = (len(handles) + ncol - 1) // ncol
    fig.tight_layout(rect=(0, min(0.4, 0.2 * legend_rows / fig.get_figheight()), 1, 0.96))
    fig.savefig(args.output, dpi=120)
    print(f"plot.py: wrote {args.output} ({len(rows)} rows)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
