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
  that takes them too.
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


def check_combos(node: type[io.ComfyNode], host_checks: bool = HOST_CHECKS_COMBOS) -> type[io.ComfyNode]:
    """On a host that does not check V3 combos, replace ``node.validate_inputs`` with one that
    also takes (and checks) every combo the node's own ``validate_inputs`` does not."""
    if host_checks:
        return node
    own = node.__dict__.get("validate_inputs")
    own_func: Callable | None = own.__func__ if own is not None else None
    own_params = list(inspect.signature(own_func).parameters.values())[1:] if own_func else []
    own_names = {p.name for p in own_params}
    fixed = [i.id for i in node.define_schema().inputs
             if isinstance(i, io.Combo.Input) and i.id not in own_names]
    if not fixed:
        return node

    def validate_inputs(cls, **values) -> bool | str:
        problems = []
        if own_func is not None:
            verdict = own_func(cls, **{k: v for k, v in values.items() if k in own_names})
            if verdict is not True:
                problems.append(str(verdict) if verdict is not False else "invalid")
        problems += unknown_choices(cls, **{k: v for k, v in values.items() if k in fixed})
        return "; ".join(problems) or True

    # ComfyUI passes a node's validate_inputs the inputs its signature names (getfullargspec,
    # which reads __signature__), so the fixed combos are spelled out; a linked combo is not
    # passed (its value is not known yet), hence the defaults.
    parameter = inspect.Parameter
    validate_inputs.__signature__ = inspect.Signature(
        [parameter("cls", parameter.POSITIONAL_OR_KEYWORD)] + own_params
        + [parameter(name, parameter.POSITIONAL_OR_KEYWORD, default=None) for name in fixed])
    validate_inputs.__doc__ = f"The node's own checks, and the combos {', '.join(fixed)} (this host checks none)."
    node.validate_inputs = classmethod(validate_inputs)
    return node
