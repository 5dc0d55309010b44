"""nodes/host/combo_check.py: on a host that checks no V3 combo value (before ComfyUI 0.7),
every node's validate_inputs also takes its fixed combos and refuses a value it does not
offer, naming the input; the node's own checks (file combos) still run; on newer hosts the
fixed combos are left to the host. On every host a JSON null for a combo validate_inputs
takes is refused (a link, also None there, is told apart by ``input_types``), and the
links keep the host's type check. The real-server check is
tests/integration/test_server_messages.py::test_unknown_combo_values_are_refused_at_validation_naming_the_input."""
from __future__ import annotations

import inspect

import pytest

from comfy_host import use_comfy_in_process

HOST = use_comfy_in_process()
from comfy_api.latest import io  # noqa: E402

from comfyui_lingbot_world.nodes import NODES  # noqa: E402
from comfyui_lingbot_world.nodes.host import combo_check  # noqa: E402
from comfyui_lingbot_world.nodes.host.combo_check import check_combos  # noqa: E402


def _node(with_own_check: bool) -> type[io.ComfyNode]:
    class Node(io.ComfyNode):
        @classmethod
        def define_schema(cls) -> io.Schema:
            return io.Schema(node_id="ComboCheckProbe", inputs=[
                io.Combo.Input("file", options=["a.pth", "b.pth"]),
                io.Combo.Input("mode", options=["fast", "slow"]),
                io.Int.Input("steps", default=1),
                io.Combo.Input("device", options=["auto", "cpu"], optional=True),
            ], outputs=[])

        @classmethod
        def execute(cls, file, mode, steps, device="auto") -> io.NodeOutput:
            return io.NodeOutput()

    if with_own_check:
        def own(cls, file) -> bool | str:
            # as nodes.inputs.offered: a linked value (None here) is checked when it is known
            return True if file is None or file in ("a.pth", "b.pth") else f"file: {file!r} is not offered"
        Node.validate_inputs = classmethod(own)
    return Node


def _args(node) -> list[str]:
    # What ComfyUI reads to decide which inputs validate_inputs takes.
    return inspect.getfullargspec(node.validate_inputs).args


def test_an_older_host_gets_every_fixed_combo_checked_by_validate_inputs():
    node = check_combos(_node(with_own_check=True), host_checks=False)
    assert _args(node) == ["cls", "file", "mode", "device", "input_types"]  # not steps: the host checks numbers
    assert node.validate_inputs(file="a.pth", mode="slow", device="cpu") is True
    assert node.validate_inputs(file="a.pth", mode="bogus") == "mode: 'bogus' is not one of fast, slow"
    assert node.validate_inputs(file="c.pth", mode="fast", device="gpu") == \
        "file: 'c.pth' is not offered; device: 'gpu' is not one of auto, cpu"
    assert node.validate_inputs(file="a.pth") is True  # a linked combo's value is not known yet


def test_a_node_without_its_own_check_gets_one_for_its_combos():
    node = check_combos(_node(with_own_check=False), host_checks=False)
    assert _args(node) == ["cls", "file", "mode", "device", "input_types"]
    assert node.validate_inputs(file="x", mode="fast") == "file: 'x' is not one of a.pth, b.pth"


def test_a_host_that_checks_combos_leaves_the_fixed_combos_to_it():
    plain = _node(with_own_check=False)
    own = plain.__dict__.get("validate_inputs")
    assert check_combos(plain, host_checks=True).__dict__.get("validate_inputs") is own  # nothing taken
    node = check_combos(_node(with_own_check=True), host_checks=True)
    assert _args(node) == ["cls", "file", "input_types"]
    assert node.validate_inputs(file="c.pth") == "file: 'c.pth' is not offered"


@pytest.mark.parametrize("host_checks", [False, True])
def test_a_json_null_for_a_combo_is_refused_and_a_link_is_not(host_checks):
    """A JSON null passed validation (a linked combo's value is None there too) and failed when
    the node ran."""
    node = check_combos(_node(with_own_check=True), host_checks=host_checks)
    assert node.validate_inputs(file=None, input_types={}) == \
        "file: null is not one of its choices; give a value from its list"
    assert node.validate_inputs(file=None, input_types={"file": "COMBO"}) is True  # linked: known when it runs
    if not host_checks:
        assert node.validate_inputs(file="a.pth", mode=None, input_types={}).startswith("mode: null is not one")


def test_a_node_that_takes_input_types_keeps_the_hosts_link_type_check():
    node = check_combos(_node(with_own_check=True), host_checks=True)
    assert node.validate_inputs(file="a.pth", input_types={"steps": "INT"}) is True
    assert node.validate_inputs(file="a.pth", input_types={"steps": "IMAGE"}) == \
        "steps: a IMAGE output cannot feed this input (INT)"


def test_every_registered_node_has_every_combo_checked_on_this_host():
    for node in NODES:
        combos = [i.id for i in node.define_schema().inputs if isinstance(i, io.Combo.Input)]
        if combo_check.HOST_CHECKS_COMBOS:  # the host checks them; validate_inputs only the files
            continue
        assert set(combos) <= set(_args(node)), (node.__name__, combos, _args(node))
        bad = {name: "no-such-choice" for name in combos}
        verdict = node.validate_inputs(**bad)
        assert isinstance(verdict, str) and all(f"{name}: 'no-such-choice'" in verdict for name in combos), verdict
