"""The command line: user mistakes are one sentence and exit code 2, never a traceback."""

import subprocess
import sys

import pytest

from sessionize_assets.cli import main
from sessionize_assets.jars import jars_dir


def _run(args, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SESSIONIZE_HOME": str(tmp_path / "h"),
        "SESSIONIZE_JARS_DIR": str(jars_dir()),
    }
    return subprocess.run(
        [sys.executable, "-m", "sessionize_assets.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--now", "noon", "status"], "--now"),
        (["--config", "/nonexistent.yaml", "status"], "does not exist"),
        (["load", "/nonexistent/file.csv"], "does not exist"),
        (["load", "--by-load-date", "/etc/hostname"], "is not a folder"),
        (["load", "--by-load-date", "--lookback", "1 day", "/tmp"], "ISO 8601 duration"),
        (["export", "events", "--out", "x.txt"], ".csv or .parquet"),
    ],
)
def test_user_mistakes_are_one_sentence(tmp_path, args, needle):
    result = _run(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_bad_setting_is_named_before_any_data_is_touched(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("reprocess_days: -1\n")
    code = main(
        [
            "--home",
            str(tmp_path / "h"),
            "--config",
            str(tmp_path / "bad.yaml"),
            "load",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert "`reprocess_days`" in capsys.readouterr().err
    assert not (tmp_path / "h" / "warehouse").exists()


def test_export_of_a_missing_table_names_the_known_ones(tmp_path, capsys):
    code = main(
        ["--home", str(tmp_path / "h"), "export", "sesions", "--out", str(tmp_path / "o.csv")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "sesions" in err and "sessions" in err


def test_the_command_leaves_after_its_threads_and_exit_handlers_with_its_status(tmp_path):
    """`sessionize` ends with os._exit (no native teardown, which can abort with -6 after the
    work is done); what Python's own exit would have done still happens first, in order."""
    program = (
        "import atexit, threading, time\n"
        "from sessionize_assets.cli import leave\n"
        "atexit.register(lambda: print('exit handler', flush=False))\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('thread', flush=False))).start()\n"
        "print('work', flush=False)\n"
        "leave(3)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout.splitlines() == ["work", "thread", "exit handler"]


def test_usage_errors_keep_argparse_status_through_the_entry_point(tmp_path):
    assert _run(["no-such-command"], tmp_path).returncode == 2
    helped = _run(["--help"], tmp_path)
    assert helped.returncode == 0 and "usage:" in helped.stdout
