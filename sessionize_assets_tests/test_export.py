"""`sessionize export`: a successful export, and each refusal as one sentence (exit 2)."""

import csv
import json

import pyarrow as pa
from deltalake import write_deltalake

from sessionize_assets.cli import main
from sessionize_assets.home import Home


def _home_with_a_map_table(tmp_path):
    home = Home(tmp_path / "h")
    home.ensure()
    data = pa.table(
        {
            "user_identifier": ["u1", "u2"],
            "props": pa.array([[("a", 1), ("b", 2)], None], type=pa.map_(pa.string(), pa.int64())),
            "tags": pa.array([["x", "y"], []], type=pa.list_(pa.string())),
        }
    )
    write_deltalake(home.table("attributes"), data)
    return home


def test_export_writes_nested_values_as_json_and_refuses_to_overwrite(tmp_path, capsys):
    home = _home_with_a_map_table(tmp_path)
    out = tmp_path / "out" / "attributes.csv"
    args = ["--home", str(home.root), "export", "attributes", "--out", str(out)]
    assert main(args) == 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert json.loads(rows[0]["props"]) == {"a": 1, "b": 2}
    assert json.loads(rows[0]["tags"]) == ["x", "y"]
    assert rows[1]["props"] == ""
    before = out.read_bytes()
    assert main(args) == 2
    assert "--force" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main([*args, "--force"]) == 0
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_export_refusals_are_one_sentence(tmp_path, capsys):
    home = _home_with_a_map_table(tmp_path)
    folder = tmp_path / "a_folder.csv"
    folder.mkdir()
    for table, out, needle in [
        ("attributes", folder, "is a folder"),
        ("../h/warehouse/attributes", tmp_path / "x.csv", "not a table name"),
        ("sessions", tmp_path / "s.csv", "no table `sessions`"),
    ]:
        code = main(["--home", str(home.root), "export", table, "--out", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and needle in err and "Traceback" not in err, (table, err)
