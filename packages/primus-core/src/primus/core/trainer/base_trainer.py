"""BaseTrainer: the lifecycle every backend's trainer follows (the original backend guide's)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import log_rank_0


class BaseTrainer(ABC):
    """setup -> init -> train -> cleanup, driven by PrimusRuntime (which runs the patches).

    `rank`, `world_size`, `local_rank` come from the torchrun (or Slurm) environment.
    `stages` names the stages this trainer runs; the runtime refuses any other.
    """

    stages: ClassVar[tuple[str, ...]] = ("pretrain",)

    def __init__(self, backend_args: Any) -> None:
        self.backend_args = backend_args
        env = get_torchrun_env()
        self.dist_env = env
        self.rank = env.rank
        self.world_size = env.world_size
        self.local_rank = env.local_rank

    def setup(self) -> None:  # noqa: B027 - optional hook
        """Checks and set-up before the model is built."""

    @abstractmethod
    def init(self) -> None:
        """Build the model, optimizer and data."""

    @abstractmethod
    def train(self) -> None:
        """Run the training loop."""

    def cleanup(self, on_error: bool = False) -> None:  # noqa: B027 - optional hook
        """Release resources; called after training, and also after a failure (`on_error`)."""

    def already_finished(self, step: int, key: str, above: int | None = None) -> None:
        """Say that the run resumed from a checkpoint at its last step (or past it) and trained
        nothing: every backend then exits 0 with this line. `key` is the param that sets the
        steps, to be raised above `above` (default `step`) to train further."""
        log_rank_0(
            f"the run already finished at step {step}: nothing was trained (raise {key} above "
            f"{step if above is None else above} to train further)"
        )
