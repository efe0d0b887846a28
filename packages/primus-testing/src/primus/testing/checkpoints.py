"""Helpers for backend tests of checkpoints: presets derived from HF configs, and what a torch
distributed checkpoint holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from primus.testing.runs import primus


def resolved_model(framework: str, module: str, model: str, folder: Path) -> dict[str, Any]:
    """The resolved params of a one-module experiment using preset `model` (a name or a path
    relative to `folder`), after `primus config validate` accepted it."""
    exp = folder / f"exp-{Path(model).stem}.yaml"
    exp.write_text(
        f"modules:\n  pre_trainer:\n    framework: {framework}\n    config: {module}\n"
        f"    model: {model}\n"
    )
    for args in (
        ("config", "validate", str(exp)),
        ("config", "show", str(exp), "--format", "json"),
    ):
        result = primus(*args, cwd=folder)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads(result.stdout)["modules"]["pre_trainer"]["overrides"]


def derived_preset(framework: str, hf_config: dict[str, Any], folder: Path) -> Path:
    """`primus checkpoint preset` for an HF directory holding `hf_config`; the written file."""
    hf_dir = folder / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps(hf_config))
    out = folder / "derived.yaml"
    result = primus("checkpoint", "preset", "--hf", str(hf_dir), "--framework", framework,
                    "--out", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert out.read_text().startswith(f"# {framework} model preset derived from the Hugging Face")
    return out


def inspect_json(path: Path) -> dict[str, Any]:
    """`primus checkpoint inspect PATH --json`, parsed."""
    result = primus("checkpoint", "inspect", str(path), "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout)


def dcp_state(checkpoint: Path, out: Path) -> dict[str, Any]:
    """A torch distributed checkpoint (DCP) folder as one state dict, through a `torch.save`
    copy written at `out`."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, out)
    return dict(torch.load(out, weights_only=False))


def estimate_and_size(recipe: Path, overrides: list[str], checkpoint: Path) -> tuple[int, int]:
    """(the adapter's `checkpoint_bytes` for `recipe` with `overrides`, the bytes of the files
    under `checkpoint`, one saved checkpoint of that run)."""
    from primus.core.runtime import resolution

    module = next(iter(resolution.load(recipe, overrides).modules.values()))
    adapter = resolution.backend_for(module).adapter
    estimate = adapter.checkpoint_bytes(module)
    assert estimate is not None, "the run saves checkpoints: the adapter should tell their size"
    return estimate, sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())


def export_of_nothing(recipe: Path, folder: Path) -> str:
    """`primus checkpoint export` of `recipe` in a fresh workspace under `folder` (the run never
    trained), in this process: its stderr, once asserted a config error (exit 2, no
    traceback) that wrote no model."""
    from primus.testing.in_process import in_process, primus_here

    with in_process():
        done = primus_here("checkpoint", "export", "--config", str(recipe), "--hf",
                           str(folder / "out"), f"workspace={folder / 'ws'}")  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert not (folder / "out").exists()
    return done.stderr
