"""PNG charts of ``python -m bench gateway`` and ``python -m bench tunnel`` (``--plot DIR``):
the side-by-side comparison at a glance. matplotlib comes with the ``bench`` extra
(``pip install -e '.[bench]'``) and is imported only here, only when asked.

Charts (one PNG each, configurations in the table's order, hubproxy highlighted):

* ``small_get_rps.png``: small GET requests/s at each concurrency;
* ``small_get_latency.png``: p50 and p99 at concurrency 1 (what one caller waits);
* ``large_body.png``: large-body throughput (MB/s);
* ``cpu.png``: proxy CPU seconds per 10k requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ORDER = ("direct", "nginx", "nginx-auto", "kubectl-proxy", "aiohttp-proxy", "hubproxy",
         "hubproxy-2w", "relay")
HUB_COLOUR, OTHER_COLOUR = "#d62728", "#7f7f7f"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _value(cfg: dict[str, Any], *path: str) -> float | None:
    node: Any = cfg
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def _bars(plt: Any, path: Path, title: str, unit: str, names: list[str],
          series: dict[str, list[float | None]], note: str) -> Path:
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(names) * max(1, len(series))), 4.0))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(names))]
        heights = [v or 0.0 for v in values]
        colours = [HUB_COLOUR if n.startswith("hubproxy") else OTHER_COLOUR for n in names]
        bars = ax.bar(xs, heights, width * 0.9, label=label, color=colours,
                      alpha=1.0 - 0.35 * i)
        for bar, value in zip(bars, values, strict=True):
            if value is not None:
                text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
                ax.annotate(text, (bar.get_x() + bar.get_width() / 2,
                                              bar.get_height()),
                            ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel(unit)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.text(0.01, 0.01, note, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gateway_charts(result: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write the charts of one ``bench gateway`` result; returns the files written."""
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfgs: dict[str, Any] = result.get("configs", {})
    names = [n for n in ORDER if n in cfgs] + sorted(n for n in cfgs if n not in ORDER)
    note = f"python -m bench gateway ({result.get('mode', '?')} mode)"
    machine = result.get("machine") or {}
    if isinstance(machine, dict) and machine.get("nproc"):
        note += f", {machine['nproc']} CPUs"
    written = []
    concurrencies = [c for c in ("c1", "c16", "c64")
                     if any(c in cfgs[n].get("small_get", {}) for n in names)]
    if concurrencies:
        written.append(_bars(plt, out / "small_get_rps.png", "Small GET, requests/s (higher "
                             "is better)", "requests/s", names,
                             {c: [_value(cfgs[n], "small_get", c, "rps") for n in names]
                              for c in concurrencies}, note))
        written.append(_bars(plt, out / "small_get_latency.png", "Small GET latency at c=1 "
                             "(lower is better)", "ms", names,
                             {p: [_value(cfgs[n], "small_get", "c1", f"{p}_ms") for n in names]
                              for p in ("p50", "p99")}, note))
    written.append(_bars(plt, out / "large_body.png", "Large body throughput (higher is "
                         "better)", "MB/s", names,
                         {"MB/s": [_value(cfgs[n], "large_body", "mb_s") for n in names]},
                         note))
    written.append(_bars(plt, out / "cpu.png", "Proxy CPU per 10k small requests (lower is "
                         "better)", "CPU s", names,
                         {"CPU s": [_value(cfgs[n], "cpu", "total", "s_per_10k_requests")
                                    for n in names]}, note))
    return written


def tunnel_charts(result: dict[str, Any], directory: str | Path) -> list[Path]:
    """Write the charts of one ``bench tunnel`` result: the tunnel beside a plain TLS copy."""
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    names = ["hubproxy tunnel", "plain TLS"]
    note = f"python -m bench tunnel ({result.get('mode', '?')} mode)"

    def pair(tunnel_key: str, plain_key: str) -> list[float | None]:
        return [_value(result, tunnel_key), _value(result, plain_key)]

    def rtt(percentile: str) -> list[float | None]:
        total, added = _value(result, f"rtt_{percentile}_us"), \
            _value(result, f"rtt_{percentile}_added_us")
        return [total, None if total is None or added is None else total - added]

    return [
        _bars(plt, out / "tunnel_throughput.png", "Bulk copy, MB/s (higher is better)", "MB/s",
              names, {"one stream": pair("single_mb_s_tunnel", "single_mb_s_plain"),
                      "64 streams": pair("aggregate_mb_s", "aggregate_mb_s_plain")}, note),
        _bars(plt, out / "tunnel_rtt.png", "64-byte echo round trip (lower is better)", "µs",
              names, {"p50": rtt("p50"), "p99": rtt("p99")}, note),
    ]
