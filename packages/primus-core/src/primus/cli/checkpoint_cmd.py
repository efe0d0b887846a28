"""`primus checkpoint import|export|preset|inspect|tiny`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from primus.cli.common import DEBUG, OVERRIDES, ConfigFile, Debug, Module

app = typer.Typer(
    rich_markup_mode="markdown",
    help="Checkpoints: Hugging Face model directories and each backend's native format.",
    no_args_is_help=True,
)


HFDir = Annotated[
    Path,
    typer.Option("--hf", help="A Hugging Face model directory (config.json + *.safetensors).",
                 show_default=False),
]  # fmt: skip


@app.command("import", context_settings=OVERRIDES)
def import_(
    ctx: typer.Context, hf: HFDir, config: ConfigFile, module: Module = None, debug: Debug = False
) -> None:
    """Convert an HF model into the experiment's native checkpoint, in its run directory, so
    `primus train` starts from it. The HF config must match the experiment's model: each
    differing field is named (exit 2). Overrides may follow the options."""
    from primus.core.runtime import PrimusRuntime

    runtime = PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on, converting=True)
    typer.echo(f"imported {hf} into {runtime.import_hf(hf)}")


@app.command(context_settings=OVERRIDES)
def export(
    ctx: typer.Context,
    config: ConfigFile,
    hf: Annotated[
        Path | None,
        typer.Option(
            "--hf", help="The HF model directory to write (LoRA merged in).", show_default=False
        ),
    ] = None,
    adapter: Annotated[
        Path | None,
        typer.Option(
            "--adapter",
            help="A LoRA run: the PEFT adapter folder to write "
            "(adapter_config.json, adapter_model.safetensors).",
            show_default=False,
        ),
    ] = None,
    iteration: Annotated[
        int | None,
        typer.Option("--iteration", min=0, help="The checkpoint to export (default: latest)."),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace a non-empty --hf or --adapter.")
    ] = False,
    module: Module = None,
    debug: Debug = False,
) -> None:
    """Write the experiment's checkpoint as an HF model directory that transformers loads.
    From an HF import (init_from, or `primus checkpoint import`), that model comes back as it
    went in: its config.json, tokenizer (unless the experiment names its own) and
    generation_config.json, in its dtype unless the backend's export dtype option is set; the
    log says which dtype was written and why. A LoRA run's adapters go to --adapter as a PEFT
    adapter that `peft.PeftModel.from_pretrained(base, folder)` loads onto the HF model the run
    started from. Overrides may follow the options."""
    from primus.core.reliability.atomic import check_replaceable
    from primus.core.runtime import PrimusRuntime

    if hf is None and adapter is None:
        raise typer.BadParameter("name what to write: --hf, --adapter or both",
                                 param_hint="--hf / --adapter")  # fmt: skip
    if hf is not None and adapter is not None and hf.resolve() == adapter.resolve():
        raise typer.BadParameter("the model and the adapter need folders of their own",
                                 param_hint="--hf / --adapter")  # fmt: skip
    for out in (hf, adapter):  # at once, not after the backend is built
        if out is not None:
            check_replaceable(out, force)
    runtime = PrimusRuntime(config, list(ctx.args), module=module, debug=DEBUG.on, converting=True)
    if hf is not None:
        typer.echo(f"exported {runtime.export_hf(iteration, hf, force)}")
    if adapter is not None:
        typer.echo(f"exported {runtime.export_adapter(iteration, adapter, force)}")


@app.command()
def preset(
    hf: HFDir,
    framework: Annotated[
        str | None,
        typer.Option(
            "--framework", help="The backend whose preset to write (default: the only ready one)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the YAML here (default: stdout).")
    ] = None,
    debug: Debug = False,
) -> None:
    """Derive a backend's model preset from an HF config.json (shapes, norms, RoPE, MoE), so
    architecture numbers are never copied by hand. Unsupported fields are named (exit 2)."""
    from primus.core.checkpoint.preset import derive_preset, pick_framework
    from primus.core.errors import ConfigError
    from primus.core.folders import unwritable
    from primus.core.reliability.atomic import write_atomic

    text = derive_preset(hf, pick_framework(framework))
    if out is None:
        typer.echo(text, nl=False)
        return
    why = unwritable(out.parent)
    if why is None and out.is_dir():
        why = "it is a folder"
    if why is None and out.exists() and out.resolve().parent == hf.resolve():
        why = f"it is a file of the HF model {hf}"
    if why is not None:
        raise ConfigError(f"cannot write {out}: {why}", hint="name another file for the preset")
    write_atomic(out, text)
    typer.echo(f"wrote {out}")


@app.command()
def inspect(
    path: Annotated[
        Path,
        typer.Argument(help="A checkpoint folder (HF or a backend's native).", show_default=False),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    debug: Debug = False,
) -> None:
    """Say what a checkpoint is: format, backend, iteration, model shape, parallel layout,
    size, and the Primus run that wrote it. HF directories are read from their file headers;
    native formats are recognised by the installed backends."""
    from primus.core.checkpoint.inspect import inspect_checkpoint, render

    info = inspect_checkpoint(path)
    typer.echo(json.dumps(info, indent=2) if as_json else "\n".join(render(info)))


@app.command()
def tiny(
    hf: Annotated[
        Path,
        typer.Option("--hf", help="The HF model directory to write.", show_default=False),
    ],
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer",
            help="An HF tokenizer folder (or its tokenizer.json) to copy into it.",
            show_default=False,
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of the random weights.")
    ] = 0,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --hf.")] = False,
    debug: Debug = False,
) -> None:
    """Write a tiny random-initialised Llama-3 HF model (2 layers, hidden 64, vocabulary 256;
    config.json + fp32 safetensors), with the tokenizer of `--tokenizer`: the model of the CPU
    fine-tuning recipes. Needs torch and transformers. For `configs/*/sft-tiny-cpu.yaml`:
    `primus checkpoint tiny --tokenizer configs/data/sft-tiny/tokenizer --hf output/sft-tiny/hf`."""
    from primus.core.checkpoint.tiny import write_tiny_model

    typer.echo(f"wrote {write_tiny_model(hf, tokenizer, seed, force)}")
