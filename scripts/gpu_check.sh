#!/usr/bin/env bash
# GPU check on a machine with a CUDA GPU (never run in CI; there is no GPU there). Three parts:
#   1. path check: 20 steps of the embedded tiny config on cuda with optim.fused=on (the fused
#      AdamW kernel) and SDPA attention, in bf16 and in fp16 (dynamic loss scaling); every loss and
#      gradient norm must be finite, no step skipped or rolled back (an fp16 overflow the scaler
#      absorbs is allowed; fp16 records must carry a loss scale), and the loss must fall; the bf16
#      run (run.cuda_graphs: auto) must have captured a CUDA graph and give the same losses as the
#      same run with graphs off, within bf16 tolerance;
#   2. NCCL: the same 20 steps as one rank of a c10d NCCL process group (torchrun's variables for
#      one rank and distributed.backend=nccl) with ZeRO-1, its gradient buckets reduce-scattered
#      from the backward pass's hooks and the weights all-gathered after each step; finite and
#      falling, and the log shows the group, ZeRO-1 and the buckets;
#   3. throughput: a 124M (gpt2-small dimensions) and a 350M (gpt2-medium dimensions) llama-style
#      model trained in bf16 by keel and by the plain PyTorch reference (bench/reference/), in
#      alternating pairs (bench/run.py), and a Markdown table of median tokens/s, the
#      keel/reference ratio and MFU against this GPU's bf16 matmul peak (8192³, measured in the
#      same run with the same torch).
# A few minutes on an H100-class GPU once keel is built. Two ways to call it:
#
#   scripts/gpu_check.sh [ARGS...]
#       builds keel here with scripts/build.sh, which sets up the Debian packages and the wheel;
#   scripts/gpu_check.sh --bundle DIR [ARGS...]
#       runs the keel of a folder made by scripts/gpu_bundle.sh, on a bare CUDA machine: nothing
#       is built or installed; LibTorch comes from that machine's own `python3 -c 'import torch'`
#       (its torch/lib and the wheel's nvidia/*/lib), which also runs the reference (override:
#       KEEL_PYTHON).
#
# --quick stops after parts 1 and 2 (a minute). Other ARGS go to bench/run.py, e.g. --pairs 3. With $OUT set (the device tool's output folder) it
# writes there: gpu_check.log (everything printed), gpu_bench.md (the table), gpu_bench.json,
# path_check.log, path_check_metrics.jsonl (bf16), path_check_fp16.log,
# path_check_fp16_metrics.jsonl, nccl.log and nccl_metrics.jsonl. Exits non-zero when
# any part fails; each part runs even when an earlier one failed. The exact call for the device
# tool is in docs/benchmarks.md, "GPU check".
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
bundle=""
quick=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="${2:?--bundle needs a folder}"; shift 2 ;;
    --bundle=*) bundle="${1#--bundle=}"; shift ;;
    --quick) quick=1; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
out="${OUT:-}"
if [ -n "$out" ]; then
  mkdir -p "$out"
  exec > >(tee -a "$out/gpu_check.log") 2>&1
fi
log() { echo "[gpu_check] $*" >&2; }
export PYTHONUNBUFFERED=1

command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true

if [ -n "$bundle" ]; then
  bundle="$(cd "$bundle" && pwd)"
  [ -x "$bundle/keel" ] && [ -f "$bundle/MANIFEST.txt" ] ||
    { log "$bundle has no keel or MANIFEST.txt; scripts/gpu_bundle.sh makes a bundle"; exit 2; }
  sed -n '/^[a-z_]*=/p' "$bundle/MANIFEST.txt" | sed 's/^/[gpu_check] bundle: /' >&2
  manifest() { sed -n "s/^$1=//p" "$bundle/MANIFEST.txt"; }
  python="${KEEL_PYTHON:-python3}"
  # torch's version, its folder, and the nvidia/*/lib folders of the wheel it came with.
  mapfile -t found < <("$python" -c '
import glob, os, torch
d = os.path.dirname(torch.__file__)
print(torch.__version__)
print(torch.version.cuda)
print(os.path.join(d, "lib"))
for lib in sorted(glob.glob(os.path.join(os.path.dirname(d), "nvidia", "*", "lib"))):
    print(lib)')
  [ "${#found[@]}" -ge 3 ] || { log "$python cannot import torch"; exit 2; }
  torch_version="${found[0]}" torch_cuda="${found[1]}"
  want="$(manifest torch_version)"
  log "LibTorch from $python: torch $torch_version (CUDA $torch_cuda) at ${found[2]}"
  # keel links LibTorch's C++ API, which changes between releases: only the one it was built with.
  if [ "${torch_version%%+*}" != "$want" ]; then
    log "the bundle was built against torch $want, $python has $torch_version; rebuild the bundle" \
        "against that release (scripts/setup.sh's TORCH_VERSION) or set KEEL_PYTHON"
    exit 2
  fi
  [ "$torch_cuda" != None ] || { log "torch $torch_version is a CPU-only build"; exit 2; }
  glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')"
  glibc_min="$(manifest glibc_min)"
  if [ -n "$glibc" ] && [ -n "$glibc_min" ] &&
     [ "$(printf '%s\n%s\n' "$glibc_min" "$glibc" | sort -V | head -n 1)" != "$glibc_min" ]; then
    log "this machine's glibc is $glibc; the bundle needs >= $glibc_min (build it on an older one)"
    exit 2
  fi
  libpath="$(IFS=:; echo "${found[*]:2}")"
  export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if command -v ldd >/dev/null && ldd "$bundle/keel" | grep -q 'not found'; then
    ldd "$bundle/keel" | grep 'not found' >&2
    log "the bundle's keel misses the libraries above"
    exit 2
  fi
  keel="$bundle/keel"
  run_py="$bundle/bench/run.py"
else
  build="$("$here/scripts/build.sh" --target keel)"
  keel="$(cd "$build" && pwd)/keel"
  # The interpreter of the wheel keel links (as bench/run.sh finds it).
  torch_version="$(sed -n 's/^TORCH_VERSION="\([^"]*\)".*/\1/p' "$here/scripts/setup.sh")"
  python="${KEEL_PYTHON:-${KEEL_CACHE:-$HOME/.cache/keel}/torch-$torch_version/bin/python}"
  run_py="$here/bench/run.py"
fi
version="$("$keel" --version)" || { log "$keel does not start (above)"; exit 2; }
log "keel: $keel ($version)"
status=0

# ---- 1. path check: fused AdamW and SDPA on cuda, in bf16 and in fp16 --------------------------
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for precision in bf16 fp16; do
  name=path_check; run="$tmp/run"  # bf16's run is also part 2's reference
  [ "$precision" = bf16 ] || { name="path_check_$precision"; run="$tmp/run_$precision"; }
  log "path check: 20 steps of the tiny config, cuda, $precision, optim.fused=on"
  # In $tmp: keel's free-space check looks at run.out_dir, relative to the working directory.
  if (cd "$tmp" && timeout 300 "$keel" train --run-dir "$run" --set run.device=cuda \
        --set run.precision="$precision" --set optim.fused=on --set run.max_steps=20 \
        --set schedule.warmup_steps=2 --set logging.every_steps=1 --set logging.progress=off \
        --set eval.every_steps=0 --set checkpoint.every_steps=0) >"$tmp/$name.log" 2>&1; then
    [ -z "$out" ] || cp "$run/metrics.jsonl" "$out/${name}_metrics.jsonl"
    # The log names the optimizer ("adamw(fused)"); run_start the device; metrics.jsonl holds the
    # losses (and, in fp16, the loss scale). An fp16 overflow that the scaler absorbs is allowed.
    if "$python" - "$tmp/$name.log" "$run" "$precision" <<'EOF' >&2; then
import json, math, os, sys
log_text = open(sys.argv[1]).read()
read = lambda name: [json.loads(l) for l in open(os.path.join(sys.argv[2], name)) if l.strip()]
precision = sys.argv[3]
metrics, events = read("metrics.jsonl"), read("events.jsonl")
losses = [m["loss"] for m in metrics]
norms = [m["grad_norm"] for m in metrics]
finite = lambda xs: all(x is not None and math.isfinite(x) for x in xs)  # non-finite is null
problems = []
if "adamw(fused)" not in log_text:
    problems.append("keel did not use the fused AdamW kernel (no 'adamw(fused)' in its log)")
start = next((e["detail"] for e in events if e["kind"] == "run_start"), {})
if not str(start.get("device", "")).startswith("cuda"):
    problems.append(f"the run was not on cuda (run_start device {start.get('device')!r})")
if [m["step"] for m in metrics] != list(range(1, 21)):
    problems.append(f"expected records of steps 1..20, got {[m['step'] for m in metrics]}")
if not finite(losses) or not finite(norms):
    problems.append("a loss or gradient norm is not finite")
redone = sorted({e["kind"] for e in events if e["kind"] in ("rollback", "skip_nan")})
if redone:
    problems.append(f"steps were skipped or rolled back: {', '.join(redone)}")
if precision == "fp16":
    scales = [m.get("loss_scale") for m in metrics]
    overflows = sum(e["kind"] == "overflow" for e in events)
    if not finite(scales) or not all(x > 0 for x in scales):
        problems.append(f"fp16 without a finite loss scale in every record: {scales}")
    else:
        print(f"[gpu_check] path check ({precision}): loss scale {scales[0]:g} -> {scales[-1]:g}, "
              f"{overflows} overflow(s) absorbed")
if finite(losses) and len(losses) >= 10:
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"[gpu_check] path check ({precision}): loss {losses[0]:.4f} -> {losses[-1]:.4f} "
          f"(mean of steps 1-5 {first:.4f}, of steps 16-20 {last:.4f})")
    if not last < first - 0.1:
        problems.append(f"no fall in the loss (means {first:.4f}, steps 1-5; {last:.4f}, 16-20)")
for p in problems:
    print(f"[gpu_check] path check ({precision}): {p}")
sys.exit(1 if problems else 0)
EOF
      log "path check: ok (fused AdamW, SDPA, $precision on cuda: finite, falling)"
    else
      if [ -n "$out" ]; then log "path check: FAILED (keel's log: $out/$name.log)"
      else tail -n 20 "$tmp/$name.log" >&2; log "path check: FAILED"
      fi
      status=1
    fi
  else
    tail -n 40 "$tmp/$name.log" >&2
    log "path check: FAILED, keel exited non-zero ($precision)"
    status=1
  fi
  [ -z "$out" ] || cp "$tmp/$name.log" "$out/$name.log"
done

# ---- 1b. CUDA graphs: part 1's bf16 run (run.cuda_graphs: auto) against the same run eager -----
log "cuda graphs: part 1's bf16 run again with run.cuda_graphs=off"
if (cd "$tmp" && timeout 300 "$keel" train --run-dir "$tmp/eager" --set run.device=cuda \
      --set run.precision=bf16 --set optim.fused=on --set run.max_steps=20 \
      --set run.cuda_graphs=off --set schedule.warmup_steps=2 --set logging.every_steps=1 \
      --set logging.progress=off --set eval.every_steps=0 --set checkpoint.every_steps=0) \
      >"$tmp/eager.log" 2>&1 &&
   "$python" - "$tmp/path_check.log" "$tmp/run" "$tmp/eager" <<'EOF' >&2; then
import json, math, os, sys
read = lambda d: [json.loads(l)["loss"] for l in open(os.path.join(d, "metrics.jsonl")) if l.strip()]
graphed, eager = read(sys.argv[2]), read(sys.argv[3])
problems = []
if "CUDA graph captured" not in open(sys.argv[1]).read():
    problems.append("part 1's bf16 run captured no CUDA graph (its log says why)")
finite = lambda xs: all(x is not None and math.isfinite(x) for x in xs)
if len(graphed) != len(eager) or not finite(graphed + eager):
    problems.append("the records differ in length or hold a non-finite loss")
else:
    diff = max(abs(a - b) / abs(b) for a, b in zip(graphed, eager))
    print(f"[gpu_check] cuda graphs: largest relative loss difference, graphs on vs off: {diff:.2e}")
    if diff > 2e-2:  # bf16 rounding over 20 steps, not another computation
        problems.append(f"graphs on and off differ by {diff:.2e} (more than bf16's 2e-2)")
for p in problems:
    print(f"[gpu_check] cuda graphs: {p}")
sys.exit(1 if problems else 0)
EOF
  log "cuda graphs: ok (captured; the same losses as eager within bf16 tolerance)"
else
  tail -n 20 "$tmp/eager.log" >&2
  log "cuda graphs: FAILED"
  status=1
fi
[ -z "$out" ] || cp "$tmp/eager.log" "$out/path_check_eager.log"

# ---- 2. NCCL: one rank, its process group made and its collectives run -----------------------
# torchrun's variables for one rank, and distributed.backend named: keel makes the NCCL group
# (rendezvous through a TCPStore on loopback) and, with ZeRO-1, reduce-scatters its gradient
# buckets from the backward pass's hooks and all-gathers the updated weights after each step. The
# same 20 steps as part 1: finite, falling, and close to part 1's.
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log "nccl: the same 20 steps as one rank of a c10d NCCL group (MASTER_PORT $port)"
if (cd "$tmp" && env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" timeout 300 "$keel" train --run-dir "$tmp/nccl" \
      --set run.device=cuda --set run.precision=bf16 --set optim.fused=on \
      --set distributed.backend=nccl --set distributed.zero=1 --set distributed.timeout_s=60 \
      --set run.max_steps=20 \
      --set schedule.warmup_steps=2 --set logging.every_steps=1 --set logging.progress=off \
      --set eval.every_steps=0 --set checkpoint.every_steps=0) >"$tmp/nccl.log" 2>&1; then
  [ -z "$out" ] || cp "$tmp/nccl/metrics.jsonl" "$out/nccl_metrics.jsonl"
  if "$python" - "$tmp/nccl.log" "$tmp/nccl" "$tmp/run" <<'EOF' >&2; then
import json, math, os, re, sys
log_text = open(sys.argv[1]).read()
read = lambda d, name: [json.loads(l) for l in open(os.path.join(d, name)) if l.strip()]
metrics = read(sys.argv[2], "metrics.jsonl")
losses = [m["loss"] for m in metrics]
finite = lambda xs: all(x is not None and math.isfinite(x) for x in xs)
problems = []
if "rank 0 of 1 (0 from torchrun), nccl over 127.0.0.1" not in log_text:
    problems.append("keel made no NCCL process group (no 'nccl over' in its log)")
if "(zero1: state sharded over 1 rank)" not in log_text:
    problems.append("keel did not use ZeRO-1 (no 'zero1' in its log)")
buckets = re.search(r"gradients reduce-scattered in (\d+) buckets; (\d+) of them started during",
                    log_text)
if not buckets:
    problems.append("no gradient buckets were reduce-scattered (no 'gradients reduce-scattered "
                    "in' line)")
else:
    print(f"[gpu_check] nccl: gradients reduce-scattered in {buckets[1]} buckets, "
          f"{buckets[2]} started during the backward pass")
if [m["step"] for m in metrics] != list(range(1, 21)):
    problems.append(f"expected records of steps 1..20, got {[m['step'] for m in metrics]}")
if not all("comm_ms" in m for m in metrics):
    problems.append("metrics.jsonl has no comm_ms: the step did not wait on a collective")
if not finite(losses):
    problems.append("a loss is not finite")
elif len(losses) >= 10:
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    comm = sorted(m["comm_ms"] for m in metrics if "comm_ms" in m)
    print(f"[gpu_check] nccl: loss {losses[0]:.4f} -> {losses[-1]:.4f}; median comm_ms "
          f"{comm[len(comm) // 2] if comm else float('nan'):.3f}")
    if not last < first - 0.1:
        problems.append(f"no fall in the loss (means {first:.4f}, steps 1-5; {last:.4f}, 16-20)")
    try:  # GPU kernels are not bit-reproducible run to run: printed, not judged
        plain = [m["loss"] for m in read(sys.argv[3], "metrics.jsonl")]
        diff = max(abs(a - b) / abs(b) for a, b in zip(losses, plain))
        print(f"[gpu_check] nccl: largest relative difference from part 1's losses: {diff:.2e}")
    except (OSError, ValueError, ZeroDivisionError):
        pass
for p in problems:
    print(f"[gpu_check] nccl: {p}")
sys.exit(1 if problems else 0)
EOF
    log "nccl: ok (a 1-rank NCCL group: buckets reduce-scattered, finite, falling)"
  else
    tail -n 20 "$tmp/nccl.log" >&2
    log "nccl: FAILED"
    status=1
  fi
else
  tail -n 40 "$tmp/nccl.log" >&2
  log "nccl: FAILED, keel exited non-zero"
  status=1
fi
[ -z "$out" ] || cp "$tmp/nccl.log" "$out/nccl.log"

# ---- 3. throughput: keel against the plain PyTorch reference ---------------------------------
if [ "$quick" -eq 1 ]; then
  if [ "$status" -eq 0 ]; then log "done (--quick: no throughput table)"; else log "FAILED"; fi
  exit "$status"
fi
# keel logs every 5 steps rather than every step: a log step also snapshots all weights for the
# update ratios and reads several values back to the host, work a real run does not do per step
# (the per-config warm-up and step counts are multiples of 5). One checkpoint kept of each kind:
# keel's free-space check asks for room for keep_last + stable.keep + 1 checkpoints (4.3 GB each at
# 350M), and only the start and end saves are ever written here.
bench=("$python" "$run_py" --keel "$keel" --python "$python" --device cuda --precision bf16
       --configs 124m 350m --pairs 2 --log-every 5
       --keel-set checkpoint.keep_last=1 --keel-set checkpoint.stable.keep=1)
[ -z "$out" ] || bench+=(--json "$out/gpu_bench.json")
log "throughput: ${bench[*]} ${args[*]:-}"
if [ -n "$out" ]; then
  "${bench[@]}" "${args[@]}" | tee "$out/gpu_bench.md" || status=1
else
  "${bench[@]}" "${args[@]}" || status=1
fi
if [ "$status" -eq 0 ]; then log "done"; else log "FAILED (see above)"; fi
exit "$status"
