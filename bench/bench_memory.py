"""Memory a SmolLM2 shard adds to a node process: layers 0-14 ÷ layers 0-29 (target <= 0.70).

Each shard loads in a fresh process, exactly as ``runnode`` loads it (weights,
and the tokenizer since both shards start at layer 0). "Added" is the peak
RSS after loading minus the RSS before loading (torch and transformers
already imported).

    .venv/bin/python bench/bench_memory.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "smollm2-135m"
TARGET = 0.70


def measure_child(start: int, end: int) -> None:
    import resource

    import psutil
    import torch

    from nodes_app.runtime.loading.shard import load_shard
    from nodes_app.shared.sources import resolve_source

    torch.set_num_threads(1)
    before = psutil.Process().memory_info().rss
    shard = load_shard(
        model_key=MODEL, source=resolve_source(MODEL), start=start, end=end, progress=False
    )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    after = psutil.Process().memory_info().rss
    print(json.dumps({"before": before, "peak": peak, "after": after, "layers": len(shard.layers)}))


def measure(start: int, end: int) -> dict[str, int]:
    from tracker_app.localnet import process_env, run_checked

    argv = [sys.executable, __file__, "--child", str(start), str(end)]
    out = run_checked(argv, env=process_env(PYTHONPATH=str(ROOT)))
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> int:
    half, whole = measure(0, 14), measure(0, 29)
    mib = 2**20
    added_half = (half["peak"] - half["before"]) / mib
    added_whole = (whole["peak"] - whole["before"]) / mib
    ratio = added_half / added_whole
    for name, run, added in (("0-14", half, added_half), ("0-29", whole, added_whole)):
        settled = (run["after"] - run["before"]) / mib
        print(f"layers {name}: +{added:.0f} MiB peak (+{settled:.0f} MiB after load)")
    print(f"ratio memory(0-14) / memory(0-29) = {ratio:.3f} (target <= {TARGET})")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        measure_child(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
