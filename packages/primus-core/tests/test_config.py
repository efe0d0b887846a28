"""The config system: YAML typing, interpolation, extends, presets, precedence, provenance."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from primus.core.config import yaml_io
from primus.core.config.experiment import ModuleConfig, load_experiment, resolved_tree
from primus.core.config.loader import load_config_file
from primus.core.config.overrides import parse_overrides
from primus.core.config.render import to_json, to_yaml
from primus.core.config.sanity import (
    FRACTION,
    FRACTION_PAIR,
    LEARNING_RATE,
    NON_NEGATIVE,
    POSITIVE,
)
from primus.core.config.schema import ParamSpec
from primus.core.config.tree import ConfigTree
from primus.core.config.yaml_io import load_yaml_file, parse_scalar
from primus.core.errors import DETAIL_WIDTH, ConfigError, clipped
from primus.core.runtime import resolution


def test_yaml_1_2_floats_and_cli_values_are_typed_alike(write) -> None:
    data, _ = load_yaml_file(write("a.yaml", "lr: 1e-4\nbig: 2E5\nname: 1e\n"))
    assert data == {"lr": 1e-4, "big": 2e5, "name": "1e"}
    assert parse_scalar("1e-4") == 1e-4 and parse_scalar("[1,2]") == [1, 2]
    assert parse_scalar("true") is True and parse_scalar("abc") == "abc"


def test_interpolation_types_plain_scalars_and_keeps_quoted_ones(write, monkeypatch) -> None:
    monkeypatch.setenv("LAYERS", "12")
    monkeypatch.delenv("UNSET_X", raising=False)
    path = write(
        "a.yaml",
        """
        layers: ${LAYERS}
        lr: ${UNSET_X:3e-4}
        tag: "${UNSET_X:7}"
        name: run-${LAYERS}
    """,
    )
    data, origins = load_yaml_file(path)
    assert data == {"layers": 12, "lr": 3e-4, "tag": "7", "name": "run-12"}
    assert origins[("layers",)].kind == "env" and origins[("layers",)].detail == "LAYERS"
    assert origins[("lr",)].kind == "file" and origins[("lr",)].line == 2


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("a: 1\nb: ${PRIMUS_TEST_UNSET}\n", 2, "PRIMUS_TEST_UNSET is not set"),
        ("a: 1\nb: x-${BAD\n", 2, "malformed ${...} in 'x-${BAD': write ${NAME} or"),
        ("a: ${:x}\n", 1, "malformed ${...} in '${:x}'"),
        ("a: ${A:${B:x}}\n", 1, "a default holds no ${...}"),
        ("a: 1\nb: [1, 2\nc: 3\n", 3, "YAML syntax error"),
        ("a: 1\na: 2\n", 2, "duplicate key 'a'"),
        ("- 1\n- 2\n", 1, "top level must be a mapping"),
    ],
)
def test_file_errors_carry_file_and_line(write, text, line, message) -> None:
    path = write("bad.yaml", text)
    with pytest.raises(ConfigError) as err:
        load_yaml_file(path)
    assert message in err.value.message
    assert err.value.origin.file == str(path) and err.value.origin.line == line


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file not found"):
        load_yaml_file(tmp_path / "nope.yaml")


def test_extends_merges_left_to_right_with_the_file_last(write) -> None:
    write("base/a.yaml", "x: 1\ny: 1\nz: 1\nsec: {p: 1, q: 1}\n")
    write("base/b.yaml", "y: 2\nz: 2\nsec: {q: 2}\n")
    path = write("exp.yaml", "extends: [base/a.yaml, base/b.yaml]\nz: 3\n")
    tree = load_config_file(path)
    assert tree.data == {"x": 1, "y": 2, "z": 3, "sec": {"p": 1, "q": 2}}
    assert [v for v, _ in tree.replaced[("z",)]] == [1, 2]
    assert tree.origin(("z",)).file.endswith("exp.yaml")
    assert tree.origin(("sec", "q")).file.endswith("b.yaml")


def test_extends_single_path_relative_to_the_naming_file(write) -> None:
    write("deep/base.yaml", "extends: ../root.yaml\nb: 2\n")
    write("root.yaml", "a: 1\n")
    assert load_config_file(write("exp.yaml", "extends: deep/base.yaml\n")).data == {"a": 1, "b": 2}


def test_extends_cycle_and_missing_base_name_the_extends_line(write) -> None:
    write("a.yaml", "extends: b.yaml\n")
    write("b.yaml", "x: 1\nextends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"extends cycle: a.yaml -> b.yaml -> a.yaml") as err:
        load_config_file(write("a.yaml", "extends: b.yaml\n"))
    assert err.value.origin.file.endswith("b.yaml") and err.value.origin.line == 2
    with pytest.raises(ConfigError, match=r"not found") as err:
        load_config_file(write("c.yaml", "k: 1\nextends: [missing.yaml]\n"))
    assert err.value.origin.line == 2


def test_a_symlink_loop_is_a_config_error_at_the_extends_line(write, tmp_path) -> None:
    (tmp_path / "loop1.yaml").symlink_to("loop2.yaml")
    (tmp_path / "loop2.yaml").symlink_to("loop1.yaml")
    with pytest.raises(ConfigError, match=r"loop1.yaml: a symbolic link that loops"):
        load_config_file(tmp_path / "loop1.yaml")
    with pytest.raises(ConfigError, match=r"a symbolic link that loops") as err:
        load_config_file(write("exp.yaml", "k: 1\nextends: loop1.yaml\n"))
    assert err.value.origin.line == 2


def test_overrides_syntax() -> None:
    parsed = parse_overrides(
        ["--lr", "1e-4", "a.b=[1,2]", "--train-iters=3", "--flag", "--shift", "-1", "--last"]
    )
    assert [(k, v) for k, v, _ in parsed] == [
        (("lr",), 1e-4),
        (("a", "b"), [1, 2]),
        (("train_iters",), 3),
        (("flag",), True),
        (("shift",), -1),
        (("last",), True),
    ]
    assert str(parsed[0][2]) == "cli (--lr 1e-4)"
    with pytest.raises(ConfigError, match=r"cannot read override 'oops'"):
        parse_overrides(["oops"])


EXPERIMENT = """
    workspace: ${WS:/tmp/ws}
    exp_name: demo
    modules:
      trainer:
        framework: toy
        config: toy_trainer.yaml
        model: toy_model
        overrides:
          name: overrides
          lr: 0.5
"""


def test_precedence_module_preset_model_preset_overrides_cli(toy_backend, write) -> None:
    path = write("exp.yaml", EXPERIMENT)
    exp = resolution.load(path, ["name=cli", "exp_name=from-cli"])
    module = exp.modules["trainer"]
    assert module.params == {"lr": 0.5, "layers": 2, "name": "cli"}
    history = [v for v, _ in module.tree.replaced[("name",)]]
    assert history == ["module", "model", "overrides"]
    assert module.origin("layers").file.endswith("toy_model.yaml")
    assert (
        exp.exp_name == "from-cli"
        and exp.run_dir == Path("/tmp/ws/local") / exp.user_name / "from-cli"
    )


def test_presets_from_primus_config_path_shadow_the_backend(
    toy_backend, write, tmp_path, monkeypatch
) -> None:
    write("user/models/toy_model.yaml", "layers: 9\n")
    monkeypatch.setenv("PRIMUS_CONFIG_PATH", str(tmp_path / "user"))
    exp = resolution.load(write("exp.yaml", EXPERIMENT))
    assert exp.modules["trainer"].params["layers"] == 9


def test_preset_not_found_suggests_close_names(toy_backend, write) -> None:
    path = write("exp.yaml", EXPERIMENT.replace("model: toy_model", "model: toy_modle"))
    with pytest.raises(
        ConfigError, match=r"model preset 'toy_modle' .*did you mean: toy_model.yaml"
    ) as err:
        resolution.load(path)
    assert err.value.origin.line == 7


@pytest.mark.parametrize(
    ("edit", "message", "line"),
    [
        (
            ("config: toy_trainer.yaml", "confg: toy_trainer.yaml"),
            "unknown module key 'confg' (did you mean: config?)",
            6,
        ),
        (("framework: toy", "framework: toyy"), "unknown framework 'toyy' (did you mean: toy?)", 5),
        (
            ("exp_name: demo", "exp_nam: demo"),
            "unknown experiment key 'exp_nam' (did you mean: exp_name, user_name?)",
            2,
        ),
        (("exp_name: demo", "exp_name: [1]"), "exp_name: must be a string", 2),
    ],
)
def test_experiment_errors(toy_backend, write, edit, message, line) -> None:
    path = write("exp.yaml", EXPERIMENT.replace(*edit))
    with pytest.raises(ConfigError) as err:
        resolution.load(path)
    assert message in err.value.message and err.value.origin.line == line


def test_several_modules_need_a_choice(toy_backend, write) -> None:
    text = EXPERIMENT + "      other:\n        framework: toy\n"
    path = write("exp.yaml", text)
    assert set(resolution.load(path).modules) == {"trainer", "other"}
    with pytest.raises(ConfigError, match=r"several modules"):
        resolution.load(path, single=True)
    assert list(resolution.load(path, module="other", single=True).modules) == ["other"]


def test_schema_check_unknown_keys_types_and_open_sections(toy_backend, write) -> None:
    path = write("exp.yaml", EXPERIMENT)
    exp = resolution.load(path, ["lrr=1", "layers=2.5", "optim.beta=0.9", "extra.anything.deep=1"])
    errors = toy_backend("toy").param_schema().check(exp.modules["trainer"].tree)
    messages = sorted(e.message for e in errors)
    assert messages == [
        "layers: must be an integer, got float 2.5",
        "unknown parameter 'lrr' (did you mean: lr?)",
    ]
    assert all(str(e.origin).startswith("cli") for e in errors)


def test_spec_types() -> None:
    assert ParamSpec(float).type_error(3) is None
    assert ParamSpec(int).type_error(True) == "must be an integer, got bool True"
    assert ParamSpec(int).type_error(None) is None
    assert "must be one of 'a', 'b'" in ParamSpec(str, choices=("a", "b")).type_error("c")


def test_rendered_provenance_names_what_was_overridden(toy_backend, write) -> None:
    exp = resolution.load(write("exp.yaml", EXPERIMENT), ["--lr", "1e-3"])
    text = to_yaml(resolved_tree(exp), provenance=True)
    assert "lr: 0.001  # cli (--lr 1e-3) (overrode 0.5 from" in text
    assert "toy_trainer.yaml:1" in text
    import json

    data = json.loads(to_json(resolved_tree(exp), provenance=True))
    entry = data["provenance"]["modules.trainer.overrides.lr"]
    assert entry["source"] == "cli (--lr 1e-3)" and [o["value"] for o in entry["overrode"]] == [
        0.1,
        0.5,
    ]


def test_json_of_a_nan_or_an_infinity_is_json_every_reader_takes() -> None:
    """JSON has no NaN: `config show --format json` printed one, which strict readers refuse."""
    import json

    tree = ConfigTree({"lr": float("nan"), "betas": [float("-inf"), 0.9]})
    strict = json.loads(to_json(tree), parse_constant=lambda name: pytest.fail(name))
    assert strict == {"lr": ".nan", "betas": ["-.inf", 0.9]}


def test_resolved_config_is_itself_a_runnable_experiment(toy_backend, write, tmp_path) -> None:
    exp = resolution.load(write("exp.yaml", EXPERIMENT), ["layers=7"])
    again = write("resolved.yaml", to_yaml(resolved_tree(exp), provenance=True))
    assert resolution.load(again).modules["trainer"].params == exp.modules["trainer"].params


def test_defaults_when_fields_are_absent(write) -> None:
    exp = load_experiment(write("my-exp.yaml", "modules: {m: {framework: x}}\n"))
    assert (exp.workspace, exp.work_group, exp.exp_name, exp.log_level) == (
        "./output",
        "local",
        "my-exp",
        "INFO",
    )


def test_presets_resolve_next_to_the_file_that_names_them(toy_backend, write) -> None:
    write(
        "common/base.yaml",
        "modules:\n  trainer:\n    framework: toy\n    model: local_model.yaml\n",
    )
    write("common/local_model.yaml", "layers: 5\n")
    exp = resolution.load(write("exp.yaml", "extends: common/base.yaml\n"))
    assert exp.modules["trainer"].params == {"layers": 5}


def test_an_experiment_named_like_a_preset_does_not_load_itself(toy_backend, write) -> None:
    exp = resolution.load(
        write("toy_model.yaml", "modules:\n  trainer:\n    framework: toy\n    model: toy_model\n")
    )
    assert exp.modules["trainer"].params == {"layers": 2, "name": "model"}  # the shipped preset


def test_float_like_strings_and_cli_mappings_round_trip_with_provenance(toy_backend, write) -> None:
    exp = resolution.load(write("exp.yaml", EXPERIMENT), ["name='1e-4'", "--extra", "{a: 1}"])
    assert exp.modules["trainer"].params["name"] == "1e-4"
    text = to_yaml(resolved_tree(exp), provenance=True)
    assert "name: '1e-4'" in text and "a: 1  # cli (--extra {a: 1})" in text
    again = resolution.load(write("resolved.yaml", text))
    assert again.modules["trainer"].params == exp.modules["trainer"].params


def test_a_bare_flag_before_an_assignment_is_true() -> None:
    parsed = parse_overrides(["--save", "exp_name=x", "--name=a=b"])
    assert [(k, v) for k, v, _ in parsed] == [
        (("save",), True),
        (("exp_name",), "x"),
        (("name",), "a=b"),
    ]


def test_log_level_is_case_insensitive(write) -> None:
    exp = load_experiment(write("e.yaml", "log_level: debug\nmodules: {m: {framework: x}}\n"))
    assert exp.log_level == "DEBUG"


def test_only_regular_files_are_read_and_never_opened_otherwise(tmp_path, monkeypatch) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # opening it for reading would block: it is refused from its stat
    for path, kind in ((fifo, "a FIFO"), (tmp_path, "a folder"), (Path("/dev/zero"), "a character device")):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"is {kind}.*, not a regular file"):
            load_yaml_file(path)
    monkeypatch.setattr(yaml_io, "MAX_BYTES", 64)
    (tmp_path / "big.yaml").write_text("#" * 65)
    with pytest.raises(ConfigError, match=r"big.yaml is 0.0 MiB, over the limit"):
        load_yaml_file(tmp_path / "big.yaml")


def test_composition_stops_past_the_value_limit(write, monkeypatch) -> None:
    monkeypatch.setattr(yaml_io, "MAX_VALUES", 50)
    with pytest.raises(ConfigError, match=r"holds more than 50 values") as err:
        load_yaml_file(write("a.yaml", "a: 1\nb:\n" + "  - 1\n" * 100))
    assert err.value.origin.line < 60  # stopped where the 51st node is, not at the end


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!int abc", "'abc' is not an integer"),
        ("!!float ...", "'...' is not a number"),
        ("!!bool maybe", "'maybe' is not a boolean"),
        ("!!timestamp 2020-99-99", "YAML tag !!timestamp is not allowed"),
        ("!!binary aGk=", "YAML tag !!binary is not allowed"),
        ("!!set {a, b}", "YAML tag !!set is not allowed"),
        ("1" * 5000, "an integer of 5000 digits is out of range"),
        ("&a [*a]", "an alias (*name) refers to the list or mapping that holds it"),
        ('"a\\0b"', "a NUL character"),
        ('"\\ud800"', "is not a character (a lone surrogate)"),
    ],
)
def test_tags_and_characters_no_value_may_hold_are_errors_at_their_line(
    write, monkeypatch, value, message
) -> None:
    path = write("a.yaml", f"a: 1\nb: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_yaml_file(path)
    assert message in err.value.message and err.value.origin.line == 2
    monkeypatch.setenv("PRIMUS_TEST_VALUE", value)  # the same from ${VAR}, at the line using it
    if not value.startswith('"'):  # a quoted value stays a string: an escape is not read
        with pytest.raises(ConfigError) as err:
            load_yaml_file(write("b.yaml", "a: 1\nb: ${PRIMUS_TEST_VALUE}\n"))
        assert message in err.value.message
        assert str(err.value.origin).startswith("env PRIMUS_TEST_VALUE (at ")
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        parse_overrides([f"b={value}"])  # and from the command line, at its token
    assert str(err.value.origin) == f"cli ({clipped(f'b={value}', DETAIL_WIDTH)})"  # cut short


def test_dates_stay_strings() -> None:
    assert parse_scalar("2020-01-02") == "2020-01-02" and parse_scalar("2020-99-99") == "2020-99-99"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("exp_name: ../../../../tmp/escape", "exp_name '../../../../tmp/escape' is not a folder name: it holds a path separator"),
        ("exp_name: /tmp/escape", "it is an absolute path"),
        ("exp_name: ''", "exp_name '' is not a folder name: it is empty"),
        ("work_group: ..", "work_group '..' is not a folder name"),
        ("user_name: .", "user_name '.' is not a folder name"),
        ("user_name: " + "u" * 256, "longer than 255 bytes"),
        ("workspace: ''", "workspace is empty"), ("workspace: ' '", "workspace ' ' is blank"),
    ],
)  # fmt: skip
def test_run_dir_names_are_one_folder_each(write, line, message) -> None:
    with pytest.raises(ConfigError) as err:
        load_experiment(write("e.yaml", f"modules: {{m: {{framework: x}}}}\n{line}\n"))
    assert message in err.value.message and err.value.origin.line == 2


def test_sanity_rules_refuse_set_values_and_leave_unset_keys_to_the_upstream() -> None:
    tree = ConfigTree({"lr": None, "opt": {"betas": [0.9, 1.5]}, "steps": 0, "eps": -1})
    config = ModuleConfig("m", "x", tree.data, tree)
    for rules, message in (
        ({"lr": LEARNING_RATE}, "lr must be a finite number of 0 or more, got null"),
        ({"opt.betas": FRACTION_PAIR}, "opt.betas must be two numbers in [0, 1), got [0.9, 1.5]"),
        ({"steps": POSITIVE}, "steps must be a positive number, got 0"),
        ({"eps": NON_NEGATIVE}, "eps must be a finite number of 0 or more, got -1"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            config.require(rules)
    config.require({"unset": LEARNING_RATE, "opt.unset": POSITIVE, "lr_min": FRACTION})
    for rule in (POSITIVE, NON_NEGATIVE, LEARNING_RATE, FRACTION, FRACTION_PAIR):
        assert all(rule.problem("k", value) for value in rule.refuses)
