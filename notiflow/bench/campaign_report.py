"""The report of ``notiflow bench campaign``: its Markdown table and its figure (rows read and
provider-accepted over time, P0 latency, the expander's RSS)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def campaign_markdown(doc: dict[str, Any]) -> str:
    e, d, p0, rows = doc["expansion"], doc["drain"], doc["p0"], doc["rows"]
    rss = e.get("expander_rss_mb") or [None, None, None]
    sent = max(1, rows.get("provider_accepted") or 0)
    cost = {name: round(f["cpu_s"] * 1000 / sent, 2)
            for name, f in (doc.get("processes") or {}).items() if "cpu_s" in f}
    per_msg = ", ".join(f"{k} {v}" for k, v in sorted(cost.items(), key=lambda kv: -kv[1])
                        if v >= 0.01)
    platform = sum(v for k, v in cost.items() if k not in ("fakes", "bench"))
    within = p0.get("within_1s")
    channel = doc.get("channel", "SMS")
    send = doc.get("send_p3") or {}
    batching = [] if not send else [
        "| P3 provider_batch | provider requests | messages per request | P3 send flow CPU "
        "ms/msg |", "|---|---|---|---|",
        f"| {send.get('provider_batch')} | {_n(send.get('requests'))} | "
        f"{_n(send.get('messages_per_request'))} | {send.get('cpu_ms_per_msg')} |", ""]
    return "\n".join([
        "# Campaign benchmark", "",
        f"{doc['n']:,} {channel} rows"
        f"{' (through SendGrid alone)' if channel == 'EMAIL' else ''} from a CSV manifest in "
        f"the stack's S3 store (SeaweedFS), "
        f"created through the bulk API (max_rate {doc['max_rate']:,.0f}/s), one expander; P0 "
        f"OTPs through the priority API at {doc['otp_rate']:g}/s throughout. Drained: "
        f"{doc['drained']}; wall {doc['wall_s']} s.", "",
        "| rows read | expanded | rejected | provider-accepted | expansion rows/s | "
        "expander CPU ms/row | expander RSS MiB (start, end, max) | P3 drain msg/s |",
        "|---|---|---|---|---|---|---|---|",
        f"| {rows['read']:,} | {rows['expanded']:,} | {rows['rejected']:,} | "
        f"{rows['provider_accepted']:,} | {e['rows_per_s']} | {e['expander_cpu_ms_per_row']} | "
        f"{rss[0]}, {rss[1]}, {rss[2]} | {d['per_s']}"
        f"{'' if d.get('drained', True) else ' (not drained)'} |", "",
        "| P0 OTPs | refused | missing | p50 ms | p99 ms | max ms | within 1 s |",
        "|---|---|---|---|---|---|---|",
        f"| {p0['sent']:,} | {p0['refused']} | {p0['missing']} | {p0['p50']} | {p0['p99']} | "
        f"{p0['max']} | {'-' if within is None else f'{within:.2%}'} |", "",
        *batching,
        f"CPU ms per provider-accepted campaign message, by process (the whole run, the "
        f"expansion of every row and the P0 OTPs included): {per_msg}; the platform without "
        f"the emulators and the bench: {platform:.2f} ms.", ""])


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def campaign_plot(doc: dict[str, Any], path: Path) -> Path:
    """Rows read and provider-accepted over time; P0 latency; the expander's RSS."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = doc.get("timeline") or {}
    prog = tl.get("progress") or []
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 3.8))
    a.plot([p["t"] for p in prog], [p["read"] for p in prog], label="rows read")
    a.plot([p["t"] for p in prog], [p["provider_accepted"] for p in prog],
           label="provider-accepted")
    a.set_xlabel("s since the campaign was created")
    a.set_ylabel("rows")
    a.legend()
    a.set_title(f"{doc['n']:,}-row campaign")
    p0 = tl.get("p0") or tl.get("p0_worst_per_s") or []
    b.scatter([t for t, _ in p0], [x for _, x in p0], s=3, color="tab:red")
    b.axhline(1000, color="grey", linestyle="--", linewidth=1)
    b.set_xlabel("s since the campaign was created")
    b.set_ylabel("P0 OTP latency (ms)" if "p0" in tl else "worst P0 OTP latency per s (ms)")
    b.set_title(f"P0 at {doc['otp_rate']:g}/s: p99 {doc['p0']['p99']} ms")
    tenths = ((doc.get("processes") or {}).get("expander") or {}).get("rss_tenths_mb") or []
    c.plot([i * 10 for i in range(len(tenths))], tenths, marker="o", color="tab:green")
    c.set_ylim(bottom=0)
    c.set_xlabel("share of the run (%)")
    c.set_ylabel("expander RSS (MiB)")
    c.set_title("expander memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
