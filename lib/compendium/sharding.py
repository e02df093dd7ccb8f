"""Work spread over the processes of a launch (`accelerate launch` or `torchrun`: several GPUs), merged in a fixed
order, so that N processes give what one process gives.

The unit of work is the chunk one process would run as one batch: chunk j of the one-process order goes to rank
j mod N, each rank runs its chunks as the one process would, and every rank then holds every chunk's result in the
one-process order (`all_chunks`). The same batches make the same numbers: a model sees the same inputs padded the
same way whichever process runs them. One process (no launch) runs everything itself, with nothing to gather.
"""
from __future__ import annotations

import atexit
import os
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def launch() -> tuple[int, int]:
    """(rank, world size) of this process in a launch, (0, 1) outside one (from the environment a launcher sets)."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError as e:
        raise ValueError(f"RANK / WORLD_SIZE in the environment are not whole numbers: {e}") from None


def chunks(items: Sequence[T], size: int) -> list[list[T]]:
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    return [list(items[s:s + size]) for s in range(0, len(items), size)]


def mine(n_chunks: int, rank: int, world: int) -> list[int]:
    """The chunk indices rank `rank` of `world` runs: j mod world == rank."""
    return [j for j in range(n_chunks) if j % world == rank]


def _gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order, on every rank: torch.distributed's object all-gather over the launch's
    process group (joined from the launcher's environment if nothing has yet: NCCL with GPUs, else gloo)."""
    dist = _group()
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _group():
    """torch.distributed with the launch's process group joined (NCCL on each process's own GPU, else gloo)."""
    import torch
    import torch.distributed as dist
    if not dist.is_initialized():
        if torch.cuda.is_available():
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            dist.init_process_group(backend="nccl", device_id=torch.device("cuda", local))
        else:
            dist.init_process_group(backend="gloo")
        atexit.register(_leave)
    return dist


def _leave() -> None:
    """Leave the process group this module joined, before the interpreter exits: a gloo group left to the
    interpreter's teardown can abort the process ("terminate called without an active exception") after its
    work is done and written."""
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    """Every process of a launch waits here for the others (nothing outside a launch)."""
    if launch()[1] > 1:
        _group().barrier()


def all_chunks(items: Sequence[T], size: int, run: Callable[[list[T]], list[R]],
               rank_world: tuple[int, int] | None = None) -> list[R]:
    """`run` on each chunk of `size` items, the chunks shared over the launch's processes; the results of every
    chunk, in the items' order, on every process. `run` returns one result per item of its chunk."""
    rank, world = rank_world or launch()
    parts = chunks(items, size)
    if world == 1:
        return [r for part in parts for r in _checked(run, part)]
    # a rank whose work raises still joins the gather (with its error instead of its chunks), so the others learn
    # of it and raise too, rather than wait in the gather until the process group's timeout
    failure: BaseException | None = None
    try:
        done, error = {j: _checked(run, parts[j]) for j in mine(len(parts), rank, world)}, None
    except Exception as e:                              # noqa: BLE001  (re-raised below, after the gather)
        failure, done, error = e, {}, f"{type(e).__name__}: {e}"
    merged: dict[int, list[R]] = {}
    errors = []
    for r, (got, err) in enumerate(_gather((done, error))):
        merged.update(got)
        if err is not None:
            errors.append(f"rank {r}: {err}")
    if failure is not None:
        raise failure
    if errors:
        raise RuntimeError(f"sharded work failed on {len(errors)} of the {world} processes: " + "; ".join(errors))
    missing = sorted(set(range(len(parts))) - set(merged))
    if missing:
        raise RuntimeError(f"sharded work: chunks {missing[:10]} came back from no process of the {world}")
    return [r for j in range(len(parts)) for r in merged[j]]


def _checked(run: Callable[[list[T]], list[R]], part: list[T]) -> list[R]:
    out = list(run(part))
    if len(out) != len(part):
        raise ValueError(f"sharded work: a chunk of {len(part)} items gave {len(out)} results")
    return out


def generate(chat, conversations: Sequence[Any], params, **kw) -> list[Any]:
    """`chat.generate_many` over the launch's processes: chunks of the chat's batch size (the batches one process
    generates when nothing is cached and no request repeats), every answer on every process in input order.
    Outside a launch it is `chat.generate_many` itself."""
    rank, world = launch()
    if world == 1:
        return chat.generate_many(conversations, params, **kw)
    kw = {**kw, "progress": False}
    return all_chunks(conversations, max(1, int(chat.batch_size)),
                      lambda part: chat.generate_many(part, params, **kw), (rank, world))
