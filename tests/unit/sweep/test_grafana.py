"""install_dashboard where the dashboard folder cannot take it: one WARNING, never an error."""

from __future__ import annotations

import logging
import shutil

import pytest

from rllib_amp.sweep import grafana as G


def _warnings(caplog):
    return [
        r
        for r in caplog.records
        if getattr(r, "amp_event", None) == "grafana_dashboard_not_installed"
    ]


@pytest.fixture
def clean_env(monkeypatch, caplog):
    monkeypatch.delenv(G.GRAFANA_OUTPUT_DIR_ENV, raising=False)
    monkeypatch.delenv(G.METRICS_ROOT_ENV, raising=False)
    caplog.set_level(logging.WARNING, logger="rllib_amp")
    return monkeypatch


@pytest.mark.parametrize("below", ["", "dashboards"])
def test_output_dir_on_a_file_warns_once_and_installs_nothing(tmp_path, clean_env, caplog, below):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    folder = blocker / below if below else blocker
    clean_env.setenv(G.GRAFANA_OUTPUT_DIR_ENV, str(folder))
    assert G.install_dashboard(wait_s=0.1) is None
    [warning] = _warnings(caplog)
    assert warning.levelname == "WARNING"
    message = warning.getMessage()
    assert f"{blocker} is a file, not a folder" in message
    assert G.GRAFANA_OUTPUT_DIR_ENV in message and "goes on" in message
    assert blocker.read_text() == "not a folder"


def test_session_folder_with_a_file_in_the_way_warns_without_waiting(tmp_path, clean_env, caplog):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "grafana").write_text("odd")  # where Ray's folder should be
    assert G.install_dashboard(str(tmp_path), wait_s=60) is None  # no 60 s wait: it returns
    [warning] = _warnings(caplog)
    assert str(tmp_path / "metrics" / "grafana") in warning.getMessage()


@pytest.mark.parametrize(
    "error", [PermissionError(13, "Permission denied"), OSError(28, "No space left on device")]
)
def test_unwritable_folder_warns_with_the_reason(tmp_path, clean_env, caplog, error):
    clean_env.setenv(G.GRAFANA_OUTPUT_DIR_ENV, str(tmp_path / "dashboards"))

    def refuse(src, dst, **kwargs):
        # Tests run as root, whom a chmod does not stop: the OS's answer is simulated.
        raise type(error)(*error.args, dst)

    clean_env.setattr(shutil, "copyfile", refuse)
    assert G.install_dashboard() is None
    [warning] = _warnings(caplog)
    assert error.args[1] in warning.getMessage()
    assert str(tmp_path / "dashboards") in warning.getMessage()


def test_writable_folder_gets_the_dashboard_without_a_warning(tmp_path, clean_env, caplog):
    clean_env.setenv(G.GRAFANA_OUTPUT_DIR_ENV, str(tmp_path / "new" / "dashboards"))
    assert G.install_dashboard() == str(tmp_path / "new" / "dashboards" / G.GRAFANA_DASHBOARD_NAME)
    assert _warnings(caplog) == []
