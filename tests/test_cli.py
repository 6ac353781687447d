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
