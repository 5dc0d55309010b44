"""nodes/host/outputs.py, the .mp4 a video node (Long Video, Fast Long Video, Play) writes in
ComfyUI's output folder: named and numbered as Save Video names its files, created empty
before any work, and a prefix with a control character, one that leaves the output folder
or one whose folder cannot be made refused naming it (inside the ComfyUI host, which makes the
folder itself: its error is named as the folder's, not as a prefix outside the output folder)."""
from __future__ import annotations

import pytest

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()  # before comfy.model_management is imported
from comfyui_lingbot_world.nodes.host.outputs import check_prefix, output_file  # noqa: E402


def test_a_new_numbered_file_in_the_prefixs_subfolder_is_created_empty(comfy_dirs):
    path, name, subfolder = output_file("LingBotWorld/long", 832, 480)
    assert (path, name, subfolder) == (comfy_dirs["output"] / "LingBotWorld" / "long_00001_.mp4", "long_00001_.mp4",
                                       "LingBotWorld")
    assert path.is_file() and path.stat().st_size == 0
    again, name, _ = output_file("LingBotWorld/long", 832, 480)  # the next run: the next number, nothing overwritten
    assert name == "long_00002_.mp4" and again.is_file() and path.is_file()
    _, name, subfolder = output_file("clip_%width%x%height%", 48, 32)  # Save Video's size fields
    assert (name, subfolder) == ("clip_48x32_00001_.mp4", "")


@pytest.mark.parametrize("prefix, shown", [("a\nb", r"'\n'"), ("x\x00", r"'\x00'"), ("del\x7f\t", r"'\t', '\x7f'")])
def test_a_control_character_in_the_prefix_is_refused_naming_it(comfy_dirs, prefix, shown):
    with pytest.raises(ValueError) as error:
        check_prefix(prefix)
    assert str(error.value).startswith(f"filename_prefix: {prefix!r} contains the control character(s) {shown}; ")
    with pytest.raises(ValueError, match="^filename_prefix: "):
        output_file(prefix, 48, 32)
    assert list(comfy_dirs["output"].iterdir()) == []


def test_a_prefix_outside_the_output_folder_is_refused(comfy_dirs):
    with pytest.raises(ValueError, match=r"filename_prefix: '\.\./escape/long' points outside the output folder; use "
                                         "a relative name"):
        output_file("../escape/long", 48, 32)
    assert not (comfy_dirs["output"].parent / "escape").exists()


def test_a_folder_that_cannot_be_made_is_named(comfy_dirs, tmp_path):
    (comfy_dirs["output"] / "gone").symlink_to(tmp_path / "unmounted" / "disk")  # a link to a folder not there
    with pytest.raises(OSError, match=r"output/gone: cannot create the folder for the video .*check filename_prefix"):
        output_file("gone/long", 48, 32)
