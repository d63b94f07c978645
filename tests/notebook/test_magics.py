"""The %distlab magic through a real InteractiveShell: output a user sees, one-line errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from distlab.profiling.model_profile import ModelProfile
from tests.fresh import run_python
from tests.notebook.conftest import run


def test_help_lists_every_subcommand(shell, capsys):
    out, err = run(shell, "help", capsys)
    assert err == ""
    for sub in ("profile", "cluster", "calibrate", "simulate", "pick", "launch", "compare", "help"):
        assert f"%distlab {sub}" in out


def test_help_fits_88_columns_and_names_the_data_options(shell, capsys):
    subs = ("profile", "cluster", "calibrate", "simulate", "pick", "launch", "compare", "help")
    for line in ["help", *(f"help {s}" for s in subs)]:
        out, err = run(shell, line, capsys)
        assert err == "" and max(len(ln) for ln in out.splitlines()) <= 88, line
    out, _ = run(shell, "help", capsys)
    for option in ("--data VAR", "--sample-input VAR", "--loss VAR", "--batch-size N", "--oversubscribe"):
        assert option in out


def test_help_of_one_subcommand_shows_its_usage(shell, capsys):
    out, _ = run(shell, "help launch", capsys)
    assert "--strategy NAME|FILE|VAR" in out and "--noblock" in out


@pytest.mark.parametrize(
    "line, expected",
    [
        ("frobnicate", "unknown subcommand 'frobnicate'"),
        ("help nope", "unknown subcommand 'nope'"),
        ("profile missing_model", "'missing_model' is not defined"),
        ("profile", "the following arguments are required: var"),
        ("profile m --batch-size 0", "--batch-size must be an integer >= 1, got 0"),
        ("profile m --batch-size x", "invalid int value"),
        ("launch m --strategy AllReduce --steps 0", "--steps must be an integer >= 1, got 0"),
        ("launch m", "--strategy"),
        ("cluster local 0", "N must be a positive number"),
        ("cluster frob", "expected status, 'local N'"),
        ("cluster lcoal 1", "did you mean 'local'?"),
        ("cluster local 99", "this machine has"),
        ("profil m", "did you mean 'profile'?"),
        ("profile m --bacth-size 3", "did you mean '--batch-size'?"),
        ("profile m --sample_input nothing", "--sample-input 'nothing' is not defined"),
        ("profile m --data nothing", "--data 'nothing' is not defined"),
        ("launch m --strategy Paralax", "did you mean 'Parallax'?"),
        ("launch m --strategy AllReduce --loss m_size", "not callable"),
        ("launch m --strategy AllReduce -o 2x", "not a Python name"),
        ("calibrate m n --data m", "--data and --loss go with one model VAR"),
        ("profile modle", "did you mean 'model'?"),
        ("profile m --data bad_data", "expected a Dataset"),
        ("profile m --data ids_only", "holds inputs only"),
        ("simulate m --top 0", "--top must be an integer >= 1, got 0"),
        ("calibrate m --batch-size 0", "--batch-size must be an integer >= 1, got 0"),
        ("calibrate missing_model", "'missing_model' is not defined"),
        ("compare", "no runs yet"),
        ('profile "unclosed', "cannot parse the line"),
    ],
)
def test_user_errors_print_one_line_and_no_traceback(shell, capsys, line, expected):
    shell.user_ns["m"] = shell.user_ns["n"] = shell.user_ns["model"] = nn.Linear(4, 2)
    shell.user_ns["m_size"], shell.user_ns["bad_data"] = 3, {"x": 1}
    shell.user_ns["ids_only"] = torch.zeros(8, 4)
    out, err = run(shell, line, capsys)
    assert expected in err
    assert err.count("\n") == 1 and err.startswith("distlab: ")
    assert "Traceback" not in out + err


def test_profile_of_a_non_model_says_what_was_expected(shell, capsys):
    shell.user_ns["things"] = [1, 2, 3]
    out, err = run(shell, "profile things", capsys)
    assert err.startswith("distlab: ") and "list" in err
    assert "Traceback" not in out + err


def test_profile_shows_the_table_and_stores_the_profile(shell, capsys):
    shell.user_ns["net"] = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    out, err = run(shell, "profile net --batch-size 4 -o prof", capsys)
    assert err == ""
    prof = shell.user_ns["prof"]
    assert isinstance(prof, ModelProfile)
    assert prof.batch_size == 4
    assert [v.name for v in prof.variables] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert "4 variables (0 sparse, 0 embedding), 195 parameters" in out


def test_a_magic_line_takes_a_trailing_comment_as_users_copy_them(shell, capsys):
    shell.user_ns["net"] = nn.Sequential(nn.Linear(8, 3))
    out, err = run(shell, "profile net --batch-size 4 -o prof   # per-layer table + chart", capsys)
    assert err == "" and shell.user_ns["prof"].batch_size == 4, err


def test_profile_chart_shows_time_and_flops_per_layer():
    import distlab as dl
    from distlab.notebook.views import profile_chart

    prof = dl.profile(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), batch_size=4)
    fig = profile_chart(prof)
    names = [t.name for t in fig.data]
    assert names == ["forward", "forward", "backward", "backward"]
    # one legend entry per pass, and each pass one colour in both panels: the legend matches the bars
    assert [t.showlegend for t in fig.data] == [None, False, None, False]
    assert fig.data[0].marker.color == fig.data[1].marker.color != fig.data[2].marker.color
    assert fig.data[2].marker.color == fig.data[3].marker.color
    flops_fwd = fig.data[1]
    linear0 = list(flops_fwd.y).index("0 (Linear)")
    assert flops_fwd.x[linear0] == pytest.approx(2 * 4 * 8 * 16 / 1e9)
    assert all(x >= 0 for x in fig.data[0].x)


def test_profile_with_a_wrong_input_shape_names_the_layer(shell, capsys):
    class TwoInputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()
            self.fc = nn.Linear(5, 2)

        def forward(self, x):
            return self.fc(self.act(x))

    shell.user_ns["odd"] = TwoInputs()
    out, err = run(shell, "profile odd", capsys)
    assert err.startswith("distlab: ") and "sample_input" in err
    assert "Traceback" not in out + err


def test_cluster_status_before_any_cluster(shell, capsys):
    out, err = run(shell, "cluster status", capsys)
    assert "no cluster yet" in out and err == ""


def test_import_distlab_registers_the_magic_in_any_ipython_once_and_quietly():
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "sh.run_cell('import distlab')\n"
        "print('registered', 'distlab' in sh.magics_manager.magics['line'])\n"
        "first = sh._distlab_magics\n"
        "print('load_ext', sh.run_line_magic('load_ext', 'distlab'))\n"
        "print('same session', sh._distlab_magics is first)\n"
        "sh.run_line_magic('distlab', 'help')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "registered True" in out and "load_ext None" in out and "same session True" in out, out
    assert "already loaded" not in out + proc.stderr and "%distlab SUBCOMMAND" in out
    # outside IPython, import distlab does not import IPython for it
    bare = run_python("import sys, distlab; print('IPython' in sys.modules)")
    assert bare.stdout.strip() == "False", bare.stderr[-2000:]
