"""The curves engineers read a serving benchmark by, from `orch.bench` documents.

Every chart puts all series (a baseline and its candidates, or one benchmark alone) on one
axis against *achieved* concurrency (requests really in flight), with each point's interval
over its measurement windows as error bars: throughput, per-request speed, TTFT and TPOT
percentiles, and acceptance (tau against its ceiling k+1). Documents of orch.bench/v1 (no
windows, no percentiles) are drawn with what they have.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.kinds.sections import Figure, png_of, pyplot, safe_name

Series = tuple[str, dict[str, Any]]  # (label, the orch.bench document)
PERCENTILES = (("p50", "-"), ("p90", "--"), ("p99", ":"))


def read_document(path: str) -> tuple[dict[str, Any] | None, str]:
    """An orch.bench JSON document, or None and why it cannot be drawn."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror}): no figures"
    except ValueError:
        return None, f"{path} is not JSON: no figures"
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("orch.bench/"):
        return None, f"{path} is not an orch.bench document: no figures"
    return doc, ""


def _levels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    levels = [lv for lv in doc.get("levels", []) if isinstance(lv, dict)]
    return sorted(levels, key=lambda lv: float(lv.get("concurrency", 0)))


def _x(level: dict[str, Any]) -> float:
    return float(level.get("achieved_concurrency") or level.get("concurrency") or 0)


def _errors(values: Sequence[float], bounds: Sequence[Sequence[float] | None]) -> list[list[float]]:
    """matplotlib's asymmetric yerr from [lo, hi] intervals (0 where none was measured)."""
    low = [v - b[0] if b else 0.0 for v, b in zip(values, bounds, strict=True)]
    high = [b[1] - v if b else 0.0 for v, b in zip(values, bounds, strict=True)]
    return [[max(x, 0.0) for x in low], [max(x, 0.0) for x in high]]


def _interval(level: dict[str, Any], key: str) -> list[float] | None:
    got = (level.get("interval") or {}).get(key)
    return [float(got[0]), float(got[1])] if isinstance(got, list) and len(got) == 2 else None


def _label(text: str) -> str:
    """A series' name as matplotlib draws it, literally: a `$` would start mathtext, and a
    label from a result document that is not valid TeX would fail the whole report."""
    return text.replace("$", r"\$")


def _legend(
    ax: Any, fontsize: float, handles: Sequence[Any] = (), labels: Sequence[str] = ()
) -> None:
    """The legend right of the axes, outside them: inside, it covered points and error bars
    wherever it went (`loc="best"` only picks the least bad corner)."""
    ax.legend(
        *((list(handles), list(labels)) if handles else ()),
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0.0,
        fontsize=fontsize,
    )


def _axes(title: str, ylabel: str) -> tuple[Any, Any]:
    fig, ax = pyplot().subplots(figsize=(7.5, 4.2))
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("achieved concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    return fig, ax


def _throughput(name: str, series: Sequence[Series]) -> Figure:
    fig, ax = _axes("Output throughput", "output tokens/s (all requests)")
    for label, doc in series:
        levels = _levels(doc)
        ys = [float(lv["output_tok_s"]) for lv in levels]
        ax.errorbar(
            [_x(lv) for lv in levels],
            ys,
            capsize=3,
            marker="o",
            label=_label(label),
            yerr=_errors(ys, [_interval(lv, "output_tok_s") for lv in levels]),
        )
        for lv, y in zip(levels, ys, strict=True):
            ax.annotate(
                f"c={lv.get('concurrency')}",
                (_x(lv), y),
                fontsize=7,
                textcoords="offset points",
                xytext=(4, -10),
            )
    _legend(ax, 8)
    return Figure(
        f"{name}-throughput",
        "Output throughput against concurrency",
        png_of(fig),
        "median of the kept windows; bars: [min, max] over them; c=N: requested",
    )


def _speed(name: str, series: Sequence[Series]) -> Figure | None:
    fig, ax = _axes("Per-request speed", "output tokens/s per request (1000 / TPOT ms)")
    drawn = False
    for label, doc in series:
        levels = [lv for lv in _levels(doc) if lv.get("tpot_ms")]
        if not levels:
            continue
        ys = [1000.0 / float(lv["tpot_ms"]) for lv in levels]
        bounds = [
            (lambda b: [1000.0 / b[1], 1000.0 / b[0]] if b and b[0] > 0 else None)(
                _interval(lv, "tpot_ms")
            )
            for lv in levels
        ]
        ax.errorbar(
            [_x(lv) for lv in levels],
            ys,
            yerr=_errors(ys, bounds),
            capsize=3,
            marker="o",
            label=_label(label),
        )
        drawn = True
    if not drawn:
        pyplot().close(fig)
        return None
    _legend(ax, 8)
    return Figure(
        f"{name}-speed",
        "Per-request speed against concurrency",
        png_of(fig),
        "what one user sees; bars from the TPOT interval",
    )


def _latency(name: str, series: Sequence[Series]) -> Figure | None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    drawn = False
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric, title in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        ax.set_title(f"{title} percentiles", fontsize=11)
        ax.set_xlabel("achieved concurrency")
        ax.set_ylabel("ms")
        ax.grid(alpha=0.3)
        for i, (label, doc) in enumerate(series):
            levels = [lv for lv in _levels(doc) if isinstance(lv.get(metric), dict)]
            for pct, style in PERCENTILES:
                points = [
                    (_x(lv), lv[metric][pct])
                    for lv in levels
                    if isinstance(lv[metric].get(pct), int | float)
                ]
                if points:
                    ax.plot(
                        *zip(*points, strict=True),
                        linestyle=style,
                        marker=".",
                        color=colours[i % len(colours)],
                        label=_label(f"{label} {pct}"),
                    )
                    drawn = True
    if not drawn:
        plt.close(fig)
        return None
    # One legend for both charts (the same series), right of the right one: outside both.
    legend: dict[str, Any] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(text, handle)
    _legend(axes[1], 7, list(legend.values()), list(legend))
    fig.tight_layout()
    return Figure(
        f"{name}-latency",
        "TTFT and TPOT percentiles",
        png_of(fig),
        "solid p50, dashed p90, dotted p99, over every request of the kept windows",
    )


def _acceptance(name: str, series: Sequence[Series]) -> Figure | None:
    fig, ax = _axes("Acceptance", "tau: tokens per verify step (bonus included)")
    drawn = False
    for label, doc in series:
        levels = [
            lv
            for lv in _levels(doc)
            if isinstance(lv.get("spec"), dict)
            and isinstance(lv["spec"].get("accept_length"), int | float)
        ]
        if not levels:
            continue
        k = next(
            (lv["spec"].get("draft_tokens") for lv in levels if lv["spec"].get("draft_tokens")),
            None,
        )
        line = ax.plot(
            [_x(lv) for lv in levels],
            [lv["spec"]["accept_length"] for lv in levels],
            marker="o",
            label=_label(f"{label} (k={k})" if k else label),
        )[0]
        if k:
            ax.axhline(k + 1, color=line.get_color(), linestyle="--", linewidth=0.8)
        for lv in levels:
            if isinstance(rate := lv["spec"].get("acceptance"), int | float):
                ax.annotate(
                    f"{rate:.0%}",
                    (_x(lv), lv["spec"]["accept_length"]),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(4, 4),
                )
        drawn = True
    if not drawn:
        pyplot().close(fig)
        return None
    ax.set_ylim(bottom=1.0)
    _legend(ax, 8)
    return Figure(
        f"{name}-acceptance",
        "Acceptance against concurrency",
        png_of(fig),
        "dashed: the ceiling k+1; labels: acceptance (tau-1)/k",
    )


def bench_figures(name: str, series: Sequence[Series]) -> list[Figure]:
    """Every chart the series support, named `<name>-<chart>`."""
    series = [(label, doc) for label, doc in series if _levels(doc)]
    if not series:
        return []
    name = safe_name(name)
    made = [
        _throughput(name, series),
        _speed(name, series),
        _latency(name, series),
        _acceptance(name, series),
    ]
    return [f for f in made if f is not None]
