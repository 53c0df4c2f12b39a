#!/usr/bin/env python3
"""Stability scenarios under keel's DEFAULTS: each fault trained protected (the guard as shipped)
and unprotected (stability.enabled: false), against one clean run, on the same seed and data.

  python3 bench/stability/run.py --keel build/keel                 # everything (~70 min, 2 cores)
  python3 bench/stability/run.py --keel build/keel --only regions  # a chosen part
  python3 bench/stability/run.py --keel build/keel --scenarios random_tokens/20@75%
  python3 bench/stability/run.py --keel build/keel --jobs 2        # 2 runs at a time, 1 thread each

Parts (--only, repeatable):
  regions       the bad-data matrix: corrupt_batch in each mode (random_tokens, repeat_token,
                shuffled), regions of 1 step, 20 steps and 10 % of the run, starting at 25 % and
                at 75 % of the run (18 scenarios)
  numeric       an lr spike and a NaN gradient
  incidents     one run with 10 separate incidents (regions of mixed modes, an lr_spike, a
                nan_grad)
  text          real text: prepared fortunes shards with a contiguous stretch of junk documents
                (byte noise, one repeated character, markup boilerplate, base64 blobs, prepared by
                `keel prepare`, so whatever its filters let through) spliced into the data order
  repeats       the seed's §3.2: a set of 16 documents coming back every 10 steps over half the
                run (repeat_data), unprotected, with the default screen.low (warn) and with
                screen.low quarantine
  accumulation  data.grad_accum: dynamic against fixed (4 micro-batches of 4), clean and noisy
                (an lr spike then a corrupt region), over 3 seeds: final val loss and wall time
  false-alarms  clean runs over several seeds, tiny (synthetic) and the tiny and fortunes configs
                on two real corpora (fortunes prose, Python's standard library source), with the
                false-alarm rate of each signal per 10,000 steps after warmup
  machine       issue 48's machine faults: a device's wrong gradient once (corrupt_grad) on one
                process and on rank 1 of 2, twice, every time (persistent, 2 ranks), and a flipped
                bit in one rank's weights (flip_bit, 3 ranks): what was named, the final val
                against the clean run of the same layout, the exit code, and the replay's cost
  lr            issue 47's sweep: the tiny config on two real corpora (fortunes prose, Python's
                standard library source) at its peak lr times 1, 3, 10 and 30, each as the old
                defaults unprotected (no q/k norms), the new defaults (model.qk_norm auto: on for
                llama) unprotected, and protected (the guard as shipped): final val, back-offs and final lr; the check asks every protected run to
                exit 0 within 10 % of the sweep's best val (not met before the schedule backs off)

Every training run uses the embedded tiny config (or configs/fortunes.yaml) with nothing set but
the fault, the seed, the data path and, for the measurement only, logging.sample_ids (to count
true and false quarantines), logging.progress=off and eval.batches=32 (a precise val loss;
evaluation never touches training). Writes a Markdown report (docs/stability.md by default),
prints it, and exits non-zero when an acceptance criterion fails.
"""
import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import base64

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY_STEPS = 400  # configs/tiny.yaml's run.max_steps
MEASURE = ["logging.progress=off", "eval.batches=32", "logging.sample_ids=true"]
MODES = ["random_tokens", "repeat_token", "shuffled"]
LENGTHS = {"1": 1, "20": 20, "10%": TINY_STEPS // 10}
STARTS = {"25%": TINY_STEPS // 4, "75%": 3 * TINY_STEPS // 4}


def region_scenarios():
    out = {}
    for mode in MODES:
        for lname, length in LENGTHS.items():
            for sname, start in STARTS.items():
                out[f"{mode}/{lname}@{sname}"] = {
                    "faults": [{"kind": "corrupt_batch", "mode": mode, "at_step": start,
                                "steps": length}],
                    "region": (start, length)}
    return out


NUMERIC = {
    "lr_spike": {"faults": [{"kind": "lr_spike", "factor": 100, "at_step": 200, "steps": 3}]},
    "nan_grad": {"faults": [{"kind": "nan_grad", "at_step": 250}]},
}

# Ten incidents spread over one default run: regions of every mode and length, a spike, a NaN.
TEN_INCIDENTS = [
    {"kind": "corrupt_batch", "mode": "random_tokens", "at_step": 50, "steps": 5},
    {"kind": "lr_spike", "factor": 100, "at_step": 80, "steps": 2},
    {"kind": "corrupt_batch", "mode": "repeat_token", "at_step": 110, "steps": 15},
    {"kind": "nan_grad", "at_step": 140},
    {"kind": "corrupt_batch", "mode": "shuffled", "at_step": 165, "steps": 20},
    {"kind": "corrupt_batch", "mode": "random_tokens", "at_step": 205, "steps": 1},
    {"kind": "corrupt_batch", "mode": "repeat_token", "at_step": 235, "steps": 3},
    {"kind": "corrupt_batch", "mode": "shuffled", "at_step": 265, "steps": 10},
    {"kind": "corrupt_batch", "mode": "random_tokens", "at_step": 300, "steps": 25},
    {"kind": "corrupt_batch", "mode": "repeat_token", "at_step": 350, "steps": 8},
]

ALL_PARTS = ["regions", "numeric", "incidents", "repeats", "accumulation", "text",
             "false-alarms", "lr", "machine"]

# A set of documents coming back on a schedule: step 100's micro-batch returns every 10 steps.
REPEATS = {"kind": "repeat_data", "at_step": 100, "steps": 200, "period": 10}

# Dynamic accumulation against fixed, at the tiny config's global batch of 16 sequences.
ACCUM_FIXED = ["data.micro_batch_size=4", "data.grad_accum_steps=4"]
ACCUM_DYNAMIC = ACCUM_FIXED + ["data.grad_accum=dynamic", "data.grad_accum_min=1",
                               "data.grad_accum_max=8"]
ACCUM_NOISE = [{"kind": "lr_spike", "factor": 6, "at_step": 150, "steps": 30},
               {"kind": "corrupt_batch", "mode": "random_tokens", "at_step": 250, "steps": 30}]
ACCUM_SEEDS = [1, 2, 3]

STORY = {"warn", "screen", "pause", "rollback", "recovery_start", "recovery_end", "skip_nan",
         "overflow", "incident_end", "abort"}


def faults_arg(faults):
    parts = []
    for f in faults:
        parts.append("{" + ", ".join(f"{k}: {v}" for k, v in f.items()) + "}")
    return "faults=[" + ", ".join(parts) + "]"


def read_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def finished_run(run_dir):
    """The exit code of a run already in run_dir (--reuse): 0 at its run_end, 3 at an abort."""
    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    if any(e["kind"] == "run_end" for e in events):
        return 0
    aborts = [e for e in events if e["kind"] == "abort"]
    if aborts:
        return 4 if aborts[-1]["detail"].get("reason") == "faulty_device" else 3
    return None


# --jobs: a first pass of this script with PLAN_ENV naming a file records every run it would
# train (run directory, sets, config) instead of training it; the runs are then trained --jobs at a
# time with run.threads=1 and the real pass reads them back as --reuse does.
PLAN_ENV = "KEEL_STABILITY_PLAN"


def planned_result():
    """What a run reports in the planning pass: enough for every part to plan its next runs."""
    import collections
    r = collections.defaultdict(int)
    r.update({"exit": 0, "final_val": 2.0, "events": [], "samples": [], "quarantine": [],
              "stable_every": 10, "checkpoint_every": 10, "warmup": 40, "steps": TINY_STEPS,
              "iterations": TINY_STEPS, "seconds": 1.0, "final_lr": 0.0, "tail": "",
              "accum": [], "machine": [], "replay_s": []})
    return r


def train_planned(keel, plan, jobs):
    """Trains the planned runs `jobs` at a time (one intra-op thread each)."""
    import concurrent.futures
    runs, seen = [], set()
    for r in plan:
        if r["run_dir"] not in seen and finished_run(r["run_dir"]) is None:
            seen.add(r["run_dir"])
            runs.append(r)

    def one(r):
        train(keel, r["run_dir"], r["sets"] + ["run.threads=1"], r["config"],
              ranks=r.get("ranks", 1))
        return r["run_dir"]

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for n, run_dir in enumerate(pool.map(one, runs), 1):
            print(f"   [{n}/{len(runs)}] {os.path.basename(run_dir)}", file=sys.stderr, flush=True)


def train(keel, run_dir, sets, config=None, reuse=False, ranks=1):
    if os.environ.get(PLAN_ENV):
        with open(os.environ[PLAN_ENV], "a") as f:
            f.write(json.dumps({"run_dir": run_dir, "sets": sets, "config": config,
                                "ranks": ranks}) + "\n")
        return planned_result()
    launch = ["launch", "--nproc", str(ranks), "--"] if ranks > 1 else []
    cmd = [keel] + launch + ["train"] + ([config] if config else []) + ["--run-dir", run_dir]
    for s in MEASURE + sets:
        cmd += ["--set", s]
    code = finished_run(run_dir) if reuse and os.path.isdir(run_dir) else None
    if code is not None:
        proc = subprocess.CompletedProcess(cmd, code, stdout="(reused)")
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    events = read_jsonl(os.path.join(run_dir, "events.jsonl"))
    evals = read_jsonl(os.path.join(run_dir, "eval.jsonl"))
    end = next((e for e in events if e["kind"] == "run_end"), None)
    samples = read_jsonl(os.path.join(run_dir, "samples.jsonl"))
    accum = [m["grad_accum"] for m in read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
             if "grad_accum" in m]
    quarantine = read_jsonl(os.path.join(run_dir, "quarantine.jsonl"))
    rollbacks = [e for e in events if e["kind"] == "rollback"]
    per_incident = {}
    for e in rollbacks:
        per_incident[e["detail"].get("incident", -1)] = per_incident.get(
            e["detail"].get("incident", -1), 0) + 1
    cadence = next((e["detail"] for e in events if e["kind"] == "checkpoint_cadence"), {})
    return {
        "exit": proc.returncode,
        "final_val": evals[-1]["val_loss"] if evals else None,
        "events": [e for e in events if e["kind"] in STORY],
        "rollbacks": len(rollbacks),
        "max_rollbacks_per_incident": max(per_incident.values()) if per_incident else 0,
        "incidents": len({e["detail"].get("incident") for e in events
                          if e["kind"] == "pause"}),
        "redone": sum(e["detail"]["from_step"] - e["detail"]["to_step"] for e in rollbacks),
        "iterations": end["iteration"] if end else None,
        "seconds": end["detail"]["seconds"] if end else None,
        "samples": samples,
        "quarantine": quarantine,
        "stable_every": cadence.get("stable_every_steps"),
        "checkpoint_every": cadence.get("every_steps"),
        "warns_after_warmup": sum(1 for e in events if e["kind"] == "warn" and
                                  e["step"] > warmup_of(run_dir)),
        "warmup": warmup_of(run_dir),
        "steps": end["step"] if end else None,
        "warns": sum(1 for e in events if e["kind"] == "warn"),
        "pauses": sum(1 for e in events if e["kind"] == "pause"),
        "screened": sum(1 for q in quarantine if q["reason"] == "screen"),
        "accum": accum,
        "accum_changes": sum(1 for e in events if e["kind"] == "grad_accum"),
        "backoffs": sum(1 for e in events if e["kind"] == "schedule_backoff"),
        "machine": [e for e in events if e["kind"] == "hardware_fault"],
        "replay_s": [e["detail"]["replay_s"] for e in events if "replay_s" in e.get("detail", {})] +
                    [e["detail"]["seconds"] for e in events
                     if e["kind"] == "hardware_fault" and "seconds" in e["detail"]],
        "final_lr": next((m["lr"] for m in reversed(read_jsonl(
            os.path.join(run_dir, "metrics.jsonl"))) if "lr" in m), None),
        "tail": proc.stdout[-3000:],
    }


def warmup_of(run_dir):
    """The run's warmup, from the config it resolved (config.resolved.yaml)."""
    path = os.path.join(run_dir, "config.resolved.yaml")
    if os.path.exists(path):
        m = re.search(r"^\s*warmup_steps:\s*(\d+)", open(path).read(), re.M)
        if m:
            return int(m.group(1))
    return 0


def region_ids(clean, start, length):
    """Sample ids of data positions [start, start+length) steps, from the clean run's record."""
    ids = set()
    for rec in clean["samples"]:
        if start <= rec["position"] < start + length:
            ids.update(rec["ids"])
    return ids


def data_accounting(run, bad):
    """Quarantined samples split into true (in the bad region) and false (clean), and the bad
    samples the run trained on (in samples.jsonl, never quarantined)."""
    quarantined = {q["id"] for q in run["quarantine"]}
    trained = set()
    for rec in run["samples"]:
        trained.update(rec["ids"])
    return {"true": len(quarantined & bad), "false": len(quarantined - bad),
            "let_through": len((trained & bad) - quarantined), "bad": len(bad)}


def detection(run, start):
    """The first step at or after the fault that any alarm or screen fired at."""
    for e in run["events"]:
        if e["step"] >= start and e["kind"] in ("warn", "screen", "pause", "skip_nan"):
            return e["step"]
    return None


def lead_times(run, start):
    """The first step each signal fired at, and its lead over the loss alarm (positive: earlier)."""
    first = {}
    for e in run["events"]:
        if e["step"] < start:
            continue
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
    loss = [v for k, v in first.items() if k in ("loss", "pause:loss")]
    parts = []
    for name, step in sorted(first.items(), key=lambda kv: kv[1]):
        parts.append(f"{name} @{step}" + (f" ({min(loss) - step:+d})" if loss else ""))
    return "; ".join(parts) or "—"


def fmt_val(v):
    return "—" if v is None else ("NaN" if v != v else f"{v:.4f}")


def gap(v, ref):
    if v is None or v != v:
        return "diverged"
    if ref is None:
        return "—"
    return f"{(v - ref) / ref * 100:+.2f} %"


def rel(v, ref):
    return None if v is None or ref is None or v != v else (v - ref) / ref


def story(run):
    kinds = []
    for e in run["events"]:
        k = e["kind"]
        if k == "warn" and e["detail"].get("signal") not in (None, "screen"):
            continue  # advisory warns left out of the story
        if not kinds or kinds[-1] != k:
            kinds.append(k)
    return " → ".join(kinds) or "—"


# ---- real text --------------------------------------------------------------------------------

def junk_documents(seed=7, count=3000):
    """A few thousand junk documents of four kinds, as a broken converter or a bad crawl writes."""
    rng = random.Random(seed)
    boiler = ("<div class=\"nav\"><ul><li><a href=\"/\">Home</a></li><li><a href=\"/about\">About"
              "</a></li><li><a href=\"/contact\">Contact</a></li></ul></div><!-- generated -->")
    docs = []
    for i in range(count):
        kind = i % 4
        n = rng.randint(120, 480)
        if kind == 0:  # byte noise
            docs.append(bytes(rng.randrange(32, 256) for _ in range(n)).decode("latin-1"))
        elif kind == 1:  # one repeated character
            docs.append(rng.choice("=-*#~.x") * n)
        elif kind == 2:  # markup boilerplate with a token of variation
            docs.append((boiler + f" id={rng.randrange(10**6)} ") * (n // len(boiler) + 1))
        else:  # base64 blobs
            docs.append(base64.b64encode(bytes(rng.randrange(256) for _ in range(n))).decode())
    return docs


def prepare_code(keel, work):
    """A second real corpus on every machine with Python: its standard library's source files,
    one document per file, prepared as fortunes is (byte tokenizer, 256-token windows)."""
    code = os.path.join(work, "pystdlib_data")
    if not os.path.exists(os.path.join(code, "meta.json")):
        stdlib = sysconfig.get_paths()["stdlib"]
        subprocess.run([keel, "prepare", "--input", os.path.join(stdlib, "*.py"), "--output", code,
                        "--cluster", "source", "--seq-len", "256", "--val-fraction", "0.05"],
                       check=True, stdout=subprocess.DEVNULL)
    return code


def prepare_text(keel, work):
    """Fortunes prepared as configs/fortunes.yaml says, and the junk prepared the same way."""
    fortunes = os.path.join(work, "fortunes_data")
    if not os.path.exists(os.path.join(fortunes, "meta.json")):
        subprocess.run([keel, "prepare", "--input", "/usr/share/games/fortunes", "--output",
                        fortunes, "--separator", "%", "--cluster", "source", "--seq-len", "256",
                        "--val-fraction", "0.05"], check=True, stdout=subprocess.DEVNULL)
    junk = os.path.join(work, "junk_data")
    if not os.path.exists(os.path.join(junk, "meta.json")):
        os.makedirs(os.path.join(work, "junk_text"), exist_ok=True)
        path = os.path.join(work, "junk_text", "junk.txt")
        with open(path, "w", encoding="latin-1") as f:
            for d in junk_documents():
                f.write(d.replace("\n%\n", " ") + "\n%\n")
        out = subprocess.run([keel, "prepare", "--input", path, "--output", junk, "--separator",
                              "%", "--seq-len", "256", "--val-fraction", "0"], check=True,
                             stdout=subprocess.PIPE, text=True)
        print("   junk: " + out.stdout.strip(), file=sys.stderr)
    return fortunes, junk


# ---- the learning-rate sweep (issue 47) --------------------------------------------------------

TINY_LR = 3e-3  # the embedded tiny config's optim.lr
LR_MULTIPLIERS = [1, 3, 10, 30]
LR_VARIANTS = {
    "old defaults, unprotected": ["stability.enabled=false", "model.qk_norm=off"],
    "new defaults, unprotected": ["stability.enabled=false"],
    "new defaults, protected": [],
}


def lr_section(go, check, corpora, multipliers, raw):
    lines = ["## Learning rate: the schedule's own failure (issue 47)", "",
             f"The embedded tiny config on real text ({TINY_STEPS} steps, byte tokens) at its peak lr "
             f"({TINY_LR:g}) times {', '.join(f'{m:g}' for m in multipliers)}. Acceptance (issue 47): "
             "every protected run exits 0 within 10 % of the sweep's best final val.", "",
             "The columns separate what the model's defaults buy from what the guard buys: *old "
             "defaults* is the llama before issue 47 (no q/k norms) with the guard off; *new "
             "defaults, unprotected* adds `model.qk_norm: auto` (on for llama) alone; *new defaults, "
             "protected* is keel as shipped, whose schedule watch backs the peak off by 1/√10 each "
             "time the attention output passes 100× its value at initialisation within the judged "
             "window. A back-off within the warmup rolls back to step 0 and replays the same data, "
             "so a run that backed off k times trains from there exactly as a run configured with "
             "the lowered peak would: equal final vals in the protected column are that, not a "
             "copy. The final lr is the cosine's floor (0.1 × the peak the run ended with).", ""]
    for corpus, path in corpora.items():
        lines += [f"### {corpus}", "",
                  "| peak lr | " + " | ".join(LR_VARIANTS) + " | back-offs (protected) | "
                  "final lr (protected) |",
                  "|---|" + "---|" * (len(LR_VARIANTS) + 2)]
        base = ["data.source=shards", f"data.path={path}", "model.vocab_size=auto"]
        runs = {}
        for m in multipliers:
            lr = TINY_LR * m
            for variant, sets in LR_VARIANTS.items():
                name = f"lr/{corpus}/{lr:g}/{variant}".replace(" ", "_").replace(",", "")
                runs[(m, variant)] = go(name, base + [f"optim.lr={lr:g}"] + sets)
                raw[name] = runs[(m, variant)]
        vals = [r["final_val"] for r in runs.values() if r["final_val"] is not None]
        best = min(vals) if vals else None
        for m in multipliers:
            p = runs[(m, "new defaults, protected")]
            run_dir_lr = p.get("final_lr")
            cells = [f"{fmt_val(runs[(m, v)]['final_val'])} "
                     f"({gap(runs[(m, v)]['final_val'], best)})" for v in LR_VARIANTS]
            lines.append(f"| {TINY_LR * m:g} | " + " | ".join(cells) +
                         f" | {p['backoffs']} | "
                         f"{'—' if run_dir_lr is None else format(run_dir_lr, '.3g')} |")
            g = rel(p["final_val"], best)
            check(f"lr {TINY_LR * m:g} on {corpus}", p["exit"] == 0 and g is not None and g <= 0.10,
                  f"exit {p['exit']}, {gap(p['final_val'], best)} from the sweep's best")
        lines.append("")
    return "\n".join(lines)


# ---- false alarms -----------------------------------------------------------------------------

FALSE_ALARM_CONFIGS = {
    "tiny (synthetic)": {"config": None, "sets": []},
    "tiny on text shards": {"config": None,
                            "sets": ["data.source=shards", "data.path={data}",
                                     "model.vocab_size=auto"]},
    "fortunes": {"config": "configs/fortunes.yaml",
                 "sets": ["data.path={data}", "run.max_steps={fortunes_steps}"]},
    "tiny on Python source": {"config": None,
                              "sets": ["data.source=shards", "data.path={code}",
                                       "model.vocab_size=auto"]},
    "fortunes config on Python source": {"config": "configs/fortunes.yaml",
                                         "sets": ["data.path={code}",
                                                  "run.max_steps={fortunes_steps}"]},
}
# The false-alarm budget per signal (issue 31): at most one warn per 10,000 steps after warmup.
FALSE_ALARMS_PER_10K = 1.0
MIN_CLEAN_STEPS = 20000


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keel", default="build/keel")
    ap.add_argument("--out", default="docs/stability.md")
    ap.add_argument("--json", help="also write the figures of every run to this file")
    ap.add_argument("--only", action="append",
                    choices=ALL_PARTS)
    ap.add_argument("--scenarios", nargs="*", help="region scenarios to run (default: all 18)")
    ap.add_argument("--seeds", type=int, default=5, help="clean runs per config (false alarms)")
    ap.add_argument("--fortunes-seeds", type=int,
                    help="clean runs of the fortunes config per corpus (default: --seeds)")
    ap.add_argument("--fortunes-steps", type=int, default=300)
    ap.add_argument("--false-alarm-configs", nargs="*", default=list(FALSE_ALARM_CONFIGS))
    ap.add_argument("--lr-multipliers", nargs="*", type=float, default=LR_MULTIPLIERS,
                    help="the lr sweep's peak lr multipliers (part lr)")
    ap.add_argument("--lr-corpora", nargs="*", default=["fortunes", "Python source"],
                    choices=["fortunes", "Python source"])
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    ap.add_argument("--reuse", metavar="DIR",
                    help="work in DIR (kept by an earlier --keep) and read the runs that finished "
                         "there instead of training them again (implies --keep)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="train N runs at a time, each with run.threads=1 (default 1: one run at "
                         "a time with LibTorch's threads)")
    args = ap.parse_args()
    parts = args.only or ALL_PARTS
    keel = os.path.abspath(args.keel)
    work = args.reuse or tempfile.mkdtemp(prefix="keel_stability_")
    if args.jobs > 1 and not os.environ.get(PLAN_ENV):
        plan_file = os.path.join(work, "plan.jsonl")
        if os.path.exists(plan_file):
            os.remove(plan_file)
        argv = [a for a in sys.argv[1:]]
        subprocess.run([sys.executable, os.path.abspath(__file__)] + argv +
                       ["--reuse", work, "--out", os.devnull],
                       env=dict(os.environ, **{PLAN_ENV: plan_file}),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not os.path.exists(plan_file):
            sys.exit("the planning pass recorded no run (see --only and --scenarios)")
        train_planned(keel, read_jsonl(plan_file), args.jobs)
        args.reuse = work
    checks = []  # (name, passed, detail)

    def check(name, passed, detail):
        checks.append((name, passed, detail))
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}", file=sys.stderr, flush=True)

    def go(name, sets, config=None, ranks=1):
        print(f"-- {name}", file=sys.stderr, flush=True)
        r = train(keel, os.path.join(work, name.replace("/", "_").replace("%", "pct")), sets,
                  config, reuse=bool(args.reuse), ranks=ranks)
        print(f"   exit {r['exit']} val {fmt_val(r['final_val'])} rollbacks {r['rollbacks']} "
              f"screened {r['screened']} {story(r)}", file=sys.stderr, flush=True)
        return r

    sections = []
    raw = {}
    try:
        clean = None
        if {"regions", "numeric", "incidents", "repeats"} & set(parts):
            clean = go("clean", [])
            raw["clean"] = clean
            check("clean run", clean["exit"] == 0 and clean["pauses"] == 0 and
                  not clean["quarantine"], f"exit {clean['exit']}, {clean['pauses']} pauses, "
                  f"{len(clean['quarantine'])} quarantined")
            stable_every = clean["stable_every"] or 0
        if "regions" in parts:
            sections.append(regions_section(go, check, clean, stable_every, args.scenarios, raw))
        if "numeric" in parts:
            sections.append(numeric_section(go, check, clean, raw))
        if "incidents" in parts:
            sections.append(incidents_section(go, check, clean, raw))
        if "repeats" in parts:
            sections.append(repeats_section(go, check, clean, raw))
        if "accumulation" in parts:
            sections.append(accumulation_section(go, check, raw))
        if "text" in parts or "false-alarms" in parts or "lr" in parts:
            fortunes, junk = prepare_text(keel, work)
        if "text" in parts:
            sections.append(text_section(go, check, fortunes, junk, args.fortunes_steps, raw))
        if "false-alarms" in parts:
            code = prepare_code(keel, work)
            sections.append(false_alarm_section(go, check, fortunes, code, args, raw))
        if "machine" in parts:
            sections.append(machine_section(go, check, raw))
        if "lr" in parts:
            corpora = {"fortunes": fortunes, "Python source": prepare_code(keel, work)}
            sections.append(lr_section(go, check, {k: corpora[k] for k in args.lr_corpora},
                                       args.lr_multipliers, raw))
    finally:
        if args.keep or args.reuse:
            print(f"run directories kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    failed = [c for c in checks if not c[1]]
    head = [
        "# Stability scenarios",
        "",
        f"Measured {datetime.date.today().isoformat()} on {platform.machine()} "
        f"({os.cpu_count()} cores) with keel's **defaults**: the embedded tiny config "
        f"({TINY_STEPS} steps, CPU, fp32) or configs/fortunes.yaml, with nothing set but the fault "
        "(and, for the measurement, `" + "`, `".join(MEASURE) + "`). Reproduce with",
        "",
        "```",
        "python3 bench/stability/run.py --keel build/keel" +
        ("" if parts == ALL_PARTS
         else " " + " ".join(f"--only {p}" for p in parts)) +
        (f" --seeds {args.seeds}" if args.seeds != 5 else "") +
        (f" --fortunes-seeds {args.fortunes_seeds}" if args.fortunes_seeds else "") +
        (f" --jobs {args.jobs}" if args.jobs > 1 else ""),
        "```",
        "",
    ] + ([f"With `--jobs {args.jobs}` the runs train {args.jobs} at a time, each with "
          "`run.threads=1` (one intra-op thread): figures may differ from a one-at-a-time run "
          "in the last digits (another summation order).", ""]
         if args.jobs > 1 else []) + [
        f"Acceptance checks: {len(checks) - len(failed)} of {len(checks)} passed" +
        ("" if not failed else "; failed: " + "; ".join(f"{n} ({d})" for n, _, d in failed)) +
        ".",
        "",
    ]
    report = "\n".join(head + sections)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: {kk: vv for kk, vv in v.items()
                           if kk not in ("tail", "samples", "quarantine", "events")}
                       for k, v in raw.items()}, f, indent=1)
    return 1 if failed else 0


def regions_section(go, check, clean, stable_every, only, raw):
    scenarios = region_scenarios()
    names = only or list(scenarios)
    lines = [
        "## Bad data regions",
        "",
        f"`corrupt_batch` over the data positions of a region; the clean run's auto cadence chose "
        f"stable snapshots every {stable_every} steps. Criteria: exit 0, final val within 1 % of "
        "the clean run, at most 2 rollbacks per incident, clean data dropped at most "
        "max(one stable interval, 2 × the region), and the unprotected run ≥ 5 % worse where it is "
        "damaged at all.",
        "",
        "| scenario | clean val | unprotected (gap) | protected (gap) | detected at | rollbacks "
        "(max/incident) | steps redone | quarantined: bad / clean (of bad) | bad trained on | "
        "wall time lost | protected run's story | signals (lead over the loss alarm) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        spec = scenarios[name]
        start, length = spec["region"]
        fault = faults_arg(spec["faults"])
        u = go(f"{name}/unprotected", [fault, "stability.enabled=false"])
        p = go(f"{name}/protected", [fault])
        raw[f"{name}/unprotected"], raw[f"{name}/protected"] = u, p
        bad = region_ids(clean, start, length)
        acc = data_accounting(p, bad)
        samples_per_step = len(clean["samples"][0]["ids"]) if clean["samples"] else 1
        dropped_steps = acc["false"] / samples_per_step
        allowed = max(stable_every, 2 * length)
        lost = (p["seconds"] - clean["seconds"]) if p["seconds"] and clean["seconds"] else None
        g_p, g_u = rel(p["final_val"], clean["final_val"]), rel(u["final_val"], clean["final_val"])
        check(f"{name} protected", p["exit"] == 0 and g_p is not None and abs(g_p) <= 0.01 and
              p["max_rollbacks_per_incident"] <= 2 and dropped_steps <= allowed,
              f"exit {p['exit']}, gap {gap(p['final_val'], clean['final_val'])}, "
              f"{p['max_rollbacks_per_incident']} rollbacks/incident, clean data dropped "
              f"{dropped_steps:.1f} steps (allowed {allowed})")
        lines.append(
            f"| {name} | {fmt_val(clean['final_val'])} | {fmt_val(u['final_val'])} "
            f"({gap(u['final_val'], clean['final_val'])}) | {fmt_val(p['final_val'])} "
            f"({gap(p['final_val'], clean['final_val'])}){'' if p['exit'] == 0 else ', exit ' + str(p['exit'])} | "
            f"{detection(p, start) if detection(p, start) is not None else '—'} | "
            f"{p['rollbacks']} ({p['max_rollbacks_per_incident']}) | {p['redone']} | "
            f"{acc['true']} / {acc['false']} (of {acc['bad']}) | {acc['let_through']} | "
            f"{'—' if lost is None else f'{lost:+.1f} s'} | {story(p)} | {lead_times(p, start)} |")
        raw[f"{name}/accounting"] = acc
        _ = g_u
    lines += [
        "",
        "*quarantined: bad / clean*: samples set aside (quarantine.jsonl) that lay in the region / "
        "outside it; *bad trained on*: region samples the protected run trained on (in "
        "samples.jsonl, never quarantined). *steps redone*: updates thrown away by rollbacks and "
        "trained again. *wall time lost*: against the clean run. The unprotected gap says whether a "
        "scenario damages training at all: a region the model shrugs off needs no defence, and "
        "the protected run must then simply not make things worse.",
        "",
    ]
    return "\n".join(lines)


def numeric_section(go, check, clean, raw):
    lines = ["## Numeric faults", "",
             "| fault | clean val | unprotected (gap) | protected (gap) | rollbacks | story |",
             "|---|---|---|---|---|---|"]
    for name, spec in NUMERIC.items():
        fault = faults_arg(spec["faults"])
        u = go(f"{name}/unprotected", [fault, "stability.enabled=false"])
        p = go(f"{name}/protected", [fault])
        raw[f"{name}/unprotected"], raw[f"{name}/protected"] = u, p
        g = rel(p["final_val"], clean["final_val"])
        check(f"{name} protected", p["exit"] == 0 and g is not None and abs(g) <= 0.01,
              f"exit {p['exit']}, gap {gap(p['final_val'], clean['final_val'])}")
        lines.append(f"| `{fault}` | {fmt_val(clean['final_val'])} | {fmt_val(u['final_val'])} "
                     f"({gap(u['final_val'], clean['final_val'])}) | {fmt_val(p['final_val'])} "
                     f"({gap(p['final_val'], clean['final_val'])}) | {p['rollbacks']} | "
                     f"{story(p)} |")
    lines += ["", "NaN gradients: even with the guard off, keel's optimizer step refuses a "
              "non-finite gradient on the device (the found-inf flag of the fused update), so the "
              "unprotected run is not damaged; the guard adds the `skip_nan` event and escalates "
              "repeated NaNs to an incident.", ""]
    return "\n".join(lines)


def incidents_section(go, check, clean, raw):
    fault = faults_arg(TEN_INCIDENTS)
    u = go("ten_incidents/unprotected", [fault, "stability.enabled=false"])
    p = go("ten_incidents/protected", [fault])
    raw["ten_incidents/unprotected"], raw["ten_incidents/protected"] = u, p
    g = rel(p["final_val"], clean["final_val"])
    check("ten incidents", p["exit"] == 0 and g is not None and abs(g) <= 0.01 and
          p["max_rollbacks_per_incident"] <= 2,
          f"exit {p['exit']}, gap {gap(p['final_val'], clean['final_val'])}, "
          f"{p['rollbacks']} rollbacks, {p['max_rollbacks_per_incident']} max per incident")
    screens = sum(1 for e in p["events"] if e["kind"] == "screen")
    return "\n".join([
        "## Ten incidents in one run", "",
        "`" + fault + "`", "",
        f"Clean {fmt_val(clean['final_val'])}; unprotected {fmt_val(u['final_val'])} "
        f"({gap(u['final_val'], clean['final_val'])}); protected {fmt_val(p['final_val'])} "
        f"({gap(p['final_val'], clean['final_val'])}), exit {p['exit']}: {p['incidents']} "
        f"incident(s) with rollbacks, {p['rollbacks']} rollback(s) "
        f"(at most {p['max_rollbacks_per_incident']} per incident), {screens} screened step(s), "
        f"{len(p['quarantine'])} samples quarantined, {p['redone']} steps redone.", "",
        "Story: " + story(p), ""])


# Machine faults (issue 48): (name, ranks, faults, what the run must show). The clean run of each
# layout is the reference.
CORRUPT_ONCE = {"kind": "corrupt_grad", "at_step": 200, "rank": 0}
MACHINE = [
    ("corrupt_grad once", 1, [CORRUPT_ONCE], "named"),
    ("corrupt_grad once, rank 1 of 2", 2, [dict(CORRUPT_ONCE, rank=1)], "named"),
    ("corrupt_grad twice", 1, [CORRUPT_ONCE, dict(CORRUPT_ONCE, at_step=260)], "stops"),
    ("corrupt_grad every time, rank 1 of 2", 2, [dict(CORRUPT_ONCE, rank=1, persistent="true")],
     "stops"),
    ("flip_bit, rank 2 of 3", 3, [{"kind": "flip_bit", "at_step": 200, "rank": 2}], "restored"),
]


def machine_section(go, check, raw):
    lines = ["## Machine faults", "",
             "A device that computes wrong, the data clean (issue 48). `corrupt_grad` multiplies one "
             "rank's gradient by 1000 (once, or every time: `persistent`); `flip_bit` flips a "
             "mantissa bit (2^-7 of the value) of one weight in one rank's copy after an update. Each against the clean "
             "run of the same number of ranks (`keel launch --nproc N`), protected (defaults) and "
             "unprotected (`stability.enabled=false`).", "",
             "| fault | ranks | clean val | unprotected (gap) | protected (gap) | exit | named | "
             "quarantined | replay |",
             "|---|---|---|---|---|---|---|---|---|"]
    cleans = {}
    for name, ranks, faults, expect in MACHINE:
        if ranks not in cleans:
            cleans[ranks] = go(f"machine/clean_{ranks}", [], ranks=ranks)
            raw[f"machine/clean_{ranks}"] = cleans[ranks]
        clean = cleans[ranks]
        fault = faults_arg(faults)
        key = name.replace(" ", "_").replace(",", "")
        u = go(f"machine/{key}/unprotected", [fault, "stability.enabled=false"], ranks=ranks)
        p = go(f"machine/{key}/protected", [fault], ranks=ranks)
        raw[f"machine/{key}/unprotected"], raw[f"machine/{key}/protected"] = u, p
        named = sorted({r for e in p["machine"] for r in e["detail"].get("ranks", [])})
        causes = sorted({e["detail"].get("cause", "") for e in p["machine"]})
        if expect == "named":
            ok = (p["exit"] == 0 and p["final_val"] == clean["final_val"] and
                  not p["quarantine"] and len(p["machine"]) == 1)
        elif expect == "stops":
            ok = p["exit"] == 4 and len(p["machine"]) >= 1 and not p["quarantine"]
        else:
            ok = (p["exit"] == 0 and len(p["machine"]) == 1 and named == [2] and
                  not p["quarantine"] and p["final_val"] == clean["final_val"])
        check(f"machine: {name}", ok,
              f"exit {p['exit']}, val {fmt_val(p['final_val'])} vs clean "
              f"{fmt_val(clean['final_val'])}, named {named} ({', '.join(causes)}), "
              f"{len(p['quarantine'])} quarantined")
        step_s = (clean["seconds"] / clean["iterations"]) if clean["seconds"] else None
        replay = ("-" if not p["replay_s"] else
                  f"{max(p['replay_s']):.3f} s" +
                  (f" ({max(p['replay_s']) / step_s:.1f} steps)" if step_s else ""))
        lines.append(
            f"| `{fault}` | {ranks} | {fmt_val(clean['final_val'])} | {fmt_val(u['final_val'])} "
            f"({gap(u['final_val'], clean['final_val'])}) | {fmt_val(p['final_val'])} "
            f"({gap(p['final_val'], clean['final_val'])}) | {p['exit']} | "
            f"{', '.join(map(str, named)) or '-'} ({', '.join(causes) or '-'}) | "
            f"{len(p['quarantine'])} | {replay} |")
    lines += ["", "\"replay\": the longest replay of the run (the step computed again, one rank on "
              "under several ranks), in seconds and in mean steps of the clean run; it runs only on "
              "an alarm and once at each start (the run's own noise: exact here, so a replay's "
              "parts must match to the bit).", ""]
    return "\n".join(lines)


def repeats_section(go, check, clean, raw):
    fault = faults_arg([REPEATS])
    first_return = REPEATS["at_step"] + REPEATS["period"]
    u = go("repeats/unprotected", [fault, "stability.enabled=false"])
    w = go("repeats/warn", [fault])
    q = go("repeats/quarantine", [fault, "stability.screen.low=quarantine"])
    raw["repeats/unprotected"], raw["repeats/warn"], raw["repeats/quarantine"] = u, w, q

    def first_warn(run, signal):
        for e in run["events"]:
            if e["kind"] == "warn" and e.get("detail", {}).get("signal") == signal:
                return e
        return None

    found = first_warn(w, "repeated_data")
    named = (found or {}).get("detail", {}).get("top_samples", [])
    check("repeat_data detected", found is not None and found["step"] <= first_return and
          named and all("duplicate_of" in n for n in named),
          f"first repeated_data warn at step {found['step'] if found else None} (the set's first "
          f"return: {first_return}), {len(named)} samples named")
    g = rel(q["final_val"], clean["final_val"])
    check("repeat_data quarantined", q["exit"] == 0 and g is not None and abs(g) <= 0.01,
          f"exit {q['exit']}, gap {gap(q['final_val'], clean['final_val'])}")
    set_aside = sum(1 for r in q["quarantine"] if r.get("reason") == "repeated_data")
    returns = REPEATS["steps"] // REPEATS["period"] - 1
    signals = []
    for sig in ("repeated_data", "low_loss", "loss_periodicity"):
        e = first_warn(w, sig)
        signals.append(f"`{sig}` " + (f"@{e['step']} ({e['step'] - first_return:+d})" if e
                                      else "—"))
    example = named[0] if named else {}
    return "\n".join([
        "## Repeated data", "",
        "`" + fault + "`: the 16 samples of step " + str(REPEATS["at_step"]) + " come back every "
        f"{REPEATS['period']} steps ({returns} returns), under the ids of the positions they "
        "displace, as a shard listed twice would.", "",
        "| run | final val (gap) | exit | first warnings (steps after the first return) | "
        "samples set aside as repeats |", "|---|---|---|---|---|",
        f"| unprotected | {fmt_val(u['final_val'])} ({gap(u['final_val'], clean['final_val'])}) "
        f"| {u['exit']} | — | — |",
        f"| screen.low: warn (default) | {fmt_val(w['final_val'])} "
        f"({gap(w['final_val'], clean['final_val'])}) | {w['exit']} | {'; '.join(signals)} | 0 |",
        f"| screen.low: quarantine | {fmt_val(q['final_val'])} "
        f"({gap(q['final_val'], clean['final_val'])}) | {q['exit']} | "
        f"{'; '.join(s for s in signals if s.startswith('`repeated'))} | {set_aside} "
        f"(of {returns * 16}) |", "",
        f"Clean {fmt_val(clean['final_val'])}. The first warning names, e.g., sample "
        f"{example.get('id')} as a repeat of sample {example.get('duplicate_of')}.", ""])


def accumulation_section(go, check, raw):
    rows = []
    for setup, faults in (("clean", []), ("noisy", [faults_arg(ACCUM_NOISE)])):
        runs = {}
        for mode, sets in (("fixed", ACCUM_FIXED), ("dynamic", ACCUM_DYNAMIC)):
            runs[mode] = [go(f"accum/{setup}/{mode}/{seed}", sets + faults + [f"run.seed={seed}"])
                          for seed in ACCUM_SEEDS]
            for seed, r in zip(ACCUM_SEEDS, runs[mode]):
                raw[f"accum/{setup}/{mode}/{seed}"] = r
        for mode in ("fixed", "dynamic"):
            rs = runs[mode]
            vals = [r["final_val"] for r in rs]
            secs = [r["seconds"] for r in rs]
            counts = sorted({k for r in rs for k in r["accum"]}) or [4]
            check(f"accumulation {setup}/{mode} runs", all(r["exit"] == 0 for r in rs),
                  f"exits {[r['exit'] for r in rs]}")
            rows.append(
                f"| {setup} | {mode} | {sum(vals) / len(vals):.4f} "
                f"({', '.join(fmt_val(v) for v in vals)}) | {sum(secs) / len(secs):.1f} | "
                f"{counts[0]}–{counts[-1]} | "
                f"{sum(r['accum_changes'] for r in rs) / len(rs):.1f} | "
                f"{sum(r['pauses'] for r in rs)} |")
        fixed = sum(r["final_val"] for r in runs["fixed"]) / len(ACCUM_SEEDS)
        dyn = sum(r["final_val"] for r in runs["dynamic"]) / len(ACCUM_SEEDS)
        check(f"accumulation {setup}: dynamic within 2 % of fixed", abs(dyn / fixed - 1) <= 0.02,
              f"mean val {dyn:.4f} against {fixed:.4f}")
    return "\n".join([
        "## Dynamic gradient accumulation", "",
        "`data.grad_accum: dynamic` (experimental, the seed's §4.3) against fixed accumulation, "
        "both at the tiny config's global batch of 16 sequences as 4 micro-batches of 4 "
        "(`" + "`, `".join(ACCUM_FIXED) + "`; dynamic within [1, 8]). Noisy: `" +
        faults_arg(ACCUM_NOISE) + "`. Seeds " + ", ".join(map(str, ACCUM_SEEDS)) +
        "; wall time is the run's own (run_end seconds), on this machine's 2 cores.", "",
        "| run | accumulation | final val, mean (per seed) | seconds, mean | micro-batches per "
        "step (logged) | changes per run | pauses |", "|---|---|---|---|---|---|---|",
        *rows, ""])


def text_section(go, check, fortunes, junk, steps, raw):
    cfg = os.path.join(ROOT, "configs/fortunes.yaml")
    base = [f"data.path={fortunes}", f"run.max_steps={steps}"]
    start, length = steps // 2, steps // 10
    fault = faults_arg([{"kind": "splice_data", "path": junk, "at_step": start, "steps": length}])
    clean = go("fortunes/clean", base, cfg)
    u = go("fortunes_junk/unprotected", base + [fault, "stability.enabled=false"], cfg)
    p = go("fortunes_junk/protected", base + [fault], cfg)
    raw["fortunes/clean"], raw["fortunes_junk/unprotected"], raw["fortunes_junk/protected"] = \
        clean, u, p
    bad = region_ids(clean, start, length)
    acc = data_accounting(p, bad)
    g = rel(p["final_val"], clean["final_val"])
    check("fortunes with junk", p["exit"] == 0 and g is not None and abs(g) <= 0.01,
          f"exit {p['exit']}, gap {gap(p['final_val'], clean['final_val'])}")
    meta = json.load(open(os.path.join(junk, "report.json")))
    return "\n".join([
        "## Real text with a stretch of junk", "",
        f"configs/fortunes.yaml ({steps} steps, its cosine compressed with it) on the prepared "
        f"fortunes corpus; steps {start}–{start + length - 1} of the data order replaced by "
        f"windows of {meta['documents_out']} junk documents (of {meta['documents_in']} generated: "
        "byte noise, one repeated character, markup boilerplate, base64; `keel prepare` removed "
        f"{meta['exact_duplicates']} exact and {meta['near_duplicates']} near duplicates and "
        f"{meta['removed_by_length']} by length and {meta.get('removed_by_repetition', 0)} as "
        "self-repeating) with the `splice_data` fault.", "",
        f"Clean {fmt_val(clean['final_val'])}; unprotected {fmt_val(u['final_val'])} "
        f"({gap(u['final_val'], clean['final_val'])}); protected {fmt_val(p['final_val'])} "
        f"({gap(p['final_val'], clean['final_val'])}), exit {p['exit']}, {p['rollbacks']} "
        f"rollback(s). Quarantined {acc['true']} junk and {acc['false']} clean samples "
        f"(of {acc['bad']} junk windows); {acc['let_through']} junk windows trained on.", "",
        "Story: " + story(p), ""])


def false_alarm_section(go, check, fortunes, code, args, raw):
    lines = ["## False alarms on clean data", "",
             "Clean runs under each config's defaults (only the seed and the data path set; "
             f"fortunes shortened to {args.fortunes_steps} steps, its cosine compressed with it). "
             "A warning counts after warmup when its step is past the run's resolved warmup. "
             "Samples screened are the per-sample screen's masks (natural-tail samples set aside, "
             "reported as `screen` info events; a warn only past the natural tail).", "",
             "| config | seeds | exit codes | warns (all) | warns after warmup | pauses | schedule "
             "back-offs | samples screened | final val |", "|---|---|---|---|---|---|---|---|---|"]
    for name in args.false_alarm_configs:
        spec = FALSE_ALARM_CONFIGS[name]
        fortunes_config = spec["config"] == "configs/fortunes.yaml"
        n = (args.fortunes_seeds or args.seeds) if fortunes_config else args.seeds
        runs = []
        for seed in range(1, n + 1):
            sets = [x.format(data=fortunes, code=code, fortunes_steps=args.fortunes_steps)
                    for x in spec["sets"]] + [f"run.seed={seed}"]
            config = os.path.join(ROOT, spec["config"]) if spec["config"] else None
            r = go(f"clean/{name.replace(' ', '_')}/{seed}", sets, config)
            raw[f"clean/{name}/{seed}"] = r
            # Masked samples are not alarms: the screen sets aside a natural-tail sample now and
            # then (a `screen` info event). A pause fails the run; warns count against each
            # signal's budget (signal_rates).
            # A back-off in a clean run at the config's lr is a false alarm of the schedule watch.
            check(f"clean {name} seed {seed}",
                  r["exit"] == 0 and r["pauses"] == 0 and r["backoffs"] == 0,
                  f"exit {r['exit']}, {r['warns_after_warmup']} warns after warmup, "
                  f"{r['pauses']} pauses, {r['backoffs']} back-offs, {r['screened']} screened")
            runs.append(r)
        lines.append(f"| {name} | {len(runs)} | {', '.join(str(r['exit']) for r in runs)} | "
                     f"{sum(r['warns'] for r in runs)} | "
                     f"{sum(r['warns_after_warmup'] for r in runs)} | "
                     f"{sum(r['pauses'] for r in runs)} | {sum(r['backoffs'] for r in runs)} | "
                     f"{sum(r['screened'] for r in runs)} | "
                     f"{', '.join(fmt_val(r['final_val']) for r in runs)} |")
    lines += ["", "The text-shards runs use the fortunes corpus prepared as configs/fortunes.yaml "
              "describes, with the tiny model (`model.vocab_size=auto`); the Python-source runs the "
              "standard library's top-level modules of the Python that ran the bench, prepared the "
              "same way (one document per file).", ""]
    lines += signal_rates(check, [v for k, v in raw.items() if k.startswith("clean/")])
    return "\n".join(lines)


def signal_rates(check, runs):
    """Warns per signal per 10,000 clean steps after warmup, over every clean run."""
    steps = sum(max((r["steps"] or 0) - r["warmup"], 0) for r in runs)
    counts = {}
    for r in runs:
        for e in r["events"]:
            if e["kind"] == "warn" and e["step"] > r["warmup"]:
                name = e["detail"].get("signal") or e["detail"].get("alarm", "grad_norm")
                counts[name] = counts.get(name, 0) + 1
    pauses = sum(r["pauses"] for r in runs)
    signals = ["grad_norm", "loss", "screen", "clip_rate", "update_ratio", "attention_drift",
               "attention_growth",
               "repeated_data", "low_loss", "loss_periodicity", "loss_scale", "loss_scale_trend",
               "grad_scale"]
    signals += sorted(k for k in counts if k not in signals)
    lines = ["### False-alarm rate per signal", "",
             f"{len(runs)} clean runs, {steps:,} steps after warmup ({sum(r['steps'] or 0 for r in runs):,} "
             f"in all), {pauses} pauses. Budget: at most {FALSE_ALARMS_PER_10K:g} warn per 10,000 "
             "steps after warmup per signal, 0 pauses (fp16's loss-scale signals cannot fire in "
             "these fp32 runs; their clean fp16 check is in the suite).", "",
             "| signal | warns after warmup | per 10,000 steps |", "|---|---|---|"]
    worst = 0.0
    for name in signals:
        n = counts.get(name, 0)
        rate = n * 10000 / steps if steps else float("nan")
        worst = max(worst, rate)
        lines.append(f"| `{name}` | {n} | {rate:.2f} |")
    check("false-alarm rate", steps >= MIN_CLEAN_STEPS and worst <= FALSE_ALARMS_PER_10K and
          pauses == 0, f"{steps} clean steps after warmup (at least {MIN_CLEAN_STEPS}), worst "
          f"signal {worst:.2f} per 10,000, {pauses} pauses")
    return lines + [""]


if __name__ == "__main__":
    sys.exit(main())
