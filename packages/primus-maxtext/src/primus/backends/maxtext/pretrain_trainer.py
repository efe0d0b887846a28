"""The pretrain trainer: MaxText's own `maxtext.trainers.pre_train.train.main`, in two halves."""

from __future__ import annotations

import re
from typing import Any

from primus.backends.maxtext.config.checks import no_rows
from primus.backends.maxtext.config.mesh import mesh_origin
from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0
from primus.core.trainer.base_trainer import BaseTrainer


class MaxTextPretrainTrainer(BaseTrainer):
    """`backend_args` is a MaxTextArgs: MaxText's argv, already validated by the adapter.

    init() is MaxText's `initialize(argv)` (config, JAX settings, goodput recorder); train() is
    the rest of its `main`: the training loop with checkpointing, tensorboard and its step log.
    """

    config: Any = None
    recorder: Any = None
    corpus_rows: Any = None  # set by the maxtext.corpus_data patch

    def init(self) -> None:
        import jax

        from maxtext.trainers.pre_train import train
        from maxtext.utils.maxtext_utils import create_device_mesh

        self.config, self.recorder = train.initialize(self.backend_args.argv)
        origins = self.backend_args.origins
        try:  # the mesh MaxText will build: only now are a GPU's devices known (CPU's before)
            create_device_mesh(self.config)
        except (AssertionError, ValueError) as exc:
            raise ConfigError(
                f"MaxText cannot lay out its mesh on {jax.device_count()} device(s): "
                + " ".join(str(exc).split()),
                mesh_origin(origins, self.backend_args.config),
                hint="the ici_*_parallelism keys must multiply to the devices of a slice, the "
                "dcn_* keys to the slices (num_slices); -1 takes the rest",
            ) from exc
        error = no_rows(
            self.config.per_device_batch_size,
            jax.device_count(),
            origins.get("per_device_batch_size"),
        )
        if error is not None:
            raise error

    def train(self) -> None:
        import jax

        from maxtext.common.goodput import (
            RECORD_JOB_START_TIME,
            maybe_monitor_goodput,
            record_goodput,
        )
        from maxtext.trainers.pre_train import train

        self.check_corpus_read()
        devices = jax.devices()
        log_rank_0(
            f"[maxtext] training: {self.config.steps} steps on {len(devices)} "
            f"{devices[0].platform} device(s) in {jax.process_count()} process(es)"
        )
        record_goodput(self.recorder, RECORD_JOB_START_TIME)
        with maybe_monitor_goodput(self.config):
            try:
                train.get_train_func(self.config, self.recorder, self.backend_args.argv)()
            except RuntimeError as exc:  # maxtext.utils.train_utils.validate_completed_steps
                if not str(exc).startswith("Requested training up to step"):
                    raise
                # the checkpoint is at the last step or past it: as on every backend, exit 0
                done = re.search(r"which means (\d+) steps have been completed", str(exc))
                self.already_finished(int(done[1]) if done else self.config.steps, "steps")

    def check_corpus_read(self) -> None:
        """A prepared corpus at `dataset_path` is what the loop reads, not synthetic data."""
        from pathlib import Path

        path = self.config.dataset_path
        if self.corpus_rows is not None or self.config.dataset_type != "synthetic" or not path:
            return
        if Path(f"{path}.idx").expanduser().is_file():
            raise ConfigError(
                f"maxtext: dataset_path names the prepared corpus {path}, and the patch "
                "maxtext.corpus_data did not run, so MaxText would train on synthetic data",
                hint="leave maxtext.corpus and maxtext.corpus_data enabled (PRIMUS_PATCHES), "
                "or drop dataset_path for synthetic data",
            )
