"""The `data:` module section: one prepared corpus or a weighted blend, the sequence length and
the seed, written the same for every backend; checked when the experiment loads, every error at
the line it is about. The backends' own keys it becomes are their packages' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.core.config import load_experiment
from primus.core.config.data_section import Corpus
from primus.core.config.experiment import resolved_tree
from primus.core.config.render import to_yaml
from primus.core.errors import ConfigError
from primus.testing.fuzz_runs import run_in_process

# the data section's first key is on line 5
EXPERIMENT = """\
modules:
  trainer:
    framework: dummy
    data:
      path: corpus/c
      seq_length: 64
"""


def experiment(tmp_path: Path, edit: str = "") -> Path:
    """The experiment above, with `edit` ("old => new") applied."""
    old, _, new = (part.replace("\\n", "\n") for part in edit.partition(" => "))
    assert old in EXPERIMENT
    (path := tmp_path / "exp.yaml").write_text(EXPERIMENT.replace(old, new) if edit else EXPERIMENT)
    return path


def test_one_corpus_a_blend_and_the_defaults(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # paths are relative to where primus runs
    data = load_experiment(experiment(tmp_path)).modules["trainer"].data
    assert data is not None
    assert (data.corpora, data.seq_length, data.seed) == (
        (Corpus(tmp_path / "corpus/c"),),
        64,
        1234,
    )
    blend = "path: corpus/c => path: [{path: a, weight: 0.25}, {path: /data/b, weight: 3}]"
    data = load_experiment(experiment(tmp_path, blend), ["data.seed=7"]).modules["trainer"].data
    assert data is not None and data.seed == 7
    assert data.corpora == (Corpus(tmp_path / "a", 0.25), Corpus(Path("/data/b"), 3.0))


def test_the_resolved_experiment_writes_the_section_back(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    blend = "path: corpus/c => path: [{path: a, weight: 1}, {path: b, weight: 2}]"
    for edit in ("", blend):
        first = load_experiment(experiment(tmp_path, edit))
        again = tmp_path / "again.yaml"
        again.write_text(to_yaml(resolved_tree(first)))
        assert load_experiment(again).modules["trainer"].data == first.modules["trainer"].data


@pytest.mark.parametrize(
    ("edit", "message", "line"),
    [
        ("path: corpus/c => path: ''", "a corpus path must be a non-empty string", 5),
        ("path: corpus/c => path: []", "data.path is an empty list", 5),
        ("path: corpus/c => path: [corpus/c]", "data.path[0] must be {path: PREFIX, weight: SHARE}", 5),
        ("path: corpus/c => path: [{path: a, weight: 0}]", "data.path[0].weight must be positive, got 0", 5),
        ("path: corpus/c => path: [{path: a, weight: .nan}]", "data.path[0].weight must be positive", 5),
        ("path: corpus/c => path: [{path: a, weight: x}]", "data.path[0].weight must be a number, got 'x'", 5),
        ("path: corpus/c => path: [{path: a, weight: true}]", "data.path[0].weight must be a number", 5),
        ("path: corpus/c => path: [{path: a, weight: 1}, {path: a, weight: 2}]", "data.path names a corpus twice", 5),
        ("path: corpus/c => path: [{path: a, weight: 1.0e+308}, {path: b, weight: 1.0e+308}]", "data.path's weights add up to more than a float holds", 5),
        ("path: corpus/c => path: corpus/c.idx", "names the corpus by its PREFIX, not a file", 5),
        ("path: corpus/c => path: 3", "data.path: must be a string or a list, got int 3", 5),
        ("seq_length: 64 => seq_length: 1", "data.seq_length must be at least 2, got 1", 6),
        ("seq_length: 64 => seed: -1", "data.seed must be at least 0, got -1", 6),
        ("seq_length: 64 => sequence: 64", "unknown data key 'data.sequence'", 6),
        ("path: corpus/c => seed: 3", "data: needs path, the prepared corpus", 4),
        ("    data:\\n      path: corpus/c\\n      seq_length: 64 =>     data: 3", "'data' must be a mapping", 4),
    ],
)  # fmt: skip
def test_bad_sections_are_refused_at_their_line(
    tmp_path: Path, edit: str, message: str, line: int
) -> None:
    with pytest.raises(ConfigError) as err:
        load_experiment(experiment(tmp_path, edit))
    assert message in str(err.value)
    assert err.value.origin is not None and err.value.origin.line == line, str(err.value)


def test_a_folder_is_refused_naming_the_corpus_in_it(tmp_path: Path) -> None:
    """`path: data` where data is the folder `primus data prepare -o data/c` wrote into."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "c.idx").write_bytes(b"")
    with pytest.raises(ConfigError) as err:
        load_experiment(experiment(tmp_path, f"path: corpus/c => path: {folder}"))
    assert f"names the corpus by its PREFIX, not a folder: {folder} (its corpora: c)" in str(
        err.value
    )
    assert err.value.hint == f"data.path: {folder / 'c'}"
    assert err.value.origin is not None and err.value.origin.line == 5
    (tmp_path / "data.idx").write_bytes(b"")  # a corpus named as the folder beside it: fine
    assert load_experiment(experiment(tmp_path, f"path: corpus/c => path: {folder}")).modules


def test_a_blend_of_corpora_from_two_tokenizers_is_refused(tmp_path: Path) -> None:
    """Corpora whose manifests name different tokenizers (or end-of-document ids) would blend
    two vocabularies' ids into one stream."""
    import json
    import shutil

    from primus.core.config.inputs import check_inputs
    from primus.testing.corpus import prepared_reverse_task

    a = prepared_reverse_task(tmp_path / "a" / "c", 20, 0, 8)
    b = tmp_path / "b" / "c"
    b.parent.mkdir()
    for suffix in (".bin", ".idx", ".json"):
        shutil.copy(f"{a}{suffix}", f"{b}{suffix}")
    blend = f"path: [{{path: {a}, weight: 1}}, {{path: {b}, weight: 1}}]"
    module = load_experiment(experiment(tmp_path, f"path: corpus/c => {blend}")).modules["trainer"]
    check_inputs(module)  # one tokenizer: fine
    manifest = json.loads(Path(f"{b}.json").read_text())
    for change, what in (({"eod": {"id": 0}}, "end-of-document id"),
                         ({"tokenizer": {"sha256": "0" * 64}}, "tokenizer")):  # fmt: skip
        Path(f"{b}.json").write_text(json.dumps(manifest | change))
        with pytest.raises(ConfigError) as err:
            check_inputs(module)
        assert f"data.path blends corpora prepared with another {what}: {a} and {b}" in str(
            err.value
        )
        assert err.value.origin is not None and err.value.origin.line == 5


def test_a_backend_that_reads_no_corpus_refuses_the_section_at_its_line(tmp_path: Path) -> None:
    path = experiment(tmp_path)
    outcome = run_in_process(["config", "validate", str(path)], tmp_path, {})
    assert outcome.code == 2 and "Traceback" not in outcome.stderr, outcome.stderr
    assert "exp.yaml:4: the dummy backend does not provide corpus" in outcome.stderr
