"""Unknown combo values refused when a prompt is queued (HTTP 400 naming the input), on
every host, instead of failing when the node runs.

ComfyUI checks a V3 combo's value against its options from 0.7.0 on (the release that made
``io.DynamicCombo`` public); the 0.3.x hosts check none, and queue a ``sampler`` of
``"bogus"``. A host also skips its own check of every input the node's ``validate_inputs``
takes, and when ``validate_inputs`` refuses, it marks every input it takes. So:

- file and folder combos: each node's own ``validate_inputs`` checks them on every host
  (``nodes.inputs.offered``: the lists change while the server runs);
- the fixed combos (sampler, device, source, preset, ...): the host checks them where it
  can, each on its own; on older hosts ``check_combos`` gives the node a ``validate_inputs``
  that takes them too;
- a JSON null for a combo the node's ``validate_inputs`` takes: the host passes a linked
  input's value as None too (it is not known yet), so the wrapper also takes ``input_types``
  (the host's documented argument: the types of the linked inputs) and refuses a None that
  is not a link. A node that takes ``input_types`` gets no link type check from the host,
  so the wrapper runs the host's own (``validate_node_input``) for each link.
"""
from __future__ import annotations

import inspect
from typing import Callable

from comfy_api.latest import io

HOST_CHECKS_COMBOS: bool = hasattr(io, "DynamicCombo")  # came with ComfyUI's own V3 combo check


def unknown_choices(node: type[io.ComfyNode], **values) -> list[str]:
    """What is wrong with the given combo values: a value the node does not offer."""
    # define_schema, not GET_SCHEMA: during validation the class is a locked clone.
    options = {i.id: i.options for i in node.define_schema().inputs if isinstance(i, io.Combo.Input)}
    return [f"{name}: {value!r} is not one of {', '.join(map(str, options[name]))}"
            for name, value in values.items()
            if name in options and value is not None and value not in options[name]]


_ABSENT = object()  # an input the host did not pass (absent from the prompt)


def link_type_problems(node: type[io.ComfyNode], input_types: dict) -> list[str]:
    """The host's check of each linked input's type (skipped by the host for a node whose
    ``validate_inputs`` takes ``input_types``), with the host's own functions."""
    from comfy_execution.validation import validate_node_input

    declared = node.INPUT_TYPES()  # what the host reads an input's type from (comfy_execution.graph.get_input_info)
    problems = []
    for name, received in input_types.items():
        info = next((declared[c][name] for c in ("required", "optional") if name in declared.get(c, {})), None)
        expected = info[0] if info else None
        if expected is not None and not validate_node_input(received, expected):
            problems.append(f"{name}: a {received} output cannot feed this input ({expected})")
    return problems


def check_combos(node: type[io.ComfyNode], host_checks: bool = HOST_CHECKS_COMBOS) -> type[io.ComfyNode]:
    """Replace ``node.validate_inputs`` with one that refuses a JSON null for every combo it
    takes (see the module docstring) and, on a host that does not check V3 combos, also
    takes (and checks) every combo the node's own ``validate_inputs`` does not."""
    own = node.__dict__.get("validate_inputs")
    own_func: Callable | None = own.__func__ if own is not None else None
    own_params = list(inspect.signature(own_func).parameters.values())[1:] if own_func else []
    own_names = {p.name for p in own_params}
    if host_checks and own_func is None:  # the host checks every combo, nulls included: no schema to read now
        return node
    combos = [i.id for i in node.define_schema().inputs if isinstance(i, io.Combo.Input)]
    fixed = [] if host_checks else [name for name in combos if name not in own_names]
    taken = [name for name in combos if name in own_names] + fixed  # combos the host leaves to the node
    if not taken:
        return node

    def validate_inputs(cls, *args, **kwargs) -> bool | str:
        # Bound by the signature declared below, so a direct call with the node's own inputs in
        # order (as its own validate_inputs took them) means what it meant.
        given = validate_inputs.__signature__.bind(cls, *args, **kwargs).arguments
        input_types = given.get("input_types")
        values = {k: v for k, v in given.items() if k not in ("cls", "input_types") and v is not _ABSENT}
        linked = input_types if isinstance(input_types, dict) else {}
        nulls = [name for name in taken if name in values and values[name] is None and name not in linked]
        problems = [f"{name}: null is not one of its choices; give a value from its list" for name in nulls]
        problems += link_type_problems(cls, linked) if linked else []
        if nulls:
            return "; ".join(problems)  # the node's own checks take values, not nulls
        if own_func is not None:
            verdict = own_func(cls, **{k: v for k, v in values.items() if k in own_names})
            if verdict is not True:
                problems.append(str(verdict) if verdict is not False else "invalid")
        problems += unknown_choices(cls, **{k: v for k, v in values.items() if k in fixed})
        return "; ".join(problems) or True

    # ComfyUI passes a node's validate_inputs the inputs its signature names (getfullargspec,
    # which reads __signature__), so the fixed combos are spelled out; an input absent from
    # the prompt is not passed (the node's own default then applies), a linked one is None.
    parameter = inspect.Parameter
    validate_inputs.__signature__ = inspect.Signature(
        [parameter("cls", parameter.POSITIONAL_OR_KEYWORD)]
        + [parameter(p.name, parameter.POSITIONAL_OR_KEYWORD, default=_ABSENT) for p in own_params]
        + [parameter(name, parameter.POSITIONAL_OR_KEYWORD, default=_ABSENT) for name in fixed]
        + [parameter("input_types", parameter.POSITIONAL_OR_KEYWORD, default=None)])
    validate_inputs.__doc__ = (f"The node's own checks, no JSON null for {', '.join(taken)}"
                               + (f", and the combos {', '.join(fixed)} (this host checks none)." if fixed else "."))
    node.validate_inputs = classmethod(validate_inputs)
    return node
