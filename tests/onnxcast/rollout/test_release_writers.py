"""Release writers (promote, refresh, rollback, keys publish-root) never re-sign what they
cannot verify: a planted pointer, a published root chain with a gap or a planted link, and
hostile shapes in the manifests and pointers they read. Each through the real CLI
(``onnxcast.cli.main``): one error line, nothing moved."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rollout_support import one_error_line, raw_get, raw_put
from test_rollout_hardening import EDGE

from onnxcast import cli
from onnxcast.rollout.edge import pull
from onnxcast.rollout.promote import promote
from onnxcast.rollout.signing import generate_key, load_signer, sign_envelope
from onnxcast.rollout.store import dump_json

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def edge_pull(store: str, dest, *extra: str) -> int:
    return cli.main(["edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", str(dest),
                     *extra])


def pointer_of(store: str) -> dict:
    return json.loads(raw_get(store, EDGE))


def plant_pointer(store: str, **changes) -> bytes:
    """What anyone with write access to the store (no key) can do: edit the pointer's signed
    fields and leave signatures that verify nothing."""
    envelope = pointer_of(store)
    envelope["signed"].update(changes)
    envelope["signatures"] = [{"keyid": "00" * 32, "sig": "00" * 64}]
    data = dump_json(envelope)
    raw_put(store, EDGE, data)
    return data


def resign_pointer(store: str, key_file: Path, **changes) -> None:
    """A pointer the release key signed, with fields no onnxcast writer writes."""
    envelope = pointer_of(store)
    envelope["signed"].update(changes)
    raw_put(store, EDGE, dump_json(sign_envelope(envelope["signed"], [load_signer(str(key_file))])))


@pytest.fixture
def two_versions(tmp_path, make_run):
    """Versions 1 and 2 promoted to edge (the session's release key); a device on version 2."""
    store, dest = str(tmp_path / "store"), tmp_path / "device"
    promote(make_run("a"), store, "m", "edge", version="1")
    promote(make_run("b"), store, "m", "edge", version="2")
    assert pull(store, "m", "edge", dest).version == "2"
    return store, dest


# --- a writer never re-signs a pointer it cannot verify ---------------------------

class TestPlantedPointer:
    @pytest.mark.parametrize("command", [
        ["refresh"],
        ["rollback", "--reason", "bad model"],
        ["promote", "--version", "3"],
    ])
    def test_a_planted_pointer_is_refused_not_re_signed(self, two_versions, make_run, command, capsys):
        store, dest = two_versions
        planted = plant_pointer(store, version="1", counter=pointer_of(store)["signed"]["counter"] + 1,
                                rollback={"version": "1", "from_version": "2", "by": "x", "at": "x", "reason": "x"})
        if command[0] == "promote":
            command = [*command, "--report", str(make_run("c"))]
        capsys.readouterr()
        assert cli.main([*command, "--store", store, "--model", "m", "--channel", "edge"]) == 1
        one_error_line(capsys, "channels/edge.json: the current pointer does not verify against trust root version "
                               "1 (signed by 0 of the 1 release key(s) required); it was not written with a release "
                               "key, so nothing of it is re-signed or copied, nothing written")
        assert raw_get(store, EDGE) == planted
        assert not (Path(store) / "m/versions/3").exists()
        # The device still refuses the planted pointer and keeps version 2.
        assert edge_pull(store, dest) == 1
        assert (dest / "current").readlink().name == "2"

    def test_rollback_does_not_take_its_target_from_a_planted_history(self, two_versions, capsys):
        store, dest = two_versions
        pointer = pointer_of(store)["signed"]
        # A history that says version 2 was promoted over version "1-evil"... and is unsigned.
        history = [*pointer["history"], {"action": "promote", "version": "2", "from_version": "0"}]
        plant_pointer(store, history=history)
        assert cli.main(["rollback", "--store", store, "--model", "m", "--channel", "edge",
                         "--reason", "bad"]) == 1
        one_error_line(capsys, "the current pointer does not verify")

    def test_promote_with_the_flag_moves_away_from_a_planted_pointer_keeping_nothing_of_it(
            self, two_versions, make_run, capsys):
        store, dest = two_versions
        plant_pointer(store, version="1", history=[{"action": "promote", "version": "1", "from_version": "evil"}])
        assert cli.main(["promote", "--report", str(make_run("c")), "--store", store, "--model", "m",
                         "--channel", "edge", "--version", "3", "--overwrite-unverified-pointer"]) == 0
        signed = pointer_of(store)["signed"]
        assert signed["version"] == "3" and signed["rollback"] is None
        assert [(e["action"], e["version"], e["from_version"]) for e in signed["history"]] == [("promote", "3", None)]
        assert edge_pull(store, dest) == 0
        assert (dest / "current").readlink().name == "3"

    def test_a_genuine_pointer_is_still_refreshed_and_rolled_back(self, two_versions, capsys):
        store, dest = two_versions
        assert cli.main(["refresh", "--store", store, "--model", "m", "--channel", "edge"]) == 0
        assert cli.main(["rollback", "--store", store, "--model", "m", "--channel", "edge", "--reason", "r"]) == 0
        assert "rolled back from 2 to 1" in capsys.readouterr().out
        assert edge_pull(store, dest) == 0
        assert (dest / "current").readlink().name == "1"

    def test_a_pointer_signed_for_another_channel_is_refused(self, tmp_path, make_run, capsys):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge,cloud", version="1")
        raw_put(store, EDGE, raw_get(store, "m/channels/cloud.json"))  # genuine, but the cloud channel's
        assert cli.main(["refresh", "--store", store, "--model", "m", "--channel", "edge"]) == 1
        one_error_line(capsys, "signed for 'm' channel 'cloud', not 'm' channel 'edge'")


# --- the published root chain, as a chain ---------------------------------

@pytest.fixture
def three_roots(tmp_path, make_run, capsys):
    """Keys k1 (root 1), k2 (root 2), k3 (root 3), each root signed by the previous key and
    its own; version 1 promoted with k1; root files written, none published."""
    k = {n: generate_key(tmp_path / f"k{n}") for n in (1, 2, 3)}
    for n in (2, 3):
        previous = k[1]["root"] if n == 2 else tmp_path / "root2.json"
        assert cli.main(["keys", "root", "--out", str(tmp_path / f"root{n}.json"), "--previous", str(previous),
                         "--root-key", str(k[n]["public"]), "--release-key", str(k[n]["public"]),
                         "--sign-with", str(k[n - 1]["private"]), "--sign-with", str(k[n]["private"])]) == 0
    store = str(tmp_path / "store")
    promote(make_run("a"), store, "m", "edge", version="1", signers=[k[1]["private"]])
    capsys.readouterr()
    return store, k, {1: k[1]["root"], 2: tmp_path / "root2.json", 3: tmp_path / "root3.json"}


def publish(store: str, root: Path) -> int:
    return cli.main(["keys", "publish-root", "--store", store, "--root", str(root)])


class TestRootChain:
    def test_publish_root_refuses_a_gap(self, three_roots, capsys):
        store, _, roots = three_roots
        assert publish(store, roots[3]) == 2
        one_error_line(capsys, "root/2.root.json: not published; publish root 2 first ('onnxcast keys publish-root "
                               f"--store {store} --root FILE'), nothing written")
        assert not (Path(store) / "root/3.root.json").exists()
        assert publish(store, roots[1]) == 0 and publish(store, roots[2]) == 0 and publish(store, roots[3]) == 0

    def test_publish_root_refuses_a_root_that_does_not_chain(self, three_roots, tmp_path, capsys):
        store, _, roots = three_roots
        assert publish(store, roots[1]) == 0
        # root 3's file has version 3; a root 2 signed by k3 alone does not chain from root 1.
        other = generate_key(tmp_path / "other")
        assert cli.main(["keys", "root", "--out", str(tmp_path / "bad2.json"), "--previous", str(roots[1]),
                         "--root-key", str(other["public"]), "--release-key", str(other["public"]),
                         "--sign-with", str(other["private"])]) == 0
        capsys.readouterr()
        assert publish(store, tmp_path / "bad2.json") == 2
        one_error_line(capsys, "root version 2 is signed by 0 of the 1 root key(s) the trusted root's threshold "
                               "needs (the published root 1); devices would refuse it, nothing written")
        assert not (Path(store) / "root/2.root.json").exists()

    def test_a_twice_revoked_key_is_refused_when_the_store_has_a_gap(self, three_roots, tmp_path, capsys):
        store, k, roots = three_roots
        assert publish(store, roots[1]) == 0
        raw_put(store, "root/3.root.json", roots[3].read_bytes())  # root 2 never published
        for command in (["refresh"], ["rollback", "--to", "1", "--reason", "r"]):
            before = raw_get(store, EDGE)
            assert cli.main([*command, "--store", store, "--model", "m", "--channel", "edge",
                             "--signing-key", str(k[1]["private"])]) == 1
            one_error_line(capsys, "root/2.root.json: missing, though root version 3 is published: the store's trust "
                                   "roots have a gap; nothing written")
            assert raw_get(store, EDGE) == before

    def test_a_planted_root_is_named_as_the_broken_link(self, three_roots, tmp_path, make_run, capsys):
        store, k, roots = three_roots
        assert publish(store, roots[1]) == 0 and publish(store, roots[2]) == 0
        assert cli.main(["promote", "--report", str(make_run("b")), "--store", store, "--model", "m",
                         "--channel", "edge", "--version", "2", "--signing-key", str(k[2]["private"])]) == 0
        attacker = generate_key(tmp_path / "attacker")
        assert cli.main(["keys", "root", "--out", str(tmp_path / "att3.json"), "--previous", str(roots[2]),
                         "--root-key", str(attacker["public"]), "--release-key", str(attacker["public"]),
                         "--sign-with", str(attacker["private"])]) == 0
        raw_put(store, "root/3.root.json", (tmp_path / "att3.json").read_bytes())
        capsys.readouterr()
        before = raw_get(store, EDGE)
        for command in (["refresh"], ["rollback", "--to", "1", "--reason", "r"],
                        ["promote", "--report", str(make_run("c")), "--version", "3"]):
            assert cli.main([*command, "--store", store, "--model", "m", "--channel", "edge",
                             "--signing-key", str(k[2]["private"])]) == 1
            one_error_line(capsys, "root/3.root.json is not signed by the keys of root 2: the store's trust roots "
                                   "were tampered with; nothing written")
        assert raw_get(store, EDGE) == before

    def test_after_two_rotations_the_current_key_refreshes_a_pointer_of_an_older_root(self, three_roots, capsys):
        store, k, roots = three_roots
        for n in (1, 2, 3):
            assert publish(store, roots[n]) == 0
        # The pointer was signed by k1 under root 1; k3 re-signs it, k1 and k2 are refused.
        for revoked in (1, 2):
            assert cli.main(["refresh", "--store", store, "--model", "m", "--channel", "edge",
                             "--signing-key", str(k[revoked]["private"])]) == 2
            one_error_line(capsys, "trust root version 3 requires to sign channel pointers")
        # (version 1's manifest is signed by k1 only: root 3 devices would refuse it.)
        assert cli.main(["refresh", "--store", store, "--model", "m", "--channel", "edge",
                         "--signing-key", str(k[3]["private"])]) == 2
        one_error_line(capsys, "versions/1/manifest.json: signed by 0 of the 1 release key(s) required of trust root "
                               "version 3 (published in the store); devices would refuse it, nothing written; "
                               "promote that model again as a new version")


# --- hostile shapes in what a writer reads ---------------------------------------

class TestHostileShapes:
    def test_a_signed_manifest_without_channels_is_one_line(self, two_versions, release_key, capsys):
        store, _ = two_versions
        key = "m/versions/2/manifest.json"
        manifest = json.loads(raw_get(store, key))["signed"]
        del manifest["channels"]
        raw_put(store, key, dump_json(sign_envelope(manifest, [load_signer(str(release_key["private"]))])))
        assert cli.main(["refresh", "--store", store, "--model", "m", "--channel", "edge"]) == 1
        one_error_line(capsys, "m/versions/2/manifest.json: malformed manifest (no 'channels' object); nothing written")

    @pytest.mark.parametrize("field, value, message", [
        ("version", 7, "malformed channel pointer (no valid version)"),
        ("history", "not a list", "malformed channel pointer ('history' is a str)"),
        ("rollback", ["x"], "malformed channel pointer ('rollback' is a list)"),
    ])
    def test_signed_pointer_fields_of_the_wrong_type_are_one_line(self, two_versions, release_key, field, value,
                                                                 message, capsys):
        store, _ = two_versions
        resign_pointer(store, release_key["private"], **{field: value})
        before = raw_get(store, EDGE)
        for command in (["refresh"], ["rollback", "--reason", "r"]):
            assert cli.main([*command, "--store", store, "--model", "m", "--channel", "edge"]) == 1
            one_error_line(capsys, message)
        assert raw_get(store, EDGE) == before

    def test_a_channel_choice_naming_a_missing_artifact_is_one_line(self, two_versions, release_key, capsys):
        store, _ = two_versions
        key = "m/versions/2/manifest.json"
        manifest = json.loads(raw_get(store, key))["signed"]
        manifest["channels"]["edge"]["artifact"] = "gone.onnx"
        raw_put(store, key, dump_json(sign_envelope(manifest, [load_signer(str(release_key["private"]))])))
        assert cli.main(["refresh", "--store", store, "--model", "m", "--channel", "edge"]) == 1
        one_error_line(capsys, "channel 'edge' names artifact 'gone.onnx', which it does not list")


