import subprocess
import sys

from fastdpr import cli


def test_help_lists_every_available_subcommand(capsys):
    parser = cli.build_parser()
    help_text = parser.format_help()
    for name in cli._available():
        assert name in help_text


def test_python_dash_m_works():
    out = subprocess.run([sys.executable, "-m", "fastdpr", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("fastdpr ")


def test_every_registered_command_has_a_module():
    # a command listed in the CLI but missing its module would silently vanish from --help
    missing = [name for name in cli.COMMANDS if name not in cli._available()]
    assert missing == [], f"commands without a module: {missing}"


def _words(text: str) -> str:
    return " ".join(text.split())


def test_help_epilogs_never_start_mid_sentence():
    # the epilog is the module docstring after its first paragraph; cutting after the first line instead began
    # `data`, `index` and `quickstart` help with the second half of a sentence
    import importlib

    for name, (module, _) in cli._available().items():
        mod = importlib.import_module(module)
        first_paragraph = _words(mod.__doc__.strip().split("\n\n")[0])
        epilog = cli._examples(mod)
        if epilog:
            assert _words(epilog.splitlines()[0]) not in first_paragraph, name


def test_quickstart_help_shows_the_defaults_the_run_uses():
    from fastdpr.quickstart import QuickstartConfig

    full = QuickstartConfig.preset()
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["quickstart"]
    text = _words(sub.format_help())
    assert f"(default: {full.train_examples:,};" in text
    assert f"(default: {full.batch_size};" in text
    assert "10 minutes" not in text


def _split_argv(tmp_path, output):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "d1", "title": "T", "text": "one two three"}\n', encoding="utf-8")
    return ["split", str(docs), "-o", str(output)]


def _one_error_line(capsys, argv):
    status = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"fastdpr {argv[0]}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_an_output_under_a_file_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "existing_file").write_text("x")
    line = _one_error_line(capsys, _split_argv(tmp_path, tmp_path / "existing_file" / "p.tsv"))
    assert "existing_file/p.tsv" in line
    assert (tmp_path / "existing_file").read_text() == "x"


def test_an_output_that_is_a_directory_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    line = _one_error_line(capsys, _split_argv(tmp_path, tmp_path / "out"))
    assert "directory" in line
    assert list((tmp_path / "out").iterdir()) == []


def test_an_output_the_file_system_refuses_is_one_line_exit_2(tmp_path, capsys):
    line = _one_error_line(capsys, _split_argv(tmp_path, "/proc/p.tsv"))
    assert "/proc/p.tsv" in line


def test_os_errors_of_other_writers_are_one_line_exit_2(tmp_path, capsys, monkeypatch):
    # writers outside fastdpr.atomic (the index writer, a library's save) raise OSError with the path
    from fastdpr.commands import split as split_command

    def refuse(args):
        raise PermissionError(13, "Permission denied", str(tmp_path / "ro" / "x"))

    monkeypatch.setattr(split_command, "run", refuse)
    line = _one_error_line(capsys, _split_argv(tmp_path, tmp_path / "p.tsv"))
    assert line.endswith("ro/x: Permission denied")


def test_warnings_are_one_line_without_a_source_path(tmp_path, capsys):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "d1", "text": "one two"}\nnot json\n', encoding="utf-8")
    assert cli.main(["split", str(docs), "-o", str(tmp_path / "p.tsv"), "--skip-bad"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("wrote ")]
    assert warned and all(line.startswith("fastdpr split: warning: ") for line in warned), warned
    assert not any(".py:" in line or "BadRowWarning" in line for line in warned), warned
    assert any("docs.jsonl:2: not valid JSON" in line for line in warned), warned


def test_a_flag_that_turns_a_default_off_states_the_default_in_words():
    help_text = _words(cli.build_parser()._subparsers._group_actions[0].choices["serve"].format_help())
    assert "memory-mapping them (default: mapped)" in help_text and "(default: True)" not in help_text


def test_sigterm_stops_a_command_with_a_message_and_what_a_rerun_does(monkeypatch, capsys):
    import os
    import signal
    import time

    import fastdpr.commands.encode as encode

    def killed(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the signal interrupts this
        return 0

    monkeypatch.setattr(encode, "run", killed)
    start = time.monotonic()
    assert cli.main(["encode", "--merge", "anywhere"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert time.monotonic() - start < 5
    assert "fastdpr encode: stopped by SIGTERM; rerun the same command to resume" in err
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # given back after the command
