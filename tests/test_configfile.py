from __future__ import annotations

import pytest

from specguard import configfile
from specguard.errors import ConfigError


def test_every_issue_is_reported_with_file_line_column_and_path():
    doc = configfile.parse_text(
        "pools:\n  - name: a\n    url: 3\n  - name: b\ntap:\n  window_seconds: -1\n  bogus: 1\n", "x.yaml"
    )
    root = doc.root()
    for pool in root.items("pools"):
        pool.get("name", str)
        pool.get("url", str)
    tap = root.section("tap")
    tap.get("window_seconds", float, 300.0, minimum=1)
    tap.reject_unknown()
    with pytest.raises(ConfigError) as info:
        doc.raise_if_issues()
    assert [str(i) for i in info.value.issues] == [
        "x.yaml:3:5: pools[0].url: must be a string, got int 3",
        "x.yaml:4:5: pools[1].url: is required",
        "x.yaml:6:3: tap.window_seconds: (-1.0) must be >= 1",
        "x.yaml:7:3: tap.bogus: unknown key (known: window_seconds)",
    ]


def test_yaml_syntax_error_names_line_and_column():
    with pytest.raises(ConfigError) as info:
        configfile.parse_text("a: [1, 2\nb: 3\n", "bad.yaml")
    assert str(info.value).startswith("bad.yaml:")
    assert "invalid YAML" in str(info.value)


def test_integers_are_accepted_for_floats_but_booleans_are_not_integers():
    doc = configfile.parse_text("x: 2\ny: true\n")
    root = doc.root()
    assert root.get("x", float) == 2.0
    assert root.get("y", int, 7) == 7
    assert "must be an integer, got bool True" in str(doc.issues[0])


def test_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        configfile.load_file(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "text, where",
    [
        pytest.param('a: 1\nb: "x\x07y"\n', "bad.yaml:2:6:", id="bell-in-a-string"),
        pytest.param("a: 1\nb:\n  - ok\n  - \x01\n", "bad.yaml:4:5:", id="control-char-in-a-list"),
        pytest.param("\x1b", "bad.yaml:1:1:", id="first-character"),
    ],
)
def test_yaml_reader_error_names_line_and_column(text, where):
    """PyYAML's reader errors carry only a character position: reported as line and column."""
    with pytest.raises(ConfigError) as info:
        configfile.parse_text(text, "bad.yaml")
    message = str(info.value)
    assert message.startswith(where) and "unacceptable character #x00" in message, message
    assert "position" not in message


def test_file_not_in_utf8_names_line_and_column(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("a: 1\nb: café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        configfile.load_file(path)
    assert str(info.value).startswith(f"{path}:2:7: not UTF-8: byte #xe9"), str(info.value)


# --- limits on every YAML and JSON file specguard reads
@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a: 1\na: 2\n", "x.yaml:2:1: a: duplicate key (first at line 1)", id="duplicate-key"),
        pytest.param("? [1, 2]\n: x\n", "x.yaml:1:3: refused: a key must be a plain value", id="list-as-key"),
        pytest.param(
            "a: &a [1]\n" + "".join(f"b{i}: *a\n" for i in range(101)),
            "x.yaml:102:7: refused: more than 100 aliases",
            id="aliases",
        ),
        pytest.param("a: &a [*a]\n", "refused: nested deeper than 64 levels", id="alias-cycle"),
        pytest.param("a: " + "[" * 65 + "]" * 65 + "\n", "x.yaml:1:", id="nested-65"),
        pytest.param("a: '" + "x" * (4 << 20) + "'\n", "x.yaml: larger than 4194304 bytes", id="too-large"),
    ],
)
def test_limits_are_errors_with_their_place(text, message):
    with pytest.raises(ConfigError) as info:
        configfile.parse_text(text, "x.yaml").raise_if_issues()
    assert message in str(info.value)


def test_an_alias_bomb_is_refused_before_it_is_built():
    levels = ['l0: &l0 ["a", "a", "a", "a", "a", "a", "a", "a", "a"]']
    levels += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    with pytest.raises(ConfigError, match="expands to more than 100000 values"):
        configfile.parse_text("\n".join(levels) + "\n", "bomb.yaml")


def test_anchors_aliases_and_nesting_within_limits_still_work():
    doc = configfile.parse_text("base: &b {x: 1}\none: *b\ntwo: *b\ndeep: " + "[" * 60 + "]" * 60 + "\n")
    assert doc.data["one"] == doc.data["two"] == {"x": 1} and doc.issues == []


def test_a_device_is_not_read_for_ever(tmp_path):
    with pytest.raises(ConfigError, match="/dev/zero: refused: file is a character device"):
        configfile.load_file("/dev/zero")
