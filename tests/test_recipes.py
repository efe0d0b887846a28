"""Every recipe under configs/ as a user has it after the README's set-up, from the repository
root. The CPU recipes train as shipped in the backends' tests (quickstart.yaml and tiny-cpu.yaml
in test_training.py; sft-tiny-cpu.yaml in test_posttrain.py, after the model command of its
comment: primus.testing.sft_runs.shipped_run; dpo-tiny-cpu.yaml makes its dry run here, after
that command); the GPU fine-tuning recipes make their dry run
(--full) against Llama-3.2-1B's published config in test_posttrain.py too. Here: the data the
SFT recipes ship is the reverse task's generator's, the model command's refusals, and each GPU
pretraining recipe passes `config validate` and the dry run on the CPU (in process: no
upstream is imported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing.fuzz_runs import run_in_process
from primus.testing.sft_runs import MODEL_COMMAND, SHIPPED

ROOT = Path(__file__).resolve().parents[1]
ON_CPU = {"quickstart.yaml", "tiny-cpu.yaml", "sft-tiny-cpu.yaml"}  # trained by the tests
RECIPES = sorted(p.relative_to(ROOT) for p in (ROOT / "configs").rglob("*.yaml"))
DPO = [p for p in RECIPES if p.name == "dpo-tiny-cpu.yaml"]  # dry run after the model command
GPU = [
    p for p in RECIPES if p.name not in ON_CPU and p not in DPO and not p.name.endswith("-sft.yaml")
]


def test_the_shipped_sft_data_is_the_reverse_task(tmp_path: Path) -> None:
    """configs/data/sft-tiny holds what write_reverse_task (4096 train, 64 eval samples, seed 0),
    write_preference_task (1024 pairs, seed 1) and write_tokenizer write: regenerated with them,
    byte for byte."""
    from primus.testing.dpo import write_preference_task
    from primus.testing.sft_data import write_reverse_task, write_tokenizer

    made = write_reverse_task(tmp_path, 4096, 64)
    made["preference_train"] = write_preference_task(tmp_path, 1024, seed=1)["train"]
    write_tokenizer(tmp_path / "tokenizer")
    shipped = ROOT / SHIPPED
    for name in ("chat_train", "chat_eval", "preference_train"):
        assert (shipped / f"{name}.jsonl").read_bytes() == made[name].read_bytes(), name
    assert sorted(p.name for p in (shipped / "tokenizer").iterdir()) == sorted(
        p.name for p in (tmp_path / "tokenizer").iterdir()
    )
    for file in (tmp_path / "tokenizer").iterdir():
        assert (shipped / "tokenizer" / file.name).read_bytes() == file.read_bytes(), file.name


def test_the_model_command_refuses_a_full_folder_a_file_and_a_folder_without_a_tokenizer(
    tmp_path: Path,
) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    full = run_in_process([*MODEL_COMMAND[:-1], str(tmp_path / "hf")], ROOT, {})
    assert full.code == 2 and "hf exists and is not empty" in full.message, full.stderr
    argv = ["checkpoint", "tiny", "--tokenizer", str(tmp_path), "--hf", str(tmp_path / "new")]
    bare = run_in_process(argv, ROOT, {})
    assert bare.code == 2 and "no tokenizer.json" in bare.message, bare.stderr
    argv[3] = str(tmp_path / "nothing")
    missing = run_in_process(argv, ROOT, {})
    assert missing.code == 2 and f"--tokenizer {argv[3]}: not found" in missing.message
    assert not (tmp_path / "new").exists()
    (tmp_path / "a-file").write_text("x")
    for folder, said in (("a-file", "a-file is a file, not a folder"),
                         ("a-file/sub", "a-file is not a folder")):  # fmt: skip
        refused = run_in_process(["checkpoint", "tiny", "--hf", str(tmp_path / folder)], ROOT, {})
        assert refused.code == 2 and said in refused.message, refused.stderr


def test_the_model_command_with_force_keeps_the_old_model_until_the_new_one_is_whole(
    tmp_path: Path,
) -> None:
    """A seed out of range is a usage error that leaves the old model (and no folder when
    there was none); --force with a good seed replaces it with a model of new weights."""
    hf = tmp_path / "hf"
    made = run_in_process(["checkpoint", "tiny", "--hf", str(hf)], ROOT, {})
    assert made.code == 0, made.stderr
    weights = (hf / "model.safetensors").read_bytes()
    for folder in (hf, tmp_path / "none"):
        huge = ["checkpoint", "tiny", "--hf", str(folder), "--force", "--seed", str(2**70)]
        refused = run_in_process(huge, ROOT, {})
        assert refused.code == 2 and "--seed" in refused.stderr, refused.stderr
    assert (hf / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    again = run_in_process(["checkpoint", "tiny", "--hf", str(hf), "--force", "--seed", "7"],
                           ROOT, {})  # fmt: skip
    assert again.code == 0, again.stderr
    assert (hf / "model.safetensors").read_bytes() != weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


@pytest.mark.parametrize("recipe", GPU, ids=str)
def test_a_gpu_recipe_validates_and_dry_runs_on_the_cpu(recipe: Path, tmp_path: Path) -> None:
    for argv in (["config", "validate", str(recipe)],
                 ["train", "pretrain", "--config", str(recipe), "--dry-run"]):  # fmt: skip
        done = run_in_process(argv, ROOT, {"PRIMUS_WORKSPACE": str(tmp_path / "ws")})
        assert done.code == 0, (argv, done.stderr[-3000:])
    assert not (tmp_path / "ws").exists()  # neither writes anything


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CPU fine-tuning recipes' model, made by the command their comment gives."""
    from primus.testing.sft_runs import make_task

    return make_task(tmp_path_factory.mktemp("model"))["hf"]


@pytest.mark.parametrize("recipe", DPO, ids=str)
def test_a_dpo_recipe_validates_and_dry_runs_after_the_model_command(
    recipe: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """The preference-training CPU recipes as their comment runs them (their training, as
    shipped, is in docs/posttrain.md; the backends' test_dpo.py train DPO)."""
    env = {"PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_SFT_HF": str(tiny_model)}
    for argv in (["config", "validate", str(recipe)],
                 ["train", "posttrain", "--config", str(recipe), "--dry-run"]):  # fmt: skip
        done = run_in_process(argv, ROOT, env)
        assert done.code == 0, (argv, done.stderr[-3000:])
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("recipe", [p for p in RECIPES if p.name == "sft-tiny-cpu.yaml"], ids=str)
def test_a_fine_tuning_recipe_is_refused_by_the_pretrain_stage(
    recipe: Path, tiny_model: Path, tmp_path: Path
) -> None:
    """Pretraining would train on mock data and leave the sft: section unread: refused at it,
    by `config validate --stage pretrain` and the pretrain stage's dry run alike."""
    env = {"PRIMUS_WORKSPACE": str(tmp_path / "ws"), "PRIMUS_SFT_HF": str(tiny_model)}
    for argv in (["config", "validate", str(recipe), "--stage", "pretrain"],
                 ["train", "pretrain", "--config", str(recipe), "--dry-run"]):  # fmt: skip
        done = run_in_process(argv, ROOT, env)
        assert done.code == 2, (argv, done.stderr[-3000:])
        assert f"error: {recipe}:" in done.stderr and "sft: is the data fine-tuning reads" in (
            done.stderr
        )
        assert "Traceback" not in done.stderr
    shown = run_in_process(["config", "show", str(recipe)], ROOT, env)  # no stage: not refused
    assert shown.code == 0, shown.stderr[-3000:]
    assert not (tmp_path / "ws").exists()
