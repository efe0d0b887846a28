"""The `sft:` and `peft:` module keys: checked when the experiment loads, every error at the
file:line it is about; through the real CLI where that is cheap."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from primus.core.config import load_experiment
from primus.core.config.experiment import resolved_tree
from primus.core.config.posttrain import LORA_TARGETS
from primus.core.config.render import to_yaml
from primus.core.config.sft_data import DataFile
from primus.core.errors import ConfigError, Origin
from primus.testing.fuzz_runs import run_in_process
from primus.testing.runs import primus
from primus.testing.sft_data import LLAMA3_TEMPLATE, write_reverse_task, write_tokenizer

# the sft section's first key is on line 6, peft's on line 10
EXPERIMENT = """\
modules:
  trainer:
    framework: {framework}
    init_from: {{hf: {hf}}}
    sft:
      train: {train}
      seq_length: 64
      packing: true
    peft:
      type: lora
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sft")
    hf = write_tokenizer(root / "hf")
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    return {"hf": hf, **write_reverse_task(root / "data", 8, 2)}


def experiment(
    files: dict[str, Path], tmp_path: Path, edit: str = "", framework: str = "x"
) -> Path:
    """The experiment above, with `edit` ("old => new" per line) applied."""
    text = EXPERIMENT.format(framework=framework, hf=files["hf"], train=files["chat_train"])
    for change in filter(None, edit.split("\n")):
        old, new = (part.replace("\\n", "\n") for part in change.split(" => "))
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_defaults_resolved_paths_and_the_resolved_experiment(files, tmp_path) -> None:
    module = load_experiment(experiment(files, tmp_path), ["sft.seed=7"]).modules["trainer"]
    sft, peft = module.sft, module.peft
    assert sft is not None and peft is not None
    assert (sft.train[0].path, sft.eval, sft.seq_length, sft.packing, sft.truncate, sft.seed) == (
        files["chat_train"],
        None,
        64,
        True,
        False,
        7,
    )
    assert sft.tokenizer == files["hf"] and sft.format == "auto" and sft.chat_template is None
    assert (peft.rank, peft.alpha, peft.dropout, peft.target_modules) == (
        8,
        16.0,
        0.0,
        LORA_TARGETS,
    )
    assert peft.scaling == 2.0
    text = to_yaml(resolved_tree(load_experiment(experiment(files, tmp_path), ["sft.seed=7"])))
    assert f"train: {files['chat_train']}" in text and "seed: 7" in text
    assert "target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]" in text


def test_a_peft_section_without_type_is_lora(files, tmp_path) -> None:
    """LoRA is the one adapter kind: `peft: {rank: 4}` needs no `type`."""
    exp = experiment(files, tmp_path, "type: lora => rank: 4")
    module = load_experiment(exp).modules["trainer"]
    assert module.peft is not None and (module.peft.type, module.peft.rank) == ("lora", 4)


def test_chat_template_from_a_file_or_inline(files, tmp_path) -> None:
    (tmp_path / "t.jinja").write_text(LLAMA3_TEMPLATE)
    inline = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    for value, text in ((tmp_path / "t.jinja", LLAMA3_TEMPLATE), (json.dumps(inline), inline)):
        path = experiment(files, tmp_path, f"packing: true => chat_template: {value}")
        sft = load_experiment(path).modules["trainer"].sft
        assert sft is not None and sft.chat_template == text


@pytest.mark.parametrize(
    ("edit", "line", "message"),
    [
        ("seq_length: 64 => seq_lenght: 64", 7,
         "unknown sft key 'sft.seq_lenght' (did you mean: sft.seq_length"),
        ("seq_length: 64 => seq_length: 0", 7, "sft.seq_length must be positive"),
        ("seq_length: 64 => seq_length: many", 7, "sft.seq_length: must be an integer"),
        ("seq_length: 64 => truncate: false", 5, "sft.seq_length is required"),
        ("train: {t} => train: nowhere.jsonl", 6, "sft.train: nowhere.jsonl does not exist"),
        ("train: {t} => train: {hf}/config.json", 6, "is not a .jsonl or .parquet file"),
        ("packing: true => format: xml", 8, "sft.format: must be one of 'auto', 'chat'"),
        ("packing: true => eval_fraction: 0.7", 8, "sft.eval_fraction must be between 0 and 0.5"),
        ("packing: true => eval: {t}\\n      eval_fraction: 0.1", 9,
         "sft.eval_fraction holds out training samples, but sft.eval names an eval file"),
        ("packing: true => eval: {t}", 8, "chat_train.jsonl is also a training file (sft.train)"),
        ("packing: true => tokenizer: {t}", 8, "is not a Hugging Face tokenizer directory"),
        ("packing: true => chat_template: missing.jinja", 8, "sft.chat_template: missing.jinja does not exist"),
        ("packing: true => chat_template: ''", 8, "sft.chat_template is empty"),
        ("packing: true => chat_template: {hf}", 8, "/hf is a folder\n  hint: a Jinja template"),
        ("    init_from: {hf: {hf}}\\n => ", 4, "sft needs a tokenizer: set sft.tokenizer or init_from.hf"),
        ("peft:\\n      type: lora => peft: lora", 9, "'peft' must be a mapping"),
        ("type: lora => type: lora\\n      rank: 0", 11, "peft.rank must be a positive integer, got 0"),
        ("type: lora => type: lora\\n      dropout: 1.0", 11, "peft.dropout must be at least 0 and below 1"),
        ("type: lora => type: lora\\n      alpha: -2", 11, "peft.alpha must be positive"),
        ("type: lora => type: dora", 10, "peft.type: must be one of 'lora', got 'dora'"),
        ("type: lora => type: lora\\n      target_modules: [q_prj]", 11,
         "peft.target_modules: unknown layer 'q_prj' (did you mean: q_proj"),
        ("type: lora => type: lora\\n      target_modules: [q_proj, q_proj]", 11, "names a layer twice"),
        ("type: lora => type: lora\\n      target_modules: []", 11, "peft.target_modules is empty"),
        ("train: {t} => train: [{t}, {t}.gone]", 6, "chat_train.jsonl.gone does not exist"),
        ("train: {t} => train: [{hf}/config.json]", 6, "hf/config.json is not a .jsonl or .parquet file"),
        ("train: {t} => train: []", 6, "sft.train is an empty list"),
        ("train: {t} => train: [{path: {t}, weight: 0}]", 6,
         "sft.train[0].weight must be a positive number, got 0"),
        ("train: {t} => train: [{path: {t}, weight: -1.5}]", 6,
         "sft.train[0].weight must be a positive number, got -1.5"),
        ("train: {t} => train: [{path: {t}, weight: 2}, {t}]", 6,
         "sft.train[1] has no weight, but sft.train[0] has one"),
        ("train: {t} => train: [{path: {t}, wieght: 2}]", 6,
         "sft.train[0]: unknown key 'wieght' (did you mean: weight"),
        ("train: {t} => train: [{path: {t}, columns: {promt: q}}]", 6,
         "sft.train[0].columns: unknown record key 'promt' (did you mean: prompt"),
        ("packing: true => columns:\\n        prompt: q\\n        complet: a", 10,
         "sft.columns: unknown record key 'complet' (did you mean: completion"),
        ("packing: true => columns:\\n        prompt: q\\n        completion: q", 10,
         "sft.columns: prompt and completion both read 'q'"),
        ("packing: true => columns: [q]", 8, "sft.columns: must be a mapping"),
        ("packing: true => train_on_prompt: 1", 8, "sft.train_on_prompt: must be a boolean"),
    ],
)  # fmt: skip
def test_bad_keys_are_refused_where_they_are_written(files, tmp_path, edit, line, message) -> None:
    edit = edit.replace("{t}", str(files["chat_train"])).replace("{hf}", str(files["hf"]))
    with pytest.raises(ConfigError) as err:
        load_experiment(experiment(files, tmp_path, edit))
    assert message in str(err.value)
    assert err.value.origin is not None and err.value.origin.line == line, str(err.value)


def test_cli_validate_and_show_name_the_line_and_the_command_line(files, tmp_path) -> None:
    path = experiment(files, tmp_path, "seq_length: 64 => seq_length: -3", framework="dummy")
    result = primus("config", "validate", str(path), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert re.search(r"exp.yaml:7: sft.seq_length must be positive", result.stderr), result.stderr
    path = experiment(files, tmp_path, framework="dummy")
    result = primus(  # with --config, the first override is not taken for the experiment
        "config", "show", "--config", str(path), "sft.seq_length=32", "--provenance", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"seq_length: 32 +# cli \(sft.seq_length=32\)", result.stdout), result.stdout
    assert re.search(r"packing: true +# exp.yaml:8", result.stdout)


def test_importing_posttrain_imports_no_framework() -> None:
    probe = textwrap.dedent("""
        import sys
        import primus.core.posttrain, primus.testing.sft_data, primus.core.config
        heavy = {"torch", "jax", "numpy", "transformers", "pyarrow", "tokenizers"}
        print("HEAVY", sorted(heavy & {m.split(".")[0] for m in sys.modules}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout


def test_several_train_files_with_weights_and_columns(files, tmp_path) -> None:
    """Each entry's columns over sft.columns; the resolved experiment keeps the list, with
    absolute paths, and loads again to the same section."""
    entries = f"[{{path: {files['pc_train']}, weight: 3, columns: {{prompt: q}}}}, " + (
        f"{{path: {files['chat_train']}, weight: 1}}]\\n      columns: {{completion: a}}"
    )
    path = experiment(files, tmp_path, f"train: {files['chat_train']} => train: {entries}")
    sft = load_experiment(path, ["sft.train_on_prompt=true"]).modules["trainer"].sft
    assert sft is not None and sft.train_on_prompt and sft.columns == {"completion": "a"}
    assert sft.train == (
        DataFile(files["pc_train"], 3.0, {"completion": "a", "prompt": "q"}),
        DataFile(files["chat_train"], 1.0, {"completion": "a"}),
    )
    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(to_yaml(resolved_tree(load_experiment(path))))
    again = load_experiment(resolved).modules["trainer"].sft
    assert again is not None and again.train == sft.train


def test_a_later_layer_replaces_eval_by_eval_fraction_and_back(files, tmp_path) -> None:
    """A file that extends a recipe (or the command line) wins over it; one file setting both
    stays an error (test_bad_keys_are_refused_where_they_are_written)."""
    layers = {
        "eval": f"eval: {files['chat_eval']}",
        "eval_fraction": "eval_fraction: 0.25",
    }
    for recipe_key, own_key in (("eval", "eval_fraction"), ("eval_fraction", "eval")):
        recipe = experiment(files, tmp_path, f"packing: true => {layers[recipe_key]}")
        recipe.rename(tmp_path / "recipe.yaml")
        own = tmp_path / "own.yaml"
        own.write_text(
            f"extends: recipe.yaml\nmodules:\n  trainer:\n    sft:\n      {layers[own_key]}\n"
        )
        exp = load_experiment(own)
        sft = exp.modules["trainer"].sft
        assert sft is not None
        assert (sft.eval, sft.eval_fraction) == (
            (None, 0.25) if own_key == "eval_fraction" else (files["chat_eval"], 0.0)
        )
        tree = resolved_tree(exp)
        key = ("modules", "trainer", "sft")
        assert tree.origin((*key, own_key)) == Origin("file", str(own.resolve()), 5)
        if own_key == "eval_fraction":
            assert tree.get((*key, "eval")) is None
        else:
            assert tree.origin((*key, "eval_fraction")) == Origin("default")
    with_eval = experiment(files, tmp_path, f"packing: true => {layers['eval']}")
    sft = load_experiment(with_eval, ["sft.eval_fraction=0.1"]).modules["trainer"].sft
    assert sft is not None and (sft.eval, sft.eval_fraction) == (None, 0.1)
    with pytest.raises(ConfigError, match=r"but sft\.eval names an eval file"):
        load_experiment(own, ["sft.eval_fraction=0.1", f"sft.eval={files['chat_eval']}"])


def test_validate_reads_every_train_file_through_its_columns(files, tmp_path) -> None:
    """`config validate` (in process): a mix of ShareGPT and renamed Alpaca records passes; a
    ShareGPT turn from an unknown speaker is one error at its file:line."""
    sharegpt = tmp_path / "sharegpt.jsonl"
    turns = [{"from": "human", "value": "apple"}, {"from": "gpt", "value": "apple"}]
    sharegpt.write_text(json.dumps({"conversations": turns}) + "\n")
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text(json.dumps({"task": "reverse", "input": "a b", "output": "b a"}) + "\n")
    entries = f"[{sharegpt}, {{path: {alpaca}, columns: {{instruction: task}}}}]"
    edit = (
        f"train: {files['chat_train']} => train: {entries}\n"
        f"    init_from: {{hf: {files['hf']}}}\\n => \n"  # a tokenizer, but no weights
        f"packing: true => tokenizer: {files['hf']}\n"
        "    peft:\\n      type: lora\\n => "
    )
    path = experiment(files, tmp_path, edit, framework="dummy")
    validate = ["config", "validate", str(path), "--stage", "pretrain"]  # dummy has no posttrain
    assert run_in_process(validate, tmp_path, {}).code == 0
    turns[1]["from"] = "robot"
    with sharegpt.open("a") as lines:
        lines.write(json.dumps({"conversations": turns}) + "\n")
    outcome = run_in_process(validate, tmp_path, {})
    assert outcome.code == 2 and "Traceback" not in outcome.stderr
    assert "error: sharegpt.jsonl:2: conversations[1] has unknown 'from' 'robot'" in outcome.stderr


def test_init_from_adapter_is_checked_against_the_peft_section(files, tmp_path) -> None:
    """`init_from: {hf, adapter}`: a PEFT LoRA adapter folder whose rank, alpha and targets
    are the module's peft:'s; each refusal at the line at fault, the resolved experiment
    keeps the adapter."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    peft = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": list(LORA_TARGETS)}
    with_adapter = (
        f"init_from: {{hf: {files['hf']}}} => init_from: {{hf: {files['hf']}, adapter: {adapter}}}"
    )
    cases = [
        ({}, with_adapter, 4, "init_from.adapter: " + f"{adapter} is not a PEFT adapter directory"),
        (peft, with_adapter + "\npeft:\\n      type: lora => ", 4,
         "continuing an adapter needs the module's peft: section"),
        (peft | {"r": 4}, with_adapter, 9, "peft.rank is 8, and the adapter init_from.adapter "
         "names has 4\n  hint: set peft.rank: 4"),
        (peft | {"target_modules": ["q_proj"]}, with_adapter, 9, "peft.target_modules is"),
        (peft | {"use_dora": True}, with_adapter, 4, "is a LORA adapter with DoRA or rsLoRA"),
        (peft | {"peft_type": "IA3"}, with_adapter, 4, "is a IA3 adapter"),
    ]  # fmt: skip
    for config, edit, line, message in cases:
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            (adapter / name).unlink(missing_ok=True)
        if config:
            (adapter / "adapter_config.json").write_text(json.dumps(config))
            (adapter / "adapter_model.safetensors").write_bytes(b"")
        with pytest.raises(ConfigError) as err:
            load_experiment(experiment(files, tmp_path, edit))
        assert message in str(err.value), str(err.value)
        assert err.value.origin is not None and err.value.origin.line == line, str(err.value)
    (adapter / "adapter_config.json").write_text(json.dumps(peft))
    exp = load_experiment(experiment(files, tmp_path, with_adapter))
    assert exp.modules["trainer"].peft.adapter == adapter  # type: ignore[union-attr]
    assert f"adapter: {adapter}" in to_yaml(resolved_tree(exp))


def test_init_from_is_set_on_the_command_line_too(files, tmp_path) -> None:
    """`init_from.hf=DIR` (and `init_from.adapter=DIR`) on the command line, as `sft.X`."""
    other = tmp_path / "other"
    shutil.copytree(files["hf"], other)
    module = load_experiment(experiment(files, tmp_path), [f"init_from.hf={other}"]).modules[
        "trainer"
    ]
    assert module.init_from == other and module.init_from_origin is not None
    assert module.init_from_origin.kind == "cli"
    with pytest.raises(ConfigError, match=r"init_from\.adapter: .* is not a PEFT adapter") as err:
        load_experiment(experiment(files, tmp_path), [f"init_from.adapter={tmp_path}"])
    assert err.value.origin is not None and err.value.origin.kind == "cli"


def test_a_key_set_to_null_takes_its_default(files, tmp_path) -> None:
    nulls = ["sft.eval_fraction=null", "sft.format=null", "sft.packing=null", "peft.rank=null"]
    module = load_experiment(experiment(files, tmp_path), nulls).modules["trainer"]
    assert module.sft is not None and module.peft is not None
    assert (module.sft.eval_fraction, module.sft.format, module.sft.packing) == (0.0, "auto", False)
    assert module.peft.rank == 8
