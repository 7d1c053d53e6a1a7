"""Helpers of bench/scaling.sh.

    python3 bench/scaling.py fill URL JOBS NONCE TOKENS_FILE
        POSTs JOBS new jobs to URL, the tenants of TOKENS_FILE (one bearer token a line)
        taken in turn; every answer must be a 202. Standard library only.
    python3 bench/scaling.py tenants COUNT SHARDS
        Prints tenant names, COUNT rounded up to a multiple of SHARDS, as many in every shard
        (summaryd maps a tenant to shard u64(first 8 bytes of SHA-256(name)) mod SHARDS).
    python3 bench/scaling.py table CSV
        Prints the CSV's figures as a Markdown table (bench/README.md has one).
    python3 bench/scaling.py plot CSV OUT_DIR
        Draws OUT_DIR/scaling-intake.png and OUT_DIR/scaling-drain.png from the CSV
        bench/scaling.sh writes. Needs matplotlib (scaling.sh installs it into a venv).
"""

import csv
import hashlib
import http.client
import sys
import threading
import urllib.parse

BODY = (
    '{"text": "Quarterly review: revenue grew 12 percent, churn fell to 3 percent. '
    "The team shipped the new billing flow and plans a pricing change next quarter. "
    'Risks: two enterprise renewals are late and support load is rising.", '
    '"notify": "bench@example.com"}'
).encode()

# Enough to keep one api process busy, few enough that the fill stays a small part of a run.
FILL_THREADS = 4


def fill(url, jobs, nonce, tokens_file):
    with open(tokens_file, encoding="ascii") as f:
        tokens = [line.strip() for line in f if line.strip()]
    if not tokens:
        sys.exit("scaling.py fill: no tokens in " + tokens_file)
    parsed = urllib.parse.urlsplit(url)
    failures = []

    def post_range(first):
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
        for i in range(first, jobs, FILL_THREADS):
            headers = {
                "Content-Type": "application/json",
                "Authorization": "Bearer " + tokens[i % len(tokens)],
                "Idempotency-Key": f"fill-{nonce}-{i:08d}",
            }
            conn.request("POST", "/v1/summaries", body=BODY, headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 202:
                failures.append(f"job {i}: HTTP {resp.status}")
                return
        conn.close()

    threads = [threading.Thread(target=post_range, args=(t,)) for t in range(FILL_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit("scaling.py fill: " + "; ".join(failures))


def plot(csv_path, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    styles = {
        "single": ("tab:blue", "o", "one Redis"),
        "sharded": ("tab:green", "^", "one Redis, 3 shards"),
        "cluster": ("tab:orange", "s", "3-master cluster"),
    }
    machine = rows[0]["machine"] if rows else ""

    for phase, unit, title, ceiling_label in (
        ("intake", "accepted POSTs/s", "Intake: api processes", "Redis ceiling (redis-benchmark, enqueue script)"),
        ("drain", "jobs/s", "Drain: worker processes", "Postgres commit ceiling (pgbench, worker txn)"),
    ):
        fig, (ax_abs, ax_ratio) = plt.subplots(1, 2, figsize=(13, 6))
        drawn_pg = False
        for target, (color, marker, label) in styles.items():
            pts = sorted(
                (r for r in rows if r["phase"] == phase and r["target"] == target),
                key=lambda r: int(r["processes"]),
            )
            if not pts:
                continue
            x = [int(r["processes"]) for r in pts]
            y = [float(r["throughput_per_s"]) for r in pts]
            err = [[yi - float(r["throughput_min"]) for yi, r in zip(y, pts)],
                   [float(r["throughput_max"]) - yi for yi, r in zip(y, pts)]]
            ax_abs.errorbar(x, y, yerr=err, marker=marker, color=color, lw=2, capsize=3,
                            label=f"{label} (median of {pts[0]['rounds']} rounds, bars: min–max)")
            ceilings = [float(r["ceiling_per_s"]) for r in pts]
            if phase == "intake":
                ax_abs.plot(x, ceilings, ls="--", color=color, lw=1, label=f"{label}: {ceiling_label}")
            elif not drawn_pg:
                # One Postgres for both targets: its ceiling is drawn once.
                ax_abs.plot(x, ceilings, ls="--", color="grey", lw=1, label=ceiling_label)
                drawn_pg = True
            ax_ratio.plot(x, [float(r["ratio_to_first"]) for r in pts], marker=marker, color=color,
                          lw=2, label=label)
            if phase == "intake":
                for xi, yi, r in zip(x, y, pts):
                    ax_abs.annotate(f"p99 {float(r['p99_ms']):.1f} ms", (xi, yi),
                                    textcoords="offset points", xytext=(7, 4), ha="left",
                                    fontsize=7, color=color)
        all_x = sorted({int(r["processes"]) for r in rows if r["phase"] == phase})
        if all_x:
            ax_ratio.plot(all_x, [x / all_x[0] for x in all_x], ls=":", color="grey",
                          label="linear (processes ÷ first point)")
        for ax in (ax_abs, ax_ratio):
            ax.set_xlabel("processes")
            ax.set_xticks(all_x or [1])
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                # Below the axes: the curves of three targets leave no empty corner.
                ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
        ax_abs.set_ylabel(unit)
        ax_abs.set_ylim(bottom=0)
        ax_ratio.set_ylabel("throughput ÷ 1-process point")
        ax_ratio.set_ylim(bottom=0)
        loads = [float(r["loadavg_1m"]) for r in rows if r["phase"] == phase]
        load = f"; mean 1-min load average {sum(loads) / len(loads):.1f}" if loads else ""
        fig.suptitle(f"{title}, ceilings from the same run ({machine}{load})", fontsize=10)
        fig.tight_layout()
        fig.savefig(f"{out_dir}/scaling-{phase}.png", dpi=100)
        plt.close(fig)


def tenants(count, shards):
    per_shard = -(-count // shards)
    taken = {s: [] for s in range(shards)}
    n = 0
    while any(len(names) < per_shard for names in taken.values()):
        n += 1
        name = f"t{n:03d}"
        shard = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % shards
        if len(taken[shard]) < per_shard:
            taken[shard].append(name)
    for names in taken.values():
        for name in names:
            print(name)


def table(csv_path):
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    # CPU per operation moves much less with the machine's other load than the rates do:
    # cores in use ÷ operations per second.
    print("| target | phase | processes | throughput /s (rounds: min–max) | ÷ first | p50 ms | p99 ms"
          " | ceiling /s | ÷ ceiling | cores: Redis / summaryd / machine | Redis / summaryd µs CPU per op"
          " | load avg | errors |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|")
    for r in rows:
        rate = float(r["throughput_per_s"])
        per_op = "-"
        if rate > 0:
            per_op = (f"{float(r['redis_cores']) * 1e6 / rate:.0f} / "
                      f"{float(r['summaryd_cores']) * 1e6 / rate:.0f}")
        print(f"| {r['target']} | {r['phase']} | {r['processes']} | {rate:,.0f}"
              f" ({float(r['throughput_min']):,.0f}–{float(r['throughput_max']):,.0f})"
              f" | {r['ratio_to_first']} | {r['p50_ms'] or '-'} | {r['p99_ms'] or '-'}"
              f" | {float(r['ceiling_per_s']):,.0f} | {r['ratio_to_ceiling']}"
              f" | {r['redis_cores']} / {r['summaryd_cores']} / {r['machine_busy_cores']} | {per_op}"
              f" | {r['loadavg_1m']} | {r['errors']} |")


def main(argv):
    if len(argv) == 6 and argv[1] == "fill":
        fill(argv[2], int(argv[3]), argv[4], argv[5])
    elif len(argv) == 4 and argv[1] == "tenants":
        tenants(int(argv[2]), int(argv[3]))
    elif len(argv) == 3 and argv[1] == "table":
        table(argv[2])
    elif len(argv) == 4 and argv[1] == "plot":
        plot(argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
