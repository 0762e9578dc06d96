# SPDX-License-Identifier: MIT
"""Per-call overhead of the Python layer: libsdpa.attention (NumPy) and
libsdpa.torch.scaled_dot_product_attention (if torch is installed, no gradient wanted)
on a tiny problem and on a decode-sized one, one thread. A benchmark to run by hand,
not a test:

    python3 python/bench_overhead.py                  # the installed libsdpa
    python3 python/bench_overhead.py --against DIR    # and another copy, interleaved

Columns (microseconds per call): call = the Python call; C alone = the library call
repeated with the first call's descriptor and views (into the same O); outside C = the
Python call's time minus the time spent inside the library call during those same calls
(a wrapper around the library function times it; the wrapper's own ~0.2 us counts as
outside; for attention()'s C fast path, libsdpa._fastpath times its own library call when
asked, by the same clock). outside C is the Python layer's cost as a sequence of calls meets it: after a
large library call, which streams its operands through the caches, the layer's code and
data are cold, and it takes several times its warm time (compare the two rows).
--against DIR: a directory holding another libsdpa package (e.g. an older commit's
`python3 -m pip install --target DIR .`); it is imported under another name and its NumPy
path timed in the same rounds: its call and outside C, and the ratio of the two outside C
figures, which holds on a busy machine too. Each figure is the median over rounds of the
mean of a batch of calls; the functions take turns within each round. --cpu-time: this
thread's CPU time instead of the wall clock (for a machine other jobs share).
"""
import argparse
import importlib.util
import os
import platform
import sys
import time

import numpy as np

# the installed package, not the source tree next to this script (it has no _config.py
# nor library)
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
import libsdpa  # noqa: E402
from libsdpa import _api, _binding  # noqa: E402


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_copy(path):
    """The libsdpa package under `path` imported as libsdpa_against."""
    pkg = os.path.join(os.path.abspath(path), "libsdpa")
    spec = importlib.util.spec_from_file_location(
        "libsdpa_against", os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["libsdpa_against"] = mod
    spec.loader.exec_module(mod)
    return mod


class Inside:
    """Times the library's sdpa_forward as a package calls it: wraps every name under
    which the package's NumPy and torch paths call it (the ctypes declarations in
    _binding, and _api's alias where there is one); .ns accumulates."""

    def __init__(self, binding, api, clock, clock_id):
        self.ns = 0
        # attention()'s C fast path (libsdpa._fastpath) calls the library without ctypes:
        # it times that call itself when asked
        self.fast = sys.modules.get(api.__name__.rsplit(".", 1)[0] + "._fastpath")
        if self.fast is not None and getattr(api, "_fast_c", None) is not None:
            self.fast.timing(clock_id)
        else:
            self.fast = None
        for mod, name in ((binding, "forward"), (binding, "forward_packed"), (api, "_forward")):
            real = getattr(mod, name, None)
            if real is not None:
                setattr(mod, name, self.wrap(real, clock))

    def wrap(self, real, clock):
        def timed(*args):
            t0 = clock()
            r = real(*args)
            self.ns += clock() - t0
            return r
        timed.real = real
        return timed


def c_call_alone(run):
    """A function that repeats the library call that run() makes (its descriptor and views
    captured once; the outputs of that first call stay alive for the pointers). The C fast
    path is set aside for the capture: it hands the library the same bytes as the Python
    one (python/tests/test_numpy.py checks that)."""
    captured = []
    saved = _binding.forward_packed, _api._forward, getattr(_api, "_fast_c", None)
    _api._fast_c = None

    def spy(*args):
        captured.append(args)
        return real(*args)

    real = getattr(saved[0], "real", saved[0])
    _binding.forward_packed = _api._forward = spy
    try:
        keep = run()
    finally:
        _binding.forward_packed, _api._forward, _api._fast_c = saved
    args = captured[-1]

    def again(_keep=keep):
        return real(*args)

    return again


def medians(funcs, rounds, calls, clock):
    """{name: (median of the per-call time, median of the per-call time outside the
    library call)} in microseconds; funcs: name -> (function, Inside or None)."""
    res = {name: ([], []) for name in funcs}
    for _ in range(rounds):
        for name, (f, inside) in funcs.items():
            if inside:
                inside.ns = 0
                if inside.fast:
                    inside.fast.inside_ns()
            t0 = clock()
            for _ in range(calls):
                f()
            t = clock() - t0
            if inside and inside.fast:
                inside.ns += inside.fast.inside_ns()
            res[name][0].append(t / calls / 1000)
            res[name][1].append((t - (inside.ns if inside else 0)) / calls / 1000)
    mid = rounds // 2
    return {name: (sorted(a)[mid], sorted(b)[mid]) for name, (a, b) in res.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", metavar="DIR", help="another libsdpa package to compare with")
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--cpu-time", action="store_true", help="time by this thread's CPU time")
    ap.add_argument("--no-torch", action="store_true", help="skip libsdpa.torch")
    a = ap.parse_args()
    clock = time.thread_time_ns if a.cpu_time else time.perf_counter_ns
    other = load_copy(a.against) if a.against else None
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    print(f"libsdpa {libsdpa.__version__} ({os.path.dirname(libsdpa.__file__)}); "
          f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs"
          + (f"; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}" if load else ""))
    print(f"Python {platform.python_version()}, NumPy {np.__version__}; threads=1; median of "
          f"{a.rounds} rounds; {'CPU' if a.cpu_time else 'wall'} microseconds per call")
    clock_id = time.CLOCK_THREAD_CPUTIME_ID if a.cpu_time else time.CLOCK_MONOTONIC
    inside = Inside(_binding, _api, clock, clock_id)
    inside_other = Inside(sys.modules["libsdpa_against._binding"],
                          sys.modules["libsdpa_against._api"], clock, clock_id) if other else None
    rng = np.random.default_rng(0)
    shapes = {"tiny 1,1,1,1,1,8": (1, 1, 1, 1, 1, 8, 2000),
              "decode 1,32,8,1,512,128": (1, 32, 8, 1, 512, 128, 100)}
    head = f"{'':6s} {'B,Hq,Hkv,Tq,Tk,D':24s} {'call':>8s} {'C alone':>8s} {'outside C':>10s}"
    if other:
        head += f" {'--against':>10s} {'its outside C':>14s} {'ratio':>6s}"
    print(head)
    for label, (B, Hq, Hkv, Tq, Tk, D, calls) in shapes.items():
        q = rng.standard_normal((B, Hq, Tq, D), dtype=np.float32)
        k = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
        v = rng.standard_normal((B, Hkv, Tk, D), dtype=np.float32)
        funcs = {"call": (lambda: libsdpa.attention(q, k, v, threads=1), inside),
                 "c": (c_call_alone(lambda: libsdpa.attention(q, k, v, threads=1)), None)}
        if other:
            funcs["other"] = (lambda: other.attention(q, k, v, threads=1), inside_other)
            assert np.array_equal(funcs["call"][0](), funcs["other"][0]())
        m = medians(funcs, a.rounds, calls, clock)
        line = f"{'numpy':6s} {label:24s} {m['call'][0]:8.2f} {m['c'][0]:8.2f} {m['call'][1]:10.2f}"
        if other:
            line += (f" {m['other'][0]:10.2f} {m['other'][1]:14.2f} "
                     f"{m['other'][1] / m['call'][1]:6.2f}")
        print(line, flush=True)
    if a.no_torch:
        return
    try:
        import torch
        import libsdpa.torch as lt
    except ImportError:
        print("torch: not installed")
        return
    torch.set_num_threads(1)   # libsdpa.torch passes torch.get_num_threads() as threads
    sdpa = torch.nn.functional.scaled_dot_product_attention
    print(f"torch {torch.__version__}: libsdpa.torch.scaled_dot_product_attention; "
          "torch's own SDPA for reference")
    for label, (B, Hq, Hkv, Tq, Tk, D, calls) in shapes.items():
        q = torch.randn(B, Hq, Tq, D)
        k = torch.randn(B, Hkv, Tk, D)
        v = torch.randn(B, Hkv, Tk, D)

        def call():
            return lt.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        funcs = {"call": (call, inside), "c": (c_call_alone(call), None),
                 "torch": (lambda: sdpa(q, k, v, enable_gqa=True), None)}
        m = medians(funcs, a.rounds, max(calls // 4, 25), clock)
        print(f"{'torch':6s} {label:24s} {m['call'][0]:8.2f} {m['c'][0]:8.2f} "
              f"{m['call'][1]:10.2f}   (torch's own SDPA: {m['torch'][0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
