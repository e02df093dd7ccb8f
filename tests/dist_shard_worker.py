"""Worker for tests/test_sharding.py (run under torch.distributed.run, 2 CPU processes): CLIP4DM's attributions and
an agent's generations, each process running its share, every process writing the merged result it got."""
import json
import sys
from pathlib import Path


def main(clip_dir: str, agent_dir: str, images: str, out: str) -> None:
    import os
    from lib.clip4dm.method import CLIP4DM
    from lib.clip4dm.runs import attribute_pairs
    from lib.models.chat import ResponseCache
    from lib.sei.agents import agent_chat, run_agent
    rank = int(os.environ["RANK"])
    paths = json.loads(Path(images).read_text())
    pairs = [(paths[(3 * i) % len(paths)], f"caption number {i} of a red sun") for i in range(11)]
    rows = attribute_pairs(CLIP4DM.from_pretrained(clip_dir, device="cpu", epsilon=0.0), pairs,
                           Path(out) / "attr.jsonl", batch_size=2, progress=False, workers=0)
    chat = agent_chat(agent_dir, ResponseCache(Path(out) / f"cache{rank}.sqlite"), batch_size=2)
    answers = [r.text for r in run_agent(chat, "explain {ocr}", [(p, {"ocr": f"text {i}"}) for i, p in
                                                                enumerate(paths)], 5, progress=False)]
    Path(out, f"rank{rank}.json").write_text(json.dumps({"rows": rows, "answers": answers}))


if __name__ == "__main__":
    main(*sys.argv[1:5])
