#!/usr/bin/env python3
"""Stability scenarios: each fault trained three ways on the same seed and data.

  clean        no fault, guard on (the reference every gap is measured against)
  unprotected  the fault, stability.enabled: false
  protected    the fault, the guard on (rollback, quarantine, recovery)

A clean run with the guard off is also timed against the clean run with it on, for the guard's
overhead. Writes a Markdown report (docs/stability.md by default) and prints it.

  python3 bench/stability/run.py --keel build/keel

Everything runs on the embedded tiny config (CPU, ~35 s per run); the scenario settings below are
calibrated so that the unprotected run is really damaged.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

MAX_STEPS = 400
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# The base: the embedded tiny config with snapshots every 25 steps, every one a stable candidate,
# a recovery overlay short enough to end inside the run, and a long eval for a precise val loss.
BASE = [
    "logging.progress=off", "logging.every_steps=5", "eval.every_steps=100", "eval.batches=32",
    f"run.max_steps={MAX_STEPS}", "run.threads=2",
    "checkpoint.every_steps=25", "checkpoint.keep_last=2",
    "checkpoint.stable.every_steps=25", "checkpoint.stable.window=25", "checkpoint.stable.keep=2",
    "stability.median_window=50", "stability.recovery.steps=40",
    "stability.rollback.skip_ahead_steps=40",
]

SCENARIOS = {
    # 30 steps of random tokens late in the run: the model unlearns the chain, and the decayed lr
    # leaves too few steps to relearn it.
    "corrupt_batch": ["faults=[{kind: corrupt_batch, mode: random_tokens, at_step: 340, steps: 40}]"],
    # The lr multiplied 100x for 3 step attempts at mid-run, as a wrong schedule edit would.
    "lr_spike": ["faults=[{kind: lr_spike, factor: 100, at_step: 200, steps: 3}]"],
    # One NaN gradient.
    "nan_grad": ["faults=[{kind: nan_grad, at_step: 250}]"],
    # A spike at peak lr (the end of warmup), a NaN, then a corrupt window late in the run.
    "combined": ["faults=[{kind: lr_spike, factor: 100, at_step: 41, steps: 2},"
                 " {kind: nan_grad, at_step: 150},"
                 " {kind: corrupt_batch, mode: repeat_token, at_step: 340, steps: 40}]"],
}

# Events that tell the incident's story (checkpoints, snapshots and advisory warnings left out).
STORY = {"warn", "pause", "rollback", "recovery_start", "recovery_end", "skip_nan", "abort"}


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(keel, run_dir, sets, base=BASE, config=None):
    cmd = [keel, "train"] + ([config] if config else []) + ["--run-dir", run_dir]
    for s in base + sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    metrics = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    evals = read_jsonl(os.path.join(run_dir, "eval.jsonl"))
    story = [e for e in events if e["kind"] in STORY and not
             (e["kind"] == "warn" and "signal" in e.get("detail", {}))]
    end = next((e for e in events if e["kind"] == "run_end"), None)
    final_val = evals[-1]["val_loss"] if evals and (base is not BASE or evals[-1]["step"] == MAX_STEPS) else None
    # Step attempts in all: the run_end event's iteration counter (rollbacks and skips included).
    iterations = end["iteration"] if end else None
    rollbacks = [e for e in events if e["kind"] == "rollback"]
    # Steps redone: the model went back from from_step to to_step and trained them again.
    redone = sum(e["detail"]["from_step"] - e["detail"]["to_step"] for e in rollbacks)
    detection = next((e["step"] for e in story if e["kind"] in ("warn", "pause", "skip_nan")), None)
    first = first_alarms(events)
    tps = [m["tokens_per_s"] for m in metrics[2:] if m.get("tokens_per_s")]
    return {
        "exit": proc.returncode,
        "final_val": final_val,
        "last_loss": metrics[-1]["loss"] if metrics else None,
        "story": [e["kind"] for e in story],
        "detection": detection,
        "first": first,
        "warns_after_warmup": sum(1 for e in events if e["kind"] == "warn" and
                                  e["step"] > warmup_of(run_dir)),
        "warns": sum(1 for e in events if e["kind"] == "warn"),
        "pauses": sum(1 for e in events if e["kind"] == "pause"),
        "rollbacks": len(rollbacks),
        "redone": redone,
        "iterations": iterations,
        "seconds": end["detail"]["seconds"] if end else None,
        "tokens_per_s": statistics.median(tps) if tps else None,
        "tail": proc.stdout[-2000:],
    }


def first_alarms(events):
    """The first step each signal alarmed at (warn or pause), by signal name."""
    first = {}
    for e in events:
        d = e.get("detail", {})
        if e["kind"] == "warn":
            name = d.get("signal") or d.get("alarm", "grad_norm")
        elif e["kind"] == "pause":
            name = "pause:" + d.get("reason", "?")
        elif e["kind"] == "skip_nan":
            name = "non_finite"
        else:
            continue
        first.setdefault(name, e["step"])
    return first


def lead_times(first):
    """Each signal's lead over the loss alarm (steps; positive = earlier), as text."""
    loss_steps = [v for k, v in first.items() if k in ("loss", "pause:loss")]
    parts = []
    for name, step in sorted(first.items(), key=lambda kv: kv[1]):
        lead = f", lead {min(loss_steps) - step:+d}" if loss_steps else ""
        parts.append(f"{name} @{step}{lead}")
    return "; ".join(parts) or "—"


def warmup_of(run_dir):
    """The run's warmup, from the config it resolved (config.resolved.yaml)."""
    path = os.path.join(run_dir, "config.resolved.yaml")
    if os.path.exists(path):
        m = re.search(r"^\s*warmup_steps:\s*(\d+)", open(path).read(), re.M)
        if m:
            return int(m.group(1))
    return 0


# Clean runs under each config's own defaults, for the false-alarm table: only the seed, the data
# path and (for fortunes) a shorter run are set, so what is measured is what a user gets.
FALSE_ALARM_CONFIGS = {
    "tiny (synthetic)": {"config": None, "sets": []},
    "tiny on text shards": {"config": None,
                            "sets": ["data.source=shards", "data.path={data}",
                                     "model.vocab_size=264"]},
    "fortunes": {"config": "configs/fortunes.yaml",
                 "sets": ["data.path={data}", "run.max_steps={fortunes_steps}"]},
}
FALSE_ALARM_BEGIN, FALSE_ALARM_END = "<!-- false-alarms:begin -->", "<!-- false-alarms:end -->"


def prepare_fortunes(keel, out):
    """keel prepare over Debian's fortunes corpus (as configs/fortunes.yaml describes)."""
    if os.path.exists(os.path.join(out, "meta.json")):
        return
    cmd = [keel, "prepare", "--input", "/usr/share/games/fortunes", "--output", out,
           "--separator", "%", "--cluster", "source", "--seq-len", "256", "--val-fraction", "0.05"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def false_alarm_runs(keel, work, data, seeds, fortunes_seeds, fortunes_steps, configs):
    rows = {}
    for name in configs:
        spec = FALSE_ALARM_CONFIGS[name]
        n = fortunes_seeds if name == "fortunes" else seeds
        runs = []
        for seed in range(1, n + 1):
            sets = [x.format(data=data, fortunes_steps=fortunes_steps) for x in spec["sets"]]
            sets += [f"run.seed={seed}", "logging.progress=off"]
            config = os.path.join(ROOT, spec["config"]) if spec["config"] else None
            run_dir = os.path.join(work, "clean", name.replace(" ", "_"), str(seed))
            print(f"-- clean {name} seed {seed}", file=sys.stderr, flush=True)
            r = run(keel, run_dir, sets, base=[], config=config)
            print(f"   exit {r['exit']} warns {r['warns']} ({r['warns_after_warmup']} after warmup)"
                  f" pauses {r['pauses']}", file=sys.stderr, flush=True)
            r["seed"] = seed
            runs.append(r)
        rows[name] = runs
    return rows


def false_alarm_section(rows, fortunes_steps):
    lines = [FALSE_ALARM_BEGIN, "", "## False alarms on clean data", "",
             f"Measured {datetime.date.today().isoformat()}: clean runs under each config's defaults "
             "(only the seed and the data path set; fortunes shortened to "
             f"{fortunes_steps} steps, its cosine compressed with it). Reproduce with",
             "", "```", "python3 bench/stability/run.py --keel build/keel --only-false-alarms", "```",
             "", "| config | seeds | exit codes | warns (all) | warns after warmup | pauses | final val |",
             "|---|---|---|---|---|---|---|"]
    for name, runs in rows.items():
        vals = [fmt_val(r["final_val"]) for r in runs]
        lines.append(f"| {name} | {len(runs)} | {', '.join(str(r['exit']) for r in runs)} | "
                     f"{sum(r['warns'] for r in runs)} | {sum(r['warns_after_warmup'] for r in runs)} | "
                     f"{sum(r['pauses'] for r in runs)} | {', '.join(vals)} |")
    lines += ["", "A warning counts after warmup when its step is past `schedule.warmup_steps`. "
              "Clip rate and activation drift are silent during warmup by design (they move while "
              "the lr ramps up); the gradient-norm and loss alarms are on from the first full "
              "baseline.", "", FALSE_ALARM_END, ""]
    return "\n".join(lines)


def fmt_val(v):
    return "—" if v is None else ("NaN" if v != v else f"{v:.4f}")


def gap(v, ref):
    if v is None or ref is None or v != v:
        return "diverged" if v is None or v != v else "—"
    return f"{(v - ref) / ref * 100:+.2f} %"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("--out", default="docs/stability.md")
    ap.add_argument("--scenarios", nargs="*", default=list(SCENARIOS))
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--json", help="also write the raw figures of every run to this file")
    ap.add_argument("--only-false-alarms", action="store_true",
                    help="run only the clean false-alarm runs; replace that section of --out")
    ap.add_argument("--no-false-alarms", action="store_true", help="skip the clean false-alarm runs")
    ap.add_argument("--seeds", type=int, default=5, help="clean runs per config (false alarms)")
    ap.add_argument("--fortunes-seeds", type=int, help="clean fortunes runs (default: --seeds)")
    ap.add_argument("--fortunes-steps", type=int, default=300)
    ap.add_argument("--false-alarm-configs", nargs="*", default=list(FALSE_ALARM_CONFIGS))
    ap.add_argument("--data", help="prepared fortunes shards (prepared into the work dir if absent)")
    args = ap.parse_args()
    keel = os.path.abspath(args.keel)
    work = tempfile.mkdtemp(prefix="keel_stability_")
    results = {}
    try:
        def go(name, sets):
            print(f"-- {name}", file=sys.stderr, flush=True)
            results[name] = run(keel, os.path.join(work, name), sets)
            r = results[name]
            print(f"   exit {r['exit']} val {fmt_val(r['final_val'])} story {r['story']}",
                  file=sys.stderr, flush=True)

        if not args.only_false_alarms:
            go("clean", [])
            go("clean_guard_off", ["stability.enabled=false"])
            for s in args.scenarios:
                go(f"{s}/unprotected", SCENARIOS[s] + ["stability.enabled=false"])
                go(f"{s}/protected", SCENARIOS[s])
        false_alarms = None
        if not args.no_false_alarms:
            data = args.data or os.path.join(work, "fortunes_data")
            prepare_fortunes(keel, data)
            false_alarms = false_alarm_runs(keel, work, data, args.seeds,
                                            args.fortunes_seeds or args.seeds, args.fortunes_steps,
                                            args.false_alarm_configs)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"run directories kept in {work}", file=sys.stderr)

    fa_section = false_alarm_section(false_alarms, args.fortunes_steps) if false_alarms else ""
    if args.only_false_alarms:
        old = open(args.out).read() if args.out and os.path.exists(args.out) else ""
        if FALSE_ALARM_BEGIN in old:
            head, rest = old.split(FALSE_ALARM_BEGIN, 1)
            tail = rest.split(FALSE_ALARM_END, 1)[1].lstrip("\n") if FALSE_ALARM_END in rest else ""
            report = head + fa_section + tail
        else:
            report = old.rstrip("\n") + "\n\n" + fa_section
        print(fa_section)
        if args.out:
            with open(args.out, "w") as f:
                f.write(report)
        return 0 if check_false_alarms(false_alarms) else 1

    clean = results["clean"]["final_val"]
    lines = [
        "# Stability scenarios",
        "",
        f"Measured {datetime.date.today().isoformat()} on {platform.machine()} "
        f"({os.cpu_count()} cores), keel's embedded tiny config ({MAX_STEPS} steps, CPU, fp32),",
        "each scenario trained three ways on the same seed and data. Reproduce with",
        "",
        "```",
        "python3 bench/stability/run.py --keel build/keel",
        "```",
        "",
        "Settings shared by every run (on top of `configs/tiny.yaml`): `" + "`, `".join(BASE) + "`.",
        "",
        "| scenario | fault | clean val | unprotected val (gap) | protected val (gap) | detected at step | rollbacks | steps redone | extra step attempts | protected run's events | signals: first step, lead over the loss alarm |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in args.scenarios:
        u, p = results[f"{s}/unprotected"], results[f"{s}/protected"]
        fault = SCENARIOS[s][0].replace("faults=", "")
        unprot = fmt_val(u["final_val"]) + f" ({gap(u['final_val'], clean)})"
        if u["exit"] != 0:
            unprot += f", exit {u['exit']}"
        prot = fmt_val(p["final_val"]) + f" ({gap(p['final_val'], clean)})"
        if p["exit"] != 0:
            prot += f", exit {p['exit']}"
        extra = p["iterations"] - MAX_STEPS if p["iterations"] is not None else "—"
        lines.append(
            f"| {s} | `{fault}` | {fmt_val(clean)} | {unprot} | {prot} | "
            f"{p['detection'] if p['detection'] is not None else '—'} | {p['rollbacks']} | "
            f"{p['redone']} | {extra} | {' → '.join(p['story']) or '—'} | {lead_times(p['first'])} |")
    same = results["clean_guard_off"]["final_val"] == clean
    lines += [
        "",
        "Columns: *gap* is relative to the clean run's final validation loss; *steps redone* are the",
        "updates thrown away by rollbacks (from the pause back to the stable snapshot) and trained",
        "again; *extra step attempts* is the compute lost in total (rollbacks plus skipped updates),",
        "in optimizer steps, out of the run's " + str(MAX_STEPS) + ".",
        "",
        "The clean run with the guard off ends at val "
        + fmt_val(results["clean_guard_off"]["final_val"])
        + (" — bit-identical to the guarded clean run: watching changes nothing when nothing happens."
           if same else " (the guarded clean run: " + fmt_val(clean) + ")."),
        "",
        "NaN gradients: even with the guard off, keel's optimizer step refuses a non-finite gradient on",
        "the device (the found-inf flag of the fused update, as GradScaler does), so the unprotected run",
        "is not damaged; the guard adds the `skip_nan` event, keeps the step counter on applied updates,",
        "and escalates repeated NaNs to a rollback. The unit test `SkipUpdate` checks that weights and",
        "optimizer state after a skipped step equal those before it, bit for bit.",
        "",
        "Guard overhead on step time is measured by `bench/run.sh` (alternating pairs), in",
        "[benchmarks.md](benchmarks.md).",
        "",
        "*Signals*: the first step each signal alarmed at in the protected run (`grad_norm` and",
        "`loss` are the per-step alarms' warns, `pause:REASON` the pause, `non_finite` a skipped",
        "NaN step) and its lead over the loss alarm (positive: earlier).",
        "",
    ]
    report = "\n".join(lines) + ("\n" + fa_section if fa_section else "")
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: {kk: vv for kk, vv in v.items() if kk != "tail"} for k, v in results.items()},
                      f, indent=1)
    for name, r in results.items():
        if r["exit"] != 0:
            print(f"\n{name} exited {r['exit']}:\n{r['tail']}", file=sys.stderr)
    ok = check(results)
    if false_alarms:
        ok &= check_false_alarms(false_alarms)
    return 0 if ok else 1


def check_false_alarms(rows):
    """Zero warns after warmup and zero pauses on every clean run."""
    ok = True
    for name, runs in rows.items():
        for r in runs:
            passed = r["exit"] == 0 and r["warns_after_warmup"] == 0 and r["pauses"] == 0
            ok &= passed
            print(f"{'PASS' if passed else 'FAIL'} clean {name} seed {r['seed']}: exit {r['exit']}, "
                  f"{r['warns_after_warmup']} warns after warmup, {r['pauses']} pauses",
                  file=sys.stderr)
    return ok


def check(results):
    """The acceptance criteria of the guard, on this run's figures; False when one fails."""
    ok = True

    def verdict(name, passed, detail):
        nonlocal ok
        ok &= passed
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", file=sys.stderr)

    clean = results["clean"]["final_val"]
    if "corrupt_batch/protected" in results:
        u, p = results["corrupt_batch/unprotected"]["final_val"], results["corrupt_batch/protected"]
        verdict("corrupt_batch unprotected >= 10 % worse", u is None or u != u or u >= 1.10 * clean,
                f"{fmt_val(u)} vs clean {fmt_val(clean)}")
        pv = p["final_val"]
        verdict("corrupt_batch protected within 1 %", pv is not None and abs(pv - clean) <= 0.01 * clean,
                f"{fmt_val(pv)} vs clean {fmt_val(clean)}")
        want = ["warn", "pause", "rollback", "recovery_start", "recovery_end"]
        verdict("corrupt_batch events", p["story"] == want, " → ".join(p["story"]))
    if "lr_spike/protected" in results:
        u, p = results["lr_spike/unprotected"]["final_val"], results["lr_spike/protected"]
        verdict("lr_spike protected recovers, unprotected does not",
                p["exit"] == 0 and p["final_val"] is not None and p["final_val"] <= 1.01 * clean
                and (u is None or u != u or u >= 1.10 * clean),
                f"protected {fmt_val(p['final_val'])}, unprotected {fmt_val(u)}, clean {fmt_val(clean)}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
