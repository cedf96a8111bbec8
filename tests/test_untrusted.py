from __future__ import annotations

import json

import pytest

from specguard import untrusted
from specguard.errors import InputError


@pytest.mark.parametrize(
    ("data", "deep"),
    [
        (b"[" * 100 + b"]" * 100, False),
        (b"[" * 101 + b"]" * 101, True),
        (b'{"a": "' + b"[" * 120 + b'"}', False),
        (
            b'["\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["]',
            False,
        ),
        (b"[[]" * 101, True),  # deeper without a long run of opening brackets
        ("[" * 101 + "]" * 101, True),
    ],
)
def test_nesting_depth(data, deep):
    assert untrusted.json_depth_exceeds(data) is deep


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" * 5000 + b"]" * 5000, "body: JSON nested deeper than 100 levels"),
        (b'{"t": ' + b"9" * 5000 + b"}", "body: not acceptable JSON: Exceeds the limit"),
        (b"\xff", "body: not UTF-8"),
        (b"{", "body: not JSON"),
    ],
)
def test_every_failure_is_an_input_error_naming_the_place(data, message):
    with pytest.raises(InputError, match=message):
        untrusted.loads(data, "body")


def test_loads_is_json_loads_otherwise():
    value = {"a": [1, 2.5, None, True, "x" * 10], "b": {"c": [[[]]]}}
    assert untrusted.loads(json.dumps(value).encode()) == value


def test_read_bytes_refuses_more_than_the_limit(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * 11)
    assert untrusted.read_bytes(tmp_path / "f", 11) == b"x" * 11
    with pytest.raises(InputError, match="larger than 10 bytes"):
        untrusted.read_bytes(tmp_path / "f", 10)
    with pytest.raises(InputError, match="larger than 10 bytes"):
        untrusted.read_bytes("/dev/zero", 10, regular=False)  # a device, when asked for, is bounded
    with pytest.raises(untrusted.NotRegularFile, match="/dev/zero: file is a character device"):
        untrusted.read_bytes("/dev/zero", 10)


def test_printable_escapes_what_could_forge_a_log_line():
    assert untrusted.printable("ok\nERROR fake\x1b[31m\u2028") == "ok\\nERROR fake\\x1b[31m\\u2028"
    assert untrusted.printable("x" * 10, 4) == "xxxx..."
