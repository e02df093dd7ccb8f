"""Worker for tests/test_trace.py::test_two_processes_stay_in_sync (run under torch.distributed.run):
trains the TRACE classifier one epoch with an Accelerator and saves this process's weights."""
import sys

import numpy as np
import torch
from PIL import Image


def main(model_dir: str, out: str) -> None:
    from accelerate import Accelerator
    from lib.data.records import MemeRecord
    from lib.models.encoders import load_encoder
    from lib.trace.model import TrainConfig
    from lib.trace.training import Trainer
    from lib.trace.features import FeatureCache, MemeBatchData
    acc = Accelerator(cpu=True)
    rng = np.random.default_rng(0)
    recs = []
    for i in range(40):
        p = f"{out}/img{i}.png"
        if acc.is_main_process:
            Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(p)
        recs.append(MemeRecord(str(i), p, f"meme {i} about zorblins", i % 2, "train" if i < 30 else "dev_seen",
                               captions={"vlm_caption": f"a red sun number {i % 7}"}))
    acc.wait_for_everyone()
    data = MemeBatchData.from_records(recs, ["vlm_caption"])
    enc = load_encoder(model_dir, device=str(acc.device))
    cache = FeatureCache(enc, data, lowest_unfrozen=2, progress=False)
    tr = Trainer(enc, data, TrainConfig(hidden=16, epochs=1, batch_size=4, lr=1e-2, unfreeze_text_layers=(-1,)),
                 cache, progress=False, accelerator=acc)
    tr.epoch(np.arange(30), 0)
    state = {**{f"clf.{k}": v for k, v in tr.model.state_dict().items()},
             **{f"enc.{n}": p.detach() for n, p in enc.model.named_parameters() if p.requires_grad}}
    torch.save({"world": acc.num_processes, "state": state}, f"{out}/rank{acc.process_index}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
