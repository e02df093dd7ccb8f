"""Worker for tests/test_agent_training.py's launches (run under torch.distributed.run, 2 CPU processes, gloo):
trains one agent through lib.sei.agents.train_agent, or makes one rank fail, and writes what it saw."""
import json
import sys
import traceback
from pathlib import Path


def main(mode: str, base: str, out: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch
    from lib.sei import agents as A
    from test_agent_training import RECIPE, TPL, _data
    out_dir = Path(out)
    rank = int(__import__("os").environ.get("RANK", "0"))
    try:
        if mode == "nan":                     # rank 1's first loss is not finite; rank 0's are
            real = A.answer_loss

            def loss(model, batch, answer, *a, **k):
                value = real(model, batch, answer, *a, **k)
                return value * float("nan") if rank == 1 else value
            A.answer_loss = loss
        if mode == "refuse":                  # train_agent's own check on "GPUs": rank 1's has no room, rank 0's has
            A._on_gpu = lambda acc: True
            A.gpu_free_bytes = lambda device=None: 1024.0 if rank == 1 else 1e15
        rec = A.train_agent(_data(out_dir / f"data{rank}"), out_dir / "agent", A.AgentRecipe(base=base, **RECIPE), TPL,
                            progress=False)
        result = {"ok": True, "curve": rec["curve"], "world": torch.distributed.get_world_size()}
    except Exception as e:                    # what each rank raised, for the test to read
        result = {"ok": False, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
