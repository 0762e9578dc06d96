#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/table.py - the README's comparison table from the JSON lines of one bench run.
"""Prints a Markdown table of libsdpa against every peer from the JSON lines of
`sdpa bench --json` and the peer scripts (bench/torch_sdpa.py, bench/ort_sdpa.py,
bench/openvino_sdpa.py) run on the same shapes and thread counts:

    python3 bench/table.py sdpa.jsonl torch.jsonl ort.jsonl ov.jsonl > table.md

One line per (shape, mask, op, threads) of the fp32 libsdpa rows (plain problems:
no attention variant, no mask form other than none / causal / causal-bottom-right /
padding). Cells are GFLOP/s (useful FLOPs, as every script counts them); the
avx512 (or neon) cell adds its % of the FMA peak measured in the same run, and a
decode row its GB/s of K and V and % of the read bandwidth. Peer columns are fp32
rows only (OpenVINO: the f32 hint; its default precision has its own column,
labelled with the precision it resolved to; libsdpa's own bf16 rows from
bench/compare.py's sdpa-bf16, "sdpa bf16", then "bf16 / openvino" where both ran: OpenVINO's
default-precision time over libsdpa's bf16 time). "best peer" is the fastest fp32 peer
of the line (naive-blas excluded), and "sdpa / best peer" the ratio of its time
to libsdpa's best ISA (above 1: libsdpa is faster); both are left out when the
input has no peer rows. Rows a peer cannot run (a
backward for ONNX Runtime and OpenVINO, masks an op cannot express) are "-".
Lines that are not JSON objects are ignored; '-' reads stdin.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa as common  # noqa: E402  (the JSON-lines reader; no torch import at this level)

ISAS = ["amx", "avx512", "avx2", "neon", "scalar"]  # amx: fp32 rows run the avx512 kernels
PEERS = [  # (impl, label): fp32 rows
    ("naive-blas", "naive-blas"),
    ("torch-sdpa", "torch-sdpa"),
    ("ort-attention", "ort-attention"),
    ("ort-mha", "ort-mha"),
    ("ort-gqa", "ort-gqa"),
    ("openvino-sdpa", "openvino f32"),
]
PLAIN_MASKS = ("none", "causal", "causal-bottom-right", "padding")


SHAPE = ("B", "Hq", "Hkv", "Tq", "Tk", "Dk", "Dv")


def number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def usable(r):
    """A row with every field the table reads, of the right kind (others are skipped)."""
    return (isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("impl", "op", "mask"))
            and all(isinstance(r.get(k), int) and not isinstance(r.get(k), bool) for k in SHAPE + ("threads",))
            and number(r.get("ms")) and r["ms"] > 0 and number(r.get("gflops")))


def read_rows(paths):
    return [r for r in common.json_rows(paths) if usable(r)]


def key(r):
    return (tuple(r[k] for k in SHAPE), r["mask"], r["op"], r["threads"])


def fmt(x):
    return "-" if x is None else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", help="JSON-lines files ('-' for stdin)")
    args = p.parse_args()
    try:
        rows = read_rows(args.inputs)
    except OSError as e:
        p.error(str(e))
    sdpa, peer, ov_default, sdpa_bf16 = {}, {}, {}, {}
    order = []
    for r in rows:
        if r.get("variant", "plain") != "plain" or r["mask"] not in PLAIN_MASKS:
            continue
        k = key(r)
        dtype = r.get("dtype", "fp32")
        if r["impl"] == "sdpa":
            if dtype == "bf16" and r.get("interleaved"):  # compare.py's sdpa-bf16
                sdpa_bf16[k] = r
            if dtype != "fp32":
                continue
            if k not in order:
                order.append(k)
            sdpa[(k, r.get("isa"))] = r
        elif r["impl"] == "openvino-sdpa" and r.get("ov_hint") == "default":
            ov_default[k] = r
        elif dtype == "fp32":
            prev = peer.get((k, r["impl"]))
            if prev is None or r["ms"] < prev["ms"]:
                peer[(k, r["impl"])] = r
    if not order:
        print("table.py: no fp32 libsdpa rows in the input", file=sys.stderr)
        return 1
    isas = [i for i in ISAS if any((k, i) in sdpa for k in order)]
    if "amx" in isas and "avx512" in isas:  # the same fp32 kernels: one column
        isas.remove("amx")
    peers = [(impl, lab) for impl, lab in PEERS if any((k, impl) in peer for k in order)]
    ovd = any(k in ov_default for k in order)
    precs = sorted({r.get("ov_precision", "?") for r in ov_default.values()})
    head = ["shape B,Hq,Hkv,Tq,Tk,Dk,Dv", "mask", "op", "thr"] + isas + [lab for _, lab in peers]
    if ovd:
        head.append("openvino default (" + ",".join(precs) + ")")
    bf = any(k in sdpa_bf16 for k in order)
    if bf:
        head.append("sdpa bf16")
    bf_ov = bf and ovd
    if bf_ov:
        head.append("bf16 / openvino")
    compared = any(impl != "naive-blas" for impl, _ in peers)
    if compared:
        head += ["best peer", "sdpa / best peer"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for k in order:
        shape, mask, op, thr = k
        cells = [",".join(str(x) for x in shape), mask, op, str(thr)]
        best_ms = None
        for i, isa in enumerate(isas):
            r = sdpa.get((k, isa))
            if r is None:
                cells.append("-")
                continue
            best_ms = r["ms"] if best_ms is None else min(best_ms, r["ms"])
            c = fmt(r["gflops"])
            if i == 0:
                if number(r.get("peak_gflops")) and r["peak_gflops"] > 0:
                    c += f" ({100 * r['gflops'] / r['peak_gflops']:.0f}%)"
                if number(r.get("gbps")) and number(r.get("peak_gbps")) and r["peak_gbps"] > 0:
                    c += f"; {r['gbps']:.1f} GB/s ({100 * r['gbps'] / r['peak_gbps']:.0f}% of read bw)"
            cells.append(c)
        best = None
        for impl, _ in peers:
            r = peer.get((k, impl))
            cells.append(fmt(r["gflops"]) if r else "-")
            if r and impl != "naive-blas" and (best is None or r["ms"] < best["ms"]):
                best = r
        if ovd:
            r = ov_default.get(k)
            cells.append(fmt(r["gflops"]) if r else "-")
        if bf:
            r = sdpa_bf16.get(k)
            cells.append(fmt(r["gflops"]) if r else "-")
        if bf_ov:
            r, o = sdpa_bf16.get(k), ov_default.get(k)
            cells.append(f"{o['ms'] / r['ms']:.2f}x" if r and o else "-")
        if not compared:
            pass
        elif best is not None and best_ms:
            lab = dict(PEERS)[best["impl"]]
            cells += [lab, f"{best['ms'] / best_ms:.2f}x"]
        else:
            cells += ["-", "-"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
