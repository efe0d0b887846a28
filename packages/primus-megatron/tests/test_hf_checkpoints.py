"""HF checkpoints into and out of Megatron on CPU, against transformers: tiny random models of
every family (one in bf16), imported and run through Megatron's own forward
(megatron_forward.py, all of them in one run), exported back with the source's config.json,
tokenizer, generation_config.json and dtype; one `primus train` run that starts from an HF model
(`init_from`), trains, saves and is inspected and exported; bad HF directories refused. What
runs in one process runs in the test process (`primus.testing.in_process`); `checkpoint inspect`,
whose output is read, in processes forked from one that imported Megatron once."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from primus.testing import checkpoints, runs
from primus.testing.checkpoints import export_of_nothing, inspect_json
from primus.testing.faults import Forks
from primus.testing.forked import forked
from primus.testing.hf_models import hf_logits, make_hf_model
from primus.testing.in_process import in_process, primus_here
from primus.testing.runs import losses, train_run
from primus.testing.scripts import run_script_here, script

pytestmark = pytest.mark.slow
RECIPE = Path(__file__).parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
FORWARD = Path(__file__).with_name("megatron_forward.py")
# name -> (family, changes to its tiny config.json)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": ("llama3", {}),
    "llama3_tied": ("llama3", {"tie_word_embeddings": True}),
    "qwen2.5": ("qwen2.5", {}),
    "qwen3": ("qwen3", {}),
    "mixtral": ("mixtral", {}),
}
TRAIN = ("train_iters=4", "save_interval=2")
BF16 = "qwen3"  # the model whose source is bf16, as published models are
CARRIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def experiment(folder: Path, hf: Path, init_from: bool = False) -> Path:
    """An experiment on the tiny CPU recipe whose model preset is derived from `hf`."""
    from primus.backends.megatron.checkpoint.native import preset_from_hf
    from primus.core.checkpoint.hf import read_config

    (folder / "preset.yaml").write_text(yaml.safe_dump(preset_from_hf(read_config(hf))))
    module: dict[str, Any] = {"model": str(folder / "preset.yaml"),
                              "overrides": {"seq_length": 32, "save_interval": 1000}}  # fmt: skip
    if init_from:
        module["init_from"] = {"hf": str(hf)}
    exp = folder / "exp.yaml"
    exp.write_text(yaml.safe_dump({"extends": str(RECIPE), "exp_name": folder.name,
                                   "workspace": str(folder / "ws"),
                                   "modules": {"pre_trainer": module}}))  # fmt: skip
    return exp


@pytest.fixture(scope="module")
def inspected() -> Iterator[Callable[[Path], dict[str, Any]]]:
    """`inspect_json`: each `checkpoint inspect` a process forked from one that imported
    Megatron once (`primus.testing.faults.Forks`), its output the process's own."""
    server = Forks("megatron.core.dist_checkpointing", "megatron.core.optimizer")
    with server, forked(server, checkpoints):
        yield inspect_json


def safetensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for p in sorted(folder.glob("*.safetensors")) for k, v in load_file(p).items()}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "tokens.pt"
    torch.save(torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0)), path)
    return path


def source(folder: Path, family: str, seed: int, changes: dict[str, Any], bf16: bool) -> Path:
    """`folder/hf`: a tiny HF model (in bf16 with `bf16`) with a tokenizer's files beside it
    (an export without a tokenizer of its own carries them over)."""
    from transformers import AutoModelForCausalLM

    hf = make_hf_model(folder / ("fp32" if bf16 else "hf"), family, seed, **changes)
    if bf16:
        model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.bfloat16)
        hf = folder / "hf"
        model.save_pretrained(hf)
    for name in CARRIED[:2]:
        (hf / name).write_text(json.dumps({"file": name}))
    return hf


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory, tokens: Path) -> Path:
    """Every model imported, run through Megatron's forward and exported, in the test
    process."""
    root = tmp_path_factory.mktemp("models")
    jobs = []
    for seed, (name, (family, changes)) in enumerate(MODELS.items()):
        hf = source(root / name, family, seed, changes, name == BF16)
        jobs.append({"exp": str(experiment(root / name, hf)), "hf": str(hf),
                     "tokens": str(tokens), "out": str(root / name / "megatron.pt"),
                     "export": str(root / name / "exported"), "samples": name == "llama3",
                     "overrides": ["train_iters=4"]})  # fmt: skip
    (root / "jobs.json").write_text(json.dumps(jobs))
    run_script_here(script(FORWARD), str(root / "jobs.json"))
    return root


@pytest.mark.parametrize("name", MODELS)
def test_imported_model_gives_transformers_logits(converted: Path, tokens: Path, name: str) -> None:
    ours = torch.load(converted / name / "megatron.pt", weights_only=False)["logits"]
    theirs = hf_logits(converted / name / "hf", torch.load(tokens))
    assert ours.shape == theirs.shape
    assert (ours - theirs).abs().max() <= 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_export_round_trip_is_bit_exact(converted: Path, tokens: Path, name: str) -> None:
    source, exported = converted / name / "hf", converted / name / "exported"
    before, after = safetensors(source), safetensors(exported)
    assert sorted(before) == sorted(after)
    for key, tensor in before.items():  # in the source's dtype (bf16 for one)
        assert after[key].dtype == tensor.dtype and torch.equal(after[key], tensor), key
    # the source's config.json (max_position_embeddings, RoPE scaling and all) and files
    config = json.loads((exported / "config.json").read_text())
    assert config == json.loads((source / "config.json").read_text())
    for name in CARRIED:
        assert (exported / name).read_bytes() == (source / name).read_bytes(), name
    batch = torch.load(tokens)
    assert torch.equal(
        hf_logits(exported, batch), hf_logits(source, batch)
    )  # transformers loads it
    assert json.loads((exported / "primus_provenance.json").read_text())["initial_weights"]


# -- one training run that starts from an HF model ---------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, converted: Path) -> Path:
    """`primus train` with `init_from` (learning rate 0: the weights stay the HF ones), 4 steps,
    checkpoints at 2 and 4: the run directory."""
    folder = tmp_path_factory.mktemp("init_from") / "initfrom"
    folder.mkdir()
    exp = experiment(folder, converted / "llama3" / "hf", init_from=True)
    with in_process(runs):
        return train_run(exp, folder / "ws", "exp_name=initfrom", *TRAIN, "lr=0", "min_lr=0")


def step2_loss(converted: Path) -> float:
    """transformers' loss on Megatron's step-2 batch (mock-data samples 8-15, as
    megatron_forward.py read them) for the llama3 model."""
    samples = torch.load(converted / "llama3" / "megatron.pt", weights_only=False)["samples"][8:]
    tokens, labels, mask = (torch.stack([s[k] for s in samples]) for k in
                            ("tokens", "labels", "loss_mask"))  # fmt: skip
    logits = hf_logits(converted / "llama3" / "hf", tokens)
    per_token = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), reduction="none"
    )
    return float((per_token * mask.flatten()).sum() / mask.sum())


def export(exp: Path, out: Path, *args: str) -> dict[str, torch.Tensor]:
    """`primus checkpoint export` of the experiment (in the test process); the tensors written."""
    with in_process():
        done = primus_here("checkpoint", "export", "--config", str(exp), "--hf", str(out), *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return safetensors(out)


def test_training_starts_from_the_hf_weights(trained: Path, converted: Path) -> None:
    assert losses(trained)[2] == pytest.approx(step2_loss(converted), abs=1e-4)
    log = (trained / "logs" / "rank-0.log").read_text()
    assert "starting from the HF import" in log and "weights only" in log
    provenance = json.loads((trained / "checkpoints" / "primus_provenance.json").read_text())
    assert provenance["initial_weights"]["hf"] == str(converted / "llama3" / "hf")


def test_inspect_a_distributed_checkpoint_from_a_real_run(
    trained: Path, inspected: Callable[[Path], dict[str, Any]]
) -> None:
    info = inspected(trained / "checkpoints")
    assert (info["format"], info["backend"], info["iteration"]) == (
        "megatron distributed checkpoint (torch_dist)", "megatron", 4)  # fmt: skip
    assert info["iterations_saved"] == [0, 2, 4]  # 0: the HF import
    assert info["model"]["num_layers"] == 2 and info["model"]["hidden_size"] == 64
    assert info["parallel"]["tensor"] == 1 and info["parallel"]["data"] == 1
    # tiny llama3: embedding + output 2x256x64, 2 layers of qkv, proj, fc1, fc2, norms
    layer = 64 * (64 + 2 * 32) + 64 * 64 + 64 * 2 * 128 + 128 * 64 + 2 * 64
    assert info["size"]["model_parameters"] == 2 * 256 * 64 + 2 * layer + 64
    assert info["provenance"]["run_dir"] == str(trained.resolve())
    one = inspected(trained / "checkpoints" / "iter_0000002")
    assert one["iteration"] == 2 and one["size"] == {**info["size"], "bytes": one["size"]["bytes"]}


def test_inspecting_a_damaged_checkpoint_is_one_error(trained: Path, tmp_path: Path) -> None:
    """The latest iteration's DCP metadata overwritten with noise: exit 2 naming the folder."""
    damaged = tmp_path / "checkpoints"
    shutil.copytree(trained / "checkpoints", damaged)
    (damaged / "iter_0000004" / ".metadata").write_bytes(bytes(range(100)))
    with in_process():
        done = primus_here("checkpoint", "inspect", str(damaged))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"{damaged}: a megatron checkpoint whose files cannot be read" in done.stderr


def test_export_a_trained_checkpoint(trained: Path, converted: Path, tmp_path: Path) -> None:
    exported = export(trained.parents[3] / "exp.yaml", tmp_path / "hf", "--iteration", "4")
    hf = converted / "llama3" / "hf"
    source = safetensors(hf)  # learning rate 0: the same weights
    assert all(torch.equal(exported[k], v) for k, v in source.items())
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == json.loads(
        (hf / "config.json").read_text()
    )  # init_from's, written again
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (hf / "tokenizer.json").read_bytes()


def test_a_forced_export_replaces_the_old_one_only_once_the_new_one_is_whole(
    trained: Path, converted: Path, tmp_path: Path
) -> None:
    """--force over an export: a failing export (an iteration never saved) leaves the old one
    as it was and no staging folder; a good one replaces it. The HF model the run started from
    is never an export's target, --force or not."""
    exp, out, hf = trained.parents[3] / "exp.yaml", tmp_path / "hf", converted / "llama3" / "hf"
    export(exp, out, "--iteration", "2")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with in_process():
        failed = primus_here("checkpoint", "export", "--config", str(exp), "--hf", str(out),
                             "--force", "--iteration", "6")  # fmt: skip
    assert failed.returncode == 2 and "no checkpoint of iteration 6" in failed.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # nothing staged left beside it
    exported = export(exp, out, "--force", "--iteration", "4")
    assert exported.keys() == safetensors(hf).keys()
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} != before
    config = (hf / "config.json").read_bytes()
    with in_process():
        onto = primus_here("checkpoint", "export", "--config", str(exp), "--hf", str(hf),
                           "--force")  # fmt: skip
    assert onto.returncode == 2 and f"{hf} would overwrite {hf.resolve()}" in onto.stderr
    assert (hf / "config.json").read_bytes() == config and "Traceback" not in onto.stderr


def test_tensor_and_pipeline_parallel(
    converted: Path, inspected: Callable[[Path], dict[str, Any]], tmp_path: Path
) -> None:
    """TP=2 x PP=2 over gloo (4 processes): the import loads sharded and trains to the same
    loss; the sharded checkpoint it saves exports (one process) to the HF weights."""
    folder = tmp_path / "tp2pp2"
    folder.mkdir()
    exp = experiment(folder, converted / "llama3" / "hf", init_from=True)
    parallel = ("tensor_model_parallel_size=2", "pipeline_model_parallel_size=2")
    run = train_run(exp, folder / "ws", "exp_name=tp2pp2", "train_iters=3", "lr=0", "min_lr=0",
                    *parallel, nproc=4)  # fmt: skip
    assert losses(run)[2] == pytest.approx(step2_loss(converted), abs=1e-4)
    info = inspected(run / "checkpoints")
    assert info["iteration"] == 3 and (
        info["parallel"]["tensor"],
        info["parallel"]["pipeline"],
    ) == (2, 2)
    exported = export(exp, tmp_path / "hf", *parallel, "export_dtype=bfloat16")  # the option wins
    source = safetensors(converted / "llama3" / "hf")
    assert sorted(exported) == sorted(source)
    assert all(torch.equal(exported[k], v.bfloat16()) for k, v in source.items())


# -- bad HF directories ----------------------------------------------------------------


def _broken(folder: Path, source: Path, how: str) -> Path:
    """A copy of the HF model `source` with one defect."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    config = json.loads((source / "config.json").read_text())
    tensors = load_file(source / "model.safetensors")
    if how == "missing":
        del tensors["model.layers.1.self_attn.k_proj.weight"]
    elif how == "dtype":
        tensors["model.layers.0.mlp.up_proj.weight"] = torch.ones(128, 64, dtype=torch.int32)
    elif how == "extra":  # a third layer that config.json does not describe
        tensors["model.layers.2.mlp.up_proj.weight"] = torch.ones(128, 64)
    elif how == "architecture":
        config["num_key_value_heads"] = 4
    elif how == "family":
        config["model_type"] = "gpt2"
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    if how == "truncated":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])
    return folder


BROKEN = {
    "missing": "model.safetensors: tensor 'model.layers.1.self_attn.k_proj.weight' is missing",
    "dtype": "model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' has dtype I32",
    "truncated": "model.safetensors: truncated safetensors file: tensor '",
    "extra": "tensor 'model.layers.2.mlp.up_proj.weight' has no place in the model",
    "architecture": "num_query_groups: 4 in the HF config, 2 in the experiment",
    "family": "model_type 'gpt2' is not supported",
}


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory, converted: Path) -> dict[str, Any]:
    """`primus checkpoint import` of each broken copy (in the test process): how, dir,
    result."""
    root = tmp_path_factory.mktemp("broken")
    exp = converted / "llama3" / "exp.yaml"

    def attempt(how: str) -> tuple[Path, subprocess.CompletedProcess[str]]:
        hf = _broken(root / how, converted / "llama3" / "hf", how)
        ws = root / f"ws-{how}"
        return ws, primus_here("checkpoint", "import", "--hf", str(hf), "--config", str(exp),
                               f"workspace={ws}")  # fmt: skip

    with in_process():
        return {how: attempt(how) for how in BROKEN}


@pytest.mark.parametrize("how", BROKEN)
def test_a_broken_hf_directory_is_refused(refused: dict[str, Any], how: str) -> None:
    ws, done = refused[how]
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert BROKEN[how] in done.stderr and "Traceback" not in done.stderr
    if how in ("missing", "dtype", "truncated", "extra"):
        assert f"{ws.parent / how}/model.safetensors: " in done.stderr
    leftovers = [p for p in ws.rglob("*") if "checkpoints" in p.name or ".partial" in p.name]
    assert leftovers == []  # nothing half-written
    if how in ("truncated", "architecture", "family"):  # found before the run directory is made
        assert not ws.exists()


def test_an_export_of_a_run_without_a_checkpoint_folder_says_so(tmp_path: Path) -> None:
    """The tiny recipe saves nothing unless `save` is set: the export names that, not '.'."""
    stderr = export_of_nothing(RECIPE, tmp_path)
    assert "the run has no checkpoint folder (its config sets neither load nor save)" in stderr
