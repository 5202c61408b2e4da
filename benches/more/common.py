"""What the runners of W5 and W6 share: the shared bench's harness (data, reference,
checks), contestants' commands, timing with /usr/bin/time, and the result table."""

import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHARED = os.path.join(ROOT, "..", "shared", "bench")


def shared_harness(bench):
    """The shared bench's run_peers module: data, reference and checks."""
    spec = importlib.util.spec_from_file_location(
        "run_peers", os.path.join(bench, "run_peers.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def command(engine, peers, workload):
    base = os.path.join(peers, engine, workload)
    if os.path.isfile(base + ".py"):
        return [sys.executable, base + ".py"]
    if os.path.isfile(base + ".sh"):
        return ["bash", base + ".sh"]
    raise SystemExit(f"no contestant {engine} in {peers}")


def timed(cmd, env):
    """(wall seconds, peak RSS MiB) of one run, or raises with its output."""
    with tempfile.NamedTemporaryFile("r") as t:
        full = ["/usr/bin/time", "-f", "%e %M", "-o", t.name, *cmd]
        done = subprocess.run(
            full, env=env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}"
            )
        wall, rss = t.read().split()[-2:]
        return float(wall), int(rss) / 1024


def version(engine, peers, env):
    base = os.path.join(peers, engine, "version.sh")
    if not os.path.isfile(base):
        return engine
    out = subprocess.run(
        ["bash", base], env=env, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() or engine


def table(rows, baseline, title, json_path=None):
    """Prints the markdown table of `rows` (engine, version, times, RSS, check), with
    each median over `baseline`'s; with `json_path`, also writes the rows there (for
    benches/all.sh's one report)."""
    if json_path:
        with open(json_path, "w") as f:
            records = [
                {"engine": e, "version": v, "wall_s": t, "rss_mib": m, "check": c}
                for e, v, t, m, c in rows
            ]
            json.dump({"title": title, "records": records}, f, indent=1)
    base = next(
        (statistics.median(t) for e, _, t, _, _ in rows if e == baseline and t), None
    )
    print(f"\n{title}\n")
    print(
        f"| engine | version | median s | range s | peak RSS MiB | vs {baseline} | check |"
    )
    print("|---|---|---:|---:|---:|---:|---|")
    for engine, ver, t, m, status in rows:
        if not t:
            print(f"| {engine} | {ver} | - | - | - | - | {status} |")
            continue
        med = statistics.median(t)
        ratio = f"{med / base:.2f}x" if base else "-"
        print(
            f"| {engine} | {ver} | **{med:.2f}** | {min(t):.2f}-{max(t):.2f} | {max(m):.0f} "
            f"| {ratio} | {status} |"
        )


def runs(cmd, env, repeat):
    """Runs `cmd` once untimed (the first write), then `repeat` timed times: (wall
    seconds, peak RSS MiB) of the timed runs, and "ok" or the first failure."""
    times, rss = [], []
    try:
        timed(cmd, env)
        for _ in range(repeat):
            t, m = timed(cmd, env)
            times.append(t)
            rss.append(m)
    except RuntimeError as e:
        return times, rss, str(e).splitlines()[0][:120]
    return times, rss, "ok"
