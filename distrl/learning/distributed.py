"""Several ranks, one run: ``torch.distributed`` ranks started by ``torchrun`` (or ``srun ... torchrun``),
or by ``distrl train distributed.nproc_per_node=K`` through torch's elastic launcher.

Every rank runs its own actors, slots and one learner thread on its share of the node's cores
(CUDA: ``cuda:LOCAL_RANK``). Before every optimizer step the learners average their gradients
(one all-reduce of the flattened gradients), so every rank holds the same weights; every
``distributed.check_interval`` updates a checksum of the weights is compared across ranks. Agent
steps are global (every update consumes ``T x B x world_size`` of them), so the budget, the
learning-rate schedule and every interval mean the same as on one rank with a batch of
``B x world_size``. Rank 0 alone writes checkpoints, TensorBoard, ``metrics.jsonl`` and runs
evaluations; the other ranks' finished episodes reach it through the learners' collectives.

Collectives run in the learner threads only, in lockstep (one gradient all-reduce per update), so
the ranks' schedule loops never have to agree on timing. The ranks also stop in lockstep: at the
end of the budget, or after a signal to any of them (its request travels with the episode
exchange), every learner returns after the same update, none in the middle of a collective.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import sys
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

import torch

from distrl.config.host import core_share
from distrl.utils.signals import Terminated

log = logging.getLogger(__name__)

WAIT_SLICE_SECONDS = 0.1


class RankMismatch(RuntimeError):
    """The ranks' weights differ (they must be identical after every update)."""


class CollectiveFailed(RuntimeError):
    """A collective between the ranks failed: another rank died, stopped or timed out."""


@dataclass
class Ranks:
    """This process's place among the ranks of a run.

    Attributes:
        rank, world_size: global rank and number of ranks.
        local_rank, local_world_size: rank on this node and ranks on this node.
        timeout: seconds a collective may wait for the other ranks.
        device: the device of the tensors the collectives move (``cuda:LOCAL_RANK`` with nccl).
        outgoing: this rank's finished episodes ``(return, length)`` not yet sent to rank 0.
        incoming: on rank 0, the other ranks' episodes received, for its logs.
        stop_requested: set by this rank's trainer (Ctrl-C, SIGTERM): the ranks are to stop together.
        group_stopped: set on every rank at the same update, by the episode exchange that found a
            rank's ``stop_requested`` set; ``stopped_by`` is the lowest such rank.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    timeout: float = 60.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where collectives' tensors live
    # the run's state between the ranks, not arguments
    outgoing: deque = field(default_factory=deque, init=False)
    incoming: deque = field(default_factory=deque, init=False)
    stop_requested: threading.Event = field(default_factory=threading.Event, init=False)
    group_stopped: threading.Event = field(default_factory=threading.Event, init=False)
    stopped_by: int | None = field(default=None, init=False)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------ collectives (learner thread)
    def _wait(self, work, stop) -> None:
        """Wait for a collective ``work`` in short blocking slices, each ending early when it
        completes, so that ``stop`` and the timeout are checked without spinning.

        Raises:
            CollectiveFailed: ``stop`` was set, the other ranks did not answer within ``timeout``
                seconds, or the collective failed.
        """
        completed = threading.Event()
        work.get_future().add_done_callback(lambda _: completed.set())
        deadline = time.monotonic() + self.timeout
        while not completed.wait(WAIT_SLICE_SECONDS):
            if stop is not None and stop.is_set():
                raise CollectiveFailed(f"rank {self.rank}: stopped while waiting for the other ranks")
            if time.monotonic() > deadline:
                raise CollectiveFailed(f"rank {self.rank}: the other ranks did not answer for {self.timeout:.0f} s "
                                       f"(distributed.timeout): one of them died or stopped")
        try:
            work.wait()
        except RuntimeError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: RuntimeError) -> CollectiveFailed:
        """The error of a collective that failed, whether at its call (the peer's connection already
        closed) or while it ran: in both a rank died or stopped."""
        return CollectiveFailed(f"rank {self.rank}: a collective failed (another rank died or stopped): "
                                f"{str(exc).splitlines()[0]}")

    def average_gradients(self, parameters, stop=None) -> None:
        """All-reduce (mean) the gradients of ``parameters`` in place: one flattened tensor, one collective."""
        import torch.distributed as dist

        params = [p for p in parameters if p.grad is not None]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        try:
            work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        except RuntimeError as exc:
            raise self._failed(exc) from exc
        self._wait(work, stop)
        flat /= self.world_size
        offset = 0
        for p in params:
            n = p.grad.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n

    def sum_(self, tensor: torch.Tensor, stop=None) -> None:
        """All-reduce (sum) ``tensor`` in place: e.g. the moments of a batch's observations, so every
        rank merges the same statistics (:mod:`distrl.nn.normalization`)."""
        import torch.distributed as dist

        try:
            work = dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=True)
        except RuntimeError as exc:
            raise self._failed(exc) from exc
        self._wait(work, stop)

    def check_identical(self, parameters, stop=None) -> None:
        """Compare a checksum of the weights (``parameters``: any tensors, the running statistics too)
        across ranks.

        Raises:
            RankMismatch: they differ, naming the ranks' checksums.
        """
        import torch.distributed as dist

        with torch.no_grad():
            local = torch.stack([torch.cat([p.detach().reshape(-1).double() for p in parameters]).sum().cpu(),
                                 torch.tensor(float(self.rank), dtype=torch.float64)]).to(self.device)
        gathered = [torch.zeros_like(local) for _ in range(self.world_size)]
        self._wait(dist.all_gather(gathered, local, async_op=True), stop)
        sums = [float(g[0]) for g in gathered]
        if any(s != sums[0] for s in sums):
            raise RankMismatch("the ranks' weights differ (checksum per rank: "
                               + ", ".join(f"{r}: {s!r}" for r, s in enumerate(sums)) + ")")

    def clear_stop(self) -> None:
        """Forget an earlier run's stop request (a trainer may train again)."""
        self.stop_requested.clear()
        self.group_stopped.clear()
        self.stopped_by = None

    def exchange_episodes(self, stop=None) -> None:
        """Send this rank's finished episodes to rank 0 (every rank calls it at the same update):
        two tensor all-gathers (the counts with the stop requests, then the padded ``(return,
        length)`` pairs). A rank's :attr:`stop_requested` sets :attr:`group_stopped` on every rank
        here, so that all of them stop after the same update, none in the middle of a collective."""
        import torch.distributed as dist

        mine = []
        while self.outgoing:
            mine.append(self.outgoing.popleft())
        count = torch.tensor([len(mine), int(self.stop_requested.is_set())], dtype=torch.int64, device=self.device)
        counts = [torch.zeros_like(count) for _ in range(self.world_size)]
        self._wait(dist.all_gather(counts, count, async_op=True), stop)
        asking = [rank for rank, c in enumerate(counts) if int(c[1])]
        if asking and not self.group_stopped.is_set():
            self.stopped_by = asking[0]
            self.group_stopped.set()
        counts = [c[0] for c in counts]
        most = max(int(c) for c in counts)
        if most == 0:
            return
        local = torch.zeros((most, 2), dtype=torch.float64)
        if mine:
            local[:len(mine)] = torch.tensor(mine, dtype=torch.float64)
        local = local.to(self.device)
        gathered = [torch.zeros_like(local) for _ in range(self.world_size)]
        self._wait(dist.all_gather(gathered, local, async_op=True), stop)
        if self.is_main:
            for rank, (n, rows) in enumerate(zip(counts, gathered, strict=True)):
                if rank != self.rank:
                    self.incoming.extend((float(r), int(n_steps)) for r, n_steps in rows[:int(n)].cpu().tolist())

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Every rank takes rank 0's weights (at the start, so that the ranks begin identical)."""
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)


def from_environment(backend: str, timeout: float) -> Ranks:
    """The ranks of this process from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``); with more than one, joins the process group
    (``backend`` ``auto``: nccl with CUDA, else gloo). Without those variables: one rank, nothing
    joined. Call :func:`take_core_share` first (before validation, which sizes the rank's share)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Ranks(timeout=timeout)
    import torch.distributed as dist

    ranks = Ranks(int(os.environ["RANK"]), world_size, int(os.environ.get("LOCAL_RANK", "0")),
                  int(os.environ.get("LOCAL_WORLD_SIZE", "1")), timeout)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":  # nccl moves CUDA tensors only: this rank's GPU
        ranks.device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(ranks.device)
    if not dist.is_initialized():
        dist.init_process_group(backend, store=_store(ranks, timeout), rank=ranks.rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
    return ranks


def _store(ranks: Ranks, timeout: float):
    """The key-value store the ranks meet in (``MASTER_ADDR:MASTER_PORT``, as ``env://``), under a prefix
    of the restart round: after an elastic restart the launcher's store still holds the previous
    round's addresses, and a rank that read one would wait for a peer that is gone."""
    import torch.distributed as dist

    agent_hosts_it = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ranks.world_size,
                          is_master=ranks.rank == 0 and not agent_hosts_it,
                          timeout=datetime.timedelta(seconds=timeout), multi_tenant=not agent_hosts_it)
    return dist.PrefixStore(f"distrl/round{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def take_core_share(local_rank: int | None = None, local_world_size: int | None = None) -> tuple[int, ...]:
    """Restrict this process to its contiguous share of the cores it may use (the cpuset split
    evenly among the node's ranks; every rank gets at least one). Returns the share. The rank and
    the ranks on this node default to ``torchrun``'s ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
    if local_world_size is None:
        local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    share = core_share(sorted(os.sched_getaffinity(0)), local_rank, local_world_size)
    os.sched_setaffinity(0, share)
    return share


def broadcast(ranks: Ranks, value):
    """``value`` of rank 0 on every rank (e.g. the run directory)."""
    if not ranks.enabled:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def shutdown(ranks: Ranks) -> None:
    if ranks.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def launch(nproc: int, argv: list[str], max_restarts: int = 0) -> int:
    """Start ``nproc`` ranks of ``python -m distrl train ARGV`` on this machine through torch's elastic
    launcher (a c10d rendezvous on a free port, never a fixed one). Returns the exit code: 0; 130 or 143
    when a rank alone got SIGINT or SIGTERM (the ranks stop together); or 1 naming the rank that
    failed first.

    Raises:
        KeyboardInterrupt, distrl.utils.signals.Terminated: SIGINT or SIGTERM reached this process; the
            launcher passed it on to the ranks (which stop together and save) and waited for them.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=max_restarts,
                          monitor_interval=0.5, start_method="spawn")
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "distrl", "train", *argv)
    except SignalException as exc:  # the launcher passed the signal on to the ranks and waited for them
        raise (Terminated() if exc.sigval == signal.SIGTERM else KeyboardInterrupt()) from None
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode in (130, 143):  # a signal to one rank: the others stopped with it (and saved)
            print(f"distrl train: a rank was {'interrupted' if failure.exitcode == 130 else 'terminated'}; "
                  f"the ranks stopped together", file=sys.stderr)
            return failure.exitcode
        print(f"distrl train: error: rank {rank} failed (exit code {failure.exitcode}); its own lines above "
              f"say why", file=sys.stderr)
        return 1
    return 0
