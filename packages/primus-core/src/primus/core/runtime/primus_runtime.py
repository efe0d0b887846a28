"""PrimusRuntime: the one owner of the training lifecycle (docs/architecture.md, "Lifecycle")."""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from primus.core import __version__
from primus.core.backend.backend_registry import BackendRegistry, require
from primus.core.checkpoint.convert import export_adapter, export_hf, import_hf, init_from_hf
from primus.core.checkpoint.provenance import PROVENANCE_FILE, write_provenance
from primus.core.config.experiment import Experiment, resolved_tree
from primus.core.config.render import args_summary, to_yaml
from primus.core.config.tree import ConfigTree
from primus.core.errors import ConfigError, Origin, filesystem_error
from primus.core.folders import check_temp_dir, unwritable
from primus.core.launch.dist_env import get_torchrun_env
from primus.core.logging import get_logger, setup_logging, write_refused
from primus.core.patches.patch import PatchContext
from primus.core.patches.runner import APPLIED, PatchRunner
from primus.core.projection import Job
from primus.core.reliability import preemption
from primus.core.reliability.atomic import write_atomic
from primus.core.reliability.out_of_memory import out_of_memory, projected_gib
from primus.core.runtime import resolution
from primus.core.trainer.base_trainer import BaseTrainer


def _size(count: int) -> str:
    """Bytes as MiB, or GiB from 1 GiB on."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


class PrimusRuntime:
    """load + validate config -> adapter -> upstream version -> patches[setup] -> prepare_backend
    -> convert_config -> patches[build_args] -> load_trainer_class(stage) -> config.resolved.yaml
    -> provenance -> init_from import (when the run has none yet) -> preemption signals watched
    -> trainer setup/init -> patches[before_train] -> train -> patches[after_train] -> cleanup
    (also on error, with on_error=True)."""

    def __init__(
        self,
        config: Path,
        overrides: list[str] | None = None,
        stage: str = "pretrain",
        module: str | None = None,
        debug: bool = False,
        converting: bool = False,
        check_inputs: bool = False,
    ) -> None:
        """`converting`: this process only converts a checkpoint (`resolution.backend_for`).
        `check_inputs`: the workspace and the files the module reads are checked before the
        upstream is imported, and nothing is written (a run, a dry run, `config validate`;
        not the workers of a Primus launcher, which checked them once for all)."""
        self.started = time.perf_counter()
        self.experiment: Experiment = resolution.load(config, overrides, module, single=True)
        self.module = next(iter(self.experiment.modules.values()))
        self.stage = stage
        self.debug = debug
        setup_logging("DEBUG" if debug else self.experiment.log_level)  # console, until run()
        self.env_changes = resolution.apply_env(self.experiment.env)
        self.run_dir = self.experiment.run_dir.resolve()
        if check_inputs:
            self.check_run_dir()
            check_temp_dir()
        began = time.perf_counter()
        self.adapter, self.source_tree, self.undecided = resolution.backend_for(
            self.module, converting, inputs=check_inputs, stage=stage
        )
        self.loaded_in = time.perf_counter() - began  # told once the run's log is set up
        if check_inputs:
            self.check_free_space()
        self.adapter.check_stage(stage)  # a stage the adapter does not declare: nothing written
        self.selection = resolution.patch_selection(self.experiment)
        self.runner = PatchRunner(
            self.module.framework, self.selection, self.experiment.patches.get("on_error", "fail")
        )
        self.rank = get_torchrun_env().rank
        self.log = get_logger()

    def _context(self, version: str | None) -> PatchContext:
        return PatchContext(
            self.module.framework,
            "setup",
            version,
            __version__,
            self.module.params,
            run_dir=self.run_dir,
            stage=self.stage,
            extra={"experiment": self.experiment, "module": self.module},
            config_tree=self.module.tree,
        )

    def _phase(self, ctx: PatchContext, phase: str) -> None:
        ctx.phase = phase
        self.runner.run(ctx)

    def check_run_dir(self) -> None:
        """The run directory can be made and take files, or a ConfigError naming the workspace
        and where it was set, before any work. Makes nothing: a probe file goes into the
        nearest existing folder, and is removed at once."""
        why = unwritable(self.run_dir, create=False)
        if why is not None:
            raise ConfigError(
                f"workspace '{self.experiment.workspace}' cannot hold the run directory "
                f"{self.run_dir}: {why}",
                self.experiment.tree.origin(("workspace",)),
                hint="set workspace (or PRIMUS_WORKSPACE) to a folder you can write, "
                "or make this one writable",
            )

    def check_free_space(self) -> None:
        """A ConfigError where the workspace's file system has less room than one checkpoint of
        this run (the adapter's `checkpoint_bytes`), before any work."""
        needed = self.adapter.checkpoint_bytes(self.module)
        if not needed:
            return
        existing = next(p for p in (self.run_dir, *self.run_dir.parents) if p.exists())
        free = shutil.disk_usage(existing).free
        if needed > free:
            raise ConfigError(
                f"the workspace's file system ({existing}) has {_size(free)} free, and one "
                f"checkpoint of this run takes about {_size(needed)} (the model's weights and "
                "optimizer state)",
                self.experiment.tree.origin(("workspace",)),
                hint="free space there, set workspace (or PRIMUS_WORKSPACE) to a larger file "
                "system, or save no checkpoints",
            )

    def holds_replicas(self, processes: int) -> bool:
        """Whether `processes` split into whole model replicas of the size the adapter's
        `parallel_sizes` give."""
        replica = math.prod(self.adapter.parallel_sizes(self.module).values())
        return replica > 0 and processes % replica == 0

    def check_world(self, processes: int, how: str) -> None:
        """A ConfigError where `processes` (started as `how` says) cannot be split into model
        replicas of the size the adapter's `parallel_sizes` give, or the adapter's
        `check_launch` refuses them, before anything starts."""
        if self.holds_replicas(processes):
            self.adapter.check_launch(self.module, processes)
            return
        sizes = self.adapter.parallel_sizes(self.module)
        replica = math.prod(sizes.values())
        product = " x ".join(f"{key} {value}" for key, value in sizes.items())
        at = next((k for k, v in sizes.items() if v > 1 and self.module.origin(k)), None)
        raise ConfigError(
            f"{processes} process{'es' * (processes != 1)} ({how}) cannot hold model replicas "
            f"of {replica} processes "
            f"({product})",
            self.module.origin(at) if at else None,
            hint=f"start a multiple of {replica} processes, or make the parallel sizes divide "
            f"{processes}",
        )

    def run(self, dry_run: bool = False, full: bool = False) -> None:
        """Train (the workspace checked at `check_inputs`, here or by the launcher), or with
        `dry_run` print the plan: without the upstream, unless `full` (or the adapter's
        `check_params` said only the full check can judge the params) builds the backend
        args as the run does, and prints them."""
        level = "DEBUG" if self.debug else self.experiment.log_level
        setup_logging(
            level,
            None if dry_run else self.run_dir / "logs",
            console_all_ranks=os.environ.get("PRIMUS_LOG_ALL_RANKS") == "1",
        )
        info = BackendRegistry.info(self.module.framework)
        for change in self.env_changes:
            self.log.info(change)
        for note in self.experiment.notes:
            self.log.warning(note)
        where = "--debug" if self.debug else self.experiment.tree.origin(("log_level",))
        self.log.debug(f"log level {level}, set by {where}")
        if self.source_tree:
            self.log.info(f"upstream source tree: {self.source_tree}")
        version = resolution.backend_version(self.adapter)
        origin = f"{info.distribution} {info.version}" if info.distribution else "in-process"
        upstream = (
            f"upstream {info.upstream_requirement} = {version}"
            if info.upstream_requirement
            else f"no upstream, version {version}"
        )
        self.log.info(
            f"primus {__version__} | {self.stage} | backend {info.name} ({origin}) | "
            f"{upstream} | run dir {self.run_dir}"
        )
        self._took("the backend loaded and the config checked", self.loaded_in)
        ctx = self._context(version)
        failed = False
        try:
            if dry_run and not full:
                if not self.undecided:
                    self._print_plan(ctx, None)
                    return
                self.log.info(f"checking in full: {self.undecided}")
            began = time.perf_counter()
            trainer_class = self._check(ctx)
            self._took(
                "the config converted (setup and build_args patches)", time.perf_counter() - began
            )
            if self.rank == 0 and not dry_run:
                self._write_resolved_config()
            if dry_run:
                self._print_plan(ctx, trainer_class)
                return
            if self.rank == 0:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                preemption.clear(self.run_dir)
                write_provenance(
                    self.run_dir / PROVENANCE_FILE, self.experiment, self.module,
                    self.module.init_from,
                )  # fmt: skip
            if self.module.init_from is not None:
                began = time.perf_counter()
                init_from_hf(
                    self.adapter, self.experiment, self.module, ctx.backend_args, self.rank
                )
                self._took("the Hugging Face checkpoint ready", time.perf_counter() - began)
            trainer = trainer_class(backend_args=ctx.backend_args)
            ctx.extra["trainer"] = trainer
            self._drive(trainer, ctx)
        except (SystemExit, KeyboardInterrupt, GeneratorExit):
            failed = True
            raise
        except BaseException as exc:  # torch.distributed.checkpoint's failures are BaseExceptions
            failed = True
            refused = filesystem_error(exc, self.run_dir) or out_of_memory(
                exc, self.rank, lambda: projected_gib(self.adapter, ctx.backend_args, self.applied)
            )
            if refused is None:
                raise
            raise refused from exc
        finally:
            if not dry_run:
                self._finish(failed)
        if not dry_run and (refused_log := write_refused()) is not None:
            raise filesystem_error(refused_log) or refused_log  # a log file on a full disk

    def _finish(self, failed: bool) -> None:
        """patch_report.json and the patch table, also after a failure. When the run failed
        already, a report the disk refuses is a warning: the run's own error is the one told."""
        try:
            if self.rank == 0:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self.runner.write_report(self.run_dir / "patch_report.json")
        except OSError as exc:
            refused = filesystem_error(exc, self.run_dir)
            if not failed:
                if refused is None:
                    raise
                raise refused from exc
            self.log.warning(f"patch_report.json not written: {exc.strerror or exc}")
        self.log.info("patches:\n" + self.runner.table())

    def build_args(self, ctx: PatchContext) -> None:
        """patches[setup] -> prepare_backend -> convert_config -> patches[build_args]: after
        this the module's config holds every value the patches set, with its origin."""
        self._phase(ctx, "setup")
        self.adapter.prepare_backend(self.module)
        ctx.backend_args = self.adapter.convert_config(self.module)
        self._phase(ctx, "build_args")

    def _check(self, ctx: PatchContext) -> type[BaseTrainer]:
        """What a dry run checks: build_args (the backend's own validation) and the trainer."""
        self.build_args(ctx)
        return resolution.trainer_class(self.adapter, self.stage)

    def validate(self, full: bool = False) -> None:
        """`primus config validate`, writing nothing: the checks that import no upstream (made
        when this runtime was built with `check_inputs`); with `full`, those of a dry run too
        (the setup and build_args patches, the backend's own validation, the trainer class),
        also made where the adapter's `check_params` says only they can judge the params."""
        if self.undecided and not full:
            self.log.info(f"checking in full: {self.undecided}")
        if full or self.undecided:
            self._check(self._context(resolution.backend_version(self.adapter)))

    def backend_args(self) -> Any:
        """The backend args after the setup and build_args patches, as a dry run builds them."""
        ctx = self._context(resolution.backend_version(self.adapter))
        self.build_args(ctx)
        return ctx.backend_args

    def import_hf(self, hf_dir: Path) -> Path:
        """`primus checkpoint import`: the HF model in `hf_dir` as the run's native
        checkpoint, checked against the experiment's model; the folder written."""
        from primus.core.config.inputs import check_hf_model

        self.module.init_from = hf_dir.resolve()
        self.module.init_from_origin = Origin("cli", detail=f"--hf {hf_dir}")
        resolution.check_init_from(self.module, self.adapter)
        check_hf_model(self.module.init_from)  # before the backend loads or a folder is made
        self.adapter.host_only = True
        args = self.backend_args()
        return import_hf(self.adapter, self.experiment, self.module, args, self.module.init_from)

    def export_hf(self, iteration: int | None, out: Path, force: bool = False) -> Path:
        """`primus checkpoint export`: the run's checkpoint as an HF directory at `out`."""
        require(self.adapter, "hf-export")
        self.adapter.host_only = True
        args = self.backend_args()
        return export_hf(self.adapter, self.experiment, self.module, args, iteration, out, force)

    def export_adapter(self, iteration: int | None, out: Path, force: bool = False) -> Path:
        """`primus checkpoint export --adapter`: the run's LoRA adapters as a PEFT adapter."""
        if self.module.peft is None:
            raise ConfigError("the experiment has no peft: section, so its checkpoints hold no "
                              "adapters", hint="export the whole model with --hf")  # fmt: skip
        require(self.adapter, "lora-export")
        self.adapter.host_only = True
        args = self.backend_args()
        return export_adapter(self.adapter, self.experiment, self.module, args, iteration, out,
                              force)  # fmt: skip

    def training_job(self, gpus: int) -> Job:
        """The job on `gpus` GPUs as the projection and the benchmarks see it (the backend
        args built as a dry run builds them, its patches included)."""
        require(self.adapter, "memory-projection")
        self.adapter.host_only = True
        args = self.backend_args()
        return self.adapter.training_job(args, gpus, self.applied)

    @property
    def applied(self) -> frozenset[str]:
        """The patches applied so far."""
        return frozenset(o.id for o in self.runner.outcomes.values() if o.status == APPLIED)

    def patched_config(self) -> ConfigTree:
        """The resolved experiment after the setup and build_args patches (as a dry run
        applies them): `primus config show --after-patches`."""
        self.backend_args()
        return resolved_tree(self.experiment)

    def _write_resolved_config(self) -> None:
        """config.resolved.yaml, written after build_args so patch-set values show, with origin."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(
            self.run_dir / "config.resolved.yaml",
            f"# resolved by primus {__version__} from {self.experiment.path}\n"
            + to_yaml(resolved_tree(self.experiment), provenance=True),
        )

    def _drive(self, trainer: BaseTrainer, ctx: PatchContext) -> None:
        start = time.perf_counter()
        preemption.watch()  # SIGTERM/SIGINT/SIGUSR1 from here on: stop at a step, with a checkpoint
        try:
            with preemption.stopping_before_training(self.run_dir, self.rank):
                began = time.perf_counter()
                trainer.setup()
                self._took("the trainer set up", time.perf_counter() - began)
                began = time.perf_counter()
                trainer.init()
                self._took("the model, optimizer and data built", time.perf_counter() - began)
                self.log.info(
                    f"start-up: done in {time.perf_counter() - self.started:.1f} s; training starts"
                )
                preemption.training_starts(self.run_dir, self.rank)
                self._phase(ctx, "before_train")
                trainer.train()
            self._phase(ctx, "after_train")
        except BaseException:
            try:
                trainer.cleanup(on_error=True)
            except Exception:
                self.log.exception("cleanup(on_error=True) failed as well")
            raise
        trainer.cleanup()
        self.log.info(
            f"{self.stage} finished in {time.perf_counter() - start:.1f} s; run dir {self.run_dir}"
        )

    def _took(self, what: str, seconds: float) -> None:
        """One start-up progress line: what is done, and the seconds it took."""
        self.log.info(f"start-up: {what} in {seconds:.1f} s")

    def _print_plan(self, ctx: PatchContext, trainer_class: type[BaseTrainer] | None) -> None:
        """The trainer, the backend args and the patch plan; without `trainer_class` (a dry run
        that imported no upstream), the trainer as the adapter names it and no args."""
        if trainer_class is None:
            named = self.adapter.trainers.get(self.stage, "(load_trainer_class)")
            print(f"# trainer: {named} (not imported; --full imports it)")
            print(
                "# backend args: not built (--full builds them with the upstream, as the run does)"
            )
        else:
            print(f"# trainer: {trainer_class.__module__}.{trainer_class.__qualname__}")
            print(f"# backend args ({type(ctx.backend_args).__name__})")
            print(args_summary(ctx.backend_args), end="")
        print("# patch plan")
        plan = self.runner.static_plan(ctx.backend_version) if trainer_class is None else None
        for patch, verdict in plan or self.runner.plan(ctx):
            print(f"{patch.phase:<13} {patch.id:<40} {verdict}")
