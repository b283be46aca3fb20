"""Latency against size per configuration, as a PNG (matplotlib, the optional `plot` extra)."""
from __future__ import annotations

from typing import Any

from ncclprobe.commands.envfile import AssignmentError

INSTALL_HINT = "pip install 'ncclprobe[plot]' (or pip install matplotlib)"


def require() -> None:
    """Fail before any measurement when --plot cannot be honoured."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise AssignmentError(f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}") from None


def figure(configs: list[dict[str, Any]], basis: str, title: str, caveat: str = ""):
    """The figure: out-of-place time against size, one line per configuration. `caveat` is written
    on the image itself, where it travels with the file: lines that cannot differ (gloo, one GPU)
    otherwise show noise as a win."""
    import matplotlib
    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for c in configs:
        pts = sorted((r["bytes"], r["time_us"]) for r in c["results"] if r["mode"] == basis and not r["inplace"])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                    label=f"{c['name']}" + ("" if c["status"] == "ok" else f" ({c['status']})"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel(f"time per all_reduce, {basis}, out-of-place (µs)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if caveat:
        fig.text(0.5, 0.01, caveat, ha="center", va="bottom", fontsize=9, color="darkred", wrap=True)
        fig.tight_layout(rect=(0, 0.06, 1, 1))  # room below the axes for the caveat
    else:
        fig.tight_layout()
    return fig


def write(path: str, configs: list[dict[str, Any]], basis: str, title: str, caveat: str = "") -> None:
    fig = figure(configs, basis, title, caveat)  # selects the Agg backend before pyplot is needed here
    import matplotlib.pyplot as plt
    fig.savefig(path, format="png")
    plt.close(fig)
