"""lowband.atomic: files written whole or not at all, and a secret's file its owner's alone."""

from __future__ import annotations


def test_a_private_file_is_its_owners_alone_from_its_first_byte(tmp_path):
    """elastic.json holds the coordinator's URL with its password: mode 0600, not the umask's 0644."""
    import stat

    from lowband.atomic import write_text_atomic

    path = tmp_path / "elastic.json"
    write_text_atomic(str(path), '{"coordinator": "redis://:secret@127.0.0.1:1/0"}', private=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    write_text_atomic(str(tmp_path / "plain.txt"), "x")
    assert stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) & 0o044  # others' files as before
