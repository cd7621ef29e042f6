#!/usr/bin/env bash
# One GPU: lordo-16m (context 256, batch 16 per worker, offline corpus, bf16 autocast, fp32 weights and optimizer
# math) for 50 steps per method, then ddp again with train.compile=true; prints time per step, tokens/s and peak GPU
# memory from each run's record. Needs no network. Usage: benchmarks/gpu_smoke.sh [extra key=value overrides]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-runs/gpu_smoke}
COMMON=(model.size=lordo-16m data.context=256 data.batch_size=16 train.accelerator=gpu train.devices=1
        train.precision=bf16-mixed train.steps=50 train.warmup=5 train.val_every=50 data.val_batches=4
        sync.sync_every=10 train.progress_bar=false run.out_dir="$OUT" run.overwrite=true)
declare -A LR=([ddp]=1e-3 [lowrank_ddp]=1e-3 [local_adam]=1e-3 [lordo]=1e-3 [muon]=0.02 [dion]=0.01 [orth_dion]=0.01
               [muloco]=0.02 [orth_dion_local]=0.01)
run() {  # name, overrides...
  local name=$1; shift
  "$PY" -m lowcomm.training.train "${COMMON[@]}" run.name="$name" "$@" > "$OUT/$name.log" 2>&1 || { tail -20 "$OUT/$name.log"; return 1; }
  "$PY" - "$OUT/$name/record.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
tokens_per_step = r["tokens"] / max(r["steps"], 1)
print(f"{sys.argv[2]:18s} {tokens_per_step / r['tokens_per_s'] * 1e3:8.1f} ms/step {r['tokens_per_s']:12,.0f} tok/s "
      f"peak {r.get('peak_gpu_memory_bytes', 0) / 2**30:6.2f} GiB  final val loss {r['final_val_loss']:.3f}")
PY
}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
for method in "${!LR[@]}"; do
  run "$method" method="$method" optim.lr="${LR[$method]}" "$@"
done
run ddp_compiled method=ddp optim.lr=1e-3 train.compile=true "$@"
