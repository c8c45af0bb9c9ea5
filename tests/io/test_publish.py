import pytest

from lmprefs.io import publish


def _publish(out, text: str, keep: int = 0) -> None:
    with publish.publish_dir(out, keep=keep) as d:
        (d / "weights.txt").write_text(text)


def test_remove_deletes_the_link_and_every_version_and_nothing_beside_them(tmp_path):
    out, other = tmp_path / "reward_model", tmp_path / "policy"
    _publish(out, "old")
    _publish(out, "new", keep=1)
    _publish(other, "policy")
    assert out.is_symlink() and len(publish.versions(out)) == 2
    publish.remove(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "policy.000001"]
    assert (other / "weights.txt").read_text() == "policy"
    publish.remove(out)  # already gone: nothing to do


def test_remove_deletes_a_plain_directory_of_an_older_lmprefs(tmp_path):
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "weights.txt").write_text("w")
    publish.remove(tmp_path / "policy")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_what_is_written_has_the_modes_the_umask_gives_so_a_teammate_can_read_a_shared_run(tmp_path, umask):
    """A published model directory (mkdtemp, safetensors' 0600 weights) and an atomically written file (mkstemp)
    get 0o777 / 0o666 less the umask, as mkdir and open give, where they were 0700 and 0600 whatever the umask."""
    import os
    import stat

    import torch
    from safetensors.torch import save_file

    from lmprefs.io.atomic import atomic_write_text

    old = os.umask(umask)
    try:
        with publish.publish_dir(tmp_path / "policy") as d:
            save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
            (d / "adapter").mkdir()
            (d / "adapter" / "config.json").write_text("{}")
        atomic_write_text(tmp_path / "results.json", "{}")
    finally:
        os.umask(old)
    version = publish.versions(tmp_path / "policy")[0]
    for p in [version, version / "adapter"]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o777 & ~umask, p
    for p in [version / "model.safetensors", version / "adapter" / "config.json", version / publish.MANIFEST,
              tmp_path / "results.json"]:  # fmt: skip
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask, p
