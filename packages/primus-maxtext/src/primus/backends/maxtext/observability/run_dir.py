"""MaxText's outputs (checkpoints, tensorboard, metrics) go into the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_param, register_patch


def _no_output_directory(ctx: PatchContext) -> bool:
    """base_output_directory is not set"""
    return not get_param(ctx, "base_output_directory")


@register_patch(
    "maxtext.run_dir",
    backend="maxtext",
    phase="setup",
    condition=_no_output_directory,
    backend_versions=TESTED,
    target="MaxText config base_output_directory, run_name",
    tags=("io",),
)
def run_dir(ctx: PatchContext) -> None:
    """MaxText writes to <base_output_directory>/<run_name>/: that becomes the run directory
    (or <run dir>/<run_name> when run_name is set), so checkpoints land in <run dir>/checkpoints
    and tensorboard in <run dir>/tensorboard; running the experiment again resumes from the
    latest checkpoint there."""
    assert ctx.run_dir is not None, "the runtime always sets the run directory"
    if get_param(ctx, "run_name"):
        ctx.set_param("base_output_directory", str(ctx.run_dir), "outputs into the run directory")
    else:
        ctx.set_param(
            "base_output_directory", str(ctx.run_dir.parent), "the run directory's parent"
        )
        ctx.set_param(
            "run_name", ctx.run_dir.name, "<base_output_directory>/<run_name> is the run directory"
        )
    out = Path(ctx.params["base_output_directory"]) / ctx.params["run_name"]
    log_rank_0(f"[maxtext] outputs: {out} (checkpoints/, tensorboard/)")


def _hlo_dump_to_tmp(ctx: PatchContext) -> bool:
    """dump_hlo is true and dump_hlo_local_dir is not set (MaxText's default: /tmp/xla_dump/)"""
    return bool(get_param(ctx, "dump_hlo")) and not get_param(ctx, "dump_hlo_local_dir")


def _hlo_dump_not_for_gcs(ctx: PatchContext) -> bool:
    """dump_hlo is true and dump_hlo_gcs_dir (default: under base_output_directory) is not gs://"""
    target = get_param(ctx, "dump_hlo_gcs_dir") or get_param(ctx, "base_output_directory")
    return bool(get_param(ctx, "dump_hlo")) and not str(target or "").startswith("gs://")


@register_patch(
    "maxtext.hlo_dump_dir",
    backend="maxtext",
    phase="setup",
    condition=_hlo_dump_to_tmp,
    backend_versions=TESTED,
    target="MaxText config dump_hlo_local_dir",
    tags=("io",),
)
def hlo_dump_dir(ctx: PatchContext) -> None:
    """The HLO dump (opt-in, `dump_hlo: true`) goes to <run dir>/hlo_dump instead of MaxText's
    hard-coded /tmp/xla_dump/, shared by every run on the machine."""
    assert ctx.run_dir is not None, "the runtime always sets the run directory"
    ctx.set_param(
        "dump_hlo_local_dir", str(ctx.run_dir / "hlo_dump"), "the HLO dump into the run directory"
    )


@register_patch(
    "maxtext.hlo_dump_kept",
    backend="maxtext",
    phase="before_train",
    condition=_hlo_dump_not_for_gcs,
    backend_versions=TESTED,
    target="maxtext.utils.gcs_utils.upload_dump",
    tags=("io",),
)
def hlo_dump_kept(ctx: PatchContext) -> None:
    """MaxText uploads the HLO dump to dump_hlo_gcs_dir after the first step and deletes the
    local copy: with no gs:// folder the upload failed (no credentials) and ended the run. The
    dump now stays in dump_hlo_local_dir, and the log says where."""

    def upload_dump(local_dir: str, target_dir: str, *args: Any, **kwargs: Any) -> None:
        log_rank_0(f"[maxtext] HLO dump kept in {local_dir} ({target_dir} is not gs://)")

    ctx.replace("maxtext.utils.gcs_utils", "upload_dump", upload_dump)
