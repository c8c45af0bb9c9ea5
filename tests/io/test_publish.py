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
